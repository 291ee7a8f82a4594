"""Feature Deletion throughput: task generation (tasks and candidates per minute, a fresh
generation of one source into a temporary directory) and grading (gradings per second of
restored and of deleted bodies), with the cost of our pinned, sandboxed, per-test-report
grading against a plain ``python -m pytest`` subprocess on the same staged tree (no isolation,
verdict = exit code), interleaved round by round; medians and ratios from the same run.

    python bench/bench_feature_deletion.py                       # toolz 1.2.0 (pip download)
    python bench/bench_feature_deletion.py --source tests/fixtures/feature_deletion/textkit
    python bench/bench_feature_deletion.py --task-set DIR   # grading only, on a generated set
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from composer_replication.config import TaskGenConfig
from composer_replication.envs.feature_deletion.candidates import original_body
from composer_replication.envs.feature_deletion.generate import (
    generate_tasks,
    load_tasks,
    suite_sandbox,
)
from composer_replication.envs.feature_deletion.grade import grade_submission
from composer_replication.envs.feature_deletion.source import resolve_source, staged_copy
from composer_replication.envs.feature_deletion.workspace import candidate_of, task_state_text
from composer_replication.sandbox.sandbox import Sandbox


def _plain_pytest(root: Path, task: dict, text: str) -> bool:
    repo = staged_copy(root, {task["file"]: text}, prefix="cr-bench-plain-")
    try:
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x"]
        return subprocess.run(cmd, cwd=repo, capture_output=True, timeout=300).returncode == 0
    finally:
        shutil.rmtree(repo, ignore_errors=True)


def _generate(source, cfg: TaskGenConfig, spec: str) -> list[dict]:
    """A fresh generation into a temporary directory, timed; returns its tasks."""
    with tempfile.TemporaryDirectory() as out:
        summary = generate_tasks(source, Path(out), cfg, spec=spec)
        tasks = load_tasks(summary.out_dir)
    minutes = summary.seconds / 60
    print(f"generation of {source.label}: {summary.candidates} candidates, {summary.tasks} tasks "
          f"in {summary.seconds:.0f} s = {summary.tasks / minutes:.1f} tasks/min, "
          f"{summary.candidates / minutes:.1f} candidates/min ({cfg.workers or 'all'} workers); "
          f"by status {summary.by_status}")  # fmt: skip
    return tasks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", default="toolz==1.2.0")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=8, help="tasks graded per round")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument(
        "--task-set",
        type=Path,
        help="grade tasks of this generated set of --source (skips generation)",
    )
    ns = ap.parse_args()
    source = resolve_source(ns.source)
    cfg = TaskGenConfig(workers=ns.workers)
    tasks = load_tasks(ns.task_set) if ns.task_set else _generate(source, cfg, ns.source)
    box = Sandbox(suite_sandbox(cfg))
    picked = tasks[: ns.tasks]
    restored = []
    for t in picked:
        text = (source.root / t["file"]).read_text()
        body = original_body(text, candidate_of(t))
        restored.append(task_state_text(source.root, t).replace(
            t["indent"] + "raise NotImplementedError  # deleted: rebuild this", body, 1))  # fmt: skip
    variants = {
        "plain pytest subprocess (no isolation, exit code)": lambda: [
            _plain_pytest(source.root, t, x) for t, x in zip(picked, restored, strict=True)
        ],
        "ours: sandboxed, pinned, per-test report": lambda: [
            grade_submission(box, source.root, t, x).passed
            for t, x in zip(picked, restored, strict=True)
        ],
    }
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(ns.rounds):
        for name, run in variants.items():
            start = time.perf_counter()
            verdicts = run()
            times[name].append((time.perf_counter() - start) / len(picked))
            assert all(verdicts), f"{name}: a restored body did not pass"
    base = statistics.median(times[next(iter(variants))])
    print(f"\ngrading {len(picked)} restored bodies x {ns.rounds} rounds (median s/grading):")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:52s} {med:6.3f} s  {1 / med:5.2f}/s  ratio {med / base:4.2f}x")


if __name__ == "__main__":
    main()
