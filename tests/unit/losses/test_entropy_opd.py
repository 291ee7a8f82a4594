import math

import pytest
import torch

from composer_replication.losses import entropy_aware_opd_loss, generalized_jsd_loss


def test_zero_when_distributions_match():
    s = torch.randn(2, 3, 9)
    loss, m = entropy_aware_opd_loss(s, s.clone())
    assert abs(loss.item()) < 1e-6
    assert m["forward_kl"].abs().item() < 1e-6 and m["reverse_kl"].abs().item() < 1e-6


def test_uniform_teacher_is_forward_kl():
    """Uniform teacher: H = log V = h_max, so w = 1 and L = KL(q||p)."""
    s = torch.randn(2, 3, 9)
    t = torch.zeros(2, 3, 9)
    loss, m = entropy_aware_opd_loss(s, t)
    fkl, _ = generalized_jsd_loss(s, t, beta=0.0)
    assert m["weight_mean"].item() == pytest.approx(1.0, abs=1e-6)
    assert m["teacher_entropy"].item() == pytest.approx(math.log(9), abs=1e-5)
    assert loss.item() == pytest.approx(fkl.item() / 3, rel=1e-5)  # fkl batchmean divides by B=2


def test_one_hot_teacher_is_reverse_kl():
    """(Near) one-hot teacher: H ~ 0, so w ~ 0 and L ~ KL(p||q).
    Hand-worked: V=2, teacher (30, 0) -> q ~ (1, 9.4e-14), student (0, 0) -> p = (1/2, 1/2);
    KL(p||q) = 1/2 log(1/2) + 1/2 (log(1/2) + 30) = 15 - log 2 = 14.306853."""
    t = torch.tensor([[[30.0, 0.0]]], dtype=torch.float64)
    s = torch.zeros(1, 1, 2, dtype=torch.float64)
    loss, m = entropy_aware_opd_loss(s, t)
    assert m["weight_mean"].item() < 1e-10
    assert loss.item() == pytest.approx(15 - math.log(2), rel=1e-6)


def test_mask_and_gradcheck():
    s = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    t = torch.randn(2, 3, 5, dtype=torch.float64)
    mask = torch.tensor([[1, 0, 1], [1, 1, 0]], dtype=torch.bool)
    full, _ = entropy_aware_opd_loss(s, t, mask, h_max=1.0)
    t2 = t.clone()
    t2[~mask] = 100.0  # masked positions must not matter
    again, _ = entropy_aware_opd_loss(s, t2, mask, h_max=1.0)
    assert full.item() == pytest.approx(again.item(), rel=1e-12)
    assert torch.autograd.gradcheck(lambda x: entropy_aware_opd_loss(x, t, mask)[0], (s,))


def test_errors():
    s = torch.randn(1, 2, 3)
    with pytest.raises(ValueError, match="h_max"):
        entropy_aware_opd_loss(s, s, h_max=0.0)
    with pytest.raises(ValueError, match="teacher_logits"):
        entropy_aware_opd_loss(s, s[:, :1])
