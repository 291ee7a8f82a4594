"""Entropy-aware on-policy distillation: per-token mix of forward and reverse KL.

Paper: "Entropy-Aware On-Policy Distillation of Language Models" (ICLR 2026). Where the
teacher is uncertain (high entropy) the mode-covering forward KL keeps its alternatives;
where it is confident the mode-seeking reverse KL sharpens the student::

    w_i = clamp(H(q_i) / h_max, 0, 1)           H: teacher entropy at token i, h_max = log V
    L   = mean_i [ w_i * KL(q_i || p_i) + (1 - w_i) * KL(p_i || q_i) ]

``w`` is computed from the (constant) teacher and carries no gradient. Departure: the paper
gates with a threshold schedule; we use the continuous clamp above (the brief's definition).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ._common import check_float, check_same_shape, resolve_mask


def entropy_aware_opd_loss(
    student_logits: Tensor,
    teacher_logits: Tensor,
    mask: Tensor | None = None,
    h_max: float | None = None,
    temperature: float = 1.0,
    *,
    labels: Tensor | None = None,
    divisor: float | Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Entropy-gated forward/reverse KL, averaged over kept tokens (module docstring).

    Returns ``(loss, metrics)``: ``forward_kl``, ``reverse_kl``, ``weight_mean``,
    ``teacher_entropy``, ``num_tokens``.

    Example (hand-worked): a uniform teacher over V has H = log V, so w = 1 (pure forward KL);
    a one-hot teacher (logits 0 / -inf-like) has H = 0, so w = 0 (pure reverse KL); when the
    student equals the teacher both KLs and the loss are 0.
    """
    check_float("student_logits", student_logits)
    check_float("teacher_logits", teacher_logits)
    check_same_shape("student_logits", student_logits, "teacher_logits", teacher_logits)
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    vocab = student_logits.shape[-1]
    h_max = math.log(vocab) if h_max is None else float(h_max)
    if h_max <= 0:
        raise ValueError(f"h_max must be > 0, got {h_max}")
    keep = resolve_mask(student_logits.shape[:-1], student_logits.device, mask, labels)
    logp = F.log_softmax(student_logits / temperature, dim=-1)
    logq = F.log_softmax(teacher_logits.detach() / temperature, dim=-1)
    q = logq.exp()
    fkl = (q * (logq - logp)).sum(-1)
    rkl = (logp.exp() * (logp - logq)).sum(-1)
    ent = -(q * logq).sum(-1)
    w = (ent / h_max).clamp(0.0, 1.0)
    tok = w * fkl + (1.0 - w) * rkl
    if keep is not None:
        tok = torch.where(keep, tok, torch.zeros((), dtype=tok.dtype, device=tok.device))
    n = keep.sum() if keep is not None else torch.tensor(tok.numel(), device=tok.device)
    loss = tok.sum() / (divisor if divisor is not None else n.clamp_min(1))
    return loss, _metrics(fkl, rkl, w, ent, keep, n)


def _metrics(fkl, rkl, w, ent, keep, n) -> dict[str, Tensor]:
    with torch.no_grad():
        k = keep if keep is not None else torch.ones_like(w, dtype=torch.bool)
        d = n.clamp_min(1)
        return {
            "forward_kl": fkl[k].sum() / d,
            "reverse_kl": rkl[k].sum() / d,
            "weight_mean": w[k].sum() / d,
            "teacher_entropy": ent[k].sum() / d,
            "num_tokens": n.float(),
        }
