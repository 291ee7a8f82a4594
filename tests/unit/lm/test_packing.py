"""Packed windows (lm/packing.py): positions restart per window and per padding run, and a
packed row's logits equal each window's own forward on sdpa and eager; left at the default
``use_cache``, the windows would see each other (the control)."""

from __future__ import annotations

import pytest
import torch

from composer_replication.lm.packing import packed_forward, packed_position_ids


def test_positions_restart_at_every_window_and_padding_run():
    prompt_mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    comp_mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
    window = torch.tensor([[0, 0, 1, 1, 1, 0], [0, 1, 1, 2, 2, 2]])
    assert packed_position_ids(prompt_mask, comp_mask, window).tolist() == [
        [0, 1, 0, 1, 2, 3, 0, 1, 2, 0],
        [0, 1, 2, 3, 4, 0, 1, 0, 1, 2],
    ]


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_a_packed_row_scores_each_window_as_its_own_forward(impl):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                      attn_implementation=impl)  # fmt: skip
    model = LlamaForCausalLM(cfg).eval()
    w0 = torch.randint(1, 50, (1, 7))  # window 0: prompt (4) + completion (3)
    w1 = torch.randint(1, 50, (1, 5))  # window 1: its prompt and completion
    ids = torch.cat(
        [torch.zeros(1, 2, dtype=torch.long), w0, w1, torch.zeros(1, 3, dtype=torch.long)], 1
    )
    prompt_mask = torch.tensor([[0, 0, 1, 1, 1, 1]])
    comp_mask = torch.tensor([[1] * 8 + [0] * 3])
    window = torch.tensor([[0] * 3 + [1] * 5 + [0] * 3])
    pos = packed_position_ids(prompt_mask, comp_mask, window)
    with torch.no_grad():
        packed = packed_forward(model, ids, pos).logits
        alone0, alone1 = model(w0).logits, model(w1).logits
        leaky = model(input_ids=ids, position_ids=pos).logits  # a cache: no packed mask
    assert torch.allclose(packed[0, 2:9], alone0[0], atol=1e-5)
    assert torch.allclose(packed[0, 9:14], alone1[0], atol=1e-5)
    assert (leaky[0, 9:14] - alone1[0]).abs().max() > 1e-2


PREFIX = list(range(5, 13))  # every window of the batch starts with these 8 tokens


def _packed_batch():
    """Three packed rows over one shared prefix: row 0 has 3 windows, row 1 one, row 2 two
    (prompts left padded, completions right padded). Returns ids, mask, K and the windows."""
    rows = [  # (prompt, [(window, tokens of the completion region)])
        (
            PREFIX + [20, 21],
            [(0, [30, 31, 32]), (1, PREFIX + [22, 33, 34]), (2, PREFIX + [23, 35])],
        ),
        (PREFIX + [24, 25, 26], [(0, [36, 37])]),
        (PREFIX + [27], [(0, [38]), (1, PREFIX + [28, 39, 40])]),
    ]
    p = max(len(r[0]) for r in rows)
    k = max(sum(len(t) for _, t in r[1]) for r in rows)
    ids = torch.zeros(len(rows), p + k, dtype=torch.long)
    mask = torch.zeros_like(ids)
    window = torch.zeros(len(rows), k, dtype=torch.long)
    for b, (prompt, parts) in enumerate(rows):
        ids[b, p - len(prompt) : p] = torch.tensor(prompt)
        mask[b, p - len(prompt) : p] = 1
        col = p
        for w, toks in parts:
            ids[b, col : col + len(toks)] = torch.tensor(toks)
            mask[b, col : col + len(toks)] = 1
            window[b, col - p : col - p + len(toks)] = w
            col += len(toks)
    return ids, mask, k, window


def _fused_model(impl: str):
    from conftest import make_tiny_model
    from trl.trainer.utils import add_fused_lm_head

    model = make_tiny_model(64, seed=3, layers=2, weight_scale=4.0)
    model.config._attn_implementation = impl
    add_fused_lm_head(model, temperature=0.7, outputs=("log_probs", "entropy"))
    return model.train()


@pytest.mark.parametrize(
    ("impl", "checkpoint"), [("sdpa", False), ("eager", False), ("sdpa", True)]
)
def test_windows_over_a_shared_prefix_score_as_the_packed_forward(impl, checkpoint):
    """:func:`packed_logps_with_prefix` (the prefix every window repeats run once) gives the
    packed forward's log-probs and entropies at every real completion token (window starts,
    predicted by the window before, included) and the same gradients; also with each chunk
    checkpointed (the model's own gradient checkpointing on, chunks of at most 8 tokens)."""
    from composer_replication.lm.packing import packed_logps_with_prefix

    ids, mask, k, window = _packed_batch()
    real = mask[:, -k:].bool()
    results = []
    for shared in (False, True):
        model = _fused_model(impl)
        if checkpoint:
            model.gradient_checkpointing_enable({"use_reentrant": False})
        if shared:
            lp, ent = packed_logps_with_prefix(model, ids, mask, k, window, entropy=True,
                                               checkpoint=checkpoint, chunk_tokens=8)  # fmt: skip
        else:
            pos = packed_position_ids(mask[:, :-k], mask[:, -k:], window)
            labels = ids.masked_fill(mask == 0, -100)
            labels[:, :-k] = -100
            out = packed_forward(model, ids, pos, labels=labels, fused_lm_head=True)
            lp, ent = out.log_probs[:, -k:], out.entropy[:, -k:]
        weights = torch.linspace(0.5, 1.5, k) * real
        ((lp * weights).sum() + 0.1 * (ent * weights).sum()).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        results.append((lp.detach(), ent.detach(), grads))
    (lp0, ent0, g0), (lp1, ent1, g1) = results
    assert lp0[real].abs().min() > 1e-3  # every compared log-prob is a real value
    torch.testing.assert_close(lp1[real], lp0[real], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent1[real], ent0[real], rtol=1e-5, atol=1e-5)
    assert (lp1[~real] == 0).all()
    for name, g in g0.items():
        torch.testing.assert_close(g1[name], g, rtol=1e-4, atol=1e-5, msg=name)


def test_windows_without_a_shared_prefix_are_left_to_the_packed_forward():
    from composer_replication.lm.packing import packed_logps_with_prefix

    ids, mask, k, window = _packed_batch()
    ids = ids.clone()
    ids[1, ids.shape[1] - k - 11] = 60  # row 1's first prompt token: the windows share nothing
    assert packed_logps_with_prefix(_fused_model("sdpa"), ids, mask, k, window, True) is None


def test_every_real_token_is_in_exactly_one_window():
    from composer_replication.lm.packing import window_sequences

    ids, mask, k, window = _packed_batch()
    seqs = window_sequences(mask, k, window)
    assert [(b, len(cols)) for b, cols in seqs] == [
        (0, 13),
        (0, 11),
        (0, 10),
        (1, 13),
        (2, 10),
        (2, 11),
    ]
    for b in range(ids.shape[0]):
        cols = sorted(c for r, cs in seqs for c in cs if r == b)
        assert cols == mask[b].nonzero().flatten().tolist()


def test_length_chunks_keep_padding_under_a_quarter():
    from composer_replication.lm.packing import length_chunks

    lengths = [316, 40, 90, 300, 41, 35, 310, 88]
    chunks = length_chunks(lengths)
    assert chunks == [[0, 6, 3], [2, 7], [4, 1, 5]]
    assert sorted(i for c in chunks for i in c) == list(range(len(lengths)))
    for c in chunks:
        assert min(lengths[i] for i in c) >= 0.75 * max(lengths[i] for i in c)
