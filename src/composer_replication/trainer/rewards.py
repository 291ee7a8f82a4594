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

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson

from composer_replication.envs.base import Environment, StepResult, infra_kind, log_infra_metrics
from composer_replication.envs.telemetry import PREFIX, hack_metrics
from composer_replication.envs.tools import tool_call_counts, tool_methods
from composer_replication.lm.chat import to_text

log = logging.getLogger(__name__)


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
        self.episode_log = Path(episode_log) if episode_log else None
        """Tool environments: each grading appends its first rollout (task, messages, reward,
        flags) to this JSONL file."""
        self.__name__ = f"{env.name}_reward"  # TRL names metrics after the function
        self._tasks = {t.task_id: t for split in ("train", "heldout") for t in env.tasks(split)}
        self.last_results: list[StepResult] = []
        self.multi_turn = env.tools
        self._offered = tuple(tool_methods(env.tools_class())) if env.tools else ()
        """The tool names the environment offers (``tools/calls/<name>``; others are counted
        as ``_not_offered``)."""
        self.task_estimates = task_estimates
        """``task_id -> (pass_rate, scored_rollouts)`` before this step (the run's
        ``TaskSampler.estimate``): splits ``env/hack/invalid_call_rate_likely_fail|pass``."""
        self.check_do_nothing = check_do_nothing and getattr(env, "checks_do_nothing", False)
        self.do_nothing: dict[str, float] = {}
        """Per task seen: the reward of its untouched workspace (graded once; must be 0)."""

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
        if self.multi_turn:
            step = trainer_state.global_step + 1 if trainer_state is not None else None
            self._log_tools(task_id, texts, results, log_metric, step)
        kinds = [infra_kind(r) for r in results]
        if self.multi_turn and log_metric is not None:
            self._log_hacks(task_id, texts, results, kinds, tasks, log_metric)
        if log_metric is not None and results:
            graded = [r for r, k in zip(results, kinds, strict=True) if k is None]
            if graded:  # the pass rate of the rollouts the machine graded
                log_metric("env/pass_rate", sum(r.passed for r in graded) / len(graded))
            flagged = [len(r.info.get("flags", ())) for r in results]
            if any(flagged) or "flags" in results[0].info:
                log_metric("env/flagged_frac", sum(f > 0 for f in flagged) / len(results))
                log_metric("env/flags_per_rollout", sum(flagged) / len(results))
            log_infra_metrics(kinds, log_metric)
        return [None if k is not None else r.reward for r, k in zip(results, kinds, strict=True)]

    def _log_hacks(self, task_id, rollouts, results, kinds, tasks, log_metric) -> None:
        """``env/hack/*`` over the rollouts the machine graded, and the do-nothing check of
        the tasks not seen before (a warning naming each task whose do-nothing reward is not 0)."""
        graded = [i for i, k in enumerate(kinds) if k is None]
        metrics = hack_metrics([task_id[i] for i in graded], [rollouts[i] for i in graded],
                               [results[i].info for i in graded], self._offered,
                               self.task_estimates)  # fmt: skip
        for key, value in metrics.items():
            log_metric(key, value)
        if not self.check_do_nothing:
            return
        new = [
            t for t in {t.task_id: t for t in tasks}.values() if t.task_id not in self.do_nothing
        ]
        with ThreadPoolExecutor(max(1, min(len(new), 8))) as pool:  # sandbox slots bound them
            rewards = list(pool.map(self._do_nothing_reward, new))
        for task, reward in zip(new, rewards, strict=True):
            if reward is None:  # the machine failed it: tried again when the task comes back
                continue
            self.do_nothing[task.task_id] = reward
            if reward != 0:
                log.warning("do-nothing submission of task %s scores %g (must be 0)",
                            task.task_id, reward)  # fmt: skip
        if not self.do_nothing:
            return
        bad = [r for r in self.do_nothing.values() if r != 0]
        log_metric(PREFIX + "do_nothing_nonzero_tasks", float(len(bad)))
        log_metric(PREFIX + "do_nothing_reward_max", max(self.do_nothing.values(), default=0.0))

    def _do_nothing_reward(self, task) -> float | None:
        """The environment's do-nothing reward of ``task``; None (tried again when the task
        comes back) if computing it failed: a telemetry check never stops the run."""
        try:
            return self.env.do_nothing_reward(task)
        except Exception as e:  # noqa: BLE001 - reported, the training step goes on
            log.warning("do-nothing check of task %s failed: %s: %s", task.task_id,
                        type(e).__name__, e)  # fmt: skip
            return None

    @property
    def last_infra_kinds(self) -> list[str | None]:
        """Per completion of the last batch: the machine failure kind, or None if graded."""
        return [infra_kind(r) for r in self.last_results]

    def _log_tools(self, task_id, rollouts, results, log_metric, step: int | None) -> None:
        """``tools/calls/<name>``: calls of each tool per rollout (the vocabulary the policy
        used; names the environment does not offer summed under ``tools/calls/_not_offered``),
        and the first rollout of the batch in ``episode_log``, with the optimizer ``step`` it
        was generated for (a resumed run drops the lines past its checkpoint)."""
        if log_metric is not None:
            for name, per_rollout in tool_call_counts(rollouts, self._offered).items():
                log_metric(f"tools/calls/{name}", per_rollout)
        if self.episode_log is not None and rollouts:
            r = results[0]
            line = {"step": step, "task_id": task_id[0], "messages": rollouts[0],
                    "reward": r.reward, "passed": r.passed,
                    "flags": r.info.get("flags", [])}  # fmt: skip
            self.episode_log.parent.mkdir(parents=True, exist_ok=True)
            with open(self.episode_log, "ab") as fh:
                fh.write(orjson.dumps(line, default=str) + b"\n")
