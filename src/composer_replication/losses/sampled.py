"""Policy and self-distillation losses over the log-probs of the *sampled* tokens only, for
engines whose loss hook sees per-token log-probs but not full logits (PRIME-RL's custom loss,
verl's policy-loss registry).

DAPO clipped surrogate (Yu et al., "DAPO", arXiv:2503.14476, Eq. 8: clip-higher with separate
``eps_low``/``eps_high``, token-level normalization). Per token, ``r = exp(logp - old_logp)``::

    per_token = -min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A)

Sampled reverse KL to a teacher (on-policy distillation with a per-token reward
``log pi_teacher(y_t) - log pi(y_t)``: GKD, Agarwal et al., arXiv:2306.13649; with a
hint-conditioned copy of the policy as teacher this is OPSD/SDPO's self-distillation, Zhao et
al., arXiv:2601.20802, restricted to the sampled token). The per-token signal is held constant
(``detach``) and weighted by the importance ratio to the behaviour policy that sampled ``y``::

    per_token = -(teacher_logp - logp).detach() * exp(logp - behaviour_logp)

Its gradient is ``E[(log pi - log pi_T) grad log pi]``, the policy gradient of the reverse KL
``KL(pi || pi_T)`` estimated on the sampled tokens. Both reduce as ``sum(per_token *
loss_weights * mask) / divisor`` (default divisor: the number of mask tokens).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._common import check_float


def _reduce(per_token: Tensor, mask: Tensor, loss_weights, divisor) -> Tensor:
    if loss_weights is not None:
        per_token = per_token * loss_weights
    denom = divisor if divisor is not None else mask.sum().clamp_min(1)
    return (per_token * mask).sum() / denom


def _check(**tensors: Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"shapes must match: {shapes}")
    for name, t in tensors.items():
        if name != "mask":
            check_float(name, t)


def dapo_clip_per_token(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
) -> tuple[Tensor, dict[str, Tensor]]:
    """DAPO's clipped surrogate per token, before any reduction (module docstring), and its
    clip metrics over ``mask``; for engines that reduce the loss themselves (verl's
    ``agg_loss``)."""
    _check(logp=logp, old_logp=old_logp, advantages=advantages, mask=mask)
    m = mask.bool()
    ratio = torch.exp(logp - old_logp.detach())
    clipped = ratio.clamp(1 - eps_low, 1 + eps_high)
    per_token = -torch.minimum(ratio * advantages, clipped * advantages)
    with torch.no_grad():
        n = m.sum().clamp_min(1)
        low = (ratio < 1 - eps_low) & (advantages < 0) & m
        high = (ratio > 1 + eps_high) & (advantages > 0) & m
        metrics = {
            "clip_low_frac": low.sum() / n,
            "clip_high_frac": high.sum() / n,
            "importance_ratio": (ratio * m).sum() / n,
            "num_tokens": m.sum().float(),
        }
    return per_token, metrics


def dapo_clip_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    *,
    loss_weights: Tensor | None = None,
    divisor: float | Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """DAPO's clipped surrogate (module docstring); tensors ``[T]`` or ``[B, T]``.

    Hand-worked: A = +1, r = 1.5 > 1 + 0.28: clipped to 1.28, loss = -1.28 (no gradient);
    A = -1, r = 0.5 < 1 - 0.2: min(-0.5, -0.8) = -0.8 clipped, loss = 0.8 (no gradient).
    Metrics: ``clip_low_frac``, ``clip_high_frac``, ``importance_ratio``, ``num_tokens``.
    """
    per_token, metrics = dapo_clip_per_token(logp, old_logp, advantages, mask, eps_low, eps_high)
    return _reduce(per_token, mask.bool(), loss_weights, divisor), metrics


def sampled_reverse_kl_per_token(
    logp: Tensor, teacher_logp: Tensor, behaviour_logp: Tensor, mask: Tensor
) -> tuple[Tensor, dict[str, Tensor]]:
    """The sampled reverse KL to the teacher per token, before any reduction (module
    docstring), and its metrics over ``mask``."""
    _check(logp=logp, teacher_logp=teacher_logp, behaviour_logp=behaviour_logp, mask=mask)
    m = mask.bool()
    gap = (teacher_logp - logp).detach()
    per_token = -gap * torch.exp(logp - behaviour_logp.detach())
    with torch.no_grad():
        n = m.sum().clamp_min(1)
        metrics = {"reverse_kl": (-gap * m).sum() / n, "num_tokens": m.sum().float()}
    return per_token, metrics


def sampled_reverse_kl_loss(
    logp: Tensor,
    teacher_logp: Tensor,
    behaviour_logp: Tensor,
    mask: Tensor,
    *,
    loss_weights: Tensor | None = None,
    divisor: float | Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Reverse KL to the teacher on the sampled tokens (module docstring).

    Hand-worked: logp = log 0.5, teacher log 0.25, behaviour = logp (on-policy): per token
    -(log 0.25 - log 0.5) * 1 = log 2 = 0.6931; its gradient w.r.t. logp is +log 2 (push the
    token down: the teacher likes it less). Metrics: ``reverse_kl`` (mean of logp -
    teacher_logp over the mask), ``num_tokens``.
    """
    per_token, metrics = sampled_reverse_kl_per_token(logp, teacher_logp, behaviour_logp, mask)
    return _reduce(per_token, mask.bool(), loss_weights, divisor), metrics
