"""TAID: Temporally Adaptive Interpolated Distillation (SakanaAI).

Paper: Shing et al., "TAID: Temporally Adaptive Interpolated Distillation for Efficient
Knowledge Transfer in Language Models", ICLR 2025, arXiv:2501.16937. Reference code:
github.com/SakanaAI/TAID (``src/distil_losses/taid.py``), read to learn the schedule; not copied.

The target is a logit-space mix of the *detached current* student and the teacher::

    p_t = softmax((1 - t) * stopgrad(s) + t * u)          s: student logits, u: teacher logits
    L   = mean over kept tokens of KL(p_t || softmax(s))   (forward KL to the moving target)

At ``t = 0`` the target is the student itself: ``L = 0`` and the gradient is exactly zero,
whatever the teacher. At ``t = 1`` it is plain forward KL(teacher || student).

Departure: upstream's ``compute_loss`` returns the cross-entropy ``-sum p_t log q`` (the KL
plus the target's entropy, a constant w.r.t. the student), so its gradients equal ours but its
value does not. We return the KL (so ``t = 1`` *is* forward KL) and report upstream's value as
``metrics["cross_entropy"]``: feed that to :meth:`TAIDScheduler.update_t` to reproduce
upstream's schedule exactly.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ._common import check_float, check_same_shape, check_unit_interval, resolve_mask


def taid_loss(
    student_logits: Tensor,
    teacher_logits: Tensor,
    mask: Tensor | None = None,
    t: float | Tensor = 0.4,
    *,
    labels: Tensor | None = None,
    divisor: float | Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """TAID loss ``KL(p_t || q_student)`` averaged over kept tokens (module docstring).

    Args:
        student_logits: ``[..., V]`` student logits (gets gradients).
        teacher_logits: same shape (treated as a constant).
        mask / labels: which tokens count (labels: -100 = ignore).
        t: interpolation coefficient in [0, 1] (e.g. ``TAIDScheduler.t``).
        divisor: if given, the summed per-token loss is divided by it instead of the count.

    Returns:
        ``(loss, metrics)``: ``kl``, ``cross_entropy`` (upstream's value), ``t``, ``num_tokens``.

    Example (hand-worked): V=2, student (0, 0), teacher (log 3, 0), t=1: p_t = (3/4, 1/4),
    q = (1/2, 1/2): KL = 0.130812 (the forward KL); at t=0, p_t = q and KL = 0.
    """
    check_float("student_logits", student_logits)
    check_float("teacher_logits", teacher_logits)
    check_same_shape("student_logits", student_logits, "teacher_logits", teacher_logits)
    t_val = float(t)
    check_unit_interval("t", t_val)
    keep = resolve_mask(student_logits.shape[:-1], student_logits.device, mask, labels)
    target_logits = (1.0 - t_val) * student_logits.detach() + t_val * teacher_logits.detach()
    dt = torch.float32 if student_logits.dtype in (torch.float16, torch.bfloat16) else None
    log_target = F.log_softmax(target_logits, dim=-1, dtype=dt)
    log_q = F.log_softmax(student_logits, dim=-1, dtype=dt)
    p_t = log_target.exp()
    ce_tok = -(p_t * log_q).sum(-1)
    kl_tok = (p_t * (log_target - log_q)).sum(-1)
    if keep is not None:
        zero = torch.zeros((), dtype=kl_tok.dtype, device=kl_tok.device)
        kl_tok = torch.where(keep, kl_tok, zero)
        ce_tok = torch.where(keep, ce_tok, zero)
    n = keep.sum() if keep is not None else torch.tensor(kl_tok.numel(), device=kl_tok.device)
    denom = divisor if divisor is not None else n.clamp_min(1)
    loss = (kl_tok.sum() / denom).to(student_logits.dtype)
    metrics = {
        "kl": kl_tok.detach().sum() / n.clamp_min(1),
        "cross_entropy": ce_tok.detach().sum() / n.clamp_min(1),
        "t": torch.tensor(t_val, device=kl_tok.device),
        "num_tokens": n.detach().float(),
    }
    return loss, metrics


class TAIDScheduler:
    """TAID's adaptive schedule for ``t`` (paper Sec. 3.2; upstream ``TAID.update_t``).

    Each call to :meth:`update_t` with the step's loss updates a momentum of the relative
    loss change ``m <- beta * m + (1 - beta) * (prev - loss) / prev`` and moves
    ``t <- min(t_end, max(t_linear, t + alpha * sigmoid(m) * (1 - t)))`` where
    ``t_linear = t_start + (t_end - t_start) * step / num_train_steps``; so ``t`` never falls
    behind the linear schedule and never decreases. ``disable_adaptive=True`` gives the
    linear schedule alone. The first call only records the loss (as upstream).

    Defaults are upstream's: ``t_start=0.4, t_end=1.0, alpha=5e-4, beta=0.99``.
    """

    def __init__(
        self,
        num_train_steps: int,
        t_start: float = 0.4,
        t_end: float = 1.0,
        alpha: float = 5e-4,
        beta: float = 0.99,
        disable_adaptive: bool = False,
    ) -> None:
        if num_train_steps <= 0:
            raise ValueError(f"num_train_steps must be > 0, got {num_train_steps}")
        if not 0.0 <= t_start < 1.0:
            raise ValueError(f"t_start must be in [0, 1), got {t_start}")
        if not 0.0 < t_end <= 1.0 or t_end < t_start:
            raise ValueError(f"t_end must be in (t_start, 1], got {t_end}")
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {alpha}")
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"beta must be in [0, 1), got {beta}")
        self.num_train_steps = num_train_steps
        self.t_start, self.t_end = t_start, t_end
        self.alpha, self.beta = alpha, beta
        self.disable_adaptive = disable_adaptive
        self.t = t_start
        self.prev_loss = math.inf
        self.momentum = 0.0

    def update_t(self, loss: float | Tensor, global_step: int) -> float:
        """Advance ``t`` after a step whose TAID loss was ``loss``; returns the adaptive delta."""
        loss = float(loss)
        if math.isinf(self.prev_loss):
            self.prev_loss = loss
            return 0.0
        relative_change = (self.prev_loss - loss) / (self.prev_loss + 1e-15)
        self.momentum = self.beta * self.momentum + (1.0 - self.beta) * relative_change
        delta_t = self.alpha * (1.0 / (1.0 + math.exp(-self.momentum))) * (1.0 - self.t)
        t_linear = self.t_start + (self.t_end - self.t_start) * global_step / self.num_train_steps
        if self.disable_adaptive:
            self.t = min(self.t_end, t_linear)  # upstream does not cap past num_train_steps
        else:
            self.t = min(self.t_end, max(t_linear, self.t + delta_t))
        self.prev_loss = loss
        return delta_t

    def state_dict(self) -> dict[str, float]:
        """Resumable state (``t``, ``prev_loss``, ``momentum``)."""
        return {"t": self.t, "prev_loss": self.prev_loss, "momentum": self.momentum}

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.t = float(state["t"])
        self.prev_loss = float(state["prev_loss"])
        self.momentum = float(state["momentum"])
