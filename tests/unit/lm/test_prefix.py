"""Shared-prefix forwards equal the plain padded forward (values and gradients)."""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_model

from composer_replication.lm.models import HiddenCapture
from composer_replication.lm.prefix import (
    common_prefix_len,
    completion_logps_with_prefix,
    forward_with_prefix,
    generate_with_prefix,
    prefix_groups,
    split_prefixes,
    supports_prefix_cache,
)

VOCAB = 97


def _rows():
    """Two groups: rows 0-2 share 9 prompt tokens then differ (a per-row "hint"), rows 3-4
    share their whole prompt (a chosen/rejected pair); tails are right-padded to 4."""
    g1 = [5, 6, 7, 8, 9, 10, 11, 12, 13]
    g2 = [40, 41, 42, 43, 44, 45]
    prompts = [g1 + [20, 21], g1 + [22], g1 + [23, 24, 25], g2, g2]
    tails = [[60, 61, 62, 63], [64, 65, 0, 0], [66, 0, 0, 0], [70, 71, 72, 0], [73, 74, 0, 0]]
    masks = [[1 if t else 0 for t in row] for row in tails]
    return prompts, [0, 0, 0, 1, 1], torch.tensor(tails), torch.tensor(masks)


def _left(seqs, width):
    """Left-padded ids and mask, built here independently of the code under test."""
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    att = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, width - len(s) :] = torch.tensor(s)
        att[i, width - len(s) :] = 1
    return ids, att


def _plain(net, prompts, tails, masks):
    """The reference: left-padded prompt + right-padded tail, one forward, no cache."""
    ids, att = _left(prompts, max(map(len, prompts)))
    return net(
        input_ids=torch.cat([ids, tails], 1),
        attention_mask=torch.cat([att, masks], 1),
        use_cache=False,
    )


def test_common_prefix_len():
    assert common_prefix_len([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2
    assert common_prefix_len([[1], [2]]) == 0
    assert common_prefix_len([[3, 4, 5]]) == 3


def test_split_keeps_last_prompt_token_in_suffix():
    """A group whose prompts are identical still leaves one prompt token per row in the
    suffix: its position predicts the first tail token."""
    prompts, groups, tails, masks = _rows()
    b = split_prefixes(prompts, groups, tails, masks, pad_id=0)
    assert b.prefix_mask.sum(1).tolist() == [9, 5]
    assert b.row_group.tolist() == [0, 0, 0, 1, 1]
    rest = b.suffix_mask[:, : -tails.shape[1]].sum(1).tolist()
    assert rest == [2, 1, 3, 1, 1]
    assert int(b.prefix_mask.sum()) == 14  # shared tokens run once instead of per row


def test_backbone_hidden_states_match_plain_forward():
    net = make_tiny_model(VOCAB, seed=1, layers=3).eval()
    assert supports_prefix_cache(net.model)
    prompts, groups, tails, masks = _rows()
    k = tails.shape[1]
    with torch.no_grad():
        ref = _plain(net.model, prompts, tails, masks).last_hidden_state[:, -k - 1 : -1]
        b = split_prefixes(prompts, groups, tails, masks, pad_id=0)
        got = forward_with_prefix(net.model, net.model, b).last_hidden_state[:, -k - 1 : -1]
    keep = torch.cat([torch.ones(5, 1, dtype=torch.bool), masks[:, :-1].bool()], 1)
    torch.testing.assert_close(got[keep], ref[keep], rtol=1e-4, atol=1e-5)


def test_logits_and_gradients_match_plain_forward():
    """The replay use: full LM on the suffixes, loss on tail log-probs, gradients through the
    expanded cache into every weight equal the plain forward's."""
    prompts, groups, tails, masks = _rows()
    k = tails.shape[1]
    grads, losses = [], []
    for shared in (False, True):
        net = make_tiny_model(VOCAB, seed=2)
        if shared:
            b = split_prefixes(prompts, groups, tails, masks, pad_id=0)
            logits = forward_with_prefix(net.model, net, b, logits_to_keep=k + 1).logits
        else:
            logits = _plain(net, prompts, tails, masks).logits
        lp = torch.log_softmax(logits[:, -k - 1 : -1].float(), -1)
        tok = lp.gather(2, tails.unsqueeze(2)).squeeze(2)
        loss = (tok * masks).sum()
        loss.backward()
        losses.append(loss.detach())
        grads.append({n: p.grad.clone() for n, p in net.named_parameters()})
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-4)
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, rtol=1e-3, atol=1e-5, msg=name)


def test_no_shared_prefix_runs_plain():
    """Groups of one-token prompts share nothing: a single forward of the suffixes."""
    net = make_tiny_model(VOCAB, seed=3).eval()
    prompts = [[5], [6]]
    tails, masks = torch.tensor([[7, 8], [9, 0]]), torch.tensor([[1, 1], [1, 0]])
    b = split_prefixes(prompts, [0, 1], tails, masks, pad_id=0)
    assert b.prefix_ids.shape[1] == 0
    with torch.no_grad():
        got = forward_with_prefix(net.model, net.model, b).last_hidden_state
        ref = _plain(net.model, prompts, tails, masks).last_hidden_state
    torch.testing.assert_close(got[0], ref[0], rtol=1e-4, atol=1e-5)


def test_split_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="2 prompts, 1 group labels"):
        split_prefixes([[1], [2]], [0], torch.zeros(2, 1, dtype=torch.long), torch.ones(2, 1), 0)


def test_sliding_window_models_are_not_prefix_cached():
    from transformers import Qwen2Config, Qwen2Model

    cfg = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        use_sliding_window=True,
        sliding_window=8,
        max_window_layers=0,
    )
    assert not supports_prefix_cache(Qwen2Model(cfg))


def test_self_teacher_states_equal_the_plain_teacher_forward(monkeypatch):
    """Channel 2's teacher: hinted rows of two problems (per-row hints after shared problem
    text), scored with and without the prefix cache."""
    from types import SimpleNamespace

    import composer_replication.channels.self_distill as sdpo
    from composer_replication.config import SdpoConfig

    net = make_tiny_model(VOCAB, seed=4).eval()
    prompts, _, tails, masks = _rows()
    student = [p[:6] for p in prompts]  # rows 0-2: one problem, rows 3-4: another
    batch = {"completion_ids": tails, "completion_mask": masks}
    batch["sdpo_prompt_ids"], batch["sdpo_prompt_mask"] = _left(prompts, max(map(len, prompts)))
    batch["prompt_ids"], batch["prompt_mask"] = _left(student, 6)
    teacher = sdpo.SelfDistillChannel(SdpoConfig(weight=1.0))
    teacher.setup(net, SimpleNamespace(pad_token_id=0), SimpleNamespace(max_steps=1))
    rows = torch.tensor([0, 2, 3, 4])
    shared, _ = teacher.teacher_states(net, batch, rows)
    monkeypatch.setattr(sdpo, "supports_prefix_cache", lambda _net: False)
    plain, _ = teacher.teacher_states(net, batch, rows)
    keep = torch.cat([torch.ones(4, 1, dtype=torch.bool), masks[rows, :-1].bool()], 1)
    torch.testing.assert_close(shared[keep], plain[keep], rtol=1e-4, atol=1e-5)


def test_gradient_checkpointing_does_not_drop_the_prefix():
    """In training mode with gradient checkpointing, transformers drops every layer's
    past_key_values: forward_with_prefix pauses checkpointing so the suffixes still see their
    prefix, and with gradients on, supports_prefix_cache sends callers to the padded forward."""
    model = make_tiny_model(VOCAB, seed=2)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    net = model.model
    prompt, tail = list(range(10, 30)), torch.tensor([[5, 6, 7, 8]])
    pb = split_prefixes([prompt], [0], tail, torch.ones_like(tail), 0)
    ids = torch.tensor([prompt + tail[0].tolist()])
    with torch.no_grad():
        assert supports_prefix_cache(net)
        shared = forward_with_prefix(net, net, pb).last_hidden_state[:, -5:-1]
        plain = net(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
    torch.testing.assert_close(shared, plain[:, -5:-1], rtol=1e-4, atol=1e-5)
    assert net.layers[0].gradient_checkpointing  # restored after the call
    assert not supports_prefix_cache(net)  # grad on + checkpointing: take the padded path
    model.eval()
    assert supports_prefix_cache(net)


def _sharp_model(seed: int):
    """A tiny random Llama with weights scaled up, so that its next token depends strongly on
    the context and the positions (the plain random init predicts almost the same token
    everywhere, which would make output comparisons meaningless)."""
    net = make_tiny_model(VOCAB, seed=seed).eval()
    with torch.no_grad():
        for p in net.parameters():
            if p.dim() == 2:
                p.mul_(6.0)
    return net


def _agent_prompts():
    """A shared 14-token "system prompt, tools and examples" then per-row requests of
    different lengths (so the plain batch is left-padded by different amounts)."""
    shared = [3, 17, 29, 41, 5, 66, 71, 8, 90, 12, 33, 54, 61, 2]
    return [shared + [20, 21], shared + [22], shared + [23, 24, 25, 26], shared + [30, 31, 32]]


def test_prefix_groups_picks_the_cheaper_layout():
    # GRPO groups of identical prompts that share nothing else: one group per prompt
    a, b = [1, 2, 3, 4, 5], [9, 8, 7, 6]
    assert prefix_groups([a, a, a, b, b, b]) == [0, 0, 0, 1, 1, 1]
    # distinct prompts around a long common prefix (later turns of tool rollouts): one group.
    # by prompt: 15 + 14 + 17 + 16 prefix tokens + 4 = 66; shared: 14 + 2 + 1 + 4 + 3 = 24
    assert prefix_groups(_agent_prompts()) == [0, 0, 0, 0]


def test_generate_with_prefix_equals_plain_generation():
    net = _sharp_model(seed=5)
    prompts = _agent_prompts()
    width = max(map(len, prompts))
    ids, att = _left(prompts, width)
    kw = dict(max_new_tokens=10, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        ref = net.generate(input_ids=ids, attention_mask=att, **kw)[:, width:]
    got = generate_with_prefix(net, prompts, pad_id=0, **kw)
    assert torch.equal(got, ref)
    # the comparison can fail: the outputs vary by row, and change when the prefix does
    assert len({tuple(r) for r in ref.tolist()}) == len(prompts)
    moved = generate_with_prefix(net, [[4] + p for p in prompts], pad_id=0, **kw)
    assert not torch.equal(moved, ref)


def test_generate_with_prefix_sampling_draws_the_same_tokens():
    net = _sharp_model(seed=6)
    prompts = _agent_prompts()
    width = max(map(len, prompts))
    ids, att = _left(prompts, width)
    kw = dict(max_new_tokens=12, do_sample=True, temperature=1.0, top_k=0, pad_token_id=0)
    torch.manual_seed(11)
    with torch.no_grad():
        ref = net.generate(input_ids=ids, attention_mask=att, **kw)[:, width:]
    torch.manual_seed(11)
    assert torch.equal(generate_with_prefix(net, prompts, pad_id=0, **kw), ref)


def _fused(seed: int):
    from trl.trainer.utils import add_fused_lm_head

    net = _sharp_model(seed)
    add_fused_lm_head(net, temperature=0.7, outputs=("log_probs", "entropy"))
    return net.train()


@pytest.mark.parametrize("layout", ["by_prompt", "shared"])
def test_completion_logps_and_gradients_equal_trl_fused_forward(layout):
    """The policy forward: TRL's fused log-probs/entropies of the completion tokens and the
    gradients of a masked sum of them, with and without the prefix cache."""
    if layout == "by_prompt":  # two GRPO groups of two identical prompts each
        base = _agent_prompts()
        prompts = [base[0], base[0], base[2], base[2]]
    else:
        prompts = _agent_prompts()
    tails = torch.tensor([[40, 41, 42, 0], [43, 44, 45, 46], [47, 0, 0, 0], [48, 49, 50, 0]])
    tmask = (tails > 0).long()
    k = tails.shape[1]
    ids, att = _left(prompts, max(map(len, prompts)))
    ids, att = torch.cat([ids, tails], 1), torch.cat([att, tmask], 1)
    results = []
    for shared in (False, True):
        net = _fused(seed=7)
        capture = HiddenCapture(net)
        with capture.active():
            if shared:
                lp, ent = completion_logps_with_prefix(net, ids, att, k, pad_id=0, entropy=True)
            else:
                labels = ids.masked_fill(att == 0, -100)
                labels[:, :-k] = -100
                out = net(input_ids=ids, attention_mask=att, labels=labels, fused_lm_head=True)
                lp, ent = out.log_probs[:, -k:], out.entropy[:, -k:]
        ((lp * tmask).sum() + 0.1 * (ent * tmask).sum()).backward()
        states = capture.completion_states(len(prompts), k)
        grads = {n: p.grad.clone() for n, p in net.named_parameters()}
        results.append((lp.detach(), ent.detach(), states.detach(), grads))
    (lp0, ent0, h0, g0), (lp1, ent1, h1, g1) = results
    keep = tmask.bool()
    assert lp0[keep].abs().max() > 0.1  # non-trivial log-probs
    torch.testing.assert_close(lp1[keep], lp0[keep], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(ent1[keep], ent0[keep], rtol=1e-4, atol=1e-4)
    # the hidden-state capture sees the completion rows only (not the prefix forward)
    torch.testing.assert_close(h1[keep], h0[keep], rtol=1e-4, atol=1e-4)
    for name, g in g0.items():
        torch.testing.assert_close(g1[name], g, rtol=1e-3, atol=1e-4, msg=name)
