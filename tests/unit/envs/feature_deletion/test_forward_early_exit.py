"""The generator's forwarding check (generate.forwardable, issue 60): the tests that call the
deleted function run under split grading first, and a candidate they refuse costs no
whole-suite split run; a candidate they pass (or whose subset run is off) still gets the
whole-suite run, which alone can see a test reading state the forwarded function changed
in the other process. Each candidate's row records the forwarding and screening time and
the wait for a sandbox slot."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from composer_replication.config import TaskGenConfig
from composer_replication.envs.feature_deletion import generate
from composer_replication.envs.feature_deletion.generate import generate_tasks, read_runs
from composer_replication.envs.feature_deletion.source import resolve_source
from composer_replication.sandbox.pytest_suite import SuiteReport

CFG = TaskGenConfig(workers=2, suite_timeout_s=30)
TEST = "tests/test_pk.py::"


def _tree(root: Path) -> Path:
    """Three candidates: ``make`` returns an object of the package's own class (cannot cross
    back: its calling test fails forwarded), ``double`` crosses, ``register`` crosses but
    changes a module list that a test not calling it reads (only the whole suite sees it)."""
    (root / "pk").mkdir(parents=True)
    (root / "pk" / "__init__.py").write_text(  # bodies under visible.MIN_NODES: no scan
        "class Box:\n    def __init__(self, v): self.v = v\n\n\n"
        "def make(v):\n    return Box(v)\n\n\n"
        "def double(x):\n    return x * 2\n\n\n"
        "REG = []\n\n\n"
        "def register(x):\n    REG.append(x)\n"
    )
    (root / "tests").mkdir()
    (root / "tests" / "test_pk.py").write_text(
        "from pk import REG, double, make, register\n\n\n"
        "def test_make():\n    assert make(3).v == 3\n\n\n"
        "def test_double():\n    assert double(2) == 4 and double(5) == 10\n\n\n"
        "def test_register():\n    register('a')\n\n\n"
        "def test_registered():\n    assert REG == ['a']\n"
    )
    return root


@pytest.fixture
def split_calls(monkeypatch):
    """Every split run the generator makes: (symbol, tests) in call order, per symbol; a
    symbol in ``off`` gets a report that did not finish for its subset run."""
    calls: dict[str, list] = {}
    lock, real = threading.Lock(), generate.split_run
    off: set[str] = set()

    def spy(box, root, task, text, tests=None):
        with lock:
            calls.setdefault(task["symbol"], []).append(tests)
        if tests is not None and task["symbol"] in off:
            return SuiteReport()  # not finished: not ok
        return real(box, root, task, text, tests=tests)

    monkeypatch.setattr(generate, "split_run", spy)
    return calls, off


def test_a_refusal_by_the_calling_tests_costs_no_whole_suite_run(tmp_path, split_calls):
    """One generation (sandbox runs are the cost): ``make`` is refused by its calling test
    alone; ``register`` passes its calling test and is refused by the whole suite;
    ``double``'s calling-tests run is made to come back unfinished, which refuses nothing:
    the whole suite runs and keeps the task."""
    calls, off = split_calls
    off.add("double")
    source = resolve_source(str(_tree(tmp_path / "src")))
    summary = generate_tasks(source, tmp_path / "out", CFG, spec="pk")
    runs = {r["key"].split("::")[1]: r for r in read_runs(summary.out_dir / "runs.jsonl").values()}
    assert {k: r["status"] for k, r in runs.items()} == {
        "make": "not_forwardable", "double": "task", "register": "not_forwardable"}  # fmt: skip
    # make: one split run over its calling test, none over the whole suite
    assert calls["make"] == [[TEST + "test_make"]]
    assert runs["make"]["forward_whole"] is False
    # register's calling test passes forwarded; test_registered, which never calls it,
    # reads the module list it changed and fails in the whole-suite run
    assert calls["register"] == [[TEST + "test_register"], None]
    assert calls["double"] == [[TEST + "test_double"], None]
    assert runs["register"]["forward_whole"] is True and runs["double"]["forward_whole"] is True
    for row in runs.values():
        assert row["forward_seconds"] > 0 and row["seconds"] > 0 and row["wait_seconds"] >= 0
    assert runs["double"]["screen_seconds"] > 0  # only a forwardable one is screened
    assert runs["make"]["screen_seconds"] == runs["register"]["screen_seconds"] == 0.0
    # rows written before these fields existed still load and are reused: the same tasks
    path, tasks_path = summary.out_dir / "runs.jsonl", summary.out_dir / "tasks.jsonl"
    tasks = [json.loads(line) for line in tasks_path.read_text().splitlines()]
    old = [{k: v for k, v in json.loads(line).items()
            if not k.endswith("_seconds") and k != "forward_whole"}
           for line in path.read_text().splitlines()]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in old))
    calls.clear()
    again = generate_tasks(source, tmp_path / "out", CFG, spec="pk")
    assert again.reused == 3 and again.ran == 0 and not calls
    assert [json.loads(line) for line in tasks_path.read_text().splitlines()] == tasks
