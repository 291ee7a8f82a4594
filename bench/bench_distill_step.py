"""What the on-policy distillation channel costs per optimizer step, measured under control:
``grpo`` and ``grpo+distill`` of issue 38's regime (a) (``configs/evidence/distill_a.yaml``:
the quickstart task, its base overrides and each arm's overrides and learning rate), single
steps in turn (grpo, grpo+distill, grpo, ...; bench/lockstep.py), each arm in its own
long-lived process from the same seed (the same first rollouts), so the machine's load,
which changes from minute to minute here, slows adjacent steps alike. The teachers' scoring is
timed apart by the channel itself (``distill/teacher_forward_s`` in ``metrics.jsonl``).

A step's time is measured around the step (generation, teacher scoring, forward, backward and
optimizer; evaluations and logging excluded). Round 0 warms up and is dropped; each later round
gives the ratio of its two steps, and the table gives the median ratio over the rounds and its
range.

    python bench/bench_distill_step.py                          # 8 rounds
    python bench/bench_distill_step.py --rounds 12 --json out.json
    python bench/bench_distill_step.py --teacher runs/distill_teacher/final   # the study's teacher
    python bench/bench_distill_step.py --smoke                  # tiny model, 2 rounds

Without ``--teacher`` the teacher is a frozen copy of the untrained student
(``allow_student_weights: true``): the same architecture, size and dtype as the study's teacher
(it was the same 135M model trained 40 steps), so its forward costs the same; what it says does
not matter for the time, only the completions' lengths do, and those come from the student.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from lockstep import ratios, run_rounds, turn_callback  # noqa: E402 - bench/lockstep.py

ARMS = ("grpo", "grpo+distill")
STUDY = "configs/evidence/distill_a.yaml"
SMOKE = [
    "generation.prompts_per_step=2",
    "generation.num_generations=2",
    "generation.max_completion_length=8",
]


def arm_overrides(arm: str, teacher: str | None, study: str = STUDY) -> tuple[str, list[str]]:
    """``(base_config, overrides)`` of ``arm`` in ``study``, its teacher replaced by ``teacher``
    (default: a frozen copy of the student)."""
    from composer_replication.config.ablation import load_ablation_config

    acfg = load_ablation_config(REPO / study)
    spec = next(a for a in acfg.arms if a.name == arm)
    kept = [o for o in spec.overrides if not o.startswith("distill.teachers=")]
    if len(kept) < len(spec.overrides):
        model = teacher or "{student}"
        flag = "" if teacher else ", allow_student_weights: true"
        kept.append(f"distill.teachers=[{{name: teacher, model: '{model}'{flag}}}]")
    return acfg.base_config, [*acfg.base_overrides, *kept]


def worker(arm: str, steps: int, seed: int, teacher: str | None, extra: list[str]) -> dict:
    from composer_replication.config import load_config, resolve_config_path
    from composer_replication.run.train import build_trainer, prepare
    from composer_replication.trainer.callbacks import read_metrics

    base, overrides = arm_overrides(arm, teacher)
    out = Path(tempfile.mkdtemp(prefix="bench-distill-step-")) / "run"
    run = [f"output_dir={out}", f"max_steps={steps}", f"seed={seed}",
           "eval.before_and_after=false", "save_steps=100000", *extra]  # fmt: skip
    student = load_config(resolve_config_path(base), run).model.name
    overrides = [o.replace("{student}", student) for o in overrides]  # default teacher
    cfg = load_config(resolve_config_path(base), [*overrides, *run])
    model, tokenizer, env = prepare(cfg)
    trainer = build_trainer(cfg, model, tokenizer, env)
    trainer.args.save_strategy = "no"
    times: list[float] = []
    trainer.add_callback(turn_callback(times))
    trainer.train()
    rows = read_metrics(out / "metrics.jsonl")
    return {"arm": arm, "step_s": times,
            "teacher_s": [r.get("distill/teacher_forward_s") for r in rows]}  # fmt: skip


def summarize(rounds: list[dict[str, float]], results: dict[str, dict]) -> dict:
    """Median step per arm over the kept rounds; per round ``grpo+distill / grpo``, its median
    and range; the teachers' median seconds per step and the rest of the extra time."""
    med = {a: statistics.median(r[a] for r in rounds) for a in ARMS}
    teacher = results["grpo+distill"]["teacher_s"][1:]  # row 0 is the warm-up step
    t = statistics.median(teacher)
    return {
        "median_step_s": med,
        "ratio": ratios(rounds, "grpo+distill", "grpo"),
        "teacher_forward_s": teacher,
        "teacher_forward_s_median": t,
        "rest_of_extra_s": med["grpo+distill"] - med["grpo"] - t,
    }


def print_table(summary: dict, rounds: int) -> None:
    med, t, ratio = summary["median_step_s"], summary["teacher_forward_s_median"], summary["ratio"]
    print()
    print("| arm | median step time (s) | of which teacher scoring (s) |")
    print("| --- | --- | --- |")
    print(f"| grpo | {med['grpo']:.2f} | - |")
    print(f"| grpo+distill | {med['grpo+distill']:.2f} | {t:.2f} |")
    lo, hi = ratio["range"]
    per_round = ", ".join(f"{x:.2f}" for x in ratio["per_round"])
    print(f"ratio grpo+distill / grpo per step: median {ratio['median']:.2f}x over {rounds} "
          f"rounds of single steps in turn (range {lo:.2f}-{hi:.2f}; per round {per_round})")  # fmt: skip
    print(f"extra per step: teacher scoring {t:.2f} s, the rest (student side) "
          f"{summary['rest_of_extra_s']:.2f} s")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1, help="the study's first table seed")
    ap.add_argument("--teacher", default=None, help="teacher model (default: the student's copy)")
    ap.add_argument("--smoke", action="store_true", help="tiny model and batch, 2 rounds")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--worker", choices=list(ARMS), help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--extra", action="append", default=[], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        res = worker(args.worker, args.steps, args.seed, args.teacher, args.extra)
        print("RESULT " + json.dumps(res), flush=True)
        return
    extra = _smoke_setup(args) if args.smoke else []
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error", "CUDA_VISIBLE_DEVICES": ""}
    commands = {arm: [sys.executable, __file__, "--worker", arm, "--steps", str(args.rounds + 1),
                      "--seed", str(args.seed),
                      *(["--teacher", args.teacher] if args.teacher else []),
                      *(f"--extra={x}" for x in extra)] for arm in ARMS}  # fmt: skip
    kept: list[dict[str, float]] = []

    def on_round(r: int, times: dict[str, float]) -> None:
        kept.append(times)
        print(f"round {r}/{args.rounds}: " + ", ".join(f"{a} {t:.2f} s" for a, t in times.items()),
              flush=True)  # fmt: skip
        if args.json:  # after every round: a run cut short keeps what it measured
            Path(args.json).write_text(json.dumps({"args": vars(args), "rounds": kept}))

    rounds, results = run_rounds(commands, args.rounds, env, on_round, cwd=str(REPO))
    summary = summarize(rounds, results)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rounds": rounds,
                                               "summary": summary}))  # fmt: skip
    print_table(summary, args.rounds)


def _smoke_setup(args) -> list[str]:
    """A tiny random model of the embedded tokenizer, 2 rounds."""
    from config_models import build_model_dir

    args.rounds = min(args.rounds, 2)
    model = build_model_dir("tiny", Path(tempfile.mkdtemp(prefix="model-tiny-")), None)
    return [*SMOKE, f"model.name={model}"]


if __name__ == "__main__":
    main()
