"""Single training steps of several variants, in turn, each variant in its own long-lived
process: the interleaving a benchmark needs on a noisy machine (load changes between minutes
slow adjacent steps alike) and on a short GPU lease (startup paid once per variant).

Parent side, :func:`run_rounds`: start one worker per variant (their startups overlap), then
per round tell each worker in turn to take one step and wait for its time; round 0 warms up
(compilation, caches, allocator) and is dropped. Worker side, :func:`turn_callback`: a
``TrainerCallback`` that waits for the parent before the first step and after every step,
synchronizes the device around the step and reports its seconds on stdout (``STEP <s>``). A
worker ends by printing ``RESULT <json>`` (read by :func:`run_rounds` once every round is done).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable


def turn_callback(times: list[float]):
    """The worker's callback: appends each step's seconds to ``times``. Anything from the parent
    other than ``go`` stops training after the current step."""
    import torch
    from transformers import TrainerCallback

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)

    def wait(control) -> None:
        if sys.stdin.readline().strip() != "go":
            control.should_training_stop = True

    class Turns(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            wait(control)

        def on_step_begin(self, args, state, control, **kw):
            sync()
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            sync()
            times.append(time.perf_counter() - self.t)
            print(f"STEP {times[-1]}", flush=True)
            wait(control)

    return Turns()


def run_rounds(
    commands: dict[str, list[str]],
    rounds: int,
    env: dict[str, str],
    on_round: Callable[[int, dict[str, float]], None] | None = None,
    cwd: str | None = None,
) -> tuple[list[dict[str, float]], dict[str, dict]]:
    """Run ``rounds`` rounds (after a warm-up round) of one step per variant, in the order of
    ``commands`` (variant -> worker command line; each worker must train ``rounds + 1``
    steps). Returns the per-round step seconds ``[{variant: s}]`` and each worker's RESULT.
    ``on_round(r, times)`` is called after each kept round (write partial results there)."""
    logs = {v: tempfile.TemporaryFile("w+") for v in commands}
    procs = {v: subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=logs[v], text=True, env=env, cwd=cwd)
             for v, cmd in commands.items()}  # fmt: skip
    kept: list[dict[str, float]] = []
    try:
        for r in range(rounds + 1):
            times = {v: float(_ask(procs[v], "go", "STEP ", v, logs[v])) for v in commands}
            if r:
                kept.append(times)
                if on_round is not None:
                    on_round(r, times)
        results = {v: json.loads(_ask(procs[v], "end", "RESULT ", v, logs[v])) for v in commands}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    return kept, results


def ratios(rounds: list[dict[str, float]], variant: str, ref: str) -> dict:
    """Per round ``variant / ref``, with the median and range over the rounds."""
    per = [r[variant] / r[ref] for r in rounds]
    return {"per_round": per, "median": statistics.median(per), "range": [min(per), max(per)]}


def _ask(proc: subprocess.Popen, say: str, prefix: str, variant: str, log) -> str:
    """Send ``say``; the rest of the worker's next stdout line starting with ``prefix``. Exits
    with the worker's log if it ends first."""
    proc.stdin.write(say + "\n")
    proc.stdin.flush()
    for line in proc.stdout:
        if line.startswith(prefix):
            return line[len(prefix) :].strip()
    log.seek(0)
    sys.exit(f"{variant} worker ended without {prefix.strip()}:\n{log.read()[-4000:]}")
