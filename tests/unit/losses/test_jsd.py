import math

import pytest
import torch
from trl.experimental.gkd import GKDTrainer

from composer_replication.losses import generalized_jsd_loss

from .conftest import rel_err

TRL_JSD = GKDTrainer.generalized_jsd_loss


def _inputs(B=2, T=6, V=11, dtype=torch.float32):
    s = (2 * torch.randn(B, T, V, dtype=dtype)).requires_grad_()
    t = 2 * torch.randn(B, T, V, dtype=dtype)
    labels = torch.randint(0, V, (B, T))
    labels[0, :2] = -100
    labels[1, -1] = -100
    return s, t, labels


def test_hand_worked_forward_kl():
    """V=2, student (0,0), teacher (log 3, 0), beta=0: q=(3/4,1/4), p=(1/2,1/2),
    KL(q||p) = 3/4 log(3/2) + 1/4 log(1/2) = 0.1308120."""
    s = torch.zeros(1, 1, 2)
    t = torch.tensor([[[math.log(3.0), 0.0]]])
    loss, m = generalized_jsd_loss(s, t, beta=0.0)
    assert loss.item() == pytest.approx(0.1308120, abs=1e-6)
    assert m["num_tokens"].item() == 1


def test_hand_worked_jsd_half():
    """beta=0.5, p=(1/2,1/2), q=(3/4,1/4): m=(5/8,3/8).
    KL(q||m) = 3/4 log(6/5) + 1/4 log(2/3) = 0.0353748; KL(p||m) = 1/2 log(4/5) + 1/2 log(4/3)
    = 0.0322692; JSD = (0.0353748 + 0.0322692)/2 = 0.0338220."""
    s = torch.zeros(1, 1, 2)
    t = torch.tensor([[[math.log(3.0), 0.0]]])
    loss, _ = generalized_jsd_loss(s, t, beta=0.5)
    assert loss.item() == pytest.approx(0.0338220, abs=1e-6)


@pytest.mark.parametrize("beta", [0.0, 0.3, 0.5, 1.0])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_trl_parity_value_and_grad(beta, temperature):
    """Our loss and d loss / d student_logits equal TRL's GKDTrainer.generalized_jsd_loss
    (imported, fp32, -100-masked positions) to 1e-5 relative."""
    s, t, labels = _inputs()
    ref = TRL_JSD(s, t, labels=labels, beta=beta, temperature=temperature)
    (g_ref,) = torch.autograd.grad(ref, s)
    ours, _ = generalized_jsd_loss(s, t, labels=labels, beta=beta, temperature=temperature)
    (g_ours,) = torch.autograd.grad(ours, s)
    assert ours.item() == pytest.approx(ref.item(), rel=1e-5)
    assert rel_err(g_ours, g_ref) < 1e-5
    # a bool mask is the same as labels
    ours_m, _ = generalized_jsd_loss(s, t, labels != -100, beta=beta, temperature=temperature)
    assert ours_m.item() == pytest.approx(ref.item(), rel=1e-6)


def test_trl_parity_teacher_grad():
    """Like TRL, gradients also reach teacher logits that require grad."""
    s, t, labels = _inputs()
    t.requires_grad_()
    ref = TRL_JSD(s, t, labels=labels, beta=0.3)
    (g_ref,) = torch.autograd.grad(ref, t)
    ours, _ = generalized_jsd_loss(s, t, labels=labels, beta=0.3)
    (g_ours,) = torch.autograd.grad(ours, t)
    assert rel_err(g_ours, g_ref) < 1e-5


@pytest.mark.parametrize("reduction", ["batchmean", "sum", "mean"])
@pytest.mark.parametrize("masked", [True, False])
def test_trl_parity_reductions(reduction, masked):
    s, t, labels = _inputs()
    lab = labels if masked else None
    ref = TRL_JSD(s, t, labels=lab, beta=0.5, reduction=reduction)
    ours, _ = generalized_jsd_loss(s, t, labels=lab, beta=0.5, reduction=reduction)
    assert ours.item() == pytest.approx(ref.item(), rel=1e-5)


def test_divisor_matches_num_items_in_batch():
    s, t, labels = _inputs()
    ref = TRL_JSD(s, t, labels=labels, beta=0.5, num_items_in_batch=37)
    ours, _ = generalized_jsd_loss(s, t, labels=labels, beta=0.5, divisor=37)
    assert ours.item() == pytest.approx(ref.item(), rel=1e-6)


def test_reduction_none_is_per_token_with_zeros():
    s, t, labels = _inputs()
    per_tok, _ = generalized_jsd_loss(s, t, labels=labels, reduction="none")
    assert per_tok.shape == labels.shape
    assert torch.all(per_tok[labels == -100] == 0)
    mean, _ = generalized_jsd_loss(s, t, labels=labels)
    assert per_tok.sum().item() / (labels != -100).sum().item() == pytest.approx(
        mean.item(), rel=1e-6
    )


def test_token_clip_vocab_clamps_elements_not_tokens():
    """OPSD semantics: clamp every vocab element of the divergence. V=2, beta=0,
    p=(1/2,1/2), q=(3/4,1/4): elements 3/4 log(3/2) = 0.304099 and 1/4 log(1/2) = -0.173287.
    clip 0.2 (vocab): 0.2 - 0.173287 = 0.026713. clip 0.1 (token): total 0.130812 -> 0.1."""
    s = torch.zeros(1, 1, 2)
    t = torch.tensor([[[math.log(3.0), 0.0]]])
    v, m = generalized_jsd_loss(s, t, beta=0.0, token_clip=0.2, token_clip_mode="vocab")
    assert v.item() == pytest.approx(0.026713, abs=1e-6)
    assert m["clip_frac"].item() == 1.0
    tok, _ = generalized_jsd_loss(s, t, beta=0.0, token_clip=0.1, token_clip_mode="token")
    assert tok.item() == pytest.approx(0.1, abs=1e-7)
    # the vocab clip at 0.2 leaves the token total (0.1308) untouched in token mode
    tok2, _ = generalized_jsd_loss(s, t, beta=0.0, token_clip=0.2, token_clip_mode="token")
    assert tok2.item() == pytest.approx(0.130812, abs=1e-6)


def test_token_clip_token_mode_zero_grad_for_clipped_tokens():
    s, t, _ = _inputs()
    per_tok, _ = generalized_jsd_loss(s, t, beta=0.5, reduction="none")
    clip = per_tok.median().item()
    loss, m = generalized_jsd_loss(s, t, beta=0.5, token_clip=clip, token_clip_mode="token")
    (g,) = torch.autograd.grad(loss, s)
    clipped = per_tok > clip
    assert clipped.any() and torch.all(g[clipped] == 0)
    assert torch.all(g[~clipped].abs().sum(-1) > 0)
    assert m["clip_frac"].item() == pytest.approx(clipped.float().mean().item())


def test_top_k_renormalises_over_teacher_top_ids():
    """top_k=V equals the full loss; top_k=2 equals the loss on the gathered 2 logits."""
    s, t, labels = _inputs()
    full, _ = generalized_jsd_loss(s, t, labels=labels, top_k=t.shape[-1])
    ref, _ = generalized_jsd_loss(s, t, labels=labels)
    assert full.item() == pytest.approx(ref.item(), rel=1e-5)
    idx = t.topk(2, dim=-1).indices
    manual, _ = generalized_jsd_loss(s.gather(-1, idx), t.gather(-1, idx), labels=labels)
    k2, _ = generalized_jsd_loss(s, t, labels=labels, top_k=2)
    assert k2.item() == pytest.approx(manual.item(), rel=1e-6)


@pytest.mark.parametrize("beta", [0.0, 0.4, 1.0])
def test_gradcheck_float64(beta):
    s = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    t = torch.randn(2, 3, 5, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    assert torch.autograd.gradcheck(
        lambda x: generalized_jsd_loss(x, t, mask, beta=beta, temperature=0.8)[0], (s,)
    )


def test_zero_when_equal_and_nonnegative():
    s, _, labels = _inputs()
    for beta in (0.0, 0.5, 1.0):
        z, _ = generalized_jsd_loss(s, s.detach(), labels=labels, beta=beta)
        assert abs(z.item()) < 1e-6
    s2, t2, _ = _inputs()
    per_tok, _ = generalized_jsd_loss(s2, t2, beta=0.3, reduction="none")
    assert torch.all(per_tok > -1e-6)


def test_errors_are_clear():
    s, t, labels = _inputs()
    with pytest.raises(ValueError, match="teacher_logits"):
        generalized_jsd_loss(s, t[..., :-1])
    with pytest.raises(TypeError, match="floating-point"):
        generalized_jsd_loss(s, t.long())
    with pytest.raises(ValueError, match="beta"):
        generalized_jsd_loss(s, t, beta=1.5)
    with pytest.raises(ValueError, match="mask has shape"):
        generalized_jsd_loss(s, t, torch.ones(3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="either mask or labels"):
        generalized_jsd_loss(s, t, labels != -100, labels=labels)
    with pytest.raises(ValueError, match="temperature"):
        generalized_jsd_loss(s, t, temperature=0.0)
    with pytest.raises(ValueError, match="top_k"):
        generalized_jsd_loss(s, t, top_k=1000)
