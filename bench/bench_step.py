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

On a GPU without network (issue 35: 16 prompts x 8 generations x 128 tokens, bf16, on a
random-init model of Qwen2.5-0.5B's shape built from a config, ``bench/config_models.py``):

    python bench/bench_step.py --device cuda --model-config qwen2.5-0.5b --rounds 1 --steps 3
    python bench/bench_step.py --smoke      # the same path on a tiny model, on CPU

``--device cuda`` reports peak GPU memory (``torch.cuda.max_memory_allocated``) instead of
peak RSS, runs ``configs/gpu/qwen2.5-0.5b.yaml`` with transformers generation (no vLLM) and
one gradient-accumulation step.

``--lockstep`` interleaves single steps instead of whole runs: one worker per variant starts
once (model loads overlap), then the parent lets them step in turn (grpo, composer, grpo, ...;
a worker waits between its steps, the device synchronized at each step's end), ``--rounds``
rounds after one warm-up round. Each round gives a ratio composer / grpo of its two steps; the
table gives the median ratio and its range over the rounds, and each worker's own peak memory.
Startup is paid once per variant, which is what makes several rounds fit a short GPU lease:

    python bench/bench_step.py --device cuda --model-config qwen2.5-0.5b --lockstep --rounds 4
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
sys.path.insert(0, str(REPO / "bench"))
from lockstep import ratios, run_rounds, turn_callback  # noqa: E402 - bench/lockstep.py

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


GPU_SHAPE = [  # issue 35's step: 16 prompts x 8 generations x 128 tokens, one micro-step
    "generation.backend=transformers",
    "generation.prompts_per_step=16",
    "generation.num_generations=8",
    "generation.max_completion_length=128",
    "optim.gradient_accumulation_steps=1",
    "logging.report_to=[]",
]
SMOKE_SHAPE = [
    "generation.prompts_per_step=2",
    "generation.num_generations=2",
    "generation.max_completion_length=8",
    "optim.gradient_accumulation_steps=1",
]


def worker(
    variant: str,
    steps: int,
    threads: int,
    config: str | None = None,
    extra: list[str] | None = None,
    lockstep: bool = False,
) -> dict:
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
        *(extra or []),
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

    trainer.add_callback(turn_callback(times) if lockstep else Timer())
    trainer.args.save_strategy = "no"
    trainer.train()
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if torch.cuda.is_available():  # the trainer placed the model on the GPU
        peak_mb = torch.cuda.max_memory_allocated() / 2**20
    kept = times if lockstep else (times[1:] or times)  # lockstep: the parent drops round 0
    return {"variant": variant, "step_s": kept, "peak_rss_mb": peak_mb}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--worker", choices=list(VARIANTS))
    ap.add_argument("--config", default=None, help="run config (default: the quickstart)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--model-config", default=None, help="random-init model of this shape")
    ap.add_argument("--model-dir", default=None, help="where to build it (default: a temp dir)")
    ap.add_argument("--tokenizer", default=None, help="tokenizer dir (default: embedded SmolLM2)")
    ap.add_argument(
        "--variants", default=None, help="comma-separated subset of " + ",".join(VARIANTS)
    )
    ap.add_argument("--smoke", action="store_true", help="tiny model and batch, 1 round, CPU")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument(
        "--lockstep", action="store_true", help="interleave single steps of long-lived workers"
    )
    ap.add_argument("--extra", action="append", default=[], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        res = worker(args.worker, args.steps, args.threads, args.config, args.extra, args.lockstep)
        print("RESULT " + json.dumps(res))
        return
    extra, variants = _setup(args)
    if args.lockstep:
        lockstep(args, extra, variants)
        return
    results: dict[str, list[dict]] = {v: [] for v in variants}
    failed: list[str] = []
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error", "TRL_EXPERIMENTAL_SILENCE": "1"}
    if args.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    for r in range(args.rounds):
        for variant in variants:
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
                *(f"--extra={x}" for x in extra),
            ]
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
            line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if line is None:  # report it and go on: the other variants still get measured
                print(f"{variant} worker failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
                failed.append(variant)
                continue
            results[variant].append(json.loads(line[7:]))
            print(
                f"round {r + 1}/{args.rounds} {variant}: "
                f"median step {statistics.median(results[variant][-1]['step_s']):.2f} s, "
                f"peak memory {results[variant][-1]['peak_rss_mb']:.0f} MiB",
                flush=True,
            )
            if args.json:  # after every worker: a stage cut short keeps what it measured
                Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}))
    if failed:
        sys.exit(f"failed: {', '.join(sorted(set(failed)))}")
    med = {v: statistics.median([t for x in rs for t in x["step_s"]]) for v, rs in results.items()}
    mem = {v: statistics.median([x["peak_rss_mb"] for x in rs]) for v, rs in results.items()}
    mem_name = "peak GPU memory (MiB)" if args.device == "cuda" else "peak RSS (MB)"
    print()
    print(f"| variant | median step time (s) | {mem_name} |")
    print("| --- | --- | --- |")
    for v in variants:
        print(f"| {v} | {med[v]:.2f} | {mem[v]:.0f} |")
    for v in [x for x in variants if x != "grpo" and "grpo" in variants]:
        print(f"ratio {v} / grpo: time {med[v] / med['grpo']:.2f}x, "
              f"peak memory {mem[v] / mem['grpo']:.2f}x")  # fmt: skip
    print(
        f"({args.rounds} interleaved rounds x {args.steps} steps, the first step of each run "
        "dropped when there are more)"
    )


def lockstep(args, extra: list[str], variants: list[str]) -> None:
    """``--lockstep`` (module docstring; bench/lockstep.py): one long-lived worker per variant,
    single steps in turn, ``--rounds`` rounds after a warm-up round; results written after every
    round."""
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error", "TRL_EXPERIMENTAL_SILENCE": "1"}
    if args.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    commands = {v: [sys.executable, __file__, "--worker", v, "--lockstep",
                    "--steps", str(args.rounds + 1), "--threads", str(args.threads),
                    *(["--config", args.config] if args.config else []),
                    *(f"--extra={x}" for x in extra)] for v in variants}  # fmt: skip
    out: dict = {"args": vars(args), "mode": "lockstep", "rounds": []}

    def on_round(r: int, times: dict[str, float]) -> None:
        out["rounds"].append(times)
        print(f"round {r}/{args.rounds}: " + ", ".join(f"{v} {t:.2f} s" for v, t in times.items()),
              flush=True)  # fmt: skip
        _dump_lockstep(args, out, {})

    _, results = run_rounds(commands, args.rounds, env, on_round, cwd=str(REPO))
    _dump_lockstep(args, out, {v: r["peak_rss_mb"] for v, r in results.items()})
    _print_lockstep(args, out, variants)


def _dump_lockstep(args, out: dict, peaks: dict) -> None:
    """``results`` in the shape of the other mode (per variant a list of one worker's steps)
    plus each variant's per-round ratio to grpo (bench/lockstep.py ``ratios``)."""
    variants = list(out["rounds"][0])
    out["results"] = {v: [{"variant": v, "step_s": [r[v] for r in out["rounds"]],
                           "peak_rss_mb": peaks.get(v)}] for v in variants}  # fmt: skip
    if "grpo" in variants:
        out["ratio"] = {v: ratios(out["rounds"], v, "grpo") for v in variants if v != "grpo"}
    if args.json:
        Path(args.json).write_text(json.dumps(out))


def _print_lockstep(args, out: dict, variants: list[str]) -> None:
    mem_name = "peak GPU memory (MiB)" if args.device == "cuda" else "peak RSS (MB)"
    res = {v: out["results"][v][0] for v in variants}
    print()
    print(f"| variant | median step time (s), range | {mem_name} |")
    print("| --- | --- | --- |")
    for v in variants:
        ts = res[v]["step_s"]
        print(f"| {v} | {statistics.median(ts):.2f} ({min(ts):.2f}-{max(ts):.2f}) "
              f"| {res[v]['peak_rss_mb']:.0f} |")  # fmt: skip
    for v, ratio in out.get("ratio", {}).items():
        per = ", ".join(f"{x:.2f}" for x in ratio["per_round"])
        mem = res[v]["peak_rss_mb"] / res["grpo"]["peak_rss_mb"]
        lo, hi = ratio["range"]
        print(f"ratio {v} / grpo: time median {ratio['median']:.2f}x (range {lo:.2f}-{hi:.2f}; "
              f"per round {per}), peak memory {mem:.2f}x")  # fmt: skip
    print(f"({args.rounds} rounds of single steps in turn after a warm-up round, lockstep)")


def _setup(args) -> tuple[list[str], list[str]]:
    """Config overrides and variants for --device/--model-config/--smoke; builds the model."""
    extra: list[str] = []
    if args.smoke:
        args.model_config = args.model_config or "tiny"
        args.rounds, args.steps = (min(args.rounds, 2) if args.lockstep else 1), 1
        extra += SMOKE_SHAPE
    elif args.device == "cuda":
        args.config = args.config or "gpu/qwen2.5-0.5b.yaml"
        extra += GPU_SHAPE
    if args.model_config:
        sys.path.insert(0, str(Path(__file__).parent))
        from config_models import build_model_dir

        out = Path(args.model_dir or tempfile.mkdtemp(prefix=f"model-{args.model_config}-"))
        tok = Path(args.tokenizer) if args.tokenizer else None
        extra.append(f"model.name={build_model_dir(args.model_config, out, tok)}")
        extra.append("model.dtype=" + ("bfloat16" if args.device == "cuda" else "float32"))
    default = ("grpo", "composer") if args.device == "cuda" or args.smoke else VARIANTS
    variants = args.variants.split(",") if args.variants else list(default)
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        sys.exit(f"unknown variants {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    return extra, variants


if __name__ == "__main__":
    main()
