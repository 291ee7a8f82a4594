"""What the off-policy correction buys: the quickstart (configs/quickstart.yaml: SmolLM2-135M-
Instruct, arithmetic) on ``rollout.engine: ray`` with workers forced to generate with exactly k
steps old weights (``rollout.force_staleness``), at the same number of samples per arm:

    fresh        force_staleness=0, correction on (at staleness 0 the weight is 1 up to rounding)
    stale4       force_staleness=4, correction on (``min(pi_old / pi_behav, C)``, C = 2)
    stale4-off   force_staleness=4, ``rollout.correction=false`` (the weight fixed at 1)

Runs go seed-major (seed 0: each arm, then seed 1, ...), so a change in the machine's load
falls on all arms alike. Each run evaluates the greedy held-out pass rate every
``--eval-every`` steps and at its last step (``heldout.jsonl`` in its run dir; step 0 is the
base model, evaluated once after the runs: greedy decoding makes it the same for every arm and
seed; ``--no-base`` skips it), and
keeps TRL's and the engine's per-step metrics (``metrics.jsonl``: ``rollout/ratio_*``,
``rollout/staleness_*``, ``clip_ratio/*``). The script then writes a table (``study.md``), the
rows behind it (``study.json``) and a plot of held-out score vs step per arm (mean and each
seed) into ``--out``, the plot also to ``--plot``. A finished run (its ``done.json``) is reused,
so an interrupted study continues where it stopped.

    nice -n 10 python bench/bench_staleness.py --seeds 3 --steps 40
    nice -n 10 python bench/bench_staleness.py --seeds 3 --steps 20 --eval-every 5

Ray's workers run at the niceness of this process (``RAY_worker_niceness=0``; Ray's default,
15 more, starves them on a shared machine and times the workers, not the engine).

Not a test: it trains 3 x seeds quickstart runs (tens of minutes each on 2 CPU cores)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src")]
os.environ.setdefault("RAY_worker_niceness", "0")  # read by the raylet a local Ray starts

from transformers import TrainerCallback  # noqa: E402

from composer_replication.config import load_config  # noqa: E402
from composer_replication.run import train  # noqa: E402

ARMS: dict[str, list[str]] = {
    "fresh": ["rollout.force_staleness=0"],
    "stale4": ["rollout.force_staleness=4"],
    "stale4-off": ["rollout.force_staleness=4", "rollout.correction=false"],
}
"""Each arm's overrides on top of the quickstart and :func:`base_overrides`."""

RATIO_KEYS = (
    "rollout/staleness_mean",
    "rollout/ratio_lag0_mean",
    "rollout/ratio_lag0_max_dev",
    "rollout/ratio_lag0_above_cap",
    "rollout/ratio_stale_mean",
    "rollout/ratio_stale_max_dev",
    "rollout/ratio_stale_above_cap",
    "sampling/importance_sampling_ratio/mean",
    "clip_ratio/region_mean",
    "rollout/wait_s",
    "rollout/weight_sync_s",
    "step_time",
)
"""Per-step metrics summarised per run (mean over the steps that log them)."""


def base_overrides(a: argparse.Namespace) -> list[str]:
    return [
        "rollout.engine=ray", f"ray.num_workers={a.workers}", "rollout.max_staleness=4",
        f"max_steps={a.steps}", "eval.before_and_after=false", f"eval.n={a.eval_n}",
        "ray.timeout_s=1800",
        # force_staleness=4 keeps 6 weight versions (0.54 GB each in float32) in the store
        "ray.object_store_gb=4",
    ]  # fmt: skip


class PeriodicHeldout(TrainerCallback):
    """Greedy held-out pass rate every ``every`` steps and at the last, to ``heldout.jsonl``
    (the project's format, trainer/callbacks.py ``HELDOUT_FILE``); no step-0 row (the base
    model's score is evaluated once for the study)."""

    def __init__(self, path: Path, env, cfg, every: int):
        self.path, self.env, self.cfg, self.every = path, env, cfg, every

    def on_step_end(self, args, state, control, model=None, processing_class=None, **kw):
        step = state.global_step
        if step % self.every and step != state.max_steps:
            return
        row = evaluate(model, processing_class, self.env, self.cfg, step)
        with self.path.open("a") as fh:
            fh.write(json.dumps(row) + "\n")


def evaluate(model, tokenizer, env, cfg, step: int) -> dict[str, Any]:
    from composer_replication.evaluation import evaluate as run_eval

    was_training = model.training
    e = cfg.eval
    res = run_eval(model, tokenizer, env, e.split, e.n, e.max_new_tokens, e.batch_size)
    model.train(was_training)
    lo, hi = res.pass_ci()
    return {"step": step, "pass_rate": res.pass_rate, "ci95_low": lo, "ci95_high": hi,
            "n": res.n}  # fmt: skip


def run_arm(a: argparse.Namespace, arm: str, seed: int) -> dict[str, Any]:
    out = Path(a.out) / f"{arm}_s{seed}"
    done = out / "done.json"
    if done.is_file():
        print(f"{arm} seed {seed}: reusing {done}", flush=True)
        return json.loads(done.read_text())
    cfg = load_config(
        REPO / "configs/quickstart.yaml",
        [*base_overrides(a), *ARMS[arm], f"seed={seed}", f"output_dir={out}"],
    )
    out.mkdir(parents=True, exist_ok=True)
    heldout = out / "heldout.jsonl"
    heldout.write_text("")
    env = train.build_env(cfg)
    t0 = time.monotonic()
    print(f"{arm} seed {seed}: training {a.steps} steps -> {out}", flush=True)
    train.run_training(cfg, extra_callbacks=[PeriodicHeldout(heldout, env, cfg, a.eval_every)])
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "step_time" in r]
    summary = {
        k: statistics.fmean(r[k] for r in steps if k in r)
        for k in RATIO_KEYS
        if any(k in r for r in steps)
    }
    curve = [json.loads(x) for x in heldout.read_text().splitlines()]
    result = {
        "arm": arm, "seed": seed, "steps": a.steps, "wall_s": time.monotonic() - t0,
        "heldout": curve, "final": curve[-1]["pass_rate"], "metrics": summary,
        "reward_mean": statistics.fmean(r["reward"] for r in steps if r.get("reward") is not None),
    }  # fmt: skip
    done.write_text(json.dumps(result, indent=1))
    print(f"{arm} seed {seed}: held-out {result['final']:.3f} at step {a.steps} "
          f"({result['wall_s'] / 60:.1f} min)", flush=True)  # fmt: skip
    return result


def base_score(a: argparse.Namespace) -> dict[str, Any]:
    """The base model's greedy held-out score (step 0 of every curve)."""
    path = Path(a.out) / "base.json"
    if path.is_file():
        return json.loads(path.read_text())
    from composer_replication.lm.models import load_model, load_tokenizer

    cfg = load_config(REPO / "configs/quickstart.yaml", [*base_overrides(a), "seed=0"])
    env = train.build_env(cfg)
    tokenizer = load_tokenizer(cfg.model.name)
    model = load_model(cfg.model.name, cfg.model.dtype)
    row = evaluate(model, tokenizer, env, cfg, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(row))
    return row


def report(
    a: argparse.Namespace, base: dict[str, Any] | None, results: list[dict[str, Any]]
) -> str:
    arms = [x for x in ARMS if any(r["arm"] == x for r in results)]
    seeds = sorted({r["seed"] for r in results})
    by = {(r["arm"], r["seed"]): r for r in results}
    lines = [
        f"Held-out greedy pass rate (n = {results[0]['heldout'][-1]['n'] if results else a.eval_n})"
        f" at step {a.steps}; base model "
        + (f"{base['pass_rate']:.3f}." if base else "not evaluated."),
        "",
        "| arm | " + " | ".join(f"seed {s}" for s in seeds) + " | mean |",
        "| --- |" + " --- |" * (len(seeds) + 1),
    ]
    for arm in arms:
        vals = [by[(arm, s)]["final"] if (arm, s) in by else None for s in seeds]
        got = [v for v in vals if v is not None]
        mean = f"{statistics.fmean(got):.3f}" if len(got) == len(seeds) else "incomplete"
        cells = " | ".join("-" if v is None else f"{v:.3f}" for v in vals)
        lines.append(f"| {arm} | {cells} | {mean} |")
    lines += ["", "Per-step metrics, mean over steps and seeds:", ""]
    keys = [k for k in RATIO_KEYS if any(k in r["metrics"] for r in results)]
    lines.append("| arm | " + " | ".join(f"`{k}`" for k in keys) + " |")
    lines.append("| --- |" + " --- |" * len(keys))
    for arm in arms:
        cells = []
        for k in keys:
            vals = [r["metrics"][k] for r in results if r["arm"] == arm and k in r["metrics"]]
            cells.append(f"{statistics.fmean(vals):.4g}" if vals else "-")
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(a: argparse.Namespace, base: dict[str, Any] | None, results: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, arm in enumerate(x for x in ARMS if any(r["arm"] == x for r in results)):
        color = f"C{i}"
        runs = [r for r in results if r["arm"] == arm]
        curves = []
        for r in runs:
            pts = [(0, base["pass_rate"])] if base else []
            pts += [(p["step"], p["pass_rate"]) for p in r["heldout"]]
            xs, ys = zip(*pts, strict=True)
            ax.plot(xs, ys, color=color, alpha=0.3, lw=1)
            curves.append(dict(pts))
        steps = sorted(set.intersection(*(set(c) for c in curves)))
        mean = [statistics.fmean(c[s] for c in curves) for s in steps]
        ax.plot(steps, mean, color=color, lw=2.2, marker="o", label=f"{arm} (mean of {len(runs)})")
    ax.set_xlabel("optimizer step (same samples per step in every arm)")
    ax.set_ylabel("held-out greedy pass rate")
    ax.set_title("Quickstart on the Ray engine: forced staleness, correction on/off")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    for path in (Path(a.out) / "study.png", Path(a.plot)):
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40, help="optimizer steps of every run")
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--eval-n", type=int, default=200)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument(
        "--arms", default=",".join(ARMS), help="comma-separated subset of " + ", ".join(ARMS)
    )
    ap.add_argument("--out", default="runs/staleness_study")
    ap.add_argument("--plot", default=str(REPO / "docs/staleness_study.png"))
    ap.add_argument("--report-only", action="store_true", help="tables and plot of finished runs")
    ap.add_argument("--no-base", dest="base", action="store_false",
                    help="skip the base model's evaluation (step 0 of the curves)")  # fmt: skip
    a = ap.parse_args()
    arms = a.arms.split(",")
    unknown = set(arms) - set(ARMS)
    if unknown:
        ap.error(f"unknown arms {sorted(unknown)}; known: {list(ARMS)}")
    results = []
    for seed in range(a.seeds):
        for arm in arms:
            if a.report_only:
                done = Path(a.out) / f"{arm}_s{seed}" / "done.json"
                if done.is_file():
                    results.append(json.loads(done.read_text()))
                continue
            results.append(run_arm(a, arm, seed))
    results = [r for r in results if r["steps"] == a.steps]
    base = base_score(a) if a.base else None  # after the runs: they matter more
    if base is not None:
        print(f"base model: held-out {base['pass_rate']:.3f}", flush=True)
    text = report(a, base, results)
    Path(a.out, "study.md").write_text(text + "\n")
    Path(a.out, "study.json").write_text(json.dumps({"base": base, "runs": results}, indent=1))
    if results:
        plot(a, base, results)
    print(text)


if __name__ == "__main__":
    main()
