import math

import pytest
import torch

from composer_replication.losses import prime_rl_policy_loss


def test_hand_worked_unmasked_token():
    """One token, trainer = inference log-prob (ratio 1, dp 0), A = 2:
    loss = -A * ratio + kl_tau * 0 = -2; the gradient w.r.t. the trainer log-prob is -2."""
    lp = torch.tensor([[math.log(0.5)]], requires_grad=True)
    loss, m = prime_rl_policy_loss(
        lp, lp.detach().clone(), torch.tensor([[2.0]]), torch.ones(1, 1, dtype=torch.bool)
    )
    assert loss.item() == pytest.approx(-2.0)
    assert torch.autograd.grad(loss, lp)[0].item() == pytest.approx(-2.0)
    assert m["is_masked"].item() == 0.0


def test_hand_worked_dppo_mask_positive_advantage():
    """Trainer prob 0.9 vs inference 0.5, A = +1: dp = 0.4 > 0.2 -> masked; only
    kl_tau * log(0.9/0.5)^2 = 1e-3 * 0.345461 = 3.45461e-4 remains."""
    t = torch.tensor([[math.log(0.9)]], requires_grad=True)
    i = torch.tensor([[math.log(0.5)]])
    loss, m = prime_rl_policy_loss(t, i, torch.tensor([[1.0]]), torch.ones(1, 1, dtype=torch.bool))
    assert loss.item() == pytest.approx(1e-3 * math.log(1.8) ** 2, rel=1e-5)
    assert m["is_masked"].item() == 1.0 and m["is_masked_high"].item() == 1.0
    # the same probability increase with a negative advantage is not masked (pushes it down)
    loss_neg, m_neg = prime_rl_policy_loss(
        t, i, torch.tensor([[-1.0]]), torch.ones(1, 1, dtype=torch.bool)
    )
    assert m_neg["is_masked"].item() == 0.0
    assert loss_neg.item() == pytest.approx(1.8 + 1e-3 * math.log(1.8) ** 2, rel=1e-5)


def test_negative_advantage_low_mask_and_loss_mask():
    """Trainer 0.1 vs inference 0.5, A=-1: dp = -0.4 < -0.2 -> masked (low). Tokens outside
    loss_mask contribute nothing and are not counted in the divisor."""
    t = torch.log(torch.tensor([[0.1, 0.5, 0.3]])).requires_grad_()
    i = torch.log(torch.tensor([[0.5, 0.5, 0.3]]))
    adv = torch.tensor([-1.0])  # per-sequence advantage, broadcast
    mask = torch.tensor([[True, True, False]])
    loss, m = prime_rl_policy_loss(t, i, adv, mask)
    kl0 = 1e-3 * math.log(0.2) ** 2
    # token 0 masked (kl only), token 1: -(-1 * 1) = +1, token 2 outside mask; divisor 2
    assert loss.item() == pytest.approx((kl0 + 1.0) / 2, rel=1e-5)
    assert m["is_masked_low"].item() == pytest.approx(0.5)
    g = torch.autograd.grad(loss, t)[0]
    assert g[0, 2].item() == 0.0


def test_divisor_and_weights():
    t = torch.randn(2, 4) - 2
    i = t + 0.01 * torch.randn(2, 4)
    a = torch.randn(2, 4)
    mask = torch.ones(2, 4, dtype=torch.bool)
    base, _ = prime_rl_policy_loss(t, i, a, mask)
    summed, _ = prime_rl_policy_loss(t, i, a, mask, divisor=1.0)
    assert summed.item() == pytest.approx(8 * base.item(), rel=1e-6)
    half, _ = prime_rl_policy_loss(t, i, a, mask, loss_weights=torch.full((2, 4), 0.5))
    assert half.item() == pytest.approx(0.5 * base.item(), rel=1e-6)


def test_errors():
    x = torch.randn(2, 3)
    with pytest.raises(ValueError, match="must match"):
        prime_rl_policy_loss(x, x[:, :2], x, torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="advantages shape"):
        prime_rl_policy_loss(x, x, torch.randn(3), torch.ones(2, 3, dtype=torch.bool))
