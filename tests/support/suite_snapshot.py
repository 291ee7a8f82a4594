"""Counts of a suite run still in progress (docs/feature_deletion.md, "The suite of issue 60,
measured again"), from each package's ``runs.jsonl`` and the run's log: candidates tried,
tasks, tasks with a hidden target (``generate.hidden_split``, as the generator computes them
when a package ends), the median target tests per task, the refusals by reason.

    PYTHONPATH=src python -m tests.support.suite_snapshot /tmp/i60_run/tasks /tmp/i60_run/log

prints a markdown table."""

from __future__ import annotations

import json
import re
import statistics
import sys
from collections import Counter
from pathlib import Path

from composer_replication.config import TaskGenConfig
from composer_replication.envs.feature_deletion.generate import hidden_split, read_runs
from composer_replication.envs.feature_deletion.source import resolve_source
from composer_replication.envs.feature_deletion.testcode import TestCode


def snapshot(out: Path, log_text: str) -> list[str]:
    """The table's lines (header, one row per package directory, the total)."""
    known = dict(re.findall(r"^(\S+): baseline passed, (\d+) candidates", log_text, re.M))
    ended = set(re.findall(r"^(\S+): done in ", log_text, re.M))
    refused = dict(re.findall(r"^(\S+): refused after [^:]*: (.*)$", log_text, re.M))
    visible = TaskGenConfig().visible_tests
    lines = ["| package | candidates | tried | tasks | with hidden targets | median target tests "
             "per task | refused candidates by reason |", "| --- | ---: | ---: | ---: | ---: | "
             "---: | --- |"]  # fmt: skip
    total, refusals = Counter(), Counter()
    for pkg in sorted(p for p in Path(out).iterdir() if p.is_dir()):
        name = pkg.name
        if name in refused or not (pkg / "runs.jsonl").exists():
            why = refused.get(name, "baseline not finished")[:200]
            lines.append(f"| {name} | - | - | - | - | - | {why} |")
            continue
        manifest = json.loads((pkg / "manifest.json").read_text())
        testcode = TestCode(**manifest["baseline"]["testcode"])
        root = resolve_source(manifest["source"]["spec"]).root
        runs = read_runs(pkg / "runs.jsonl")
        status = Counter(r["status"] for r in runs.values())
        tasks = [r for r in runs.values() if r["status"] == "task"]

        def read(rel: str, root: Path = root) -> str:
            return (root / rel).read_text(encoding="utf-8")

        hidden = sum(bool(hidden_split(read, r["failing"], visible, testcode)[1]) for r in tasks)
        median = statistics.median([len(r["failing"]) for r in tasks]) if tasks else 0
        why = ", ".join(f"{k} {v}" for k, v in sorted(status.items()) if k != "task")
        n = int(known.get(name, 0))
        tried = f"{len(runs)}" + ("" if name in ended else " (running)")
        lines.append(f"| {name} | {n} | {tried} | {len(tasks)} | {hidden} | {median:g} | {why} |")
        total.update(candidates=n, tried=len(runs), tasks=len(tasks), hidden=hidden)
        refusals.update({k: v for k, v in status.items() if k != "task"})
    why = ", ".join(f"{k} {v}" for k, v in sorted(refusals.items()))
    lines.append(f"| **total** | {total['candidates']} | {total['tried']} | **{total['tasks']}** "
                 f"| **{total['hidden']}** | | {why} |")  # fmt: skip
    return lines


if __name__ == "__main__":
    print("\n".join(snapshot(Path(sys.argv[1]), Path(sys.argv[2]).read_text(errors="replace"))))
