"""A task suite in one command: ``composer-replication tasks generate SPECS.txt --out DIR``
generates every source a file lists (one spec a line: ``name==version`` or a directory;
``#`` starts a comment), all at once in one process:

* one cache: sdists are fetched once into ``<cache>/feature_deletion/src`` (source.py), each
  package's candidate runs are in its own ``DIR/<name>-<version>/runs.jsonl``, so a re-run
  (or a run killed half-way) continues where it stopped;
* one worker pool: every package's candidates go through this process's sandbox slots
  (sandbox.SLOTS, set to ``--workers``), so a package still in its baseline runs while
  another's candidates fill the other slots; when more steps wait than slots are free, a
  free slot goes to the package with the best estimated yield of tasks with hidden targets
  per slot-second (schedule.YieldScheduler), not first come, first served;
* a package that cannot be used (an sdist that does not exist, a suite that fails untouched,
  a package that shadows the test tools) is reported with its reason and the others go on.

``DIR/suite.json`` keeps the per-package summary (candidates, tasks, tasks with hidden
targets, tests per task, why candidates were refused). While it runs, ``note(text)`` gets one
line per package when its candidates are known (its baseline passed) and when it is done or
refused, so a log of an hour's run shows which packages are still going.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from composer_replication.config import TaskGenConfig
from composer_replication.config.base import UserError
from composer_replication.envs.feature_deletion.generate import generate_tasks, load_tasks
from composer_replication.envs.feature_deletion.schedule import PackageShare, YieldScheduler
from composer_replication.envs.feature_deletion.source import prepare_source
from composer_replication.lm.models import write_atomic
from composer_replication.progress import duration
from composer_replication.sandbox.sandbox import SLOTS, set_sandbox_slots

SPEC_LINE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9][A-Za-z0-9.+!_-]*$")
"""A pinned package (source.resolve_source checks it again)."""


class SuiteError(UserError, ValueError):
    """A specs file that cannot be read as a list of sources."""


@dataclass
class PackageRow:
    """One source of a suite, as generated (or refused)."""

    spec: str
    label: str = ""
    candidates: int = 0
    reused: int = 0
    """Candidates whose run was already in the package's ``runs.jsonl`` (not run again)."""
    tasks: int = 0
    hidden_targets: int = 0
    """Tasks with at least one hidden target test."""
    tests_per_task: float = 0.0
    """Median target tests (failing with the feature deleted) per task."""
    refused: dict[str, int] = field(default_factory=dict)
    """Candidates that are no task, by reason (generate.py's statuses)."""
    error: str = ""
    """Why the whole package was refused ('' if it was generated)."""
    seconds: float = 0.0
    left: int = 0
    """Candidates not tried because the suite's time limit passed (a re-run tries them)."""
    slot_seconds: float = 0.0
    """Sandbox slot-seconds its candidates' steps held in this run (schedule.py)."""
    yield_per_ks: float = 0.0
    """The scheduler's last estimate of its tasks with hidden targets per 1000 slot-seconds
    (schedule.PackageShare.rate, reused runs included)."""


def read_specs(path: Path) -> list[str]:
    """The sources a specs file lists, in order; a one-line error naming the line of a spec
    that is neither a directory nor ``name==version``, or that repeats another."""
    specs: dict[str, int] = {}
    for n, raw in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        spec = raw.split("#", 1)[0].strip()
        if not spec:
            continue
        if not (SPEC_LINE.match(spec) or Path(spec).expanduser().is_dir()):
            raise SuiteError(f"{path}:{n}: {spec!r} is neither a directory nor a pinned "
                             "package (`toolz==1.2.0`)")  # fmt: skip
        if spec in specs:
            raise SuiteError(f"{path}:{n}: {spec!r} repeats line {specs[spec]}")
        specs[spec] = n
    if not specs:
        raise SuiteError(f"{path}: no source listed")
    return list(specs)


def generate_suite(
    specs: list[str],
    out: Path,
    cfg: TaskGenConfig,
    progress: Callable[..., None] | None = None,
    on_total: Callable[[int], None] | None = None,
    note: Callable[[str], None] | None = None,
) -> list[PackageRow]:
    """Generate every source of ``specs`` under ``out`` (module docstring); ``on_total(n)``
    is called as each package's candidates are known (n: the running total); ``note(text)``
    gets a line per package as its candidates are known and as it ends (:func:`row_line`)."""
    totals: list[int] = []

    def total(n: int) -> None:
        totals.append(n)
        if on_total is not None:
            on_total(sum(totals))

    # one limit for the whole suite: no package starts a candidate run after it
    deadline = None if cfg.time_limit_s is None else time.monotonic() + cfg.time_limit_s
    before = SLOTS.limit
    set_sandbox_slots(cfg.workers)  # 0: from the cores and memory
    scheduler = YieldScheduler(SLOTS)
    try:
        with ThreadPoolExecutor(len(specs)) as packages:

            def one(spec: str) -> PackageRow:
                return _package(spec, out, cfg, progress, total, note, deadline,
                                scheduler.share(spec))  # fmt: skip

            rows = list(packages.map(one, specs))
    finally:
        set_sandbox_slots(before)
    write_atomic(Path(out) / "suite.json",
                 json.dumps([asdict(r) for r in rows], indent=1) + "\n")  # fmt: skip
    return rows


def row_line(row: PackageRow) -> str:
    """One log line for a package that is done: its counts, or why it was refused."""
    name = row.label or row.spec
    if row.error:
        return f"{name}: refused after {duration(row.seconds)}: {row.error[:300]}"
    left = f" ({row.left} not tried: the time limit passed)" if row.left else ""
    slots = (f"; {row.slot_seconds:.0f} slot-s (the scheduler's last estimate: "
             f"{row.yield_per_ks:.1f} with hidden targets per 1000 slot-s)"
             if row.slot_seconds else "")  # fmt: skip
    return (f"{name}: done in {duration(row.seconds)}: {row.tasks} tasks "
            f"({row.hidden_targets} with hidden targets) of {row.candidates} candidates"
            f"{left}{slots}")  # fmt: skip


def _package(spec: str, out: Path, cfg: TaskGenConfig, progress, on_total, note,
             deadline: float | None = None,
             share: PackageShare | None = None) -> PackageRow:  # fmt: skip
    start, row = time.monotonic(), PackageRow(spec)
    say = note or (lambda text: None)

    def known(n: int) -> None:
        say(f"{row.label}: baseline passed, {n} candidates "
            f"(after {duration(time.monotonic() - start)})")  # fmt: skip
        on_total(n)

    try:
        tree = prepare_source(spec, cfg)
        row.label = tree.label
        summary = generate_tasks(tree, out, cfg, spec=spec, progress=progress, on_total=known,
                                 deadline=deadline, share=share)  # fmt: skip
        tasks = load_tasks(summary.out_dir)
    except UserError as e:
        row.error = " ".join(str(e).split())[:500]
        row.seconds = round(time.monotonic() - start, 1)
        say(row_line(row))
        return row
    row.candidates, row.reused, row.tasks = summary.candidates, summary.reused, len(tasks)
    row.left = summary.left
    row.hidden_targets = sum(bool(t.get("hidden_tests")) for t in tasks)
    row.tests_per_task = statistics.median([len(t["failing_tests"]) for t in tasks] or [0])
    row.refused = {k: v for k, v in sorted(summary.by_status.items()) if k != "task"}
    if share is not None:
        row.slot_seconds = round(share.run_seconds, 1)
        row.yield_per_ks = round(1000 * share.rate(), 2)
    row.seconds = round(time.monotonic() - start, 1)
    say(row_line(row))
    return row
