"""Our policy and self-distillation losses as a PRIME-RL custom loss.

PRIME-RL (PrimeIntellect-ai/prime-rl, read at commit 559b447) replaces its ``rl`` loss
component with any function named in the trainer config::

    [trainer.loss]
    type = "custom"
    import_path = "composer_replication.recipes.prime_rl.composer_loss"

    [trainer.loss.kwargs]
    policy = "dapo"          # or "dppo" (PRIME-RL's default DPPO + KL, our implementation)
    sdpo_weight = 0.1        # self-distillation to ref_logprobs, when the run ships them

The function is called once per sequence with a ``LossInputs`` (``trainer_logprobs``,
``inference_logprobs``, ``ref_logprobs`` or None, ``advantages``, ``loss_mask``,
``loss_weights`` or None; all ``[seq]``) and returns ``LossOutputs(loss, metrics)``; PRIME-RL
sums the per-sequence losses and divides by its global token count, so the loss returned here
is a **sum** over the sequence's masked tokens (``divisor=1``). prime-rl is not on PyPI and needs
Python 3.12 + vLLM, so it is not imported here: the inputs are duck-typed, and the output is
PRIME-RL's own ``LossOutputs`` when it is importable, else a dataclass with the same fields.

Self-distillation: PRIME-RL's reference scoring (``algo`` with a reference model) fills
``ref_logprobs`` with a frozen model's log-probs of the sampled tokens. Pointing that reference
at a server that scores the rollout *with the hint in its context* (the policy's weights,
OPSD/SDPO) makes ``ref_logprobs`` the hint-conditioned teacher, and ``sdpo_weight`` adds
:func:`~composer_replication.losses.sampled_reverse_kl_loss` toward it. Without ref_logprobs the
term is skipped and reported as ``sdpo/active = 0``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

from torch import Tensor

from composer_replication.losses import (
    dapo_clip_loss,
    prime_rl_policy_loss,
    sampled_reverse_kl_loss,
)


@dataclass
class LossOutputs:
    """Same fields as ``prime_rl.trainer.rl.loss.LossOutputs`` (used when prime-rl is absent)."""

    loss: Tensor
    metrics: dict[str, Tensor]


@cache
def _output_type() -> type:
    """PRIME-RL's ``LossOutputs`` when importable, else ours; looked up once, not per sequence."""
    try:
        from prime_rl.trainer.rl.loss import LossOutputs as Upstream
    except ImportError:
        return LossOutputs
    return Upstream


def _outputs(loss: Tensor, metrics: dict[str, Tensor]) -> Any:
    return _output_type()(loss=loss, metrics=metrics)


def composer_loss(
    inputs: Any,
    policy: Literal["dapo", "dppo"] = "dapo",
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    dppo_mask_low: float = 0.2,
    dppo_mask_high: float = 0.2,
    adv_tau: float = 1.0,
    kl_tau: float = 1e-3,
    sdpo_weight: float = 0.0,
) -> Any:
    """Per-sequence loss for PRIME-RL: the policy term (``dapo`` clip-higher surrogate, or
    ``dppo``: PRIME-RL's default DPPO + KL) plus ``sdpo_weight`` times the sampled reverse KL
    to ``inputs.ref_logprobs``; metrics are prefixed ``policy/`` and ``sdpo/``."""
    if policy not in ("dapo", "dppo"):
        raise ValueError(f"composer_loss: policy must be 'dapo' or 'dppo', got {policy!r}")
    mask, weights = inputs.loss_mask, inputs.loss_weights
    lp, inf_lp = inputs.trainer_logprobs, inputs.inference_logprobs
    if policy == "dapo":
        loss, pm = dapo_clip_loss(lp, inf_lp, inputs.advantages, mask, eps_low, eps_high,
                                  loss_weights=weights, divisor=1)  # fmt: skip
    else:
        loss, pm = prime_rl_policy_loss(lp, inf_lp, inputs.advantages, mask, dppo_mask_low,
                                        dppo_mask_high, adv_tau, kl_tau,
                                        loss_weights=weights, divisor=1)  # fmt: skip
    metrics = {f"policy/{k}": v for k, v in pm.items()}
    ref = getattr(inputs, "ref_logprobs", None)
    active = sdpo_weight > 0 and ref is not None
    if active:
        sd, sm = sampled_reverse_kl_loss(lp, ref, inf_lp, mask, loss_weights=weights, divisor=1)
        loss = loss + sdpo_weight * sd
        metrics.update({f"sdpo/{k}": v for k, v in sm.items()})
    if sdpo_weight > 0:
        metrics["sdpo/active"] = lp.new_tensor(float(active))
    return _outputs(loss, metrics)
