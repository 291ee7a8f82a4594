"""The bridge from an Environment to TRL's reward-function protocol.

TRL calls ``reward(prompts, completions, completion_ids, **columns)`` and expects one float per
completion. We grade with the environment and keep every verdict (passed, feedback) of the last
batch, so later stages (hints for channel 2, metrics) can read *why* a completion failed.

A grading the machine failed (``StepResult.info["infra_failure"]``, sandbox/infra.py) gets
``None``: TRL then leaves the completion out of its group's mean and standard deviation and
gives it advantage 0; the trainer takes it out of the loss (trainer/masking.py).

Tool environments also get the hack telemetry (envs/telemetry.py, ``env/hack/*``): invalid
tool calls split by the run's pass-rate estimates (``task_estimates``: the trainer's
``data.sampler``, through its public ``estimate``), questions, edit-less episodes, cache reads,
test and config edits, and the reward of a do-nothing submission, graded once per task.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from composer_replication.envs.base import Environment, StepResult, infra_kind
from composer_replication.envs.telemetry import (
    ToolTelemetry,
    do_nothing_reward,
    log_verdict_metrics,
)
from composer_replication.envs.tools import tool_methods
from composer_replication.lm.chat import to_text


class EnvReward:
    """A TRL reward function that grades completions with an Environment."""

    def __init__(
        self,
        env: Environment,
        episode_log: str | Path | None = None,
        task_estimates: Callable[[str], tuple[float, int]] | None = None,
        check_do_nothing: bool = True,
    ):
        self.env = env
        self.__name__ = f"{env.name}_reward"  # TRL names metrics after the function
        self._tasks = {t.task_id: t for split in ("train", "heldout") for t in env.tasks(split)}
        self.last_results: list[StepResult] = []
        self.multi_turn = env.tools
        self.telemetry = ToolTelemetry(
            tuple(tool_methods(env.tools_class())) if env.tools else (), episode_log,
            task_estimates,
        )  # fmt: skip
        """Tool environments: tool calls, ``env/hack/*`` and the episode log."""
        self.check_do_nothing = check_do_nothing and getattr(env, "checks_do_nothing", False)

    @property
    def do_nothing(self) -> dict[str, float]:
        """Per task seen: the reward of its untouched workspace (graded once; must be 0)."""
        return self.telemetry.do_nothing

    def __call__(
        self,
        prompts,
        completions,
        task_id,
        log_metric=None,
        environments=None,
        trainer_state=None,
        **_: Any,
    ) -> list[float | None]:
        unknown = [tid for tid in task_id if tid not in self._tasks]
        if unknown:
            raise KeyError(f"reward: unknown task_id {unknown[0]!r} for env {self.env.name!r}")
        # a tool environment grades the rollout's messages (tool calls and results), others text
        texts = list(completions) if self.multi_turn else [to_text(c) for c in completions]
        if len(texts) != len(task_id):
            raise ValueError(f"reward: {len(texts)} completions for {len(task_id)} task ids")
        tasks = [self._tasks[tid] for tid in task_id]
        if self.multi_turn:
            results = self.env.grade_episodes(tasks, texts, environments)
        else:
            results = self.env.grade_batch(tasks, texts)
        self.last_results = results
        kinds = [infra_kind(r) for r in results]
        if self.multi_turn:
            step = trainer_state.global_step + 1 if trainer_state is not None else None
            self.telemetry.log(task_id, texts, results, kinds, log_metric, step)
            if log_metric is not None and self.check_do_nothing:
                self.telemetry.log_do_nothing(self._do_nothing_rewards(tasks), log_metric)
        log_verdict_metrics(results, kinds, log_metric)
        return [None if k is not None else r.reward for r, k in zip(results, kinds, strict=True)]

    def _do_nothing_rewards(self, tasks) -> dict[str, float | None]:
        """The do-nothing rewards of the tasks not checked before (graded here)."""
        new = [
            t for t in {t.task_id: t for t in tasks}.values() if t.task_id not in self.do_nothing
        ]
        with ThreadPoolExecutor(max(1, min(len(new), 8))) as pool:  # sandbox slots bound them
            rewards = list(pool.map(self._do_nothing_reward, new))
        return {t.task_id: r for t, r in zip(new, rewards, strict=True)}

    def _do_nothing_reward(self, task) -> float | None:
        """The environment's do-nothing reward of ``task``; None (tried again when the task
        comes back) if computing it failed: a telemetry check never stops the run."""
        return do_nothing_reward(self.env, task)

    @property
    def last_infra_kinds(self) -> list[str | None]:
        """Per completion of the last batch: the machine failure kind, or None if graded."""
        return [infra_kind(r) for r in self.last_results]
