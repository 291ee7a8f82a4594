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
