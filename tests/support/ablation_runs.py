"""A finished ablation run directory with chosen numbers, written by the trainer's own writers:
``heldout.jsonl`` by :class:`HeldoutEvalCallback` (on its own schedule: step 0, every ``every``
steps and the last step; the evaluation replaced by a lookup of the chosen score),
``metrics.jsonl`` by :class:`MetricsJsonlCallback` (one log per step with its ``step_time``) and
``final_eval.json`` with the keys ``run_arm`` writes."""

from __future__ import annotations

import json
from pathlib import Path
from unittest import mock

from transformers import TrainerControl, TrainerState

from composer_replication.run.ablation import FINAL_EVAL
from composer_replication.trainer.callbacks import HeldoutEvalCallback, MetricsJsonlCallback


class _Scored:
    """What ``evaluate`` returns, with the chosen pass rate."""

    def __init__(self, rate: float):
        self.pass_rate = self.mean_reward = rate
        self.n = 100

    def pass_ci(self) -> tuple[float, float]:
        return max(0.0, self.pass_rate - 0.1), min(1.0, self.pass_rate + 0.1)


class _Model:
    training = True

    def train(self, mode: bool) -> None:
        self.training = mode


def write_finished_run(
    run_dir: Path,
    arm: str,
    seed: int,
    scores: dict[int, float],
    step_times: list[float],
    final: float,
    every: int,
    load: float | None = None,
) -> Path:
    """Train ``len(step_times)`` fake steps; the held-out evaluation at step ``s`` scores
    ``scores[s]`` (a KeyError if the callback evaluates a step not given). The machine's load
    logged at each step is ``load`` (None: not logged, as runs written before it was)."""
    state, control, args = TrainerState(), TrainerControl(), None
    state.max_steps = len(step_times)
    heldout = HeldoutEvalCallback(run_dir, None, None, every, 100, 8, 4, max_turns=1,
                                  max_tool_calls=0)  # fmt: skip
    metrics = MetricsJsonlCallback(run_dir)

    def loadavg():
        if load is None:
            raise OSError("no load average")
        return (load, load, load)

    with (
        mock.patch(
            "composer_replication.evaluation.evaluate",
            lambda *a, **k: _Scored(scores[state.global_step]),
        ),
        mock.patch("composer_replication.trainer.callbacks.os.getloadavg", loadavg),
    ):
        metrics.on_train_begin(args, state, control)
        heldout.on_train_begin(args, state, control, model=_Model())
        for step, secs in enumerate(step_times, start=1):
            state.global_step = step
            heldout.on_step_end(args, state, control, model=_Model())
            metrics.on_log(args, state, control, logs={"reward": 0.5, "step_time": secs})
    result = {"arm": arm, "seed": seed, "pass_rate": final, "n": 200, "mean_reward": final,
              "wall_s": sum(step_times), "run_dir": str(run_dir)}  # fmt: skip
    (run_dir / FINAL_EVAL).write_text(json.dumps(result))
    return run_dir
