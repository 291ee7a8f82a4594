"""Trainer callbacks: per-step metrics to ``metrics.jsonl``, a PNG of the curves, and progress
(a rich bar on a terminal, one plain line per step elsewhere)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from transformers import TrainerCallback

from composer_replication.config import UserError
from composer_replication.lm.models import write_atomic
from composer_replication.progress import eta

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "training_curves.png"


class MetricsFileError(UserError, ValueError):
    """A per-step JSONL file of a run with a damaged line; the message names file and line."""


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a metrics.jsonl file (one dict per logged step), or of a heldout.jsonl file
    (one per evaluated step); [] when the file does not exist. A last line with no newline that
    does not parse is a row a kill cut short (rows are appended whole, newline last): it is left
    out, with a warning. Any other line that is not a JSON object is a `MetricsFileError`."""
    path = Path(path)
    if not path.is_file():
        return []
    lines = path.read_bytes().split(b"\n")
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError as err:
            if n == len(lines):  # after the last newline: the write was cut short
                log.warning("%s:%d: a row cut short (killed mid-write) is left out", path, n)
                break
            raise MetricsFileError(f"{path}:{n}: not a JSON object ({err})") from None
        if not isinstance(row, dict):
            raise MetricsFileError(f"{path}:{n}: not a JSON object (a {type(row).__name__})")
        rows.append(row)
    return rows


def _rows_up_to(path: Path, step: int) -> list[dict[str, Any]]:
    """Rewrite a per-step JSONL file keeping only the rows of steps <= ``step`` (a resume's
    checkpoint step); returns them."""
    rows = [r for r in read_metrics(path) if (r.get("step") or 0) <= step]
    write_atomic(path, b"".join(orjson.dumps(r) + b"\n" for r in rows))  # a kill: old or new
    return rows


LOAD_KEY = "time/load_1m"
"""The machine's 1-minute load average when a step's row is logged (``os.getloadavg``)."""


class MetricsJsonlCallback(TrainerCallback):
    """Append every training log (one per step with ``logging_steps=1``) to metrics.jsonl.

    On resume, rows logged after the checkpoint's step are dropped first (from
    ``episodes.jsonl`` too), so the files always describe one consistent history, and
    ``time/elapsed_s`` goes on from the last kept row (the time the earlier process spent up
    to the checkpoint, plus this one's since its training began).
    """

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / METRICS_FILE
        self._t0 = time.monotonic()

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:  # one writer in a multi-process run
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        rows = _rows_up_to(self.path, state.global_step)
        if state.global_step > 0 and rows:  # resumed: this process's set-up does not count
            self._t0 = time.monotonic() - float(rows[-1].get("time/elapsed_s", 0.0))
        episodes = self.path.parent / EPISODES_FILE
        if episodes.is_file():
            _rows_up_to(episodes, state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or "train_runtime" in logs:
            return  # other ranks, and the end-of-training summary record
        row = {"step": state.global_step, "time/elapsed_s": time.monotonic() - self._t0}
        try:  # how busy the machine was (wall-time comparisons on a shared machine report it)
            row[LOAD_KEY] = os.getloadavg()[0]
        except (OSError, AttributeError):  # a platform without a load average
            pass
        row.update({k: v for k, v in logs.items() if isinstance(v, int | float)})
        with self.path.open("ab") as fh:
            fh.write(orjson.dumps(row) + b"\n")


def _rolling_mean(values, window: int) -> list[float]:
    """Mean of the last ``window`` values at each point (fewer at the start)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


EVAL_FILE = "eval.json"
"""Held-out results of the run (written by ``trainer.run`` after the final evaluation)."""
EPISODES_FILE = "episodes.jsonl"
"""Tool environments: the first rollout of each graded batch, with its step (trainer/rewards.py)."""
EVAL_EPISODES_FILE = "eval_episodes.jsonl"
"""Every held-out problem of the run's evaluations, one JSON line each (``EvalResult.episodes``:
``tag`` base or trained, task, outcome, completion or tool transcript)."""


def _loss_keys(rows: list[dict]) -> list[str]:
    """Every loss seen in the run (a channel idle at the last step still has its curve)."""
    keys: dict[str, None] = {}
    for r in rows:
        keys.update((k, None) for k in r if k == "loss" or k.endswith("/loss"))
    return list(keys)


def _plot_heldout(ax, eval_path: Path, last_step: int) -> None:
    """Held-out pass@1 with its 95% CI: base at step 0, trained at the last step."""
    import json

    if not eval_path.is_file():
        return
    record = json.loads(eval_path.read_text())
    for tag, step, color in (("base", 0, "gray"), ("trained", last_step, "black")):
        s = record.get(tag)
        if not s:
            continue
        # never negative, also for an eval.json written before wilson_interval clamped its bounds
        err = [[max(0.0, s["pass_rate"] - s["pass_ci95_low"])],
               [max(0.0, s["pass_ci95_high"] - s["pass_rate"])]]  # fmt: skip
        ax.errorbar([step], [s["pass_rate"]], yerr=err, fmt="s", color=color, capsize=4,
                    label=f"held-out pass@1, {tag}: {s['pass_rate']:.1%}")  # fmt: skip


TOOL_KEYS = (
    "tools/call_frequency",
    "tools/failure_frequency",
    "rollout/turns",
    "env/pass_rate",
    "sdpo/turn_hinted_frac",
)
"""Metrics of multi-turn tool rollouts drawn in their own panel when present."""

SAMPLER_KEYS = (
    "sampler/signal_frac",
    "sampler/sampled_pass_rate_mean",
    "sampler/sampled_pass_rate_p10",
    "sampler/sampled_pass_rate_p90",
    "sampler/retired_frac",
)
"""``data.sampler``'s metrics (envs/sampler.py), drawn in their own panel when present: the
share of groups with a GRPO signal and how hard the drawn tasks were (their pass-rate
estimates' mean and 10/90% quantiles), and the share of tasks retired as solved."""


HACK_PREFIX = "env/hack/"
"""Prefix of the hack telemetry (envs/telemetry.py), drawn in its own panel when present."""


INFRA_PREFIX = "env/infra_failed"
"""Prefix of the machine-failure metrics (trainer/rewards.py ``log_infra_metrics``)."""


def infra_keys(rows: list[dict]) -> list[str]:
    """``env/infra_failed_frac`` and the per-kind counts of ``env/infra_failed/<kind>`` that
    were ever non-zero, if the machine failed any grading in the run (else none: no panel)."""
    keys = [k for k in dict.fromkeys(k for r in rows for k in r) if k.startswith(INFRA_PREFIX)]
    seen = [k for k in keys if any(r.get(k) for r in rows)]
    return [k for k in keys if k == INFRA_PREFIX + "_frac" or k in seen] if seen else []


def plot_metrics(metrics_path: str | Path, out_path: str | Path | None = None) -> Path | None:
    """Plot reward and loss against step from metrics.jsonl into a PNG; returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics_path)
    if not rows:
        return None
    out = Path(out_path) if out_path else Path(metrics_path).with_name(PLOT_FILE)
    rewards = [k for k in rows[-1] if k == "reward" or k.startswith("rewards/")]
    panels = [
        # per-function curves only when there are several (with one, it *is* "reward")
        (
            "reward",
            [k for k in rewards if not k.endswith("/std")] if len(rewards) > 3 else ["reward"],
        ),
        ("loss (channels unweighted; total/loss weighted)", _loss_keys(rows)),
        ("learning rate", ["learning_rate"] if any("learning_rate" in r for r in rows) else []),
    ]
    tool_keys = [k for k in TOOL_KEYS if any(k in r for r in rows)]
    if tool_keys:  # multi-turn tool rollouts: calls, failures, turns and pass rate per step
        panels.insert(1, ("tool rollouts (per rollout)", tool_keys))
    sampler_keys = [k for k in SAMPLER_KEYS if any(k in r for r in rows)]
    if sampler_keys:  # how the task mix moves (data.sampler)
        panels.insert(1, ("task mix (data.sampler)", sampler_keys))
    hack_keys = [k for k in dict.fromkeys(k for r in rows for k in r) if k.startswith(HACK_PREFIX)]
    if hack_keys:  # reward hacks (docs/feature_deletion.md says when to worry)
        panels.insert(1, ("hack telemetry (per step)", hack_keys))
    if infra := infra_keys(rows):  # gradings the machine failed, masked
        panels.insert(1, ("machine failures (masked rollouts)", infra))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4))
    for ax, (title, keys) in zip(axes, panels, strict=True):
        for key in keys:
            pts = [(r["step"], r[key]) for r in rows if key in r]
            if not pts:
                continue
            steps, values = zip(*pts, strict=True)
            line = ax.plot(
                steps, values, label=key, marker=".", alpha=0.35 if title == "reward" else 1
            )
            if title == "reward" and len(values) >= 4:  # per-step rewards are noisy: smooth them
                w = max(2, len(values) // 8)
                ax.plot(
                    steps,
                    _rolling_mean(values, w),
                    color=line[0].get_color(),
                    lw=2,
                    label=f"{key} (mean of last {w})",
                )
        if title == "reward":
            _plot_heldout(ax, Path(metrics_path).with_name(EVAL_FILE), rows[-1]["step"])
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if keys:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


class PlotCallback(TrainerCallback):
    """Redraw the PNG at every checkpoint and at the end of training."""

    def __init__(self, run_dir: str | Path):
        self.metrics = Path(run_dir) / METRICS_FILE

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            plot_metrics(self.metrics)

    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            plot_metrics(self.metrics)


class RichProgressCallback(TrainerCallback):
    """A rich progress bar over optimizer steps showing the latest reward and loss."""

    def __init__(self, console=None):
        self.console = console
        self.progress = None
        self.task = None

    def on_train_begin(self, args, state, control, **kwargs):
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[info]}"),
            console=self.console,
        )
        self.progress.start()
        self.task = self.progress.add_task(
            "train", total=state.max_steps, completed=state.global_step, info=""
        )

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.progress is None or not logs or "reward" not in logs:
            return
        info = f"reward {_shown(logs['reward'])}  loss {logs.get('loss', float('nan')):.4f}"
        self.progress.update(self.task, completed=state.global_step, info=info)

    def on_step_end(self, args, state, control, **kwargs):
        if self.progress is not None:
            self.progress.update(self.task, completed=state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


HELDOUT_FILE = "heldout.jsonl"
"""A run's periodic held-out scores, one row per evaluated step (written by
:class:`HeldoutEvalCallback`): ``step``, ``pass_rate``, ``ci95_low``, ``ci95_high``,
``mean_reward``, ``n``."""


class HeldoutEvalCallback(TrainerCallback):
    """Greedy held-out pass rate every ``every`` optimizer steps (and at step 0), appended to
    ``heldout.jsonl`` in the run dir: the data of score-vs-step curves (on resume, rows after
    the checkpoint's step are dropped first). Tool environments run
    episodes of at most ``max_turns`` turns and ``max_tool_calls`` calls (the run's
    ``rollout`` budget, as its final evaluation), under ``context`` (the run's
    ``rollout.context``) as in training."""

    def __init__(
        self,
        run_dir: str | Path,
        env,
        tokenizer,
        every: int,
        n: int,
        max_new_tokens: int,
        batch_size: int,
        *,
        max_turns: int,
        max_tool_calls: int,
        shared_prefix: bool = True,
        context: Any = None,
    ):
        self.path = Path(run_dir) / HELDOUT_FILE
        self.shared_prefix, self.context = shared_prefix, context
        self.env, self.tokenizer = env, tokenizer
        self.every, self.n = every, n
        self.max_new_tokens, self.batch_size = max_new_tokens, batch_size
        self.max_turns, self.max_tool_calls = max_turns, max_tool_calls

    def _eval(self, model, step: int) -> None:
        from composer_replication.evaluation import evaluate

        was_training = model.training
        res = evaluate(
            model, self.tokenizer, self.env, "heldout", self.n, self.max_new_tokens,
            self.batch_size, max_turns=self.max_turns, max_tool_calls=self.max_tool_calls,
            shared_prefix=self.shared_prefix, context=self.context,
        )  # fmt: skip
        model.train(was_training)
        lo, hi = res.pass_ci()
        row = {
            "step": step,
            "pass_rate": res.pass_rate,
            "ci95_low": lo,
            "ci95_high": hi,
            "mean_reward": res.mean_reward,
            "n": res.n,
        }
        with self.path.open("ab") as fh:
            fh.write(orjson.dumps(row) + b"\n")

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        """A fresh run evaluates step 0; a resumed one keeps the rows up to its checkpoint."""
        if not state.is_world_process_zero:  # one writer in a multi-process run
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if state.global_step > 0:
            _rows_up_to(self.path, state.global_step)
        else:  # a run started over (none of an earlier attempt's rows is kept)
            self.path.write_bytes(b"")
            self._eval(model, 0)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if not state.is_world_process_zero:
            return
        if state.global_step % self.every == 0 or state.global_step == state.max_steps:
            self._eval(model, state.global_step)


def _print_flushed(line: str) -> None:
    print(line, flush=True)


def _shown(reward: float | None) -> str:
    """A step's mean reward as shown; None when the machine failed every grading (masked,
    trainer/masking.py: TRL's mean of no reward)."""
    return "n/a (no rollout graded)" if reward is None else f"{reward:.3f}"


class StepLineCallback(TrainerCallback):
    """One plain line per optimizer step (``step 3/40  reward 0.250  loss 0.0123  12.1 s
    ETA 7m 30s``), flushed, for output that is not a terminal (a log file, a pipe, ``nohup``,
    CI, DiLoCo replicas whose output is prefixed): a live bar renders nothing there until it
    stops, and transformers' printer would dump raw dicts. The seconds are the step's (since
    the previous line); the ETA is the mean pace of this run's steps so far."""

    def __init__(self, echo: Callable[[str], None] = _print_flushed):
        self.echo = echo
        self._t0 = self._last = time.monotonic()
        self._first_step = 0

    def on_train_begin(self, args, state, control, **kwargs):
        self._t0 = self._last = time.monotonic()
        self._first_step = state.global_step  # a resumed run's pace counts its own steps

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or "reward" not in logs:
            return
        now = time.monotonic()
        line = f"step {state.global_step}/{state.max_steps}  reward {_shown(logs['reward'])}"
        if "loss" in logs:
            line += f"  loss {logs['loss']:.4f}"
        line += f"  {now - self._last:.1f} s"
        done = state.global_step - self._first_step
        line += f"  {eta(now - self._t0, done, state.max_steps - self._first_step)}".rstrip()
        self._last = now
        self.echo(line)
