"""Test selection against the whole suite, candidate by candidate: each deletion's outcome
(generate.deletion_outcome: status before forwarding, failing tests) from the tests its
selection names (selection.py) and from the whole suite. Forwarding and the triviality screen
depend only on the failing tests, so equal outcomes mean the same task set and statuses.

    PYTHONPATH=src python -m tests.support.selection_check inflection==0.5.1 --out DIR \\
        [--max-candidates N] [--workers 4]

writes ``DIR/selection_check.json`` and prints the differences and the runs' time."""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from composer_replication.config import TaskGenConfig
from composer_replication.envs.feature_deletion.generate import deletion_outcome, plan_generation
from composer_replication.envs.feature_deletion.source import prepare_source
from composer_replication.sandbox.sandbox import set_sandbox_slots


def compare_selection(source, out: Path, cfg: TaskGenConfig, spec: str = "") -> list[dict]:
    """One row per candidate: ``selected`` (None: the whole suite; 0: no run, no_failure),
    ``same`` (equal status and failing tests), both outcomes and their seconds."""
    plan = plan_generation(source, out, cfg, spec)

    def one(cand) -> dict:
        sel = plan.selections[cand.key]
        whole = deletion_outcome(plan.box, source, cand, plan.passing, cfg, None)
        if sel is None:
            part = whole
        elif not sel:
            part = {"status": "no_failure", "failing": [], "seconds": 0.0, "whole": False}
        else:
            part = deletion_outcome(plan.box, source, cand, plan.passing, cfg, sel)
        same = (part["status"], part["failing"]) == (whole["status"], whole["failing"])
        return {"key": cand.key, "selected": None if sel is None else len(sel),
                "passing": len(plan.passing), "same": same, "whole": whole, "part": part}  # fmt: skip

    with ThreadPoolExecutor(max(1, cfg.workers)) as pool:
        return list(pool.map(one, plan.candidates))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("spec")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--max-candidates", type=int, default=None)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--suite-timeout-s", type=float, default=240.0)
    args = ap.parse_args()
    cfg = TaskGenConfig(workers=args.workers, max_candidates=args.max_candidates,
                        suite_timeout_s=args.suite_timeout_s)  # fmt: skip
    set_sandbox_slots(args.workers)
    rows = compare_selection(prepare_source(args.spec, cfg), args.out, cfg, args.spec)
    (args.out / "selection_check.json").write_text(json.dumps(rows, indent=1) + "\n")
    whole_s = sum(r["whole"]["seconds"] for r in rows)
    part_s = sum(r["part"]["seconds"] for r in rows)
    print(f"{args.spec}: {len(rows)} candidates, {sum(r['same'] for r in rows)} same, "
          f"{sum(r['selected'] == 0 for r in rows)} not run, "
          f"{sum(r['selected'] is None for r in rows)} whole suite; "
          f"run seconds whole {whole_s:.0f}, selected {part_s:.0f}")  # fmt: skip
    for r in rows:
        if not r["same"]:
            print("DIFF", r["key"], r["selected"], r["whole"]["status"], r["part"]["status"],
                  sorted(set(r["whole"]["failing"]) ^ set(r["part"]["failing"]))[:5])  # fmt: skip


if __name__ == "__main__":
    main()
