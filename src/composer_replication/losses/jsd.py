"""Generalized Jensen-Shannon divergence for on-policy distillation (GKD / OPSD).

Paper: Agarwal et al., "On-Policy Distillation of Language Models: Learning from
Self-Generated Mistakes" (GKD), arXiv:2306.13649, Eq. (1); used for hint-conditioned
self-distillation by OPSD (Zhao et al.) and SDPO (Hübotter et al., "Reinforcement Learning via
Self-Distillation", arXiv:2601.20802).

With student distribution ``p = softmax(s / tau)`` and teacher ``q = softmax(t / tau)``
over the vocabulary, and the mixture ``m = (1 - beta) * p + beta * q``::

    JSD_beta(p, q) = beta * KL(q || m) + (1 - beta) * KL(p || m)      0 < beta < 1
    beta = 0   ->  KL(q || p)   (forward KL, the teacher-weighted "mode covering" one)
    beta = 1   ->  KL(p || q)   (reverse KL, the student-weighted "mode seeking" one)

The endpoints follow TRL's ``GKDTrainer.generalized_jsd_loss`` convention: they are the
plain KLs, not the (vanishing) limits of the scaled JSD. Conventions shared with TRL so the
values agree bit for bit in spirit (and to float rounding in practice):

* the temperature divides both logits; the loss is *not* multiplied by ``tau**2``;
* ``reduction="batchmean"`` divides the summed divergence by the number of unmasked tokens
  when a mask is given, else by ``logits.shape[0]`` (the batch size for ``[B, T, V]``);
* ``reduction="mean"`` divides by (unmasked tokens x vocabulary), i.e. ``mean`` over all
  kept elements; ``"sum"`` sums; ``divisor=`` overrides all three (TRL's
  ``num_items_in_batch``: a global token count for gradient accumulation).

Departures (documented, opt-in): ``reduction="none"`` returns the per-token divergences
``[*lead]`` with zeros at masked positions (TRL returns the masked element-wise tensor).
``token_clip`` with ``token_clip_mode="vocab"`` is OPSD's behaviour: it clamps every
*vocabulary element* of the divergence (``jsd[..., v] <= clip``) before summing, so a
token's total can still exceed ``clip``; ``token_clip_mode="token"`` instead clamps each
token's summed divergence, which is what "per-token clip" usually means. ``top_k`` keeps
the teacher's top-k logits (after temperature), gathers the student's at the same ids and
renormalises both over those k entries (OPSD's ``top_k_loss``).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from ._common import check_float, check_same_shape, check_unit_interval, resolve_mask

Reduction = Literal["batchmean", "sum", "mean", "none"]
ClipMode = Literal["vocab", "token"]


def _elementwise_gjsd(logp: Tensor, logq: Tensor, beta: float) -> Tensor:
    """Per-vocabulary-element generalized JSD terms (sum over the last dim = divergence)."""
    if beta == 0.0:
        return torch.exp(logq) * (logq - logp)
    if beta == 1.0:
        return torch.exp(logp) * (logp - logq)
    logm = torch.logaddexp(logp + math.log1p(-beta), logq + math.log(beta))
    return beta * torch.exp(logq) * (logq - logm) + (1.0 - beta) * torch.exp(logp) * (logp - logm)


def _restrict_top_k(s: Tensor, t: Tensor, top_k: int | None) -> tuple[Tensor, Tensor]:
    if top_k is None or top_k <= 0:
        return s, t
    if top_k > t.shape[-1]:
        raise ValueError(f"top_k={top_k} exceeds the vocabulary size {t.shape[-1]}")
    idx = torch.topk(t, k=top_k, dim=-1).indices
    return torch.gather(s, -1, idx), torch.gather(t, -1, idx)


def _reduce(
    tok: Tensor,
    mask: Tensor | None,
    reduction: Reduction,
    divisor: float | Tensor | None,
    n_elem_per_tok: int,
) -> Tensor:
    total = tok.sum()
    if divisor is not None:
        return total / divisor
    if reduction == "sum":
        return total
    if reduction == "none":
        return tok
    n_tok = mask.sum().clamp_min(1) if mask is not None else None
    if reduction == "batchmean":
        return total / (n_tok if n_tok is not None else max(tok.shape[0], 1))
    if reduction == "mean":
        count = n_tok if n_tok is not None else tok.numel()
        return total / (count * n_elem_per_tok)
    raise ValueError(f"reduction must be batchmean, sum, mean or none, got {reduction!r}")


def generalized_jsd_loss(
    student_logits: Tensor,
    teacher_logits: Tensor,
    mask: Tensor | None = None,
    beta: float = 0.5,
    temperature: float = 1.0,
    token_clip: float | None = None,
    top_k: int | None = None,
    reduction: Reduction = "batchmean",
    *,
    labels: Tensor | None = None,
    token_clip_mode: ClipMode = "vocab",
    divisor: float | Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Generalized JSD between student and teacher token distributions (GKD Eq. 1).

    Args:
        student_logits: ``[..., V]`` (e.g. ``logits_BTV``) student logits; gets gradients.
        teacher_logits: same shape; the teacher (gradients flow if it requires grad, as in TRL).
        mask: ``[...]`` bool/0-1, True where the token counts. Or give ``labels`` (-100 = ignore).
        beta: 0 = forward KL(q||p), 1 = reverse KL(p||q), in between the generalized JSD.
        temperature: divides both logits (> 0).
        token_clip: optional upper bound; see ``token_clip_mode``.
        top_k: restrict to the teacher's top-k ids and renormalise both distributions.
        reduction: ``batchmean`` | ``sum`` | ``mean`` | ``none`` (module docstring).
        labels: alternative to ``mask`` (HF convention, -100 ignored).
        token_clip_mode: ``vocab`` (OPSD: clamp each vocab element) or ``token`` (clamp each
            token's total divergence).
        divisor: if given, loss = summed divergence / divisor (overrides ``reduction``).

    Returns:
        ``(loss, metrics)`` with metrics ``jsd_per_token`` (mean over kept tokens),
        ``num_tokens`` and, when clipping, ``clip_frac``.

    Example (hand-worked): V=2, student logits (0, 0), teacher logits (log 3, 0), beta=0:
    q = (3/4, 1/4), p = (1/2, 1/2); KL(q||p) = 3/4 log(3/2) + 1/4 log(1/2) = 0.130812.
    """
    check_float("student_logits", student_logits)
    check_float("teacher_logits", teacher_logits)
    check_same_shape("student_logits", student_logits, "teacher_logits", teacher_logits)
    check_unit_interval("beta", beta)
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if student_logits.dim() < 2:
        raise ValueError("logits need at least 2 dims [..., V]")
    if token_clip_mode not in ("vocab", "token"):
        raise ValueError(f"token_clip_mode must be 'vocab' or 'token', got {token_clip_mode!r}")
    keep = resolve_mask(student_logits.shape[:-1], student_logits.device, mask, labels)

    s, t = _restrict_top_k(student_logits / temperature, teacher_logits / temperature, top_k)
    el = _elementwise_gjsd(F.log_softmax(s, dim=-1), F.log_softmax(t, dim=-1), float(beta))
    clipped = None
    if token_clip is not None and token_clip_mode == "vocab":
        clipped = (el > token_clip).any(-1)
        el = el.clamp(max=token_clip)
    tok = el.sum(-1)
    if token_clip is not None and token_clip_mode == "token":
        clipped = tok > token_clip
        tok = tok.clamp(max=token_clip)
    if keep is not None:
        tok = torch.where(keep, tok, torch.zeros((), dtype=tok.dtype, device=tok.device))
    loss = _reduce(tok, keep, reduction, divisor, s.shape[-1])
    return loss, _metrics(tok, keep, clipped)


def _metrics(tok: Tensor, keep: Tensor | None, clipped: Tensor | None) -> dict[str, Tensor]:
    with torch.no_grad():
        n = keep.sum() if keep is not None else torch.tensor(tok.numel(), device=tok.device)
        metrics = {
            "jsd_per_token": tok.detach().sum() / n.clamp_min(1),
            "num_tokens": n.detach().float(),
        }
        if clipped is not None:
            c = clipped & keep if keep is not None else clipped
            metrics["clip_frac"] = c.sum() / n.clamp_min(1)
    return metrics
