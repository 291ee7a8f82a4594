"""A/B of the task generator's forwarding check (issue 60): A is the whole-suite split run
alone (``generate.forwardable`` without calling tests, the check before the early exit), B
runs the deletion's failing tests first and the whole suite only if they pass
(``forwardable(..., calling=failing)``, what ``_try`` does now). Same candidates, same
process, interleaved per candidate (A then B, then B then A, ...), so the machine's load
falls on both arms alike; the verdicts must be identical (the tasks kept, and so their hidden
targets, follow from the verdict: the deletion run and the screen are shared code).

Per package: the plan (generate.plan_generation) reuses the baseline of a task set's
``manifest.json`` copied from ``--reuse DIR/<label>/`` (the same settings: 240 s suite
timeout), else runs it; the candidates are those that reached forwarding in that set's
``runs.jsonl`` (status ``task`` or ``not_forwardable``), up to ``--per-class`` of each; each
candidate's deletion runs once (its failing tests feed B). Prints one line per candidate and
the sums per class, with ``uptime`` before and after; exits 1 if a verdict differs.

    PYTHONPATH=src python bench/ab_forward_early_exit.py parse==1.20.2 toolz==1.2.0 \\
        h11==0.16.0 --reuse /tmp/i60/tasks --per-class 4
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from composer_replication.config import TaskGenConfig
from composer_replication.envs.feature_deletion.generate import (
    deletion_outcome,
    forwardable,
    grading_task,
    plan_generation,
    read_runs,
)
from composer_replication.envs.feature_deletion.source import prepare_source


def bench_package(spec: str, cfg: TaskGenConfig, reuse: Path | None, per_class: int,
                  out: Path, index: list[int]) -> list[dict]:  # fmt: skip
    """One line per candidate tried (both arms' seconds and verdicts)."""
    source = prepare_source(spec, cfg)
    before = read_runs(reuse / source.label / "runs.jsonl") if reuse else {}
    if reuse and (reuse / source.label / "manifest.json").exists():
        (out / source.label).mkdir(parents=True, exist_ok=True)
        shutil.copy(reuse / source.label / "manifest.json", out / source.label / "manifest.json")
    plan = plan_generation(source, out, cfg, spec)
    picked, counts = [], {"task": 0, "not_forwardable": 0}
    for cand in plan.candidates:
        status = before.get(cand.key, {}).get("status")
        if status in counts and counts[status] < per_class:
            counts[status] += 1
            picked.append((cand, status))
    rows = []
    for cand, status in picked:
        got = deletion_outcome(plan.box, source, cand, plan.passing, cfg,
                               plan.selections[cand.key])  # fmt: skip
        if got["status"] != "breaks":
            print(f"{cand.key}: {got['status']} this time (was {status}), skipped", flush=True)
            continue
        text = (source.root / cand.file).read_text(encoding="utf-8")
        task = grading_task(cand, cfg, plan.testcode)
        calling = {"A": [], "B": got["failing"]}
        order = "AB" if index[0] % 2 == 0 else "BA"
        index[0] += 1
        res = {}
        for arm in order:
            begin = time.monotonic()
            verdict = forwardable(plan.box, source, task, text, plan.passing, calling[arm])
            res[arm] = (verdict, time.monotonic() - begin)
        row = {"package": source.label, "key": cand.key, "before": status, "order": order,
               "failing": len(got["failing"]), "passing": len(plan.passing),
               "deletion_s": got["seconds"],
               "A_s": round(res["A"][1], 2), "A_ok": res["A"][0][0],
               "B_s": round(res["B"][1], 2), "B_ok": res["B"][0][0],
               "B_whole": res["B"][0][1]}  # fmt: skip
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("specs", nargs="+")
    ap.add_argument("--reuse", type=Path, default=None)
    ap.add_argument("--per-class", type=int, default=4)
    ap.add_argument("--suite-timeout-s", type=float, default=240)
    ap.add_argument("--out", type=Path, default=None, help="JSON lines of every candidate")
    args = ap.parse_args()
    cfg = TaskGenConfig(workers=1, suite_timeout_s=args.suite_timeout_s)
    print("uptime before:", subprocess.run(["uptime"], capture_output=True, text=True).stdout,
          flush=True)  # fmt: skip
    start, rows, index = time.monotonic(), [], [0]
    with tempfile.TemporaryDirectory(prefix="cr-ab-forward-") as tmp:
        for spec in args.specs:
            rows += bench_package(spec, cfg, args.reuse, args.per_class, Path(tmp), index)
    print("uptime after:", subprocess.run(["uptime"], capture_output=True, text=True).stdout)
    if args.out:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for cls in ("not_forwardable", "task"):
        sel = [r for r in rows if (r["A_ok"] is False) == (cls == "not_forwardable")]
        a, b = sum(r["A_s"] for r in sel), sum(r["B_s"] for r in sel)
        print(f"{cls} by A: {len(sel)} candidates, A {a:.1f} s, B {b:.1f} s"
              + (f" (B/A {b / a:.2f})" if a else ""))  # fmt: skip
    a, b = sum(r["A_s"] for r in rows), sum(r["B_s"] for r in rows)
    same = all(r["A_ok"] == r["B_ok"] for r in rows)
    print(f"all: {len(rows)} candidates, A {a:.1f} s, B {b:.1f} s, verdicts identical: {same}; "
          f"bench wall {time.monotonic() - start:.0f} s")  # fmt: skip
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
