"""On-policy distillation from a stronger teacher: the student samples, the teacher scores the
student's own tokens, and the student is pulled toward the teacher token by token.

Three forms, all over the student's sampled completion tokens ``y_t`` (tool-result tokens are
masked by the caller), with ``p`` the student and ``q`` the teacher:

* **Sampled reverse KL** (on-policy distillation as in Agarwal et al., "On-Policy Distillation
  of Language Models" (GKD), arXiv:2306.13649, and Thinking Machines' "On-Policy Distillation",
  Lu et al., 2025; the per-teacher objective of MOPD, Ma et al., arXiv:2606.30406, Eq. 1).
  The per-token reverse KL is estimated on the sampled token, ``log p(y_t) - log q(y_t)``, and
  its negative is a dense per-token advantage ``A_t = log q(y_t) - log p(y_t)`` fed to the
  importance-sampled policy gradient: ``loss_t = -A_t.detach() * p(y_t) / p_old(y_t)``
  (:func:`~composer_replication.losses.sampled.sampled_reverse_kl_loss`). Needs only the
  teacher's log-prob of each sampled token, so any teacher works (a vLLM server's
  ``prompt_logprobs`` always include the sampled token).
* **Generalized JSD over the full vocabulary** (GKD Eq. 1; beta 0 forward KL ``KL(q || p)``,
  beta 1 reverse KL ``KL(p || q)``) when the teacher is a local model with the student's
  vocabulary: computed from both models' last hidden states and heads by the chunked fused
  kernel (:func:`~composer_replication.losses.chunked.chunked_generalized_jsd_loss`), no
  ``[N, V]`` tensor.
* **Generalized JSD over the teacher's top-k with a tail bucket** (:func:`topk_distill_loss`)
  when only the teacher's top-k log-probs are known (a remote teacher). The support is the
  ``k`` ids the teacher reported at each position; the student's log-probs are its *full*
  softmax gathered at those ids; with ``add_tail`` each side gets a (k+1)-th element
  ``log(1 - sum_k exp(logp_k))`` holding the rest of the mass, so a small ``k`` still gives a
  proper distribution (TRL's experimental ``ServerDistillationTrainer`` and
  ``AsyncDistillationTrainer`` use the same support and tail; ``add_tail=False`` renormalises
  both over the ``k`` ids instead). This is a sparse approximation of the full-vocabulary JSD;
  it equals it when the teacher's top-k hold all of its mass.

Conventions follow :mod:`~composer_replication.losses.jsd`: the temperature divides the
student's logits (the teacher's log-probs arrive already at their temperature), the loss is
the sum of per-token divergences over ``divisor`` (default: the kept tokens), and metrics are
detached scalars.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from ._common import check_float, check_unit_interval

_ROWS_PER_CHUNK = 256  # rows whose [chunk, V] student logits exist at once


def add_tail_bucket(logp_NK: Tensor, valid_NK: Tensor) -> tuple[Tensor, Tensor]:
    """``[N, K+1]`` log-probs and support: the ``K`` valid entries plus a tail element
    ``log(1 - sum_k exp(logp_k))`` (the mass outside the support; clamped so it stays finite
    when the support holds everything)."""
    kept = logp_NK.masked_fill(~valid_NK, float("-inf"))
    log_sum = torch.logsumexp(kept, dim=-1, keepdim=True).clamp(max=-1e-7)
    tail = torch.log(-torch.expm1(log_sum))
    ones = torch.ones_like(valid_NK[:, :1])
    return torch.cat([kept, tail], dim=-1), torch.cat([valid_NK, ones], dim=-1)


def _renormalise(logp_NK: Tensor, valid_NK: Tensor) -> Tensor:
    kept = logp_NK.masked_fill(~valid_NK, float("-inf"))
    return kept - torch.logsumexp(kept, dim=-1, keepdim=True)


def sparse_divergence_per_token(
    student_logp_NK: Tensor,
    teacher_logp_NK: Tensor,
    valid_NK: Tensor,
    beta: float,
    add_tail: bool = True,
) -> Tensor:
    """Per-token generalized JSD ``[N]`` over a sparse support (module docstring).

    ``student_logp_NK`` are the student's full-vocabulary log-probs gathered at the support
    ids, ``teacher_logp_NK`` the teacher's at the same ids, ``valid_NK`` which entries are real
    (padding entries are ignored). Hand-worked (beta 0, one id, tail): student 1/2, teacher
    3/4 -> supports (1/2, 1/2) and (3/4, 1/4): KL(q || p) = 3/4 log(3/2) + 1/4 log(1/2) =
    0.130812.
    """
    check_unit_interval("beta", beta)
    if add_tail:
        s, keep = add_tail_bucket(student_logp_NK, valid_NK)
        t, _ = add_tail_bucket(teacher_logp_NK, valid_NK)
    else:
        s, t, keep = (
            _renormalise(student_logp_NK, valid_NK),
            _renormalise(teacher_logp_NK, valid_NK),
            valid_NK,
        )
    zero = torch.zeros((), dtype=s.dtype, device=s.device)
    s, t = torch.where(keep, s, zero), torch.where(keep, t, zero)
    p, q = torch.where(keep, s.exp(), zero), torch.where(keep, t.exp(), zero)
    if beta == 0.0:
        el = q * (t - s)
    elif beta == 1.0:
        el = p * (s - t)
    else:
        m = ((1 - beta) * p + beta * q).clamp_min(torch.finfo(p.dtype).tiny)
        log_m = torch.where(keep, m.log(), zero)
        el = beta * q * (t - log_m) + (1 - beta) * p * (s - log_m)
    return el.sum(-1)


def gather_student_logps(
    hidden_NH: Tensor, weight_VH: Tensor, ids_NK: Tensor, temperature: float = 1.0
) -> Tensor:
    """``[N, K]`` student log-probs ``log_softmax(h W^T / tau)`` at ``ids_NK``, computed
    ``256`` rows at a time and recomputed in the backward pass (activation checkpointing), so
    only one ``[256, V]`` logits block exists at a time. Negative ids read as 0 (mask them)."""
    check_float("hidden_NH", hidden_NH)
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    ids = ids_NK.clamp_min(0)

    def block(h: Tensor, w: Tensor, i: Tensor) -> Tensor:
        logits = (h.float() @ w.float().T) / temperature
        return torch.log_softmax(logits, dim=-1).gather(1, i)

    out = []
    for start in range(0, hidden_NH.shape[0], _ROWS_PER_CHUNK):
        sl = slice(start, start + _ROWS_PER_CHUNK)
        if hidden_NH.requires_grad or weight_VH.requires_grad:
            out.append(checkpoint(block, hidden_NH[sl], weight_VH, ids[sl], use_reentrant=False))
        else:
            out.append(block(hidden_NH[sl], weight_VH, ids[sl]))
    if not out:
        return hidden_NH.new_zeros((0, ids_NK.shape[1]), dtype=torch.float32)
    return torch.cat(out)


def topk_distill_loss(
    hidden_NH: Tensor,
    weight_VH: Tensor,
    teacher_ids_NK: Tensor,
    teacher_logp_NK: Tensor,
    valid_NK: Tensor,
    beta: float = 0.0,
    temperature: float = 1.0,
    add_tail: bool = True,
    divisor: float | Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Generalized JSD between the student (hidden states + head, every row a kept token) and
    a teacher known by its top-k log-probs (module docstring).

    Returns ``(sum of per-token divergences / divisor, metrics)``; metrics ``divergence_per_token``
    and ``num_tokens``. A row with no valid teacher entry must be dropped by the caller.
    """
    check_float("teacher_logp_NK", teacher_logp_NK)
    s = gather_student_logps(hidden_NH, weight_VH, teacher_ids_NK, temperature)
    tok = sparse_divergence_per_token(s, teacher_logp_NK.float(), valid_NK, beta, add_tail)
    n = tok.shape[0]
    loss = tok.sum() / (divisor if divisor is not None else max(n, 1))
    with torch.no_grad():
        metrics = {
            "divergence_per_token": tok.detach().sum() / max(n, 1),
            "num_tokens": torch.tensor(float(n)),
        }
    return loss, metrics
