"""Rollouts that never wait for the learner: samples/min of ``rollout.engine: ray`` (2
workers, ``rollout.max_staleness=1``) vs ``local`` (the trainer generates and grades, then
trains), on the quickstart (arithmetic) with an environment whose grading waits ``--delay``
seconds per call (a remote sandbox; all rollouts a call grades at once, as concurrent tools
grade a turn), on a tiny random model (the time measured is the engines', not a model's).

For the local engine it prints the step's generation, update and wait times (g, t, w: the
wait is the grading's) and the ceiling of overlapping them, ``(g + t + w) / max(g + t, w)``,
beside the measured ratio ray / local. Variants alternate round by round; medians. Ray's
start-up is not counted: samples/min is taken over the steps after the first (the first waits
for the workers to start).

    PYTHONPATH=src python bench/bench_async.py                       # 2 rounds, 8 steps each
    PYTHONPATH=src python bench/bench_async.py --delay 3 --steps 8 --rounds 3

Not built yet: the calculator agent and Feature Deletion cases (the Ray engine does not run
tool environments yet), and the quickstart staleness study (``force_staleness`` 0 vs 4, with
and without the correction, held-out scores over 3 seeds)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO / "tests")]  # the package; tests/support harnesses

from support.tiny_run import save_tiny_model  # noqa: E402

from composer_replication.config import load_config  # noqa: E402
from composer_replication.envs.arithmetic import ArithmeticEnv  # noqa: E402
from composer_replication.run import preflight, train  # noqa: E402
from composer_replication.trainer.trainer import ComposerReplicationTrainer  # noqa: E402

DELAY = {"s": 3.0}
GEN_SECONDS: list[float] = []


class SlowGradingArithmetic(ArithmeticEnv):
    """Arithmetic whose every grading call waits ``DELAY`` seconds first. Defined in this
    script, so Ray pickles it by value into the workers."""

    def grade_batch(self, tasks, completions):
        time.sleep(DELAY["s"])
        return super().grade_batch(tasks, completions)


def slow_env(cfg):
    return SlowGradingArithmetic(levels=cfg.env.levels)


def timed_generation(original):
    def generate(self, *args, **kwargs):
        start = time.monotonic()
        try:
            return original(self, *args, **kwargs)
        finally:
            GEN_SECONDS.append(time.monotonic() - start)

    return generate


def run(engine: str, model: Path, out: Path, steps: int) -> dict[str, float]:
    GEN_SECONDS.clear()
    extra = (
        ["rollout.engine=ray", "ray.num_workers=2", "rollout.max_staleness=1"]
        if engine == "ray"
        else []
    )
    cfg = load_config(None, [
        f"model.name={model}", f"output_dir={out}", f"max_steps={steps}", "num_threads=1",
        "generation.num_generations=4", "generation.prompts_per_step=2",
        "generation.max_completion_length=8", "env.num_train=64", "eval.before_and_after=false",
        "optim.warmup_steps=0", *extra,
    ])  # fmt: skip
    train.run_training(cfg)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "step_time" in r]
    elapsed = [r["time/elapsed_s"] for r in rows]
    samples = 8 * (len(rows) - 1)
    result = {"samples_per_min": 60 * samples / (elapsed[-1] - elapsed[0])}
    if engine == "local":
        g = statistics.median(GEN_SECONDS[1:])
        step = statistics.median(r["step_time"] for r in rows[1:])
        result.update(g=g, w=DELAY["s"], t=max(step - g - DELAY["s"], 0.0))
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--delay", type=float, default=3.0)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    DELAY["s"] = a.delay
    preflight.build_env = train.build_env = slow_env  # both engines grade with the slow env
    ComposerReplicationTrainer._generate_single_turn = timed_generation(
        ComposerReplicationTrainer._generate_single_turn
    )
    with tempfile.TemporaryDirectory() as tmp:
        model = save_tiny_model(Path(tmp) / "tiny")
        results: dict[str, list[dict[str, float]]] = {"local": [], "ray": []}
        for r in range(a.rounds):
            order = ["local", "ray"] if r % 2 == 0 else ["ray", "local"]
            for engine in order:
                results[engine].append(run(engine, model, Path(tmp) / f"{engine}{r}", a.steps))
                print(engine, r, results[engine][-1], flush=True)
    med = {e: statistics.median(x["samples_per_min"] for x in v) for e, v in results.items()}
    g, t, w = (statistics.median(x[k] for x in results["local"]) for k in "gtw")
    ceiling = (g + t + w) / max(g + t, w)
    print(f"delay {a.delay} s, {a.steps} steps, {a.rounds} rounds (medians)")
    print(f"local  samples/min {med['local']:.1f}   g {g:.2f} s  t {t:.2f} s  w {w:.2f} s")
    print(f"ray    samples/min {med['ray']:.1f}")
    print(f"ratio ray/local {med['ray'] / med['local']:.2f}   ceiling {ceiling:.2f}   "
          f"share of ceiling {med['ray'] / med['local'] / ceiling:.0%}")  # fmt: skip


if __name__ == "__main__":
    main()
