"""Split grading end to end on a small tree: the suite's stub forwards to the submission's
sandbox, and what crosses back (values, iterators, ``return self``, changed state, raised
exceptions of the tree's classes) behaves in the tests as it would in one process."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from composer_replication.config import SandboxConfig
from composer_replication.envs.feature_deletion.candidates import delete_body, find_candidates
from composer_replication.envs.feature_deletion.forward import forwarding_text
from composer_replication.envs.feature_deletion.source import staged_copy, suite_files
from composer_replication.sandbox.pytest_suite import run_suite
from composer_replication.sandbox.sandbox import Sandbox

MODULE = """
class Empty(ValueError):
    pass


class Bag:
    def __init__(self):
        self.items = []

    def add(self, x):
        self.items.append(x)
        return self


def countdown(n):
    while n > 0:
        yield n
        n -= 1


def first(values):
    if not values:
        raise Empty("nothing in", len(values))
    return values[0]


def apply(fn, x):
    return fn(x)


def compose(f, g):
    def both(x):
        return f(g(x))

    return both


def naturals():
    n = 0
    while True:
        yield n
        n += 1


def take(n, it):
    return [next(it) for _ in range(n)]


def safe(fn, x):
    try:
        return fn(x)
    except ZeroDivisionError:
        return "caught"
"""
TESTS = """
import pytest
from pkg.mod import Bag, Empty, apply, compose, countdown, first, naturals, safe, take


def test_bag():
    bag = Bag()
    assert bag.add(1).add(2) is bag
    assert bag.items == [1, 2]


def test_countdown():
    it = countdown(3)
    assert next(it) == 3 and list(it) == [2, 1]


def test_first():
    assert first([4, 5]) == 4
    with pytest.raises(Empty, match="nothing in"):
        first([])


def test_apply():
    assert apply(abs, -3) == 3


def test_apply_lambda():
    assert apply(lambda v: v + 1, 1) == 2


def times_ten(v):
    return v * 10


def test_apply_module_helper():
    assert apply(times_ten, 3) == 30


def test_apply_reentrant():
    assert apply(lambda v: apply(abs, v) * 2, -3) == 6


def test_compose():
    inc = compose(lambda v: v + 1, abs)
    assert inc(-4) == 5 and inc(2) == 3


def test_naturals_are_lazy():
    it = naturals()
    assert next(it) == 0 and next(it) == 1


def test_take_advances_our_iterator():
    it = iter([1, 2, 3, 4])
    assert take(2, it) == [1, 2]
    assert list(it) == [3, 4]


def test_first_in_a_map():
    assert all(map(lambda v: first([v]) == v, [1, 2]))


def test_first_walks():
    assert first(["walk"]) == "walk"


def test_safe_sees_our_exception():
    assert safe(lambda v: 1 / v, 0) == "caught"
    with pytest.raises(KeyError):
        safe(lambda v: {}[v], 1)
"""


UNITTEST = """
import unittest
from pkg.mod import first


class FirstTest(unittest.TestCase):
    def test_first(self):
        self.assertEqual(first([4, 5]), 4)
"""
HOSTILE = {
    "spoofed_unittest_stop": (
        "class _ShouldStop(Exception):\n"
        "    pass\n"
        "_ShouldStop.__module__ = 'unittest.case'\n"
        "raise _ShouldStop()"
    ),
    "stop_iteration": "raise StopIteration",
    "read_the_tests": (
        "import os\n"
        "seen = [f for _, _, files in os.walk('.') for f in files if f.startswith('test')]\n"
        "return values[0] if seen else 'no tests here'"
    ),
}


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("tree")
    (root / "pkg").mkdir()
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "mod.py").write_text(textwrap.dedent(MODULE))
    (root / "tests").mkdir()
    (root / "tests" / "test_mod.py").write_text(textwrap.dedent(TESTS))
    (root / "tests" / "test_unit.py").write_text(textwrap.dedent(UNITTEST))
    return root


@pytest.fixture(scope="module")
def box():
    return Sandbox(SandboxConfig(wall_timeout_s=30, cpu_time_s=30))


def _split(box, root: Path, symbol: str, body: str | None = None):
    """Split-grade ``symbol``: served is the original tree, or with ``body`` as the body."""
    cand = next(c for c in find_candidates(root) if c.symbol == symbol)
    original = (root / cand.file).read_text()
    suite = staged_copy(root, {cand.file: forwarding_text(delete_body(original, cand), cand)})
    text = original
    if body is not None:
        stubbed = delete_body(original, cand).splitlines()
        stubbed[cand.body_start - 1] = textwrap.indent(body, cand.indent)
        text = "\n".join(stubbed) + "\n"
    hidden = tuple(suite_files(root))
    served = staged_copy(root, {cand.file: text}, leave_out=hidden)
    try:
        return run_suite(box, str(suite), served=str(served), hidden=hidden)
    finally:
        shutil.rmtree(suite, ignore_errors=True)
        shutil.rmtree(served, ignore_errors=True)


@pytest.mark.parametrize(
    "symbol, tests",
    [("Bag.__init__", ["test_bag"]), ("Bag.add", ["test_bag"]), ("countdown", ["test_countdown"]),
     ("first", ["test_first", "test_first_in_a_map", "tests/test_unit.py::FirstTest::test_first"]),
     ("apply", ["test_apply", "test_apply_lambda", "test_apply_reentrant",
                "test_apply_module_helper"]),
     ("compose", ["test_compose"]), ("naturals", ["test_naturals_are_lazy"]),
     ("take", ["test_take_advances_our_iterator"]), ("safe", ["test_safe_sees_our_exception"])],
)  # fmt: skip
def test_forwarded_function_passes_its_tests(box, tree, symbol, tests):
    """Values, iterators, ``return self``, changed state, exceptions of the tree's classes;
    a test's lambda called back (also re-entrantly), a returned closure called over there, a
    returned infinite generator advanced lazily, our iterator advanced by the other side,
    our exception raised inside the other side's ``try``."""
    rep = _split(box, tree, symbol)
    assert rep.ok, rep.output[-2000:]
    for test in tests:
        test_id = test if "::" in test else f"tests/test_mod.py::{test}"
        assert rep.outcomes[test_id] == "passed", rep.details


@pytest.mark.parametrize("attack", sorted(HOSTILE))
def test_a_hostile_body_cannot_pass_the_tests(box, tree, attack):
    """Found by red-teaming split grading: an exception class disguised as unittest's
    ``_ShouldStop`` (unittest swallows it: the test would pass); ``StopIteration`` ending
    the test's own ``map`` early (``all([])`` is True); reading the tests' expected values
    from the served tree. None may pass a test the honest body passes."""
    rep = _split(box, tree, "first", HOSTILE[attack])
    assert rep.ok, rep.output[-2000:]
    for test in ("tests/test_mod.py::test_first", "tests/test_mod.py::test_first_in_a_map",
                 "tests/test_unit.py::FirstTest::test_first"):  # fmt: skip
        assert rep.outcomes[test] == "failed", (attack, test, rep.details.get(test))
    if attack == "read_the_tests":
        assert "no tests here" in rep.details["tests/test_mod.py::test_first_walks"]
