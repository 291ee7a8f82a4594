"""The group record: what a rollout worker sends the learner for one task.

A *group* is GRPO's unit: the rollouts of one task (``generation.num_generations`` of them),
whose rewards are normalized together. Each rollout may hold several *sequences* (an episode
that was summarized, or split at a context reset, trains on each part), and carries a ``valid``
flag: a rollout lost to an infrastructure failure stays in its group, masked out, instead of
silently shrinking it. An episode run under ``rollout.context`` holds one sequence per context
window (``rollout.Window``; the learner packs them into one row: docs/summarization.md). Each
sequence records, per assistant turn, the policy version that generated it, so the learner
measures staleness from the oldest turn.

Plain dataclasses of lists (no tensors): cheap to pickle through Ray's object store, and
independent of torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Sequence", "Rollout", "GroupRecord"]


@dataclass
class Sequence:
    """One token sequence of a rollout: its prompt, what followed, and per completion token
    the behaviour policy's log-prob and whether the policy wrote it."""

    prompt_ids: list[int]
    completion_ids: list[int]
    behaviour_logps: list[float]
    """Log-prob of each completion token under the policy that sampled it (the behaviour
    policy), at the sampling temperature; 0.0 for tokens the policy did not write."""
    tool_mask: list[int]
    """1 for tokens the policy wrote, 0 for tool results and other inserted text (TRL's
    ``tool_mask``)."""
    turn_versions: list[int]
    """Policy version (optimizer steps the weights had taken) of each assistant turn."""
    summary: str | None = None
    """The summary that closed this window (``rollout.Window.summary``; None: none did)."""
    summary_tokens: int = 0
    """The summary's length in tokens."""
    summary_cut: bool = False
    """The summary hit its token limit."""

    def __post_init__(self) -> None:
        n = len(self.completion_ids)
        if len(self.behaviour_logps) != n or len(self.tool_mask) != n:
            raise ValueError(
                f"sequence: {n} completion tokens, {len(self.behaviour_logps)} log-probs, "
                f"{len(self.tool_mask)} mask entries"
            )
        if not self.turn_versions:
            raise ValueError("sequence: no turn versions (every sequence has a first turn)")


@dataclass
class Rollout:
    """One episode of a group: its sequences, its reward and the verifier's verdict."""

    sequences: list[Sequence]
    reward: float
    verdict: Any = None
    """The environment's ``StepResult`` (passed, feedback): hints are built from it."""
    valid: bool = True
    """False: lost to an infrastructure failure; kept for the group's shape, never trained."""
    messages: list[dict[str, Any]] | None = None
    """The episode as chat messages (tool environments), for logs and hint channels."""
    ended: str = "done"
    """How a ``rollout.context`` episode ended (``rollout.ContextEpisode.ended``)."""
    tokens_saved: int = 0
    """Context tokens its closed windows dropped (``rollout.ContextEpisode.tokens_saved``)."""
    environment_calls: int = 0
    """Tool calls run for the environment after a summary
    (``rollout.ContextEpisode.environment_calls``)."""

    @property
    def oldest_version(self) -> int:
        return min(v for s in self.sequences for v in s.turn_versions)

    @property
    def completion_tokens(self) -> int:
        return sum(sum(s.tool_mask) for s in self.sequences)


@dataclass
class GroupRecord:
    """The rollouts of one task, from one ticket of the dispenser."""

    group_id: int
    """The dispenser's ticket number: unique in a run, so a group is never used twice."""
    task_id: str
    row: dict[str, Any]
    """The task's dataset row (``prompt``, ``task_id`` and the columns channels read)."""
    rollouts: list[Rollout]
    worker: int = -1
    """Which worker made it (metrics)."""
    seconds: float = 0.0
    """Wall time the worker spent on the group (generation, tools, grading)."""
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def oldest_version(self) -> int:
        """The version of the group's oldest turn: what its staleness is measured from."""
        return min(r.oldest_version for r in self.rollouts)

    def staleness(self, learner_version: int) -> int:
        """Optimizer steps the learner has taken since the group's oldest turn was generated."""
        return learner_version - self.oldest_version

    @property
    def valid_mask(self) -> list[bool]:
        return [r.valid for r in self.rollouts]

    @property
    def completion_tokens(self) -> int:
        return sum(r.completion_tokens for r in self.rollouts if r.valid)

    @property
    def episode_tokens(self) -> float:
        """Mean length of its valid episodes in tokens after the prompt (the policy's and the
        tools'): what makes an episode take long, hence arrive stale."""
        lengths = [
            sum(len(s.completion_ids) for s in r.sequences) for r in self.rollouts if r.valid
        ]
        return sum(lengths) / len(lengths) if lengths else 0.0


def length_bin(tokens: float) -> int:
    """The power-of-two bin of an episode length: ``2**k <= tokens < 2**(k+1)`` gives ``2**k``
    (0 for an empty episode)."""
    n = int(tokens)
    return 0 if n < 1 else 1 << (n.bit_length() - 1)


@dataclass
class StalenessByLength:
    """Groups that arrived at the learner and groups dropped as too stale, counted by episode
    length (:func:`length_bin`), over the run: a drop rate that grows with the bin is the
    length bias staleness bounds risk (long episodes grow stale first)."""

    arrived: dict[int, int] = field(default_factory=dict)
    dropped: dict[int, int] = field(default_factory=dict)

    def count(self, group: GroupRecord, dropped: bool) -> None:
        b = length_bin(group.episode_tokens)
        self.arrived[b] = self.arrived.get(b, 0) + 1
        if dropped:
            self.dropped[b] = self.dropped.get(b, 0) + 1

    def metrics(self) -> dict[str, float]:
        """``rollout/arrived_by_tokens/<bin>`` and ``rollout/dropped_by_tokens/<bin>``."""
        out = {f"rollout/arrived_by_tokens/{b}": float(n) for b, n in self.arrived.items()}
        out |= {
            f"rollout/dropped_by_tokens/{b}": float(self.dropped.get(b, 0)) for b in self.arrived
        }
        return out
