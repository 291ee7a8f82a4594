"""The environment interface: OpenEnv-shaped ``reset() -> observation`` and
``step(action) -> StepResult`` with a reward and a textual ``feedback`` that explains a failure.

The feedback string is what the hint channel (channel 2) shows the self-teacher, so it should
say *what* was wrong ("expected 19, got 8", the failing assertion), not just that it was.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from composer_replication.sandbox.infra import KINDS, InfraFailure


def unit_hash(key: str) -> float:
    """A stable number in [0, 1) from ``key`` (SHA-256): assigns a task to a split or an order
    that does not depend on Python's hash seed or on the rest of the task set."""
    digest = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


MAX_ANSWER_DIGITS = 600
"""The longest number read from a model's reply (:func:`answer_int`): far above any answer of
our environments, and below 640, the lowest limit ``sys.set_int_max_str_digits`` accepts, so the
conversion never raises whatever the interpreter's setting."""


def answer_int(digits: str) -> int | None:
    """The integer ``digits`` spells (a ``-?\\d+`` match in model text), or None if it is longer
    than :data:`MAX_ANSWER_DIGITS`: such a number is no right answer, and ``int()`` of more than
    4300 digits raises ``ValueError`` in the grader instead of scoring 0."""
    return int(digits) if len(digits) <= MAX_ANSWER_DIGITS else None


@dataclass(frozen=True)
class Task:
    """One problem: the prompt shown to the model and what the verifier needs to grade it."""

    task_id: str
    prompt: str
    split: str
    data: dict[str, Any] = field(default_factory=dict)


FEEDBACK_FORMS = "feedback_forms"
"""``StepResult.info`` key of an environment's alternative feedback texts on a failure, by form
name (e.g. ``{"direction": "8 is too small", ...}``); ``sdpo.feedback_form`` picks one for the
hint, ``verifier`` being ``StepResult.feedback`` itself."""


@dataclass(frozen=True)
class StepResult:
    """What ``step`` returns: reward, a pass flag, and feedback explaining the verdict."""

    observation: str
    reward: float
    done: bool
    passed: bool
    feedback: str
    info: dict[str, Any] = field(default_factory=dict)


INFRA_FAILURE = "infra_failure"
"""``StepResult.info`` key of a grading the machine failed (sandbox/infra.py: the kind, one of
``KINDS``); such a result scores nothing: the trainer masks the rollout (trainer/masking.py)."""


def machine_failed(observation: Any, failure: InfraFailure) -> StepResult:
    """The result of a grading the machine failed: no verdict on the submission (reward 0 for
    callers that ignore the mark, which :func:`infra_kind` reads)."""
    feedback = f"not graded: the machine failed ({failure.kind}: {failure.detail})"
    info = {INFRA_FAILURE: failure.kind, "infra_detail": failure.detail}
    return StepResult(observation, 0.0, True, False, feedback, info)


def infra_kind(result: StepResult) -> str | None:
    """The machine failure kind of ``result``, or None for a real verdict."""
    return result.info.get(INFRA_FAILURE)


def log_infra_metrics(kinds: list[str | None], log_metric) -> None:
    """``env/infra_failed_frac`` (share of the rollouts the machine failed) and
    ``env/infra_failed/<kind>`` (how many, per kind of sandbox/infra.py, every kind every
    time so that the per-step averages are over the same steps)."""
    log_metric("env/infra_failed_frac", sum(k is not None for k in kinds) / max(len(kinds), 1))
    for kind in KINDS:
        log_metric(f"env/infra_failed/{kind}", float(sum(k == kind for k in kinds)))


class Environment(ABC):
    """A verifiable single-turn task family with disjoint train and held-out splits."""

    name: str = "env"
    tools: ClassVar[bool] = False
    """True for environments whose rollouts are multi-turn tool conversations
    (:class:`ToolEnvironment`): the one attribute everything asks."""

    def __init__(self) -> None:
        self._task: Task | None = None
        self._splits: dict[str, list[Task]] = {"train": [], "heldout": []}
        """Tasks by split; an environment fills these lists in its constructor."""

    def tasks(self, split: str) -> list[Task]:
        """All tasks of a split (``train`` or ``heldout``), in a fixed order."""
        if split not in self._splits:
            raise ValueError(f"unknown split {split!r}; use {' or '.join(map(repr, self._splits))}")
        return self._splits[split]

    @abstractmethod
    def grade(self, task: Task, completion: str) -> StepResult:
        """Score a completion for a task."""

    def grade_batch(self, tasks: list[Task], completions: list[str]) -> list[StepResult]:
        """Score many completions (in order; code environments grade them in parallel)."""
        return [self.grade(t, c) for t, c in zip(tasks, completions, strict=True)]

    def user_message(self, task: Task) -> str:
        """The text of the user turn that poses ``task`` to a chat model (default: the prompt)."""
        return task.prompt

    def privileged_context(self, task: Task) -> str | None:
        """Per-task context only a teacher may see (e.g. the reference answer), or None."""
        return None

    def reset(self, task: Task) -> str:
        """Start an episode on ``task``; returns the observation (the prompt)."""
        self._task = task
        return task.prompt

    def step(self, action: str) -> StepResult:
        """Grade ``action`` against the current task; single-turn, so the episode ends."""
        if self._task is None:
            raise RuntimeError(f"{self.name}: step() called before reset()")
        result = self.grade(self._task, action)
        self._task = None
        return result


class ToolEnvironment(Environment):
    """A multi-turn environment whose rollouts call tools (TRL's ``environment_factory``).

    ``tools_class()`` is the class TRL instantiates per rollout: ``reset(**row)`` starts an
    episode on a dataset row and every other public method is a tool (its signature and
    docstring become the tool's schema). ``row(task)`` is the dataset row for a task: a
    ``prompt`` (chat messages), ``task_id`` and whatever columns ``reset`` needs. ``grade``
    receives the rollout's messages (assistant and tool turns) and reports the first failing
    turn in ``StepResult.info["failed_turn"]`` (index among the assistant turns) with
    ``info["reason"]``, for the turn-level hint of self-distillation.
    """

    tools: ClassVar[bool] = True
    checks_do_nothing: ClassVar[bool] = False
    """Whether :meth:`do_nothing_reward` grades anything (the hack telemetry's check)."""

    @abstractmethod
    def tools_class(self) -> type:
        """The per-rollout tool holder TRL instantiates (``environment_factory``)."""

    @abstractmethod
    def row(self, task: Task) -> dict[str, Any]:
        """The dataset row of ``task``: ``prompt`` (messages), ``task_id`` and reset columns."""

    @abstractmethod
    def grade(self, task: Task, completion: str | list[dict[str, Any]]) -> StepResult:
        """Score a rollout (its messages after the prompt, or a final reply as text)."""

    def do_nothing_reward(self, task: Task) -> float | None:
        """The reward of a rollout that changes nothing and submits (must be 0), or None when
        it cannot be known here (the default: no such check) or the machine failed it."""
        return None

    def grade_episodes(
        self, tasks: list[Task], rollouts: list[list[dict[str, Any]]], instances: list[Any] | None
    ) -> list[StepResult]:
        """Score rollouts given the tool instances that served them (TRL passes them to reward
        functions as ``environments``; evaluation keeps them too). The default grades the
        messages alone; an environment whose verdict lives in the instance's state (a
        repository the agent edited) overrides this."""
        return self.grade_batch(tasks, rollouts)
