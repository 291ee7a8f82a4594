"""The placebo-contrast teacher (losses/contrast.py), by hand."""

from __future__ import annotations

import torch

from composer_replication.losses import contrast_logits, contrast_teacher_states


def test_contrast_logits_hand_worked():
    s = torch.tensor([[1.0, 0.0, -1.0]], requires_grad=True)
    h = torch.tensor([[0.5, 2.0, 0.0]])
    p = torch.tensor([[0.5, 0.0, 1.0]])
    # s + 2 * (h - p) = [1 + 0, 0 + 4, -1 - 2]
    z = contrast_logits(s, h, p, 2.0)
    torch.testing.assert_close(z, torch.tensor([[1.0, 4.0, -3.0]]))
    assert not z.requires_grad  # a target
    torch.testing.assert_close(contrast_logits(s, h, h, 3.0), s.detach())  # placebo == hint


def test_states_times_head_are_the_contrast_logits_with_two_heads():
    g = torch.Generator().manual_seed(0)
    h_s, h_h, h_p = (torch.randn(5, 4, generator=g) for _ in range(3))
    w_s, w_t = torch.randn(7, 4, generator=g), torch.randn(7, 4, generator=g)  # e.g. EMA teacher
    hidden, head = contrast_teacher_states(h_s, w_s, h_h, h_p, w_t, 1.5)
    assert hidden.shape == (5, 8) and head.shape == (7, 8)
    want = contrast_logits(h_s @ w_s.T, h_h @ w_t.T, h_p @ w_t.T, 1.5)
    torch.testing.assert_close(hidden @ head.T, want, rtol=1e-5, atol=1e-5)
