"""The channel interface: one object per extra loss channel.

A channel owns everything about itself: its config section (with its ``weight``), the batch
preparation it needs after rollouts are scored, its token or pair mask, its divisor, its loss,
its metrics prefix and its state across steps and checkpoints. The trainer holds a list of
channels and loops over it; it names none (``trainer/trainer.py``)::

    setup(model, tokenizer, args)   once, after the trainer is built (teacher copies, references)
    attach(batch, rollouts)         after each generation round is scored (hints, teacher prompts)
    see_policy_logps(batch, logps)  per micro-batch, right after the policy forward and before
                                    TRL's loss reads the batch (fold into its advantages)
    term(ctx) -> ChannelTerm        per micro-batch: the unweighted loss over the channel's own
                                    mask / divisor, its metrics; compose_loss weighs and sums
    after_step(model, step)         after each optimizer step (EMA teachers, schedules)
    save(dir) / load(dir)           channel state next to the trainer's checkpoint
    settings()                      plain-data settings a checkpoint records and resume compares

A channel with ``weight == 0`` is never set up (``enabled``): it costs nothing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor

from composer_replication.losses import ChannelTerm


@dataclass
class Rollouts:
    """What a generation round produced, as the channels see it (row order = batch order)."""

    prompts: list[Any]
    """Per row: the prompt (a string or a list of chat messages)."""
    completions: list[str]
    """Per row: the decoded completion."""
    results: list[Any]
    """Per row: the verifier's verdict (``.reward``, ``.feedback``, ``.observation``)."""
    group_size: int
    """Rows per prompt (GRPO's group); rows of one group are consecutive."""
    tools: list[Any] | None = None
    """The tools the prompts were rendered with (tool environments), so a channel that
    re-renders a prompt (a hinted teacher's) shows the model the same tool schemas."""
    columns: list[dict[str, Any]] | None = None
    """Per row: the dataset row's other columns (``task_id``, tags), for routing."""
    windows: list[list[Any]] | None = None
    """Per row, with a ``rollout.context`` strategy: the episode's context windows
    (``rollout.Window``), packed into the row's completion; teachers score each window with
    its own context (channels/packed.py). None: plain rows."""


def informative_groups(advantages_B: Tensor, group_size: int, tol: float = 1e-6) -> list[int]:
    """Indices of groups whose advantages are not all (numerically) zero: where GRPO has a
    gradient (DAPO's dynamic sampling keeps these; ``sdpo.gate`` hints only in these)."""
    adv_GN = advantages_B.view(-1, group_size)
    return torch.nonzero(adv_GN.abs().amax(dim=1) > tol).flatten().tolist()


@dataclass
class LossContext:
    """One micro-batch's loss call, as the channels see it."""

    model: Any
    batch: dict[str, Any]
    mode: Literal["train", "eval"]
    grad_accum: int
    """Micro-batches in this optimizer step (1 in eval)."""
    global_step: int
    """Optimizer steps completed before this one."""
    student_hidden_BKH: Tensor | None = None
    """The policy forward's last hidden states at the completion positions (captured when a
    channel sets ``needs_student_hidden``)."""


class Channel(ABC):
    """Base class of an extra loss channel (module docstring)."""

    name: ClassVar[str]
    """Section name in the run config and metrics prefix (``sdpo`` -> ``sdpo/``)."""
    needs_verdicts: ClassVar[bool] = False
    """True if :meth:`attach` needs the rollouts' verdicts (a grading reward function)."""
    needs_student_hidden: ClassVar[bool] = False
    """True if :meth:`term` needs the policy forward's hidden states."""
    running_counters: ClassVar[tuple[str, ...]] = ()
    """Metric keys (``fnmatch`` patterns, without the prefix) that are running totals of this
    process (calls, tokens, cost so far): logged as their latest value, summed over processes."""
    step_counts: ClassVar[tuple[str, ...]] = ("num_tokens", "num_pairs")
    """Metric keys (patterns, without the prefix) that count things in a micro-batch (tokens,
    pairs, rows): logged as the step's total, summed over its micro-batches and processes."""
    idle_hint: ClassVar[str] = ""
    """Why the channel may have had nothing to do, for the end-of-run report."""

    def __init__(self, cfg: Any):
        self.cfg = cfg
        self.shared_prefix = True
        """Run shared prompt prefixes once in this channel's forwards (``lm.prefix.use_prefix``);
        the trainer sets its own switch (``generation.shared_prefix``) here."""
        self._active_steps: set[int] = set()
        self._seen_steps: set[int] = set()

    @property
    def prefix(self) -> str:
        return f"{self.name}/"

    @property
    def weight(self) -> float:
        return float(self.cfg.weight)

    @property
    def enabled(self) -> bool:
        """The one predicate that switches a channel on: weight > 0."""
        return self.weight > 0

    def setup(self, model: Any, tokenizer: Any, args: Any) -> None:  # noqa: B027 (optional)
        """Called once by the trainer after it is built (model wrapped, args final)."""

    def attach(self, batch: dict[str, Any], rollouts: Rollouts) -> dict[str, Any]:
        """Add what :meth:`term` needs to a scored generation batch (default: nothing)."""
        return batch

    def see_policy_logps(self, batch: dict[str, Any], logps_BK: Tensor) -> None:  # noqa: B027
        """Called in each loss computation right after the policy forward, before TRL's loss
        reads ``batch`` (this micro-batch's own dict): ``logps_BK`` are the completion tokens'
        log-probs under the current weights at the sampling temperature, detached. A channel may
        change ``batch["advantages"]`` here (distill's ``as_advantage``) at no extra forward
        (default: nothing)."""

    @abstractmethod
    def loss(self, ctx: LossContext) -> tuple[Tensor, dict[str, Tensor | float]]:
        """The unweighted loss on this micro-batch (own mask, own divisor) and its metrics;
        the metrics include ``active`` (1.0 if the channel had tokens/pairs here, else 0.0)."""

    def term(self, ctx: LossContext) -> ChannelTerm:
        """:meth:`loss` as a :class:`ChannelTerm`, recording whether the channel was active."""
        loss, metrics = self.loss(ctx)
        if ctx.mode == "train":
            self._seen_steps.add(ctx.global_step)
            if float(metrics.get("active", 0.0)) > 0:
                self._active_steps.add(ctx.global_step)
        return ChannelTerm(self.prefix, self.weight, loss, metrics)

    def after_step(self, model: Any, global_step: int) -> None:  # noqa: B027 (optional)
        """Called after every optimizer step."""

    state_per_rank: bool = False
    """True: every process holds its own state and :meth:`save` writes a file per process
    (called on every rank); False: the state is the same on every rank, saved by rank 0."""

    @classmethod
    def state_file(cls, checkpoint_dir: str | Path, rank: int | str) -> Path:
        """Where process ``rank`` keeps this channel's state in a checkpoint (``state_per_rank``
        channels; preflight checks it is there before a resume loads any model; ``"*"`` gives
        the glob pattern of every rank's)."""
        return Path(checkpoint_dir, f"{cls.name}_channel.rank{rank}.json")

    @classmethod
    def saved_state_files(cls, checkpoint_dir: str | Path) -> list[Path]:
        """The per-process state files in a checkpoint, rank 0 up to the first one missing
        (the processes that saved it, when none was lost)."""
        files = []
        while (path := cls.state_file(checkpoint_dir, len(files))).is_file():
            files.append(path)
        return files

    def save(self, checkpoint_dir: str) -> None:  # noqa: B027 (optional)
        """Write the channel's state next to the trainer's checkpoint."""

    def load(self, checkpoint_dir: str) -> None:  # noqa: B027 (optional)
        """Restore what :meth:`save` wrote."""

    def settings(self) -> dict[str, Any]:
        """The channel's settings as plain data (its whole config section, weight included)."""
        return self.cfg.model_dump(mode="json")

    def idle_report(self) -> str | None:
        """A sentence if the channel had weight > 0 but stayed inactive on every training step
        it saw, else None."""
        if not self._seen_steps or self._active_steps:
            return None
        return (
            f"channel {self.name!r} (weight {self.weight:g}) was inactive on all "
            f"{len(self._seen_steps)} training steps: it contributed nothing. {self.idle_hint}"
        ).strip()
