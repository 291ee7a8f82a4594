"""Time and peak memory of one optimizer step: the three-channel ComposerReplicationTrainer
(GRPO + hint self-distillation + replay DPO), with and without running shared prompt prefixes
once, vs TRL's plain GRPOTrainer, same model, task, batch shape and seed, measured in one run.

Each variant runs in a fresh subprocess (so peak RSS is its own); subprocesses alternate
(A, B, A, B, ...) so a noisy machine slows both alike; per-step times exclude the first
(warm-up) step; the table reports medians and the ratio composer / grpo.

    python bench/bench_step.py                 # 3 rounds x 4 steps per variant
    python bench/bench_step.py --rounds 2 --steps 3
    python bench/bench_step.py --config agent_quickstart.yaml --rounds 2 --steps 3   # tool rollouts

With ``--config agent_quickstart.yaml`` both trainers run multi-turn tool rollouts on the
calculator environment (TRL's ``environment_factory``, the same bounded tool class and rows).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VARIANTS = ("grpo", "composer", "composer_padded")
"""TRL's GRPOTrainer; our three channels (shared prompt prefixes run once, the default); the
same with ``generation.shared_prefix=false`` (TRL's padded forwards and generation)."""


def _pairs_file(tmp: Path) -> Path:
    path = tmp / "pairs.jsonl"
    with path.open("w") as fh:
        for a in range(10):
            fh.write(
                json.dumps(
                    {
                        "prompt": [
                            {
                                "role": "user",
                                "content": f"What is {a} + 7? Reply with only the number.",
                            }
                        ],
                        "chosen": [{"role": "assistant", "content": str(a + 7)}],
                        "rejected": [{"role": "assistant", "content": f"{a} + 7 = {a + 6}"}],
                    }
                )
                + "\n"
            )
    return path


def worker(variant: str, steps: int, threads: int, config: str | None = None) -> dict:
    import torch
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    from composer_replication.config import load_config
    from composer_replication.run.train import (
        build_env,
        build_grpo_args,
        build_reward_funcs,
        build_trainer,
        prepare,
        tool_kwargs,
    )
    from composer_replication.trainer.data import build_prompt_dataset

    torch.set_num_threads(threads)
    tmp = Path(tempfile.mkdtemp(prefix="bench-step-"))
    overrides = [
        f"output_dir={tmp / 'run'}",
        f"max_steps={steps}",
        "eval.before_and_after=false",
        "save_steps=100000",
        f"num_threads={threads}",
    ]
    if variant.startswith("composer"):
        overrides += ["alpha_sdpo=0.1", "beta_replay=0.05", f"replay.dataset={_pairs_file(tmp)}"]
    if variant == "composer_padded":  # TRL's own padded forwards and generation
        overrides += ["generation.shared_prefix=false"]
    cfg = load_config(config, overrides)
    model, tokenizer, env = prepare(cfg)
    if variant.startswith("composer"):
        trainer = build_trainer(cfg, model, tokenizer, env)
    else:
        ds = build_prompt_dataset(
            env, "train", cfg.env.num_train, cfg.env.seed, conversational=True
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=build_reward_funcs(cfg, build_env(cfg)),
            args=build_grpo_args(cfg),
            train_dataset=ds,
            processing_class=tokenizer,
            **tool_kwargs(cfg, env),
        )

    times: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.t)

    trainer.add_callback(Timer())
    trainer.args.save_strategy = "no"
    trainer.train()
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"variant": variant, "step_s": times[1:] or times, "peak_rss_mb": peak_mb}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--worker", choices=list(VARIANTS))
    ap.add_argument("--config", default=None, help="run config (default: the quickstart)")
    args = ap.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(worker(args.worker, args.steps, args.threads, args.config)))
        return
    results: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error", "TRL_EXPERIMENTAL_SILENCE": "1"}
    for r in range(args.rounds):
        for variant in VARIANTS:
            cmd = [
                sys.executable,
                __file__,
                "--worker",
                variant,
                "--steps",
                str(args.steps),
                "--threads",
                str(args.threads),
                *(["--config", args.config] if args.config else []),
            ]
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
            line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if line is None:
                sys.exit(f"{variant} worker failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
            results[variant].append(json.loads(line[7:]))
            print(
                f"round {r + 1}/{args.rounds} {variant}: "
                f"median step {statistics.median(results[variant][-1]['step_s']):.2f} s",
                flush=True,
            )
    med = {v: statistics.median([t for x in rs for t in x["step_s"]]) for v, rs in results.items()}
    mem = {v: statistics.median([x["peak_rss_mb"] for x in rs]) for v, rs in results.items()}
    print()
    print("| variant | median step time (s) | peak RSS (MB) |")
    print("| --- | --- | --- |")
    for v in VARIANTS:
        print(f"| {v} | {med[v]:.2f} | {mem[v]:.0f} |")
    for v in VARIANTS[1:]:
        print(f"ratio {v} / grpo: time {med[v] / med['grpo']:.2f}x, "
              f"peak memory {mem[v] / mem['grpo']:.2f}x")  # fmt: skip
    print(
        f"({args.rounds} interleaved rounds x {args.steps} steps, first step of each run dropped)"
    )


if __name__ == "__main__":
    main()
