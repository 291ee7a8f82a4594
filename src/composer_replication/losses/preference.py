"""Preference losses for channel 3 (replayed-trace pairs): DPO and SimPO.

* DPO: Rafailov et al., "Direct Preference Optimization", NeurIPS 2023, arXiv:2305.18290,
  Eq. 7 (sigmoid loss), with cDPO label smoothing (Mitchell 2023)::

      z = beta * [(log pi(y_w) - log pi_ref(y_w)) - (log pi(y_l) - log pi_ref(y_l))]
      L = -(1 - eps) * log sigmoid(z) - eps * log sigmoid(-z)

  The reference log-probs are required inputs: they must really be computed (initial
  weights, or the policy with its adapter disabled), never defaulted.
* SimPO: Meng et al., "SimPO: Simple Preference Optimization with a Reference-Free
  Reward", NeurIPS 2024, arXiv:2405.14734, Eq. 6::

      L = -log sigmoid(beta * (avg log pi(y_w) - avg log pi(y_l)) - gamma)

  with *length-normalised* (mean per token) log-probs; the paper's defaults vary by model
  (beta 2.0-2.5, gamma/beta 0.3-0.55); ours are beta=2.0, gamma=1.0.

:func:`sequence_logps` turns logits and (already shifted) labels into summed (DPO) or mean
(SimPO) per-sequence log-probs without materialising a full log-softmax.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from ._common import IGNORE_INDEX, check_float


def sequence_logps(
    logits_BTV: Tensor,
    labels_BT: Tensor,
    mask_BT: Tensor | None = None,
    reduction: Literal["sum", "mean"] = "sum",
    ignore_index: int = IGNORE_INDEX,
) -> Tensor:
    """Per-sequence log-probability of ``labels`` under ``logits``: ``[B]``.

    ``labels_BT[b, t]`` is the token predicted by ``logits_BTV[b, t]`` (shift before calling).
    Positions with ``labels == ignore_index`` or ``mask == 0`` are excluded. ``sum`` for DPO,
    ``mean`` (sum / kept tokens, 0 for an empty sequence) for SimPO.

    Example (hand-worked): V=2, logits (0, 0) at both positions, labels (1, 0): each token has
    log(1/2) = -0.693147, so sum = -1.386294 and mean = -0.693147.
    """
    check_float("logits_BTV", logits_BTV)
    if logits_BTV.dim() != 3 or labels_BT.shape != logits_BTV.shape[:2]:
        raise ValueError(
            f"need logits [B, T, V] and labels [B, T]; got {tuple(logits_BTV.shape)} and "
            f"{tuple(labels_BT.shape)}"
        )
    if labels_BT.is_floating_point():
        raise TypeError(f"labels_BT must be integer token ids, got dtype {labels_BT.dtype}")
    keep = labels_BT != ignore_index
    if mask_BT is not None:
        if mask_BT.shape != labels_BT.shape:
            raise ValueError(
                f"mask_BT shape {tuple(mask_BT.shape)} != labels {tuple(labels_BT.shape)}"
            )
        keep = keep & mask_BT.bool()
    ids = torch.where(keep, labels_BT, torch.zeros_like(labels_BT))
    picked = torch.gather(logits_BTV, -1, ids.unsqueeze(-1)).squeeze(-1)
    tok = (picked - torch.logsumexp(logits_BTV, dim=-1)) * keep
    total = tok.sum(-1)
    if reduction == "sum":
        return total
    if reduction == "mean":
        return total / keep.sum(-1).clamp_min(1)
    raise ValueError(f"reduction must be 'sum' or 'mean', got {reduction!r}")


def _check_pairs(**tensors: Tensor) -> None:
    shape = None
    for name, t in tensors.items():
        check_float(name, t)
        if t.dim() != 1:
            raise ValueError(f"{name} must be 1-D [num_pairs], got shape {tuple(t.shape)}")
        if shape is not None and t.shape != shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(shape)}")
        shape = t.shape


def _pair_reduce(losses: Tensor, pair_mask: Tensor | None, divisor) -> tuple[Tensor, Tensor]:
    if pair_mask is None:
        n = torch.tensor(float(losses.numel()), device=losses.device)
        return losses.sum() / (divisor if divisor is not None else max(losses.numel(), 1)), n
    if pair_mask.shape != losses.shape:
        raise ValueError(f"pair_mask shape {tuple(pair_mask.shape)} != pairs {tuple(losses.shape)}")
    keep = pair_mask.bool()
    kept = torch.where(keep, losses, torch.zeros((), dtype=losses.dtype, device=losses.device))
    n = keep.sum()
    return kept.sum() / (divisor if divisor is not None else n.clamp_min(1)), n.float()


def dpo_loss(
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
    *,
    pair_mask: Tensor | None = None,
    divisor: float | Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Sigmoid DPO loss over ``[P]`` pairs of summed log-probs (module docstring).

    Returns ``(loss, metrics)``: ``rewards_chosen``, ``rewards_rejected``, ``margin``,
    ``accuracy`` (means over kept pairs) and ``num_pairs``.

    Example (hand-worked): policy (-1, -3), reference (-2, -2), beta=1: z = 1 - (-1) = 2,
    L = -log sigmoid(2) = 0.126928.
    """
    _check_pairs(
        policy_chosen_logps=policy_chosen_logps,
        policy_rejected_logps=policy_rejected_logps,
        ref_chosen_logps=ref_chosen_logps,
        ref_rejected_logps=ref_rejected_logps,
    )
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing}")
    chosen = beta * (policy_chosen_logps - ref_chosen_logps.detach())
    rejected = beta * (policy_rejected_logps - ref_rejected_logps.detach())
    z = chosen - rejected
    losses = -(1 - label_smoothing) * F.logsigmoid(z) - label_smoothing * F.logsigmoid(-z)
    loss, n = _pair_reduce(losses, pair_mask, divisor)
    return loss, _pair_metrics(chosen, rejected, pair_mask, n)


def simpo_loss(
    policy_chosen_avg_logps: Tensor,
    policy_rejected_avg_logps: Tensor,
    beta: float = 2.0,
    gamma: float = 1.0,
    label_smoothing: float = 0.0,
    *,
    pair_mask: Tensor | None = None,
    divisor: float | Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """SimPO loss over ``[P]`` pairs of *mean* per-token log-probs (module docstring).

    Example (hand-worked): avg log-probs (-0.5, -1.0), beta=2, gamma=1:
    z = 2 * 0.5 - 1 = 0, L = -log sigmoid(0) = log 2 = 0.693147.
    """
    _check_pairs(
        policy_chosen_avg_logps=policy_chosen_avg_logps,
        policy_rejected_avg_logps=policy_rejected_avg_logps,
    )
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    chosen = beta * policy_chosen_avg_logps
    rejected = beta * policy_rejected_avg_logps
    z = chosen - rejected - gamma
    losses = -(1 - label_smoothing) * F.logsigmoid(z) - label_smoothing * F.logsigmoid(-z)
    loss, n = _pair_reduce(losses, pair_mask, divisor)
    return loss, _pair_metrics(chosen, rejected, pair_mask, n)


def _pair_metrics(chosen: Tensor, rejected: Tensor, pair_mask, n: Tensor) -> dict[str, Tensor]:
    with torch.no_grad():
        keep = (
            pair_mask.bool() if pair_mask is not None else torch.ones_like(chosen, dtype=torch.bool)
        )
        d = n.clamp_min(1)
        return {
            "rewards_chosen": chosen[keep].sum() / d,
            "rewards_rejected": rejected[keep].sum() / d,
            "margin": (chosen - rejected)[keep].sum() / d,
            "accuracy": (chosen > rejected)[keep].float().sum() / d,
            "num_pairs": n,
        }
