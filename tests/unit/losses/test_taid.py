import math

import pytest
import torch

from composer_replication.losses import TAIDScheduler, generalized_jsd_loss, taid_loss


def test_hand_worked_endpoints():
    """V=2, student (0,0), teacher (log 3, 0). t=1: p_t = (3/4,1/4), KL = 0.1308120 (forward KL).
    t=0: p_t = softmax(student) so KL = 0; upstream's cross-entropy = H(1/2,1/2) = log 2."""
    s = torch.zeros(1, 1, 2)
    t = torch.tensor([[[math.log(3.0), 0.0]]])
    one, _ = taid_loss(s, t, t=1.0)
    assert one.item() == pytest.approx(0.1308120, abs=1e-6)
    zero, m = taid_loss(s, t, t=0.0)
    assert zero.item() == pytest.approx(0.0, abs=1e-7)
    assert m["cross_entropy"].item() == pytest.approx(math.log(2.0), abs=1e-6)


def test_t_zero_zero_grad_and_teacher_independent():
    s = torch.randn(2, 3, 7, requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    t_a, t_b = torch.randn(2, 3, 7), 10 * torch.randn(2, 3, 7)
    la, _ = taid_loss(s, t_a, mask, t=0.0)
    lb, _ = taid_loss(s, t_b, mask, t=0.0)
    assert la.item() == lb.item()
    (g,) = torch.autograd.grad(la, s)
    assert g.abs().max().item() < 1e-7


def test_t_one_equals_forward_kl():
    s = torch.randn(2, 3, 7, requires_grad=True)
    t = torch.randn(2, 3, 7)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    ours, _ = taid_loss(s, t, mask, t=1.0)
    fkl, _ = generalized_jsd_loss(s, t, mask, beta=0.0)
    assert ours.item() == pytest.approx(fkl.item(), rel=1e-6)
    g1 = torch.autograd.grad(ours, s)[0]
    g2 = torch.autograd.grad(fkl, s)[0]
    assert torch.allclose(g1, g2, atol=1e-7)


def test_gradient_equals_upstream_cross_entropy_form():
    """Upstream returns -sum p_t log q (mean over mask): same gradient as our KL form."""
    s = torch.randn(2, 4, 6, requires_grad=True)
    t = torch.randn(2, 4, 6)
    mask = torch.ones(2, 4)
    tt = 0.37
    p_t = torch.softmax((1 - tt) * s.detach() + tt * t, -1)
    upstream = -((p_t * torch.log_softmax(s, -1)).sum(-1) * mask).sum() / mask.sum()
    ours, m = taid_loss(s, t, mask, t=tt)
    assert m["cross_entropy"].item() == pytest.approx(upstream.item(), rel=1e-6)
    g_up = torch.autograd.grad(upstream, s)[0]
    assert torch.allclose(torch.autograd.grad(ours, s)[0], g_up, atol=1e-7)


def test_gradient_is_semi_gradient_closed_form_float64():
    """gradcheck does not apply (the target holds a detached copy of the student, so finite
    differences move the target too); instead check the closed form in float64:
    dL/ds = (softmax(s) - p_t) / n_tokens."""
    s = torch.randn(1, 3, 4, dtype=torch.float64, requires_grad=True)
    t = torch.randn(1, 3, 4, dtype=torch.float64)
    loss, _ = taid_loss(s, t, t=0.6)
    (g,) = torch.autograd.grad(loss, s)
    p_t = torch.softmax(0.4 * s.detach() + 0.6 * t, -1)
    assert torch.allclose(g, (torch.softmax(s.detach(), -1) - p_t) / 3, atol=1e-14)


def test_scheduler_hand_worked_step():
    """First call only records the loss. Second call with loss 1.0 -> 0.5: relative change
    0.5, momentum = 0.01 * 0.5 = 0.005, delta = 5e-4 * sigmoid(0.005) * (1 - 0.4) = 1.50037e-4;
    linear target at step 1 of 1000 = 0.4006 > 0.4 + delta, so t = 0.4006."""
    sch = TAIDScheduler(num_train_steps=1000)
    assert sch.t == 0.4
    assert sch.update_t(1.0, global_step=0) == 0.0 and sch.t == 0.4
    delta = sch.update_t(0.5, global_step=1)
    assert delta == pytest.approx(5e-4 / (1 + math.exp(-0.005)) * 0.6, rel=1e-9)
    assert sch.momentum == pytest.approx(0.005)
    assert sch.t == pytest.approx(0.4006)


def test_scheduler_monotone_bounded_and_linear_fallback():
    sch = TAIDScheduler(num_train_steps=10, alpha=0.5)
    lin = TAIDScheduler(num_train_steps=10, alpha=0.5, disable_adaptive=True)
    ts, lts = [], []
    for step in range(12):
        loss = 1.0 / (step + 1)
        sch.update_t(loss, step)
        lin.update_t(loss, step)
        ts.append(sch.t)
        lts.append(lin.t)
    assert all(b >= a for a, b in zip(ts, ts[1:], strict=False)) and max(ts) <= 1.0
    assert all(a >= b - 1e-12 for a, b in zip(ts[1:], lts[1:], strict=True))  # never behind linear
    assert lts[-1] == 1.0  # capped at t_end past num_train_steps
    assert lts[5] == pytest.approx(0.4 + 0.6 * 5 / 10)
    state = sch.state_dict()
    other = TAIDScheduler(num_train_steps=10)
    other.load_state_dict(state)
    assert other.t == sch.t


def test_errors():
    s = torch.randn(1, 2, 3)
    with pytest.raises(ValueError, match="t must be in"):
        taid_loss(s, s, t=1.5)
    with pytest.raises(ValueError, match="teacher_logits"):
        taid_loss(s, s[..., :2], t=0.5)
    with pytest.raises(ValueError, match="t_start"):
        TAIDScheduler(10, t_start=1.0)
    with pytest.raises(ValueError, match="num_train_steps"):
        TAIDScheduler(0)
