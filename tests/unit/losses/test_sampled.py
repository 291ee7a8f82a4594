"""Losses over sampled-token log-probs: the reverse-KL estimator's expected gradient is the
exact reverse-KL gradient; shapes, weights and divisors."""

from __future__ import annotations

import pytest
import torch

from composer_replication.losses import dapo_clip_loss, sampled_reverse_kl_loss


def test_expected_gradient_equals_the_exact_reverse_kl_gradient():
    """Enumerate every token y of a 6-way distribution, weight its per-token loss by pi(y)
    (the expectation over on-policy samples): the gradient is grad KL(pi || pi_T)."""
    torch.manual_seed(0)
    theta = torch.randn(6, requires_grad=True)
    log_t = torch.log_softmax(torch.randn(6), -1)
    logp = torch.log_softmax(theta, -1)
    pi = logp.exp().detach()
    est, _ = sampled_reverse_kl_loss(logp, log_t, logp.detach(), torch.ones(6, dtype=torch.bool),
                                     loss_weights=pi, divisor=1)  # fmt: skip
    (g_est,) = torch.autograd.grad(est, theta, retain_graph=True)
    exact = (logp.exp() * (logp - log_t)).sum()
    (g_exact,) = torch.autograd.grad(exact, theta)
    assert torch.allclose(g_est, g_exact, atol=1e-6)


def test_divisor_defaults_to_mask_tokens_and_weights_scale():
    logp = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5]]))
    teacher = torch.log(torch.tensor([[0.25, 0.5], [0.25, 0.25]]))
    mask = torch.tensor([[True, True], [True, False]])
    loss, m = sampled_reverse_kl_loss(logp, teacher, logp, mask)
    log2 = torch.log(torch.tensor(2.0)).item()
    assert loss.item() == pytest.approx(2 * log2 / 3)  # tokens: log 2, 0, log 2 (4th masked)
    assert m["num_tokens"].item() == 3
    w = torch.tensor([[2.0, 1.0], [0.0, 1.0]])
    loss_w, _ = sampled_reverse_kl_loss(logp, teacher, logp, mask, loss_weights=w, divisor=1)
    assert loss_w.item() == pytest.approx(2 * log2)


def test_shapes_must_match():
    a = torch.zeros(3)
    with pytest.raises(ValueError, match="shapes must match"):
        dapo_clip_loss(a, a, torch.zeros(4), torch.ones(3, dtype=torch.bool))


def test_dapo_on_policy_is_minus_mean_advantage():
    """r = 1 everywhere: loss = -mean(A) over the mask, gradient -A / n per token."""
    logp = torch.log(torch.tensor([0.3, 0.6, 0.9])).requires_grad_()
    adv = torch.tensor([1.0, -2.0, 4.0])
    loss, m = dapo_clip_loss(logp, logp.detach(), adv, torch.tensor([True, True, False]))
    assert loss.item() == pytest.approx(0.5)
    loss.backward()
    assert logp.grad.tolist() == pytest.approx([-0.5, 1.0, 0.0])
    assert m["clip_low_frac"].item() == m["clip_high_frac"].item() == 0.0
