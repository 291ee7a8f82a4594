"""Rollouts the machine failed leave the gradient: one function for every engine that builds a
generation batch (the synchronous trainer, the asynchronous engine's group records).

A grading the machine failed (sandbox/infra.py) has no verdict. Its reward is None, so TRL
already leaves it out of its group's mean and standard deviation and gives it advantage 0; but
its tokens would still count in the loss's divisor (``num_items_in_batch`` of DAPO/BNPO, the
per-sequence mean of GRPO) and in the KL term. :func:`mask_machine_failures` zeroes their
``completion_mask`` and ``tool_mask`` (as TRL's ``mask_truncated_completions`` does for truncated
ones), drops every group left with fewer than 2 graded rollouts (a group of one has no baseline:
its advantages are zeroed and all its rows masked), and recounts ``num_items_in_batch``. It marks
the rows in ``infra_masked`` ``[B]``: self-distillation gives them no hint, distillation sends
no teacher a row whose completion mask is empty.

:class:`InfraBudget` stops a run whose machine fails too often: more than ``max_frac`` of a
step's rollouts masked for :data:`PATIENCE` steps in a row.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from composer_replication.config.base import UserError

PATIENCE = 3
"""Consecutive steps over the budget after which the run stops."""


@dataclass(frozen=True)
class Masked:
    """What :func:`mask_machine_failures` did to a batch."""

    rows: int
    """Rows masked (the machine failed them, or their group was dropped)."""
    dropped_groups: int
    """Groups with fewer than 2 graded rollouts, dropped whole (DAPO refills them)."""


def valid_rows(kinds_B: Sequence[str | None], group_size: int) -> Tensor:
    """``[B]`` bool: rows the machine graded whose group has at least 2 such rows."""
    graded_GN = torch.tensor([k is None for k in kinds_B], dtype=torch.bool).view(-1, group_size)
    enough_G1 = graded_GN.sum(dim=1, keepdim=True) >= 2
    return (graded_GN & enough_G1).flatten()


def mask_machine_failures(
    batch: dict,
    kinds_B: Sequence[str | None],
    group_size: int,
    total: Callable[[Tensor], Tensor] = lambda t: t,
    rows: slice = slice(None),
) -> Masked:
    """Take the rows the machine failed (``kinds_B[b]`` not None) out of ``batch``, in place.

    ``kinds_B`` covers whole groups of ``group_size`` in order: the batch's rows, or (several
    processes) every process's rows, of which the batch holds ``rows``. The batch's rows keep
    their place (its shape is unchanged) with ``completion_mask``, ``tool_mask`` and
    ``advantages`` zeroed; ``num_items_in_batch`` loses their loss tokens (``total`` sums a
    count over the processes when the batch is one process's share of a gathered count). The
    counts returned are over all of ``kinds_B``."""
    keep_all_B = valid_rows(kinds_B, group_size)
    keep_B = keep_all_B[rows].to(batch["completion_mask"].device)
    if keep_B.shape[0] != batch["completion_mask"].shape[0]:
        n = batch["completion_mask"].shape[0]
        raise ValueError(f"{keep_B.shape[0]} failure marks for the batch's {n} rows")
    dropped = int((~keep_all_B).view(-1, group_size).all(dim=1).sum())
    before = _loss_tokens(batch)
    keep_B1 = keep_B[:, None].to(batch["completion_mask"].dtype)
    batch["completion_mask"] = batch["completion_mask"] * keep_B1
    batch["infra_masked"] = ~keep_B  # the channels skip these rows (no hint, no teacher)
    if "tool_mask" in batch:
        batch["tool_mask"] = batch["tool_mask"] * keep_B1.to(batch["tool_mask"].dtype)
    adv = batch["advantages"]
    batch["advantages"] = adv * (keep_B if adv.dim() == 1 else keep_B[:, None]).to(adv.dtype)
    if "num_items_in_batch" in batch:
        removed = total(before - _loss_tokens(batch))
        batch["num_items_in_batch"] = batch["num_items_in_batch"] - removed.to(
            batch["num_items_in_batch"].dtype
        )
    return Masked(rows=int((~keep_all_B).sum()), dropped_groups=dropped)


def _loss_tokens(batch: dict) -> Tensor:
    mask = batch["completion_mask"]
    if "tool_mask" in batch:
        mask = mask * batch["tool_mask"]
    return mask.sum()


class InfraFailureBudgetError(UserError, RuntimeError):
    """The machine failed more than the configured share of the rollouts for too long."""


class InfraBudget:
    """Stops a run (``InfraFailureBudgetError``, one line naming the commonest failure kind)
    when more than ``max_frac`` of a step's rollouts were masked for :data:`PATIENCE` steps in
    a row; a step at or under the share resets the count."""

    def __init__(self, max_frac: float, patience: int = PATIENCE):
        self.max_frac, self.patience = max_frac, patience
        self.streak = 0
        self._kinds: Counter[str] = Counter()

    def observe(self, kinds: Sequence[str | None], step: int) -> None:
        """Account one step's rollouts (every generation round of the step)."""
        failed = [k for k in kinds if k is not None]
        frac = len(failed) / max(len(kinds), 1)
        if frac <= self.max_frac:
            self.streak, self._kinds = 0, Counter()
            return
        self.streak += 1
        self._kinds.update(failed)
        if self.streak >= self.patience:
            kind, n = self._kinds.most_common(1)[0]
            raise InfraFailureBudgetError(
                f"step {step}: the machine failed {frac:.0%} of the rollouts (more than "
                f"{self.max_frac:.0%}) for {self.streak} steps in a row, mostly {kind} "
                f"({n} of {sum(self._kinds.values())} failures); fix the machine "
                f"(docs/sandbox.md, 'Machine failures') or raise grpo.max_infra_failed_frac"
            )
