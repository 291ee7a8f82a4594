"""Where the time of a GRPO step goes on this machine, for the quickstart setup and variants
(completion length, LoRA, threads): generation, reward, policy forward+backward, optimizer.

Each variant trains a few steps of ComposerReplicationTrainer on the embedded model with
timers wrapped around TRL's phases; variants run interleaved (round-robin, one fresh process
each) and the table shows median seconds per step and each phase's share.

    python bench/profile_step.py                  # quickstart + variants, 2 rounds x 3 steps
    python bench/profile_step.py --rounds 1 --steps 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

VARIANTS: dict[str, list[str]] = {
    "quickstart (16 tok, full FT, 2 thr)": [],
    "8 new tokens": ["generation.max_completion_length=8"],
    "32 new tokens": ["generation.max_completion_length=32"],
    "LoRA r=16": ["peft.enabled=true", "optim.learning_rate=1e-4"],
    "1 thread": ["num_threads=1"],
}

PHASES = ("_generate", "_calculate_rewards", "_compute_loss", "optimizer_step")


def worker(overrides: list[str], steps: int) -> dict:
    from transformers import TrainerCallback

    from composer_replication.config import load_config
    from composer_replication.run.train import build_trainer, prepare

    tmp = tempfile.mkdtemp(prefix="profile-step-")
    cfg = load_config(
        None,
        [
            f"output_dir={tmp}",
            f"max_steps={steps}",
            "save_steps=100000",
            "eval.before_and_after=false",
            "num_threads=2",
            *overrides,
        ],
    )
    model, tokenizer, env = prepare(cfg)
    trainer = build_trainer(cfg, model, tokenizer, env)
    trainer.args.save_strategy = "no"
    spent: dict[str, list[float]] = defaultdict(list)
    current: dict[str, float] = defaultdict(float)

    def timed(name, fn):
        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                current[name] += time.perf_counter() - t

        return wrapper

    for name in PHASES[:3]:
        setattr(trainer, name, timed(name, getattr(trainer, name)))

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            current.clear()
            self.t = time.perf_counter()

        def on_pre_optimizer_step(self, args, state, control, **kw):
            self.t_opt = time.perf_counter()

        def on_optimizer_step(self, args, state, control, **kw):
            current["optimizer_step"] += time.perf_counter() - self.t_opt

        def on_step_end(self, args, state, control, **kw):
            total = time.perf_counter() - self.t
            spent["total"].append(total)
            for name in PHASES:
                spent[name].append(current.get(name, 0.0))

    trainer.add_callback(StepTimer())
    trainer.train()
    return {k: v[1:] or v for k, v in spent.items()}  # drop the warm-up step


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        print("RESULT " + json.dumps(worker(json.loads(args.worker), args.steps)))
        return
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error"}
    acc: dict[str, dict[str, list[float]]] = {v: defaultdict(list) for v in VARIANTS}
    for r in range(args.rounds):
        for name, overrides in VARIANTS.items():
            cmd = [
                sys.executable,
                __file__,
                "--worker",
                json.dumps(overrides),
                "--steps",
                str(args.steps),
            ]
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
            line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if line is None:
                sys.exit(f"{name} failed:\n{out.stderr[-3000:]}")
            for k, v in json.loads(line[7:]).items():
                acc[name][k].extend(v)
            print(
                f"round {r + 1}: {name}: {statistics.median(acc[name]['total']):.2f} s/step",
                flush=True,
            )
    base = statistics.median(acc[next(iter(VARIANTS))]["total"])
    print(
        "\n| variant | s/step (median) | vs quickstart | generation | reward | policy fwd+bwd, rest | optimizer |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in VARIANTS:
        tot = statistics.median(acc[name]["total"])
        shares = {p: statistics.median(acc[name][p]) / tot for p in PHASES}
        # _compute_loss times only the forward (backward runs after it in training_step), so the
        # policy column is what is left of the step after the other timed phases
        rest = 1 - shares["_generate"] - shares["_calculate_rewards"] - shares["optimizer_step"]
        print(
            f"| {name} | {tot:.2f} | {tot / base:.2f}x | {shares['_generate']:.0%} | "
            f"{shares['_calculate_rewards']:.0%} | {rest:.0%} | {shares['optimizer_step']:.0%} |"
        )


if __name__ == "__main__":
    main()
