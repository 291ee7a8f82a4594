"""The distill channel's loss variants: one object per ``distill.loss`` setting, each carrying
its own function, so the channel (channels/distill.py) loops without asking which one runs.

* :class:`SampledReverseKl` (``type: reverse_kl``): the sampled reverse KL of on-policy
  distillation (Thinking Machines' "On-Policy Distillation", 2025; MOPD, arXiv:2606.30406;
  GKD, arXiv:2306.13649): per token the dense advantage ``log q(y) - log p(y)`` in the
  importance-sampled policy gradient (losses/sampled.py), with the importance ratio taken to
  the current weights (on-policy within a generation round).
* :class:`FoldedReverseKl` (``type: reverse_kl``, ``as_advantage: true``): the same per-token
  advantage, times ``distill.weight``, added to GRPO's advantages (``[B] -> [B, K]``) and
  trained by GRPO's clipped loss (Thinking Machines' tinker-cookbook combines OPD with RL this
  way). ``log p_old(y)`` is what TRL's loss takes as the old policy: its
  ``old_per_token_logps`` when it computed them, else the log-probs of its own policy forward
  (:meth:`fold`, called by the trainer right after that forward): no extra forward. The
  channel's own term is an exact 0; its metrics still report.
* :class:`Jsd` (``type: jsd``): the generalized JSD (beta 0: forward KL) over the whole
  vocabulary for a local teacher (the chunked fused kernel of losses/chunked.py, fed with the
  teacher's hidden states kept from its scoring forward and its head), over the teacher's top-k
  with a tail bucket for a remote one, or for every teacher with ``loss.top_k``
  (losses/distill.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from composer_replication.config import DistillLossConfig
from composer_replication.losses import (
    chunked_generalized_jsd_loss,
    gather_student_logps,
    sampled_reverse_kl_loss,
    topk_distill_loss,
)

__all__ = [
    "ScoredTokens",
    "Variant",
    "SampledReverseKl",
    "FoldedReverseKl",
    "Jsd",
    "VARIANTS",
    "build_variant",
]


@dataclass
class ScoredTokens:
    """A micro-batch's scored completion tokens, flattened to ``N``, as a variant sees them."""

    h_NH: Tensor
    """The student's last hidden states predicting each token (the policy forward's)."""
    w_VH: Tensor
    """The student's head."""
    y_N: Tensor
    """The tokens."""
    teacher_N: Tensor
    """Index of the teacher each token is distilled from."""
    actual_N: Tensor
    """That teacher's log-prob of the token (``-inf``/NaN where it reported none)."""
    top_ids_NT: Tensor
    """Its top-k token ids (``-1`` past what it reported)."""
    top_logps_NT: Tensor
    """Their log-probs."""
    local: dict[int, tuple[Tensor, Tensor]]
    """Local teacher index -> its hidden states ``[N, H_t]`` and head ``[V, H_t]`` (the
    full-vocabulary JSD only; empty otherwise)."""
    divisor: float
    """The channel's divisor: scored tokens times gradient-accumulation steps."""

    def student_logps(self, grad: bool) -> Tensor:
        """``[N]`` the student's log-probs of the tokens (detached unless ``grad``)."""
        h, w = (self.h_NH, self.w_VH) if grad else (self.h_NH.detach(), self.w_VH.detach())
        return gather_student_logps(h, w, self.y_N[:, None]).squeeze(1)


class Variant:
    """A ``distill.loss`` setting: what the channel keeps per token and the loss it trains."""

    full_vocabulary = False
    """Local teachers keep their hidden states for the loss (the full-vocabulary JSD)."""
    finite_only = True
    """Only tokens the teacher gave a finite log-prob count (the sampled losses)."""

    def __init__(self, cfg: Any, weight: float = 1.0):
        self.cfg = cfg
        self.weight = weight

    def top_k(self, remote_top_ks: list[int]) -> int:
        """Log-probs kept per position (1, the sampled token's, is enough for reverse KL)."""
        return 1

    def fold(self, batch: dict[str, Any], mask_BK: Tensor, policy_logps_BK: Tensor) -> None:
        """Right after the policy forward of a loss, before TRL's loss reads ``batch``
        (default: nothing)."""

    def zero(self, h_BKH: Tensor, w_VH: Tensor) -> Tensor:
        """The loss of a micro-batch without a scored token: 0 in the graph of the student's
        parameters (every process's backward reaches the same parameters)."""
        return (h_BKH.sum() + w_VH.sum()) * 0.0

    def loss(self, tokens: ScoredTokens) -> tuple[Tensor, dict[str, Any], Tensor]:
        """``(loss, metrics, the student's detached log-probs [N])`` on the scored tokens."""
        raise NotImplementedError


class SampledReverseKl(Variant):
    """``reverse_kl``: a loss term of its own (module docstring)."""

    def loss(self, tokens: ScoredTokens) -> tuple[Tensor, dict[str, Any], Tensor]:
        logp_N = tokens.student_logps(grad=True)
        ones = torch.ones_like(logp_N, dtype=torch.bool)
        teacher = tokens.actual_N.to(logp_N.dtype)
        loss, extra = sampled_reverse_kl_loss(
            logp_N, teacher, logp_N.detach(), ones, divisor=tokens.divisor
        )
        return loss, extra, logp_N.detach()


class FoldedReverseKl(Variant):
    """``reverse_kl`` with ``as_advantage``: trained through GRPO's advantages (module
    docstring)."""

    def fold(self, batch: dict[str, Any], mask_BK: Tensor, policy_logps_BK: Tensor) -> None:
        """``advantages[B] -> [B, K]``: plus ``weight * (log q(y) - log p_old(y))`` on the
        scored tokens (``mask_BK``), ``p_old`` being what TRL's loss takes as the old policy:
        ``old_per_token_logps`` if the batch has them, else ``policy_logps_BK`` (its forward's,
        at the sampling temperature)."""
        old_BK = batch.get("old_per_token_logps")
        old_BK = policy_logps_BK if old_BK is None else old_BK
        mask_BK = mask_BK & torch.isfinite(batch["distill_actual"])
        gap_BK = (batch["distill_actual"] - old_BK).masked_fill(~mask_BK, 0.0)
        adv = batch["advantages"]
        adv_BK = adv[:, None] if adv.dim() == 1 else adv
        batch["advantages"] = adv_BK + self.weight * gap_BK.to(adv.dtype)

    def zero(self, h_BKH: Tensor, w_VH: Tensor) -> Tensor:
        return torch.zeros((), device=w_VH.device, dtype=w_VH.dtype)

    def loss(self, tokens: ScoredTokens) -> tuple[Tensor, dict[str, Any], Tensor]:
        return self.zero(tokens.h_NH, tokens.w_VH), {}, tokens.student_logps(grad=False)


class Jsd(Variant):
    """``jsd``: full vocabulary for local teachers, top-k + tail otherwise (module
    docstring)."""

    finite_only = False

    def __init__(self, cfg: Any, weight: float = 1.0):
        super().__init__(cfg, weight)
        self.full_vocabulary = cfg.top_k is None

    def top_k(self, remote_top_ks: list[int]) -> int:
        return max([self.cfg.top_k or 1, *remote_top_ks])

    def loss(self, tokens: ScoredTokens) -> tuple[Tensor, dict[str, Any], Tensor]:
        total, parts = tokens.h_NH.new_zeros(()), 0.0
        sparse_N = torch.ones_like(tokens.teacher_N, dtype=torch.bool)
        for i, (t_NH, t_w) in tokens.local.items():
            rows_N = tokens.teacher_N == i
            if not rows_N.any():
                continue
            sparse_N &= ~rows_N
            loss, per_token = self._full(tokens, rows_N, t_NH, t_w)
            total, parts = total + loss, parts + per_token * int(rows_N.sum())
        if sparse_N.any():
            loss, per_token = self._sparse(tokens, sparse_N)
            total, parts = total + loss, parts + per_token * int(sparse_N.sum())
        n = max(int(tokens.y_N.numel()), 1)
        return total, {"divergence_per_token": parts / n}, tokens.student_logps(grad=False)

    def _full(self, tokens: ScoredTokens, rows_N: Tensor, t_NH: Tensor, t_w: Tensor):
        """The chunked full-vocabulary JSD against one local teacher on its rows."""
        h_NH = tokens.h_NH
        t_w = t_w.to(h_NH.device, h_NH.dtype)
        v = t_w.shape[0]  # the teacher's head is cut to the rows both share (channel setup)
        loss, m = chunked_generalized_jsd_loss(
            h_NH[rows_N], tokens.w_VH[:v], t_NH[rows_N].to(h_NH.dtype), t_w,
            beta=self.cfg.beta, temperature=self.cfg.temperature, divisor=tokens.divisor,
        )  # fmt: skip
        return loss, float(m["jsd_per_token"])

    def _sparse(self, tokens: ScoredTokens, rows_N: Tensor):
        """The top-k + tail JSD on the rows of teachers without hidden states here."""
        ids = tokens.top_ids_NT[rows_N]
        loss, m = topk_distill_loss(
            tokens.h_NH[rows_N], tokens.w_VH, ids, tokens.top_logps_NT[rows_N], ids >= 0,
            self.cfg.beta, self.cfg.temperature, self.cfg.add_tail, tokens.divisor,
        )  # fmt: skip
        return loss, float(m["divergence_per_token"])


VARIANTS: dict[tuple[str, bool], type[Variant]] = {
    ("reverse_kl", False): SampledReverseKl,
    ("reverse_kl", True): FoldedReverseKl,
    ("jsd", False): Jsd,
}
"""``(loss.type, loss.as_advantage)`` -> the variant that trains it."""


def build_variant(cfg: DistillLossConfig, weight: float) -> Variant:
    """The variant of a ``distill.loss`` section (``weight``: the channel's, for the fold)."""
    return VARIANTS[cfg.type, cfg.as_advantage](cfg, weight)
