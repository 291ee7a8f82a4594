"""``compose_loss``: the channels summed into one objective, and the pure per-channel losses.

::

    total = policy_loss                        # channel 1 (GRPO/DAPO from TRL, or PRIME-RL's loss)
          + sum_c weight_c * loss_c            # extra channels, e.g.
                                               #   sdpo/:   hint self-distillation (JSD / TAID / entropy-OPD)
                                               #   replay/: DPO / SimPO on replayed-trace pairs

Each channel object (``composer_replication.channels``) computes its *unweighted* loss with its
own token/pair mask and divisor (via :func:`self_distill_loss` / :func:`preference_loss`) and
hands ``compose_loss`` a :class:`ChannelTerm`; ``compose_loss`` only weighs, sums and prefixes
metrics, in the style of PRIME-RL's ``compute_loss`` (per-component normalisation, so channels
never dilute each other's denominators).

Contract:

* no terms -> ``total`` *is* ``policy_loss`` (the same tensor: bit-exact with plain GRPO);
  a channel whose weight is 0 is never built, so it never produces a term;
* a term with no tokens/pairs contributes an exact 0 and says so in its metrics
  (``<prefix>num_tokens = 0`` / ``num_pairs = 0``), never a silent 0;
* a negative weight, a non-scalar loss, or two terms with one prefix are errors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from torch import Tensor

from .chunked import TeacherLogitsFn, chunked_generalized_jsd_loss
from .entropy_opd import entropy_aware_opd_loss
from .jsd import generalized_jsd_loss
from .preference import dpo_loss, simpo_loss
from .taid import taid_loss


@dataclass(frozen=True)
class ChannelTerm:
    """One channel's contribution: ``weight * loss``, with metrics under ``prefix``."""

    prefix: str
    """Metrics prefix ending in ``/`` (``sdpo/``, ``replay/``)."""
    weight: float
    loss: Tensor
    """The unweighted scalar loss (already divided by the channel's own divisor)."""
    metrics: dict[str, Tensor | float] = field(default_factory=dict)


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
    terms: Sequence[ChannelTerm] = (),
    policy_metrics: dict[str, Tensor] | None = None,
) -> tuple[Tensor, dict[str, Tensor | float]]:
    """``total = policy_loss + sum(term.weight * term.loss)``; returns ``(total, metrics)``.

    Metrics: ``policy/loss`` plus ``policy/<k>`` for ``policy_metrics``; per term
    ``<prefix>loss`` (unweighted), ``<prefix>weight`` and ``<prefix><k>`` for its metrics; and
    ``total/loss``.

    Example: policy 1.0, an ``sdpo/`` term of loss 0.2 with weight 0.5 -> total 1.1.
    """
    if not isinstance(policy_loss, Tensor) or policy_loss.dim() != 0:
        raise ValueError("policy_loss must be a scalar tensor (channel 'policy')")
    metrics: dict[str, Tensor | float] = {"policy/loss": policy_loss.detach()}
    for key, value in (policy_metrics or {}).items():
        metrics[f"policy/{key}"] = value.detach() if isinstance(value, Tensor) else value
    total = policy_loss
    seen: set[str] = {"policy/", "total/"}
    for term in terms:
        _check_term(term, seen)
        total = total + term.weight * term.loss
        metrics[f"{term.prefix}loss"] = term.loss.detach()
        metrics[f"{term.prefix}weight"] = float(term.weight)
        for key, value in term.metrics.items():
            metrics[f"{term.prefix}{key}"] = value.detach() if isinstance(value, Tensor) else value
    metrics["total/loss"] = total.detach()
    return total, metrics


def _check_term(term: ChannelTerm, seen: set[str]) -> None:
    if not term.prefix.endswith("/") or term.prefix in seen:
        raise ValueError(f"channel prefix {term.prefix!r} must end in '/' and be unique")
    seen.add(term.prefix)
    if term.weight < 0:
        raise ValueError(f"channel {term.prefix!r}: weight must be >= 0, got {term.weight}")
    if not isinstance(term.loss, Tensor) or term.loss.dim() != 0:
        raise ValueError(f"channel {term.prefix!r}: loss must be a scalar tensor")


def self_distill_loss(x: SdpoInputs) -> tuple[Tensor, dict[str, Tensor]]:
    """Channel 2's divergence on its own tokens: dispatch on ``x.kind`` to the pure losses
    (generalized JSD from logits or, chunked, from hidden states; TAID; entropy-aware OPD)."""
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


def preference_loss(x: ReplayInputs) -> tuple[Tensor, dict[str, Tensor]]:
    """Channel 3's pair loss: DPO (needs reference log-probs) or SimPO (reference-free)."""
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
