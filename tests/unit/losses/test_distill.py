"""The distillation losses (losses/distill.py): hand-worked values, and agreement with TRL's
experimental distillation losses where they are importable (the same per-token numbers)."""

from __future__ import annotations

import math

import pytest
import torch

from composer_replication.losses import (
    chunked_generalized_jsd_loss,
    gather_student_logps,
    sampled_reverse_kl_loss,
    sparse_divergence_per_token,
    topk_distill_loss,
)


def test_tail_bucket_forward_kl_hand_worked():
    """One id: student 1/2, teacher 3/4; with the tail the supports are (1/2, 1/2) and
    (3/4, 1/4): KL(q || p) = 3/4 log(3/2) + 1/4 log(1/2) = 0.130812."""
    s = torch.tensor([[math.log(0.5)]])
    t = torch.tensor([[math.log(0.75)]])
    tok = sparse_divergence_per_token(s, t, torch.ones(1, 1, dtype=torch.bool), beta=0.0)
    assert tok.item() == pytest.approx(0.75 * math.log(1.5) + 0.25 * math.log(0.5), abs=1e-6)


def test_sampled_reverse_kl_per_token_is_log_p_minus_log_q_and_pushes_down_what_the_teacher_dislikes():
    """log p(y) = log 1/2, log q(y) = log 1/4: loss log 2 = 0.6931 and d loss / d log p = +log 2
    (gradient descent lowers p(y)); where the teacher likes y more, the sign flips."""
    logp = torch.tensor([math.log(0.5), math.log(0.5)], requires_grad=True)
    q = torch.tensor([math.log(0.25), math.log(0.9)])
    loss, m = sampled_reverse_kl_loss(logp, q, logp.detach(), torch.ones(2, dtype=torch.bool))
    loss.backward()
    assert logp.grad[0].item() == pytest.approx(math.log(2) / 2, abs=1e-6)
    assert logp.grad[1].item() == pytest.approx(-math.log(1.8) / 2, abs=1e-6)
    assert m["reverse_kl"].item() == pytest.approx((math.log(2) - math.log(1.8)) / 2, abs=1e-6)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("tail", [True, False])
def test_sparse_divergence_matches_trl_async_distillation(beta, tail):
    """Per token, equal to TRL's AsyncDistillationTrainer support math (``_add_tail_bucket`` /
    renormalised support, then ``_jsd_divergence`` summed over the support)."""
    mod = pytest.importorskip("trl.experimental.async_distillation.async_distillation_trainer")
    n, v, k = 7, 50, 5
    s_full = torch.log_softmax(torch.randn(n, v) * 2, -1)
    t_full = torch.log_softmax(torch.randn(n, v) * 2, -1)
    ids = t_full.topk(k, -1).indices
    valid = torch.ones(n, k, dtype=torch.bool)
    valid[0, 3:] = False  # a position with fewer candidates
    s, t = s_full.gather(1, ids), t_full.gather(1, ids)
    ours = sparse_divergence_per_token(s, t, valid, beta, add_tail=tail)
    neg = torch.tensor(float("-inf"))
    s_m, t_m = torch.where(valid, s, neg), torch.where(valid, t, neg)
    if tail:
        s_l, support = mod._add_tail_bucket(s_m, valid)
        t_l, _ = mod._add_tail_bucket(t_m, valid)
    else:
        s_l = s_m - torch.logsumexp(s_m, -1, keepdim=True)
        t_l = t_m - torch.logsumexp(t_m, -1, keepdim=True)
        support = valid
    theirs = mod._jsd_divergence(s_l, t_l, beta=beta, support_mask=support).sum(-1)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_topk_loss_gradient_matches_the_dense_reference():
    """The chunked, checkpointed student side: same value and gradients as building the
    ``[N, V]`` log-softmax directly."""
    n, h, v, k = 300, 8, 40, 4  # more rows than one chunk
    hidden = torch.randn(n, h, requires_grad=True)
    w = torch.randn(v, h, requires_grad=True)
    t_full = torch.log_softmax(torch.randn(n, v), -1)
    ids = t_full.topk(k, -1).indices
    valid = torch.ones(n, k, dtype=torch.bool)
    loss, m = topk_distill_loss(hidden, w, ids, t_full.gather(1, ids), valid, beta=0.0, divisor=10)
    loss.backward()
    g_h, g_w = hidden.grad.clone(), w.grad.clone()
    hidden.grad = w.grad = None
    s = torch.log_softmax(hidden @ w.T, -1).gather(1, ids)
    ref = sparse_divergence_per_token(s, t_full.gather(1, ids), valid, 0.0).sum() / 10
    ref.backward()
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(g_h, hidden.grad)
    torch.testing.assert_close(g_w, w.grad)
    assert m["num_tokens"].item() == n


def test_gather_student_logps_is_the_log_softmax_entry():
    hidden, w = torch.randn(5, 6), torch.randn(11, 6)
    ids = torch.randint(0, 11, (5, 2))
    ref = torch.log_softmax(hidden @ w.T / 0.7, -1).gather(1, ids)
    torch.testing.assert_close(gather_student_logps(hidden, w, ids, 0.7), ref)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_full_vocabulary_jsd_matches_trl_distillation_trainer(beta):
    """A local teacher's loss (the chunked fused kernel, hidden states + heads of different
    widths) equals TRL's ``DistillationTrainer`` chunked divergence (value and gradient)."""
    mod = pytest.importorskip("trl.trainer.distillation_trainer")
    b, k, h_s, h_t, v = 2, 5, 8, 12, 30
    hs = torch.randn(b, k, h_s, requires_grad=True)
    ht = torch.randn(b, k, h_t)
    ws, wt = torch.randn(v, h_s), torch.randn(v, h_t)
    mask = torch.ones(b, k, dtype=torch.bool)
    mask[1, 3:] = False
    ours, _ = chunked_generalized_jsd_loss(hs, ws, ht, wt, mask, beta=beta)
    (g_ours,) = torch.autograd.grad(ours, hs)
    theirs, _, _ = mod._chunked_divergence_loss(hs, ht, ws, wt, mask.long(), beta)
    (g_theirs,) = torch.autograd.grad(theirs, hs)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g_ours, g_theirs, rtol=1e-4, atol=1e-6)
