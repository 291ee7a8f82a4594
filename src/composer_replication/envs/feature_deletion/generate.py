"""The Feature Deletion task generator: delete one function at a time from a tree whose tests
pass, run the suite in the sandbox, and keep the deletions that break some tests but not too
many and leave the suite collectable, and whose original code passes the suite under split
grading (the way submissions are graded, grade.split_run; else ``not_forwardable``).

Output (``<out>/<name>-<version>/``, a versioned task set):

* ``manifest.json``: the source (spec, name, version, sha256 of the tree), the generator
  version, the settings, the baseline (tests passing in two clean runs; flaky ones dropped).
* ``runs.jsonl``: one line per candidate as soon as its run ends (the cache: a second run, or
  a run resumed after ``kill -9``, skips every candidate already there; a torn last line is
  dropped), with what it cost: ``seconds`` (the deletion run), ``forward_seconds``,
  ``screen_seconds`` and ``wait_seconds`` (the wait for sandbox slots, kept out of the
  others; :func:`_step`); rows written before these fields existed load as they are.
* ``tasks.jsonl``: the tasks, written atomically at the end.

A task records the file, the symbol, the deleted lines' span and sha256, the failing test ids
(the reward), the visible subset of them (shown to the agent; the others are hidden), the
tests that keep passing (must still pass), and timings.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from composer_replication.config import SandboxConfig, TaskGenConfig
from composer_replication.config.base import UserError
from composer_replication.config.env import requirement_problem
from composer_replication.envs.feature_deletion.candidates import (
    Candidate,
    delete_body,
    find_candidates,
)
from composer_replication.envs.feature_deletion.grade import split_run
from composer_replication.envs.feature_deletion.hidden import (
    def_of_test,
    hide_tests,
    split_visible,
)
from composer_replication.envs.feature_deletion.paths import (
    manifest_path_problem,
    record_path_problem,
)
from composer_replication.envs.feature_deletion.schedule import PackageShare, may_hide
from composer_replication.envs.feature_deletion.screen import run_screen
from composer_replication.envs.feature_deletion.selection import line_key, read_coverage, selected
from composer_replication.envs.feature_deletion.source import SourceTree, staged_copy, top_package
from composer_replication.envs.feature_deletion.testcode import TestCode, classify, kept_fixtures
from composer_replication.envs.feature_deletion.visible import originals_visible
from composer_replication.lm.models import write_atomic
from composer_replication.sandbox.pytest_suite import SuiteReport, pytest_tools, run_suite
from composer_replication.sandbox.sandbox import SLOTS, Sandbox

RUN_SETTINGS = frozenset({"workers", "time_limit_s"})
"""Settings of how a run goes, not of what it makes: left out of the manifest's identity."""

GENERATOR_VERSION = 8
"""8: the triviality screen limits each test under each body (``screen_test_timeout_s``): a
body that loops fails the test at the limit instead of the screening run reaching the suite's
timeout (``screen_failed``); 7: a property's setter (and any second def of a name) is a candidate of its own
(``Candidate.variant``; it shared its getter's key, was never run and took its status), and a
deletion runs only the tests that called the function (selection.py; the baseline records
per-test call coverage); 6: a deletion whose original the sandbox can see (visible.py) is ``original_visible``, a
hidden test sharing a parametrize table or data with a visible one is visible, and every path
of a record is checked at load; 5: the fixtures the kept tests got in the baseline run stay in the workspace (a plugin's
mark requests one only hidden tests name), and a hidden test a class of another test module
inherits is visible at generation as in the workspace; 4: a hidden test that a kept test calls or a class of the module inherits is visible (it
stays in the workspace; a version-3 set listed it hidden); 3: test code from the suite's run (testcode.py), hidden tests out of the workspace
(hidden.py), the triviality screen (screen.py); 2: only tasks split grading can grade."""
LOADABLE_VERSIONS = frozenset({7, GENERATOR_VERSION})
"""Generator versions whose task sets load: version 8 only recovers candidates version 7 lost
to a looping trivial body (``screen_failed``); every task of a version-7 set is one of version
8 too (a screening run that finished saw no loop, so its bits are the same)."""
TASK = "task"
STATUSES = ("task", "no_failure", "too_broad", "collect_error", "broken_run", "not_forwardable",
            "trivial", "screen_failed", "original_visible")  # fmt: skip


class TaskSetError(UserError, RuntimeError):
    """A task set directory that does not match the requested generation, or a bad baseline."""


def suite_sandbox(cfg: TaskGenConfig) -> SandboxConfig:
    """Sandbox limits for one run of a repository's test suite."""
    return SandboxConfig(
        wall_timeout_s=cfg.suite_timeout_s,
        cpu_time_s=int(cfg.suite_timeout_s),
        memory_mb=cfg.memory_mb,
        max_output_kb=4096,
        work_dir_mb=256,
        max_processes=64,
    )


@dataclass
class GenerationSummary:
    """What a call to :func:`generate_tasks` did."""

    out_dir: Path
    candidates: int
    reused: int
    ran: int
    tasks: int
    by_status: dict[str, int]
    seconds: float
    left: int = 0
    """Candidates not tried because the time limit passed (a re-run tries them)."""


def top_level_names(root: Path) -> set[str]:
    """The importable top-level names of a directory: packages and modules (``.py``)."""
    names = set()
    for entry in Path(root).iterdir():
        if entry.suffix == ".py" or (entry.is_dir() and (entry / "__init__.py").exists()):
            names.add(entry.stem if entry.suffix == ".py" else entry.name)
    return names


def refuse_shadowed(root: Path, tools: str) -> None:
    """Refuse a source that also sits in the test tools bound into both sandboxes (pytest,
    pluggy, packaging, pygments, iniconfig, ``test_requirements``): a submission could
    import the original from there instead of rebuilding it."""
    mine = top_level_names(root) | (
        top_level_names(root / "src") if (root / "src").is_dir() else set()
    )
    if both := sorted(mine & top_level_names(Path(tools)) - {"conftest", "setup"}):
        raise TaskSetError(
            f"{root}: {', '.join(both)} is also in the sandbox's test tools ({tools}), where a "
            "submission could import the original; Feature Deletion cannot use this source"
        )


@dataclass
class GenerationPlan:
    """A source's task set before its candidates run: the baseline (run, or read from the
    set's manifest), the candidates and the tests each deletion runs."""

    box: Sandbox
    out_dir: Path
    passing: list[str]
    testcode: TestCode
    candidates: list[Candidate]
    selections: dict[str, list[str] | None]
    """Candidate key -> the tests its deletion runs (selection.py; None: the whole suite,
    []: none, a ``no_failure`` without a run)."""


def plan_generation(source: SourceTree, out: Path, cfg: TaskGenConfig,
                    spec: str = "") -> GenerationPlan:  # fmt: skip
    """The :class:`GenerationPlan` of ``source`` under ``out`` (the baseline runs here if the
    set has no manifest yet)."""
    refuse_shadowed(source.root, pytest_tools(tuple(cfg.test_requirements)))
    box = Sandbox(suite_sandbox(cfg))
    out_dir = Path(out) / source.label
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = _manifest(out_dir, source, cfg, spec, box)
    passing = manifest["baseline"]["passing"]
    testcode = TestCode(**manifest["baseline"]["testcode"])
    cands = find_candidates(source.root, testcode)
    if cfg.max_candidates is not None:
        cands = cands[: cfg.max_candidates]
    cov = read_coverage(manifest["baseline"].get("coverage"))
    parsed: dict = {}
    select = {c.key: _selection(cov, source.root, c, passing, parsed) for c in cands}
    return GenerationPlan(box, out_dir, passing, testcode, cands, select)


def generate_tasks(
    source: SourceTree,
    out: Path,
    cfg: TaskGenConfig,
    spec: str = "",
    progress: Callable[..., None] | None = None,
    on_total: Callable[[int], None] | None = None,
    deadline: float | None = None,
    share: PackageShare | None = None,
) -> GenerationSummary:
    """Generate (or resume, or reuse) the task set of ``source`` under ``out`` (module
    docstring). ``progress(n)`` is called per finished candidate, ``on_total(n)`` once with
    the number of candidates. ``deadline``: the ``time.monotonic()`` after which no candidate
    run starts (default: ``cfg.time_limit_s`` from now; a suite passes its own). ``share``:
    this package's part of a suite's slot scheduler (schedule.py; its steps take their slots
    through it and it is told of each candidate that ends, the reused ones included); None:
    the sandbox slots, first come, first served."""
    start = time.monotonic()
    if deadline is None and cfg.time_limit_s is not None:
        deadline = start + cfg.time_limit_s
    tools = pytest_tools(tuple(cfg.test_requirements))
    plan = plan_generation(source, out, cfg, spec)
    box, out_dir, passing, testcode = plan.box, plan.out_dir, plan.passing, plan.testcode
    cands, select = plan.candidates, plan.selections
    runs_path = out_dir / "runs.jsonl"
    done = read_runs(runs_path)
    if share is not None:  # the reused runs: their cost and yield rank the package
        for row in (done[c.key] for c in cands if c.key in done):
            share.finished(_hidden_task(row, cfg), _slot_seconds(row))
    todo = yield_order([c for c in cands if c.key not in done], select, cfg.visible_tests)
    if on_total is not None:
        on_total(len(cands))
    if progress is not None and len(cands) > len(todo):
        progress(len(cands) - len(todo))
    workers = cfg.workers or os.cpu_count() or 1
    pool, scan = ThreadPoolExecutor(workers), ThreadPoolExecutor(1)
    # the visibility scan (minutes for a package of 100+ candidates on a loaded machine) runs
    # while the candidates do: a candidate whose original it finds is recorded as
    # original_visible whatever its run said (a run not yet started is skipped)
    seen_fut = scan.submit(originals_visible, source.root, todo, _aliases(source), [tools])
    try:
        with runs_path.open("a", encoding="utf-8") as sink:
            futures = {pool.submit(_try_unless_seen, seen_fut, deadline, box, source, c,
                                   passing, cfg, testcode, select[c.key], share=share): c
                       for c in todo if select[c.key] != []}  # fmt: skip
            seen = seen_fut.result()
            for c in todo:
                if c.key in seen:
                    _record(sink, done, _visible_row(c, seen[c.key]), progress)
                elif select[c.key] == []:
                    _record(sink, done, _uncalled_row(c), progress)
            for fut in as_completed(futures):
                if futures[fut].key not in seen and (row := fut.result()) is not None:
                    _record(sink, done, row, progress)
                    if share is not None:
                        share.finished(_hidden_task(row, cfg))
    finally:  # on Ctrl-C the queued candidates are dropped (the finished ones are in
        pool.shutdown(wait=False, cancel_futures=True)  # runs.jsonl); runs in flight end
        scan.shutdown(wait=False, cancel_futures=True)
    tried = [c for c in cands if c.key in done]  # all, unless the time limit passed
    tasks = [_task(source, c, done[c.key], passing, cfg, testcode) for c in tried]
    tasks = [t for t in tasks if t is not None]
    write_atomic(out_dir / "tasks.jsonl", "".join(json.dumps(t) + "\n" for t in tasks))
    by_status: dict[str, int] = {}
    for c in tried:
        status = done[c.key]["status"]
        by_status[status] = by_status.get(status, 0) + 1
    return GenerationSummary(out_dir, len(cands), len(cands) - len(todo),
                             len(tried) - (len(cands) - len(todo)), len(tasks), by_status,
                             time.monotonic() - start, left=len(cands) - len(tried))  # fmt: skip


def yield_order(cands: list[Candidate], select: dict[str, list[str] | None],
                visible_tests: int) -> list[Candidate]:  # fmt: skip
    """The order candidates are run in (stable; the task set is written in file order
    whatever it is): module-level functions before methods, and, within each, a deletion that
    may fail more tests than the agent sees (a hidden target is possible) before one whose
    run selects at most ``visible_tests`` tests (it can only become a task without hidden
    targets). It changes no outcome, only what a run stopped early (a time limit, Ctrl-C)
    holds: in the suite run of 2026-12-03 (docs/feature_deletion.md) 46% of the functions
    tried became tasks and 20% of the methods (a method's ``self`` is the package's own object,
    which split grading cannot pass between its two processes: ``not_forwardable``)."""

    def rank(c: Candidate) -> tuple[bool, bool]:
        tests = select.get(c.key)
        return "." in c.symbol, tests is not None and len(tests) <= visible_tests

    return sorted(cands, key=rank)


def _hidden_task(row: dict, cfg: TaskGenConfig) -> bool:
    """Whether a candidate's run made a task with hidden targets, by the cheap test of
    schedule.may_hide (an upper bound of what hidden_split keeps hidden at the package's
    end, which reads the test files): enough to rank packages."""
    return row.get("status") == TASK and may_hide(row.get("failing") or [], cfg.visible_tests)


def _slot_seconds(row: dict) -> float:
    """The slot time a recorded run took (its steps' times, without its waits)."""
    return sum(float(row.get(k) or 0.0) for k in ("seconds", "forward_seconds",
                                                  "screen_seconds"))  # fmt: skip


def _record(sink, done: dict[str, dict], row: dict, progress) -> None:
    """Append one candidate's run to ``runs.jsonl`` (synced) and to ``done``."""
    sink.write(json.dumps(row, sort_keys=True) + "\n")
    sink.flush()
    os.fsync(sink.fileno())
    done[row["key"]] = row
    if progress is not None:
        progress(1)


def _aliases(source: SourceTree) -> frozenset[str]:
    """The names the tree's own package goes by (its directory, its distribution's name):
    an installed original spells them differently from a renamed copy (visible.py)."""
    names = {re.sub(r"[-.]", "_", source.name).lower()}
    with contextlib.suppress(UserError):
        names.add(top_package(source))
    return frozenset(names)


def _visible_row(cand: Candidate, where: str) -> dict:
    """The run of a candidate whose original the sandbox can see: no run, not a task."""
    return {"key": cand.key, "status": "original_visible", "failing": [], "n_failing": 0,
            "seconds": 0.0, "visible_at": where}  # fmt: skip


def _selection(cov, root: Path, cand: Candidate, passing: list[str], parsed: dict):
    """The tests a deletion of ``cand`` runs (selection.selected); None: the whole suite."""
    if cov is None:
        return None
    try:
        return selected(cov, line_key(root, cand, parsed), passing)
    except (ValueError, SyntaxError, StopIteration):
        return None


def _uncalled_row(cand: Candidate) -> dict:
    """The run of a candidate no baseline-passing test called (selection.py): no run, no
    test can fail."""
    return {"key": cand.key, "status": "no_failure", "failing": [], "n_failing": 0,
            "seconds": 0.0, "selected": 0}  # fmt: skip


def read_runs(path: Path) -> dict[str, dict]:
    """The cached candidate runs; a torn last line (a killed writer) is cut off the file."""
    if not path.exists():
        return {}
    raw = path.read_bytes()
    keep = raw[: raw.rfind(b"\n") + 1]
    if len(keep) != len(raw):
        with path.open("r+b") as f:
            f.truncate(len(keep))
    rows = {}
    for line in keep.splitlines():
        try:
            row = json.loads(line)
        except ValueError:  # not JSON, or not UTF-8: that candidate runs again
            continue
        if (
            isinstance(row, dict)
            and row.get("status") in STATUSES
            and isinstance(row.get("key"), str)
        ):
            rows[row["key"]] = row
    return rows


def _manifest(out_dir: Path, source: SourceTree, cfg: TaskGenConfig, spec: str, box) -> dict:
    path = out_dir / "manifest.json"
    want = {
        "generator_version": GENERATOR_VERSION,
        "source": {
            "spec": spec,
            "name": source.name,
            "version": source.version,
            "sha256": source.digest,
        },  # fmt: skip
        "settings": cfg.model_dump(exclude=set(RUN_SETTINGS)),
    }
    if path.exists():
        have = read_manifest(path)
        if (problem := manifest_path_problem(have)) is not None:
            raise TaskSetError(f"{path}: {problem}")
        diff = [k for k in want if have.get(k) != want[k]]
        if diff:
            raise TaskSetError(
                f"{out_dir} holds a task set generated with a different {', '.join(diff)}; "
                "use another --out directory or remove it"
            )
        return have
    want["baseline"] = baseline(box, source.root, tuple(cfg.test_requirements))
    write_atomic(path, json.dumps(want, indent=1, sort_keys=True) + "\n")
    return want


def baseline(box: Sandbox, root: Path, requirements: tuple[str, ...] = ()) -> dict:
    """Tests passing in two clean sandboxed runs of the untouched tree (flaky ones dropped);
    the first run also records what the suite collected, opened and called, from which its
    test code is decided (testcode.py)."""
    reports = [_run(box, root, {}, requirements, probe=first) for first in (True, False)]
    bad = next((r for r in reports if not r.ok), None)
    if bad is not None:
        raise TaskSetError(
            "the untouched test suite did not run to the end in the sandbox "
            f"(timed out: {bad.timed_out}, exit status {bad.exit_status}, "
            f"tampered: {bad.tampered}); last output:\n{bad.output[-2000:]}"
        )
    passing = sorted(reports[0].passing() & reports[1].passing())
    if not passing:
        why = ("pytest collected no test (by its configuration's testpaths and python_files, "
               "default test_*.py and *_test.py: a suite kept elsewhere, e.g. titlecase's "
               "titlecase/tests.py, is not collected)" if not reports[0].collected else
               f"{reports[0].collected} collected, none passed in both runs")  # fmt: skip
        raise TaskSetError(f"no test of the untouched suite passes in the sandbox: {why}")
    try:
        coverage = json.loads(reports[0].probe).get("coverage")
    except (ValueError, AttributeError):
        coverage = None
    return {
        "passing": passing,
        "not_passing": sorted(set(reports[0].outcomes) - set(passing)),
        "seconds": round(reports[1].seconds, 3),
        "testcode": classify(root, reports[0].probe).to_dict(),
        "coverage": coverage,
    }


def _run(box: Sandbox, root: Path, overrides: dict[str, str], reqs=(), probe=False,
         tests: list[str] | None = None) -> SuiteReport:  # fmt: skip
    repo = staged_copy(root, overrides)
    try:
        return run_suite(box, str(repo), tests, requirements=tuple(reqs), probe=probe)
    finally:
        shutil.rmtree(repo, ignore_errors=True)


def _selected_run(box, root: Path, overrides: dict[str, str], reqs, tests: list[str] | None):
    """(report, failing-or-None, whether it was the whole suite): ``tests`` (selection.py) run
    alone; the whole suite instead for None, or when the selected run is off (not complete,
    a collection error, a selected test not reported)."""
    if tests is not None:
        rep = _run(box, root, overrides, reqs, tests=tests)
        if rep.ok and not rep.collect_errors and all(t in rep.outcomes for t in tests):
            return rep, sorted(t for t in tests if not rep.passed(t)), False
    rep = _run(box, root, overrides, reqs)
    return rep, None, True


def deletion_outcome(box, source: SourceTree, cand: Candidate, passing: list[str], cfg,
                     tests: list[str] | None = None) -> dict:  # fmt: skip
    """What deleting ``cand`` does to the suite, before forwarding and screening (which
    depend only on the failing tests): ``status`` (``collect_error``, ``broken_run``,
    ``no_failure``, ``too_broad`` or ``breaks``), ``failing`` (baseline-passing tests that do
    not pass), ``seconds``, ``whole`` (the whole suite ran). ``tests``: the selection
    (selection.py), None for the whole suite; ``too_broad`` is always against the whole
    suite's passing tests."""
    text = (source.root / cand.file).read_text(encoding="utf-8")
    rep, failing, whole = _selected_run(box, source.root, {cand.file: delete_body(text, cand)},
                                        cfg.test_requirements, tests)  # fmt: skip
    if failing is None:
        failing = sorted(t for t in passing if not rep.passed(t))
    if rep.collect_errors:
        status = "collect_error"
    elif not rep.ok:
        status = "broken_run"
    elif not failing:
        status = "no_failure"
    elif len(failing) > cfg.max_break_share * len(passing):
        status = "too_broad"
    else:
        status = "breaks"
    return {"status": status, "failing": failing, "seconds": round(rep.seconds, 3),
            "whole": whole}  # fmt: skip


def _try_unless_seen(seen_fut, deadline: float | None, box, source: SourceTree,
                     cand: Candidate, *args, share: PackageShare | None = None
                     ) -> dict | None:  # fmt: skip
    """:func:`_try`, unless the visibility scan already found the candidate's original or
    the time limit passed (None: not tried, not recorded)."""
    if deadline is not None and time.monotonic() >= deadline:
        return None
    if seen_fut.done() and not seen_fut.exception() and cand.key in seen_fut.result():
        return None
    return _try(box, source, cand, *args, deadline=deadline, share=share)


def _try(box, source: SourceTree, cand: Candidate, passing: list[str], cfg, testcode,
         tests: list[str] | None = None, deadline: float | None = None,
         share: PackageShare | None = None) -> dict | None:  # fmt: skip
    """One candidate's steps (``runs.jsonl``'s row); None if ``deadline`` passed while it
    waited for its first slot (a suite's threads queue for the slots long before they run).
    ``share``: its package's part of a suite's slot scheduler (schedule.py; None: SLOTS)."""
    text = (source.root / cand.file).read_text(encoding="utf-8")
    deleted = delete_body(text, cand)
    costs = dict.fromkeys(("wait_seconds", "forward_seconds", "screen_seconds"), 0.0)
    with _step(costs, share=share):
        if deadline is not None and time.monotonic() >= deadline:
            return None
        got = deletion_outcome(box, source, cand, passing, cfg, tests)
    status, failing = got["status"], got["failing"]
    forward_whole = False
    if status == "breaks":
        with _step(costs, "forward_seconds", share):
            ok, forward_whole = forwardable(box, source, grading_task(cand, cfg, testcode),
                                            text, passing, failing)  # fmt: skip
        status = TASK if ok else "not_forwardable"
    row = {"key": cand.key, "status": status, "failing": failing if status == TASK else [],
           "n_failing": len(failing), "seconds": got["seconds"],
           "selected": len(passing) if got["whole"] else len(tests or []),
           "forward_whole": forward_whole}  # fmt: skip
    if status == TASK:  # the trivial bodies are ours: one sandbox, no forwarding needed

        def passes(target_text: str, tests: list[str], n: int) -> dict[str, str] | None:
            repo = staged_copy(source.root, {cand.file: target_text})
            try:
                res = run_suite(box, str(repo), tests, requirements=tuple(cfg.test_requirements),
                                screen=n, screen_test_s=cfg.screen_test_timeout_s)  # fmt: skip
            finally:
                shutil.rmtree(repo, ignore_errors=True)
            return res.screened if res.ok else None

        with _step(costs, "screen_seconds", share):
            row["screen"] = run_screen(passes, deleted, cand, failing)
        if row["screen"] is None:
            row["status"], row["failing"] = "screen_failed", []
        elif not row["screen"]["strong"]:
            row["status"], row["failing"] = "trivial", []
    return {**row, **{k: round(v, 3) for k, v in costs.items()}}


@contextlib.contextmanager
def _step(costs: dict[str, float], key: str | None = None,
          share: PackageShare | None = None) -> Iterator[None]:  # fmt: skip
    """Run a step of a candidate holding one sandbox slot (sandbox.SLOTS: its runs take no
    other) and add to ``costs`` its wait for the slot (``wait_seconds``) and, under ``key``,
    the step's time once the slot is held (its sandbox runs and tree copies). Holding the slot
    around the deletion step also keeps that wait out of the run's own ``seconds``. The wait
    has no deadline (``SandboxConfig.slot_wait_s`` bounds a grading's wait, which a trainer
    masks; a generator's candidate waits its turn). ``share`` (a suite's scheduler,
    schedule.py) decides when the step's turn comes; a step with a ``key`` continues a
    candidate already begun."""
    begin = time.monotonic()
    with SLOTS.held() if share is None else share.held(continuing=key is not None):
        start = time.monotonic()
        costs["wait_seconds"] += start - begin
        try:
            yield
        finally:
            if key is not None:
                costs[key] += time.monotonic() - start


def grading_task(cand: Candidate, cfg, testcode: TestCode) -> dict:
    """What split grading needs of a task before it is one."""
    return {**cand.to_dict(), "test_requirements": list(cfg.test_requirements),
            "served": testcode.served}  # fmt: skip


def forwardable(box, source: SourceTree, task: dict, text: str, passing: list[str],
                calling: Sequence[str] = ()) -> tuple[bool, bool]:  # fmt: skip
    """(whether the original code ``text`` passes every baseline test (``passing``) under
    split grading (grade.split_run), whether the whole-suite split run was made): only such a
    deletion can be graded (a function taking callables or returning its own objects cannot
    cross between the two sandboxes). ``task``: :func:`grading_task`.

    ``calling`` (the deletion's failing tests: those that call the function; empty: the
    whole-suite run alone, the check before issue 60's early exit) runs first, alone under
    split grading: one of them not passing refuses the candidate without the whole-suite
    run (most ``not_forwardable`` candidates fail there, and the whole suite cost them the
    most time of the generator, issue 60). That refusal is conservative: a task is kept only
    by the whole-suite run below, as before, so the early exit can lose a task (a calling test
    that passes forwarded only after other tests ran first), never keep a bad one. A subset run
    that is off (did not finish, a collection error, a test not reported) refuses nothing: the
    whole suite runs as if there had been none.

    The whole-suite run must see every baseline-passing test, not only the calling ones: a
    test reading state the forwarded function changed (a module's registry, a class
    attribute) sees the suite's process, where the function no longer runs, and must fail
    there, or the task would keep a test that split grading fails for every submission, the
    original included."""
    if calling:
        rep = split_run(box, source.root, task, text, tests=list(calling))
        complete = rep.ok and not rep.collect_errors and all(t in rep.outcomes for t in calling)
        if complete and not all(rep.passed(t) for t in calling):
            return False, False
    rep = split_run(box, source.root, task, text)
    return all(rep.passed(t) for t in passing), True


def hidden_split(
    read: Callable[[str], str], failing: list[str], visible_defs: int, testcode: TestCode
) -> tuple[list[str], list[str], list[str]]:
    """(visible, hidden, hidden data) of a task's failing tests: ``visible_defs`` test
    functions shown (hidden.split_visible); then a hidden test the workspace cannot lose
    (hidden.hide_tests: called by a kept test, inherited, or sharing a parametrize table, a
    data helper or a class table with kept tests) is visible, and so is one that opened a
    test data file that stays in the workspace because a test not hidden opened it too
    (issue 55), until nothing moves. The hidden data: files only hidden tests opened."""
    visible, hidden = split_visible(failing, visible_defs)
    while True:
        keep = kept_fixtures(testcode.fixtures_by_test, hidden)
        _, unremovable = hide_tests(read, hidden, testcode.test_files, keep)
        moved = set(unremovable)
        data = [f for f, openers in testcode.data_by_test.items()
                if openers and set(openers) <= set(hidden) - moved]  # fmt: skip
        opened = {t for f, openers in testcode.data_by_test.items() if f not in data
                  for t in openers}  # fmt: skip
        shares = {def_of_test(t) for t in set(hidden) - moved if t in opened}
        moved |= {t for t in hidden if def_of_test(t) in shares}
        visible, hidden = sorted({*visible, *moved}), sorted(set(hidden) - moved)
        if not moved:
            return visible, hidden, sorted(data)


def _task(source: SourceTree, cand: Candidate, run: dict, passing: list[str], cfg,
          testcode: TestCode) -> dict | None:  # fmt: skip
    if run["status"] != TASK:
        return None
    failing = run["failing"]
    read = lambda rel: (source.root / rel).read_text(encoding="utf-8")  # noqa: E731
    visible, hidden, data = hidden_split(read, failing, cfg.visible_tests, testcode)
    screen = run["screen"]
    return {
        "task_id": f"{source.label}:{cand.key}",
        "source": {"name": source.name, "version": source.version, "sha256": source.digest},
        **cand.to_dict(),
        "failing_tests": failing,
        "visible_tests": visible,
        "hidden_tests": hidden,
        "hidden_data": data,
        "strong_tests": screen["strong"],
        "screen": {body: len(tests) for body, tests in screen["bodies"].items()},
        "served": testcode.served,
        "test_files": testcode.test_files,
        "kept_fixtures": kept_fixtures(testcode.fixtures_by_test, hidden),
        "passing_tests": sorted(set(passing) - set(failing)),
        "test_requirements": list(cfg.test_requirements),
        "suite_seconds": run["seconds"],
        "generator_version": GENERATOR_VERSION,
    }


def load_tasks(task_dir: Path, root: Path | None = None) -> list[dict]:
    """The tasks of a generated set (``tasks.jsonl``), with a clear error naming a bad line:
    a field of the wrong type, or a path (paths.py) that is not a clean relative path or,
    with ``root`` (the source tree), does not resolve inside it."""
    path = Path(task_dir) / "tasks.jsonl"
    if not path.exists():
        raise TaskSetError(f"{path} does not exist: generate the task set first")
    manifest = Path(task_dir) / "manifest.json"
    version = read_manifest(manifest).get("generator_version") if manifest.exists() else None
    if version not in LOADABLE_VERSIONS:
        raise TaskSetError(
            f"{task_dir} was made by task generator version {version}, this is version "
            f"{GENERATOR_VERSION}, which loads versions {sorted(LOADABLE_VERSIONS)} (version 7 runs a property's setter as a candidate of its own, "
            "which version 6 counted with its getter; version 6 refuses deletions whose original the sandbox can "
            "see and shows hidden tests that share a parametrize table with visible ones; "
            "version 5 keeps the fixtures the kept tests use in the "
            "workspace; version 4 shows a hidden test that a kept test calls or a "
            "class inherits; version 3 decides test code from the suite's run, keeps "
            "hidden tests out of the workspace and drops deletions a trivial body passes): "
            "generate it again into another directory"
        )
    tasks = []
    for n, line in enumerate(path.read_bytes().splitlines(), 1):
        if line.strip():
            tasks.append(_task_record(line, f"{path}:{n}", root))
    return tasks


TASK_FIELDS: dict[str, type] = {"task_id": str, "symbol": str, "file": str, "failing_tests": list,
                                "visible_tests": list, "passing_tests": list, "served": list}  # fmt: skip
"""The fields of a task record that building the environment, its tools and grading read."""
OPTIONAL_TASK_FIELDS: dict[str, type] = {"hidden_tests": list, "test_files": list,
                                         "hidden_data": list, "kept_fixtures": dict,
                                         "test_requirements": list}  # fmt: skip
"""Fields the workspace reads where a task has them (of this type, else the record is refused:
a ``kept_fixtures`` list raised AttributeError at every reset)."""


def _task_record(line: bytes, where: str, root: Path | None = None) -> dict:
    """One ``tasks.jsonl`` line as a task record; a `TaskSetError` naming ``where`` (file:line)
    and the field otherwise (also for a path outside ``root``, paths.py)."""
    try:
        record = json.loads(line)
    except ValueError as e:  # not JSON, or not UTF-8
        raise TaskSetError(f"{where}: not JSON ({getattr(e, 'msg', e)})") from None
    if not isinstance(record, dict):
        raise TaskSetError(f"{where}: not a task (a JSON {type(record).__name__}, not an object)")
    for key, kind in {**TASK_FIELDS, **OPTIONAL_TASK_FIELDS}.items():
        if key not in record:
            if key in TASK_FIELDS:
                raise TaskSetError(f"{where}: not a task: missing field {key!r}")
        elif not isinstance(record[key], kind):
            raise TaskSetError(f"{where}: not a task: field {key!r} must be a {kind.__name__}, "
                               f"got {type(record[key]).__name__}")  # fmt: skip
    if (problem := record_path_problem(record, root)) is not None:
        raise TaskSetError(f"{where}: not a task: {problem}")
    for text in record.get("test_requirements", ()):  # they reach pip on the host
        if (problem := requirement_problem(text)) is not None:
            raise TaskSetError(f"{where}: not a task: field 'test_requirements': {text!r} "
                               f"{problem}")  # fmt: skip
    return record


def read_manifest(path: Path) -> dict:
    """A task set's ``manifest.json``; a `TaskSetError` naming it if it is not a JSON object."""
    try:
        data = json.loads(path.read_bytes())
    except ValueError as e:
        raise TaskSetError(f"{path}: not a JSON object ({getattr(e, 'msg', e)})") from None
    if not isinstance(data, dict):
        raise TaskSetError(f"{path}: not a JSON object (a {type(data).__name__})")
    return data
