"""The Feature Deletion task generator on the textkit fixture: candidates and the deletion,
tasks from sandboxed runs, the cache (a second run reruns nothing), resuming after a killed
run (a torn last line), a refused mismatch, and the package rename."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from composer_replication.config import TaskGenConfig
from composer_replication.envs.feature_deletion.candidates import (
    STUB,
    delete_body,
    find_candidates,
    is_test_path,
)
from composer_replication.envs.feature_deletion.generate import (
    GENERATOR_VERSION,
    TaskSetError,
    generate_tasks,
    read_runs,
    yield_order,
)
from composer_replication.envs.feature_deletion.source import (
    SourceError,
    extract,
    renamed,
    resolve_source,
)

FIXTURE = Path(__file__).parents[3] / "fixtures" / "feature_deletion" / "textkit"
CFG = TaskGenConfig(workers=2, suite_timeout_s=30)


def test_candidates_skip_tests_and_trivial_bodies(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(
        "def one(x): return x\n\n"
        "def doc_only():\n    '''Nothing.'''\n\n"
        "def stub():\n    raise NotImplementedError\n\n"
        "def real(x):\n    '''Doc.'''\n    y = x + 1\n    return y\n\n"
        "class K:\n    def meth(self):\n        return 1\n"
    )
    (tmp_path / "pkg" / "test_m.py").write_text("def test_a():\n    assert 1\n")
    cands = find_candidates(tmp_path)
    assert [c.symbol for c in cands] == ["real", "K.meth"]
    text = (tmp_path / "pkg" / "m.py").read_text()
    out = delete_body(text, cands[0])
    assert "'''Doc.'''\n    " + STUB + "\n\nclass K" in out and "y = x + 1" not in out
    assert is_test_path("tests/helpers.py") and is_test_path("pkg/conftest.py")
    assert not is_test_path("pkg/core.py")
    with pytest.raises(ValueError, match="does not hold the recorded body"):
        delete_body(text.replace("y = x + 1", "y = x + 2"), cands[0])


def test_generate_reuses_its_cache_and_resumes_after_a_kill(tmp_path):
    source = resolve_source(str(FIXTURE))
    first = generate_tasks(source, tmp_path, CFG, spec="textkit")
    assert first.tasks == 9 and first.ran == 9 and first.reused == 0
    tasks = [json.loads(x) for x in (first.out_dir / "tasks.jsonl").read_text().splitlines()]
    slug = next(t for t in tasks if t["symbol"] == "slugify")
    assert slug["failing_tests"] == ["tests/test_core.py::test_slugify",
                                     "tests/test_core.py::test_slugify_sep"]  # fmt: skip
    assert "tests/test_core.py::test_titlecase" in slug["passing_tests"]
    assert not set(slug["failing_tests"]) & set(slug["passing_tests"])
    again = generate_tasks(source, tmp_path, CFG, spec="textkit")
    assert again.ran == 0 and again.reused == 9 and again.tasks == 9
    # a killed writer: three complete lines and a torn fourth
    runs = first.out_dir / "runs.jsonl"
    lines = runs.read_text().splitlines(keepends=True)
    runs.write_text("".join(lines[:3]) + lines[3][:20])
    assert len(read_runs(runs)) == 3 and runs.read_text().endswith("\n")
    resumed = generate_tasks(source, tmp_path, CFG, spec="textkit")
    assert resumed.ran == 6 and resumed.reused == 3 and resumed.tasks == 9
    with pytest.raises(TaskSetError, match="different settings"):
        generate_tasks(source, tmp_path, TaskGenConfig(max_break_share=0.1), spec="textkit")


def test_kill_9_mid_generation_then_resume(tmp_path):
    """A real kill -9 of a generating process: the re-run reuses what was written. The child
    stops in its progress callback after its second recorded candidate (with test selection
    most candidates take no run, so a poll alone would see them all written at once)."""
    code = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from composer_replication.config import TaskGenConfig\n"
        "from composer_replication.envs.feature_deletion.source import resolve_source\n"
        "from composer_replication.envs.feature_deletion.generate import generate_tasks\n"
        "count = [0]\n"
        "def hold(n):\n"
        "    count[0] += n\n"
        "    if count[0] >= 2:\n"
        "        time.sleep(600)\n"
        f"generate_tasks(resolve_source({str(FIXTURE)!r}), Path({str(tmp_path)!r}),\n"
        "               TaskGenConfig(workers=1, suite_timeout_s=30), spec='textkit',\n"
        "               progress=hold)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    runs = tmp_path / "textkit-local" / "runs.jsonl"
    import time

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if runs.exists() and runs.read_text().count("\n") >= 2:
            break
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    done_before = len(read_runs(runs))
    assert 2 <= done_before < 9 and not (tmp_path / "textkit-local" / "tasks.jsonl").exists()
    resumed = generate_tasks(resolve_source(str(FIXTURE)), tmp_path, CFG, spec="textkit")
    assert resumed.reused == done_before and resumed.ran == 9 - done_before
    assert resumed.tasks == 9


def test_renamed_package_still_passes_and_hides_the_name(tmp_path):
    tree = renamed(resolve_source(str(FIXTURE)), cache=tmp_path)
    new = tree.version.split("-as-")[1]
    assert (tree.root / new / "core.py").exists() and not (tree.root / "textkit").exists()
    everything = "".join(p.read_text() for p in tree.root.rglob("*.py"))
    assert "textkit" not in everything and f"from {new} import" in everything
    summary = generate_tasks(tree, tmp_path / "tasks", CFG, spec="textkit")
    assert summary.tasks == 9


def test_archives_cannot_write_outside_or_hold_links(tmp_path):
    import tarfile

    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tf:
        info = tarfile.TarInfo("../outside.txt")
        info.size = 0
        tf.addfile(info)
    with pytest.raises(SourceError, match="outside the target"):
        extract(evil, tmp_path / "x")
    linky = tmp_path / "link.tar.gz"
    with tarfile.open(linky, "w:gz") as tf:
        info = tarfile.TarInfo("pkg/link")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tf.addfile(info)
    with pytest.raises(SourceError, match="link"):
        extract(linky, tmp_path / "y")


def test_bad_specs_are_clear_errors():
    with pytest.raises(SourceError, match="neither a directory nor a pinned package"):
        resolve_source("toolz>=1")


def test_a_task_set_from_another_generator_version_is_refused_with_the_reason(tmp_path):
    """A version-2 set decided test code by file name and showed hidden tests; a version-3 set
    listed as hidden a test a kept test calls or a class inherits (the workspace keeps it); a
    version-4 workspace lost a fixture the kept tests got from a plugin's mark; a version-5
    set may hold a task whose original the sandbox shows, or a hidden test whose parametrize
    table a visible one shares; a version-6 set counted a property's setter with its getter:
    never used. A version-7 set loads: version 8 only recovers candidates a looping trivial
    body cost version 7."""
    from composer_replication.envs.feature_deletion.generate import TaskSetError, load_tasks

    (tmp_path / "tasks.jsonl").write_text('{"task_id": "x"}\n')
    for old in (2, 3, 4, 5, 6):
        (tmp_path / "manifest.json").write_text(f'{{"generator_version": {old}}}')
        with pytest.raises(TaskSetError, match=f"version {old}, this is version 8"):
            load_tasks(tmp_path)
    (tmp_path / "manifest.json").write_text('{"generator_version": 7}')
    with pytest.raises(TaskSetError, match="tasks.jsonl:1"):  # past the version: the record
        load_tasks(tmp_path)


def test_a_source_that_is_also_a_test_tool_is_refused(tmp_path):
    """pluggy (or pytest, packaging, ...) as a source: its original is importable in both
    sandboxes from the pinned test tools, so a submission could run it instead."""
    from composer_replication.envs.feature_deletion.generate import TaskSetError, generate_tasks

    root = tmp_path / "pluggy-0"
    (root / "src" / "pluggy").mkdir(parents=True)
    (root / "src" / "pluggy" / "__init__.py").write_text("def f():\n    return 1\n")
    with pytest.raises(TaskSetError, match="pluggy is also in the sandbox's test tools"):
        generate_tasks(resolve_source(str(root)), tmp_path / "out", TaskGenConfig())
    assert not (tmp_path / "out").exists()  # refused before anything ran or was written


def _task_row(**changes) -> dict:
    row = {"task_id": "t:f", "symbol": "f", "file": "m.py", "failing_tests": ["a"],
           "visible_tests": ["a"], "passing_tests": [], "served": []}  # fmt: skip
    return {**row, **changes}


@pytest.mark.parametrize(
    "line, problem",
    [
        (b"[1]", ":2: not a task (a JSON list, not an object)"),
        (b"{}", ":2: not a task: missing field 'task_id'"),
        (json.dumps(_task_row(visible_tests="a")).encode(),
         ":2: not a task: field 'visible_tests' must be a list, got str"),
        (b'{"task_id": "\xff"}', ":2: not JSON ("),
        (json.dumps(_task_row(kept_fixtures=["x"])).encode(),
         ":2: not a task: field 'kept_fixtures' must be a dict, got list"),
    ],
)  # fmt: skip
def test_a_task_line_of_the_wrong_shape_names_its_line_and_field(tmp_path, line, problem):
    """Before, these raised AttributeError, KeyError or UnicodeDecodeError tracebacks while the
    environment was built; a blank line (an editor's trailing one) is now skipped, not refused."""
    from composer_replication.envs.feature_deletion.generate import TaskSetError, load_tasks

    (tmp_path / "manifest.json").write_text(f'{{"generator_version": {GENERATOR_VERSION}}}')
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(json.dumps(_task_row()).encode() + b"\n" + line + b"\n\n")
    with pytest.raises(TaskSetError) as info:
        load_tasks(tmp_path)
    assert str(info.value).startswith(f"{path}{problem}")
    path.write_bytes(json.dumps(_task_row()).encode() + b"\n\n")
    assert [t["task_id"] for t in load_tasks(tmp_path)] == ["t:f"]


def test_a_damaged_manifest_names_its_file(tmp_path):
    from composer_replication.envs.feature_deletion.generate import TaskSetError, load_tasks

    (tmp_path / "tasks.jsonl").write_text(json.dumps(_task_row()) + "\n")
    (tmp_path / "manifest.json").write_text('{"generator_version": 5')
    with pytest.raises(TaskSetError, match=rf"^{tmp_path / 'manifest.json'}: not a JSON object"):
        load_tasks(tmp_path)
    (tmp_path / "manifest.json").write_text("[3]")
    with pytest.raises(TaskSetError, match="manifest.json: not a JSON object"):
        load_tasks(tmp_path)


def test_cached_runs_survive_damaged_lines(tmp_path):
    """runs.jsonl is a cache of candidate runs: a line that is not UTF-8 or has no key is
    re-run (left out) instead of stopping the resumed generation with a traceback."""
    from composer_replication.envs.feature_deletion.generate import read_runs

    path = tmp_path / "runs.jsonl"
    good = {"key": "m.py:f", "status": "task"}
    path.write_bytes(b'{"key": "\xff", "status": "task"}\n{"status": "task"}\n'
                     + json.dumps(good).encode() + b"\n")  # fmt: skip
    assert read_runs(path) == {"m.py:f": good}


def test_a_property_and_its_setter_are_two_candidates_each_run(tmp_path):
    """semver's ``Version.major`` and its setter shared one key: the setter was never run and
    was counted with the getter's status (issue 60's run: 59 runs for 64 candidates)."""
    (tmp_path / "pv").mkdir()
    (tmp_path / "pv" / "__init__.py").write_text(
        "class Box:\n"
        "    def __init__(self, n):\n        self._n = n\n\n"
        "    @property\n    def n(self):\n        return self._n\n\n"
        "    @n.setter\n    def n(self, value):\n        self._n = int(value)\n"
    )
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_pv.py").write_text(
        "from pv import Box\n\n"
        "def test_get():\n    assert Box(3).n == 3\n\n"
        "def test_set():\n    b = Box(1)\n    b.n = '7'\n    assert b._n == 7\n\n"
        "def test_other():\n    assert Box(2)._n == 2\n"
    )
    cands = find_candidates(tmp_path)
    assert [c.symbol for c in cands] == ["Box.__init__", "Box.n", "Box.n"]
    assert len({c.key for c in cands}) == 3
    summary = generate_tasks(resolve_source(str(tmp_path)), tmp_path / "out", CFG, spec="pv")
    runs = read_runs(summary.out_dir / "runs.jsonl")
    assert len(runs) == summary.candidates == 3
    assert sum(summary.by_status.values()) == 3
    getter, setter = (runs[c.key] for c in cands[1:])
    assert getter["status"] != "no_failure" and setter["status"] != "no_failure"
    assert getter["n_failing"] == 1 and setter["n_failing"] == 1


def test_yield_order_runs_functions_first_and_hidden_targets_before_visible_only():
    """Module-level functions before methods; within each, a candidate whose selected tests
    outnumber the visible ones (or whose run is the whole suite) before one selecting at most
    ``visible_tests``; otherwise file order (stable)."""
    from composer_replication.envs.feature_deletion.candidates import Candidate

    def cand(symbol: str) -> Candidate:
        return Candidate("m.py", symbol, 1, 2, "    ", "0" * 64)

    names = ["A.few", "few", "A.many", "whole", "many", "A.whole", "also_few"]
    select = {"m.py::few": ["t1", "t2"], "m.py::A.few": ["t1"], "m.py::also_few": ["t1", "t2", "t3"],
              "m.py::many": ["t1", "t2", "t3", "t4"], "m.py::A.many": ["t1", "t2", "t3", "t4"],
              "m.py::whole": None, "m.py::A.whole": None}  # fmt: skip
    got = [c.symbol for c in yield_order([cand(n) for n in names], select, visible_tests=3)]
    assert got == ["whole", "many", "few", "also_few", "A.many", "A.whole", "A.few"]
    got = [c.symbol for c in yield_order([cand(n) for n in names], select, visible_tests=1)]
    assert got == ["few", "whole", "many", "also_few", "A.many", "A.whole", "A.few"]


def test_a_candidate_whose_slot_comes_after_the_time_limit_runs_nothing(tmp_path):
    """A suite's candidate threads queue for the sandbox slots long before they run: one that
    started before the time limit but got its slot after it returns None (not tried, not
    recorded) without running a sandbox."""
    import threading
    import time
    from concurrent.futures import Future
    from types import SimpleNamespace

    from composer_replication.envs.feature_deletion import generate
    from composer_replication.envs.feature_deletion.candidates import find_candidates
    from composer_replication.sandbox.sandbox import SLOTS, set_sandbox_slots

    (tmp_path / "m.py").write_text("def f(x):\n    y = x + 1\n    return y * 2\n")
    (cand,) = find_candidates(tmp_path)
    seen = Future()
    seen.set_result({})

    class NoBox:
        def __getattr__(self, name):
            raise AssertionError(f"the sandbox was used ({name})")

    before = SLOTS.limit
    set_sandbox_slots(1)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with SLOTS.held():
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        held.wait(10)
        deadline = time.monotonic() + 0.3
        threading.Timer(0.6, release.set).start()  # the slot comes free after the limit
        got = generate._try_unless_seen(seen, deadline, NoBox(), SimpleNamespace(root=tmp_path),
                                        cand, [], None, None, None)  # fmt: skip
        assert got is None and time.monotonic() >= deadline
    finally:
        release.set()
        holder.join(10)
        set_sandbox_slots(before)
