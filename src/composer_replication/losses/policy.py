"""PRIME-RL's default RL policy loss as a pure function.

Source: PrimeIntellect-ai/prime-rl, ``src/prime_rl/trainer/rl/loss.py::default_loss_fn`` and
its ``DefaultLossConfig`` defaults (``packages/prime-rl-configs/.../configs/trainer.py``),
read at commit 559b447 (2026-08); written from the formula, not copied. It combines the
DPPO-Binary-TV trust region (arXiv:2602.04879) and the Kimi-K2.5 squared-log-ratio KL
(arXiv:2602.02276). Per token, with ``lr = log pi_trainer - log pi_inference``::

    ratio     = exp(lr)
    dp        = pi_trainer - pi_inference                    (probability difference)
    masked    = dp >  dppo_mask_high   where advantage > 0   (pushed up too far already)
                dp < -dppo_mask_low    where advantage <= 0  (pushed down too far already)
    per_token = -[keep] * adv_tau * A * ratio + kl_tau * [loss_mask] * lr**2
    loss      = sum(per_token * loss_weights) / divisor

Defaults are upstream's: ``dppo_mask_low = dppo_mask_high = 0.2``, ``adv_tau = 1``,
``kl_tau = 1e-3``. Upstream sums per sample and divides by a global token count
(``loss_scale``); here ``divisor`` defaults to the number of loss-mask tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._common import check_float


def _masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    return (values * mask).sum() / mask.sum().clamp_min(1)


def prime_rl_policy_loss(
    trainer_logprobs: Tensor,
    inference_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    dppo_mask_low: float = 0.2,
    dppo_mask_high: float = 0.2,
    adv_tau: float = 1.0,
    kl_tau: float = 1e-3,
    *,
    loss_weights: Tensor | None = None,
    divisor: float | Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """DPPO + KL policy loss (module docstring). All inputs ``[B, T]`` (or ``[T]`` packed).

    ``advantages`` may also be ``[B]`` (one per sequence; broadcast over tokens).

    Returns ``(loss, metrics)``: ``is_masked``, ``is_masked_low``, ``is_masked_high`` (fractions
    of loss-mask tokens), ``mismatch_kl`` (mean of ``ratio - lr - 1`` over kept tokens),
    ``masked_mismatch_kl``, ``importance_ratio``, ``num_tokens``.

    Example (hand-worked): one token, lr = 0 (ratio 1), A = 2: loss = -2 (the DPPO mask is
    off because dp = 0). With trainer prob 0.9 vs inference 0.5 and A = +1, dp = 0.4 > 0.2:
    the token is masked and only kl_tau * log(0.9/0.5)^2 = 3.455e-4 remains.
    """
    for name, t in (
        ("trainer_logprobs", trainer_logprobs),
        ("inference_logprobs", inference_logprobs),
        ("advantages", advantages),
    ):
        check_float(name, t)
    if (
        inference_logprobs.shape != trainer_logprobs.shape
        or loss_mask.shape != trainer_logprobs.shape
    ):
        raise ValueError(
            f"trainer_logprobs {tuple(trainer_logprobs.shape)}, inference_logprobs "
            f"{tuple(inference_logprobs.shape)} and loss_mask {tuple(loss_mask.shape)} must match"
        )
    if advantages.shape != trainer_logprobs.shape:
        if (
            advantages.dim() == 1
            and trainer_logprobs.dim() == 2
            and advantages.shape[0] == trainer_logprobs.shape[0]
        ):
            advantages = advantages.unsqueeze(1).expand_as(trainer_logprobs)
        else:
            raise ValueError(
                f"advantages shape {tuple(advantages.shape)} must be {tuple(trainer_logprobs.shape)} "
                f"or [B={trainer_logprobs.shape[0]}]"
            )
    mask = loss_mask.bool()
    inference_logprobs = inference_logprobs.detach()
    log_ratio = trainer_logprobs - inference_logprobs
    ratio = torch.exp(log_ratio)
    prob_diff = torch.exp(trainer_logprobs) - torch.exp(inference_logprobs)
    positive = advantages > 0
    masked_high = prob_diff > dppo_mask_high
    masked_low = prob_diff < -dppo_mask_low
    is_masked = torch.where(positive, masked_high, masked_low)
    keep = mask & ~is_masked
    per_token = -(keep * (adv_tau * advantages) * ratio) + kl_tau * (mask * log_ratio**2)
    if loss_weights is not None:
        per_token = per_token * loss_weights
    denom = divisor if divisor is not None else mask.sum().clamp_min(1)
    loss = per_token.sum() / denom
    with torch.no_grad():
        mismatch = ratio - log_ratio - 1
        metrics = {
            "is_masked": _masked_mean(is_masked.float(), mask),
            "is_masked_low": _masked_mean((masked_low & (advantages < 0)).float(), mask),
            "is_masked_high": _masked_mean((masked_high & positive).float(), mask),
            "mismatch_kl": _masked_mean(mismatch, keep),
            "masked_mismatch_kl": _masked_mean(mismatch, mask & is_masked),
            "importance_ratio": _masked_mean(ratio, mask),
            "num_tokens": mask.sum().float(),
        }
    return loss, metrics
