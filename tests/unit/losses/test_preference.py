import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from composer_replication.losses import dpo_loss, sequence_logps, simpo_loss


def _trl_cpo_loss(loss_type, beta, chosen, rejected, gamma=0.0, label_smoothing=0.0):
    """TRL's CPOTrainer.cpo_loss (imported, not copied), called with a minimal `self`.

    DPOTrainer computes its sigmoid loss inline in _compute_loss (not importable as a
    function); cpo_loss's "sigmoid" branch is the same math when fed DPO log-ratios."""
    from trl.experimental.cpo import CPOTrainer

    me = SimpleNamespace(
        alpha=0.0,
        beta=beta,
        loss_type=loss_type,
        simpo_gamma=gamma,
        label_smoothing=label_smoothing,
        accelerator=SimpleNamespace(device=chosen.device),
    )
    losses, _, _ = CPOTrainer.cpo_loss(me, chosen, rejected)
    return losses.mean()


def test_dpo_hand_worked():
    """policy (-1, -3), reference (-2, -2), beta=1: z = (-1+2) - (-3+2) = 2,
    L = -log sigmoid(2) = log(1 + e^-2) = 0.126928."""
    loss, m = dpo_loss(
        torch.tensor([-1.0]),
        torch.tensor([-3.0]),
        torch.tensor([-2.0]),
        torch.tensor([-2.0]),
        beta=1.0,
    )
    assert loss.item() == pytest.approx(math.log1p(math.exp(-2)), abs=1e-6)
    assert m["accuracy"].item() == 1.0 and m["margin"].item() == pytest.approx(2.0)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.2])
def test_dpo_matches_trl_sigmoid_math(label_smoothing):
    pc, pr, rc, rr = (torch.randn(8) * 5 for _ in range(4))
    pc.requires_grad_()
    ours, _ = dpo_loss(pc, pr, rc, rr, beta=0.1, label_smoothing=label_smoothing)
    ref = _trl_cpo_loss("sigmoid", 0.1, pc - rc, pr - rr, label_smoothing=label_smoothing)
    assert ours.item() == pytest.approx(ref.item(), rel=1e-6)
    assert torch.allclose(
        torch.autograd.grad(ours, pc)[0], torch.autograd.grad(ref, pc)[0], atol=1e-8
    )


def test_simpo_hand_worked_and_trl_parity():
    """avg log-probs (-0.5, -1.0), beta=2, gamma=1: z = 2*0.5 - 1 = 0, L = log 2."""
    loss, _ = simpo_loss(torch.tensor([-0.5]), torch.tensor([-1.0]), beta=2.0, gamma=1.0)
    assert loss.item() == pytest.approx(math.log(2), abs=1e-7)
    c, r = torch.randn(6), torch.randn(6)
    ours, _ = simpo_loss(c, r, beta=2.5, gamma=1.4)
    ref = _trl_cpo_loss("simpo", 2.5, c, r, gamma=1.4)
    assert ours.item() == pytest.approx(ref.item(), rel=1e-6)


def test_simpo_lower_for_better_separation_and_differentiable():
    c = torch.tensor([-0.5, -0.5], requires_grad=True)
    near, _ = simpo_loss(c, torch.tensor([-0.6, -0.6]))
    far, _ = simpo_loss(c, torch.tensor([-3.0, -3.0]))
    assert far.item() < near.item()
    far.backward()
    assert c.grad is not None and torch.all(c.grad < 0)


def test_pair_mask_and_divisor():
    pc, pr, rc, rr = (torch.randn(4) for _ in range(4))
    mask = torch.tensor([1, 0, 1, 1], dtype=torch.bool)
    masked, m = dpo_loss(pc, pr, rc, rr, pair_mask=mask)
    sub, _ = dpo_loss(pc[mask], pr[mask], rc[mask], rr[mask])
    assert masked.item() == pytest.approx(sub.item(), rel=1e-6)
    assert m["num_pairs"].item() == 3
    summed, _ = dpo_loss(pc, pr, rc, rr, divisor=1.0)
    mean, _ = dpo_loss(pc, pr, rc, rr)
    assert summed.item() == pytest.approx(4 * mean.item(), rel=1e-6)


def test_sequence_logps_hand_worked_and_vs_log_softmax():
    """V=2, logits (0,0) at both positions, labels (1,0): each token log(1/2);
    sum = -1.386294, mean = -0.693147. Ignored (-100) positions drop out."""
    logits = torch.zeros(1, 3, 2)
    labels = torch.tensor([[1, 0, -100]])
    assert sequence_logps(logits, labels).item() == pytest.approx(-2 * math.log(2), abs=1e-6)
    assert sequence_logps(logits, labels, reduction="mean").item() == pytest.approx(
        -math.log(2), abs=1e-6
    )
    logits = torch.randn(3, 5, 7, requires_grad=True)
    labels = torch.randint(0, 7, (3, 5))
    mask = torch.rand(3, 5) > 0.3
    ref = (F.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1) * mask).sum(-1)
    ours = sequence_logps(logits, labels, mask)
    assert torch.allclose(ours, ref, atol=1e-5)
    assert torch.allclose(
        torch.autograd.grad(ours.sum(), logits)[0],
        torch.autograd.grad(ref.sum(), logits)[0],
        atol=1e-6,
    )


def test_errors():
    a = torch.randn(3)
    with pytest.raises(ValueError, match="ref_rejected_logps has shape"):
        dpo_loss(a, a, a, torch.randn(4))
    with pytest.raises(ValueError, match="1-D"):
        simpo_loss(torch.randn(2, 2), torch.randn(2, 2))
    with pytest.raises(TypeError, match="token ids"):
        sequence_logps(torch.randn(1, 2, 3), torch.zeros(1, 2))
    with pytest.raises(ValueError, match="labels"):
        sequence_logps(torch.randn(1, 2, 3), torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="beta"):
        dpo_loss(a, a, a, a, beta=0.0)
