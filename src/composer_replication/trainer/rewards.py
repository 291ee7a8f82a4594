"""The bridge from an Environment to TRL's reward-function protocol.

TRL calls ``reward(prompts, completions, completion_ids, **columns)`` and expects one float per
completion. We grade with the environment and keep every verdict (passed, feedback) of the last
batch, so later stages (hints for channel 2, metrics) can read *why* a completion failed.
"""

from __future__ import annotations

from typing import Any

from composer_replication.envs.base import Environment, StepResult, is_tool_env
from composer_replication.lm.chat import to_text


class EnvReward:
    """A TRL reward function that grades completions with an Environment."""

    def __init__(self, env: Environment):
        self.env = env
        self.__name__ = f"{env.name}_reward"  # TRL names metrics after the function
        self._tasks = {t.task_id: t for split in ("train", "heldout") for t in env.tasks(split)}
        self.last_results: list[StepResult] = []
        self.multi_turn = is_tool_env(env)

    def __call__(
        self, prompts, completions, task_id, log_metric=None, environments=None, **_: Any
    ) -> list[float]:
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
        if log_metric is not None and results:
            log_metric("env/pass_rate", sum(r.passed for r in results) / len(results))
            flagged = [len(r.info.get("flags", ())) for r in results]
            if any(flagged) or "flags" in results[0].info:
                log_metric("env/flagged_frac", sum(f > 0 for f in flagged) / len(results))
                log_metric("env/flags_per_rollout", sum(flagged) / len(results))
        return [r.reward for r in results]
