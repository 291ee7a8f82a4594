"""``compose_loss``: the three Composer channels summed into one objective.

::

    total = policy_loss                      # channel 1 (GRPO/DAPO from TRL, or PRIME-RL's loss)
          + alpha_sdpo  * sdpo_loss          # channel 2: hint self-distillation (JSD / TAID / entropy-OPD)
          + beta_replay * replay_loss        # channel 3: DPO / SimPO on replayed-trace pairs

The caller (e.g. ``ComposerReplicationTrainer._compute_loss``) computes each channel's
*inputs* (the policy loss from ``GRPOTrainer``, student/teacher logits or hidden states on the
hinted completion tokens, pair log-probs) and passes them here. Each channel keeps its own
token/pair mask, its own divisor and its own metrics prefix (``policy/``, ``sdpo/``,
``replay/``), in the style of PRIME-RL's ``compute_loss`` (per-component normalisation, so
channels never dilute each other's denominators).

Contract:

* weight 0 -> the channel is not computed at all (its inputs are not even looked at) and
  ``total`` *is* ``policy_loss`` (the same tensor: bit-exact with plain GRPO);
* weight > 0 and inputs missing -> ``ValueError`` naming the channel (never a silent 0);
* a present channel with no tokens/pairs contributes an exact 0 that still backpropagates,
  and reports ``<prefix>num_tokens = 0`` / ``num_pairs = 0``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from .chunked import TeacherLogitsFn, chunked_generalized_jsd_loss
from .entropy_opd import entropy_aware_opd_loss
from .jsd import generalized_jsd_loss
from .preference import dpo_loss, simpo_loss
from .taid import taid_loss


@dataclass
class SdpoInputs:
    """Channel 2 inputs: student vs hinted-teacher distributions on the same completion tokens.

    Give either ``student_logits`` + ``teacher_logits`` (``[B, T, V]``), or, for the chunked
    fused path (``kind="jsd"`` only), ``student_hidden`` + ``student_head_weight`` and
    ``teacher_hidden`` + ``teacher_head_weight`` (or ``teacher_logits_fn``).
    """

    mask: Tensor
    """``[B, T]`` bool: completion tokens that have a hinted teacher (the channel's own mask)."""
    student_logits: Tensor | None = None
    teacher_logits: Tensor | None = None
    student_hidden: Tensor | None = None
    student_head_weight: Tensor | None = None
    teacher_hidden: Tensor | None = None
    teacher_head_weight: Tensor | None = None
    teacher_logits_fn: TeacherLogitsFn | None = None
    kind: Literal["jsd", "taid", "entropy_opd"] = "jsd"
    """Which divergence: generalized JSD (OPSD), TAID, or entropy-aware OPD."""
    beta: float = 0.5
    """JSD interpolation (0 forward KL, 1 reverse KL)."""
    temperature: float = 1.0
    token_clip: float | None = None
    token_clip_mode: Literal["vocab", "token"] = "vocab"
    top_k: int | None = None
    taid_t: float | None = None
    """Required when ``kind="taid"`` (e.g. ``TAIDScheduler.t``)."""
    h_max: float | None = None
    """Entropy-OPD normaliser; None = log V."""
    divisor: float | Tensor | None = None
    """Global token count for gradient accumulation; None = this batch's kept tokens."""


@dataclass
class ReplayInputs:
    """Channel 3 inputs: per-pair sequence log-probs (see ``sequence_logps``)."""

    policy_chosen_logps: Tensor
    policy_rejected_logps: Tensor
    ref_chosen_logps: Tensor | None = None
    """Required for DPO (really computed: initial weights or adapter disabled)."""
    ref_rejected_logps: Tensor | None = None
    kind: Literal["dpo", "simpo"] = "dpo"
    """DPO takes summed log-probs; SimPO takes mean (length-normalised) log-probs."""
    beta: float = 0.1
    gamma: float = 1.0
    """SimPO target margin."""
    label_smoothing: float = 0.0
    pair_mask: Tensor | None = None
    divisor: float | Tensor | None = None


def compose_loss(
    policy_loss: Tensor,
    policy_metrics: dict[str, Tensor] | None = None,
    sdpo: SdpoInputs | None = None,
    replay: ReplayInputs | None = None,
    alpha_sdpo: float = 0.0,
    beta_replay: float = 0.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Sum the channels (module docstring) and return ``(total, metrics)``.

    Metrics: ``policy/*`` (``policy/loss`` plus the given ``policy_metrics``), ``sdpo/*`` and
    ``replay/*`` for computed channels (their ``loss``, the unweighted value, and ``weight``),
    and ``total/loss``.

    Example: policy 1.0, sdpo JSD 0.2 with alpha 0.5, replay 0.7 with beta 0 ->
    total = 1.0 + 0.1 = 1.1 and no ``replay/`` key.
    """
    if not isinstance(policy_loss, Tensor) or policy_loss.dim() != 0:
        raise ValueError("policy_loss must be a scalar tensor (channel 'policy')")
    for name, w in (("alpha_sdpo", alpha_sdpo), ("beta_replay", beta_replay)):
        if w < 0:
            raise ValueError(f"{name} must be >= 0, got {w}")
    metrics = {"policy/loss": policy_loss.detach()}
    for key, value in (policy_metrics or {}).items():
        metrics[f"policy/{key}"] = value.detach() if isinstance(value, Tensor) else value
    total = policy_loss
    if alpha_sdpo > 0:
        if sdpo is None:
            raise ValueError("channel 'sdpo' has alpha_sdpo > 0 but no SdpoInputs were given")
        loss, m = _sdpo_loss(sdpo)
        total = total + alpha_sdpo * loss
        _add(metrics, "sdpo/", loss, m, alpha_sdpo)
    if beta_replay > 0:
        if replay is None:
            raise ValueError("channel 'replay' has beta_replay > 0 but no ReplayInputs were given")
        loss, m = _replay_loss(replay)
        total = total + beta_replay * loss
        _add(metrics, "replay/", loss, m, beta_replay)
    metrics["total/loss"] = total.detach()
    return total, metrics


def _add(metrics: dict, prefix: str, loss: Tensor, m: dict[str, Tensor], weight: float) -> None:
    metrics[f"{prefix}loss"] = loss.detach()
    metrics[f"{prefix}weight"] = torch.tensor(float(weight))
    for key, value in m.items():
        metrics[f"{prefix}{key}"] = value


def _sdpo_loss(x: SdpoInputs) -> tuple[Tensor, dict[str, Tensor]]:
    if x.student_logits is None:
        return _sdpo_chunked(x)
    if x.teacher_logits is None:
        raise ValueError("channel 'sdpo': student_logits given without teacher_logits")
    if x.kind == "jsd":
        return generalized_jsd_loss(
            x.student_logits,
            x.teacher_logits.detach(),
            x.mask,
            beta=x.beta,
            temperature=x.temperature,
            token_clip=x.token_clip,
            top_k=x.top_k,
            token_clip_mode=x.token_clip_mode,
            divisor=x.divisor,
        )
    if x.kind == "taid":
        if x.taid_t is None:
            raise ValueError("channel 'sdpo': kind='taid' needs taid_t (e.g. TAIDScheduler.t)")
        return taid_loss(x.student_logits, x.teacher_logits, x.mask, t=x.taid_t, divisor=x.divisor)
    if x.kind == "entropy_opd":
        return entropy_aware_opd_loss(
            x.student_logits,
            x.teacher_logits,
            x.mask,
            h_max=x.h_max,
            temperature=x.temperature,
            divisor=x.divisor,
        )
    raise ValueError(f"channel 'sdpo': unknown kind {x.kind!r} (jsd, taid, entropy_opd)")


def _sdpo_chunked(x: SdpoInputs) -> tuple[Tensor, dict[str, Tensor]]:
    if x.student_hidden is None or x.student_head_weight is None:
        raise ValueError(
            "channel 'sdpo' needs student_logits+teacher_logits or student_hidden+student_head_weight"
        )
    if x.kind != "jsd" or x.top_k or (x.token_clip is not None and x.token_clip_mode == "vocab"):
        raise ValueError(
            "channel 'sdpo': the hidden-state (chunked) path supports kind='jsd' without top_k "
            "and only token_clip_mode='token'; pass logits for the other options"
        )
    return chunked_generalized_jsd_loss(
        x.student_hidden,
        x.student_head_weight,
        x.teacher_hidden,
        x.teacher_head_weight,
        x.mask,
        beta=x.beta,
        temperature=x.temperature,
        teacher_logits_fn=x.teacher_logits_fn,
        divisor=x.divisor,
        token_clip=x.token_clip,
    )


def _replay_loss(x: ReplayInputs) -> tuple[Tensor, dict[str, Tensor]]:
    if x.kind == "dpo":
        if x.ref_chosen_logps is None or x.ref_rejected_logps is None:
            raise ValueError(
                "channel 'replay': DPO needs ref_chosen_logps and ref_rejected_logps "
                "(compute them with the reference model; they have no default)"
            )
        return dpo_loss(
            x.policy_chosen_logps,
            x.policy_rejected_logps,
            x.ref_chosen_logps,
            x.ref_rejected_logps,
            beta=x.beta,
            label_smoothing=x.label_smoothing,
            pair_mask=x.pair_mask,
            divisor=x.divisor,
        )
    if x.kind == "simpo":
        return simpo_loss(
            x.policy_chosen_logps,
            x.policy_rejected_logps,
            beta=x.beta,
            gamma=x.gamma,
            label_smoothing=x.label_smoothing,
            pair_mask=x.pair_mask,
            divisor=x.divisor,
        )
    raise ValueError(f"channel 'replay': unknown kind {x.kind!r} (dpo, simpo)")
