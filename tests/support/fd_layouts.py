"""A constructed repository whose test code a file-name rule misses (issue 37), for the
Feature Deletion tests: tests inside the package (``layoutkit/tests.py``), a root ``test.py``,
a ``python_files`` setting (``layoutkit/check_core.py``), test data outside any test folder
(``data/expected.json``, read by ``test.py``) and an in-package assertion helper module
(``layoutkit/checks.py``: ``raises`` and ``assert_close``, which only tests call).

The package's features (``layoutkit/core.py``) are what may become tasks; nothing else."""

from __future__ import annotations

import json
from pathlib import Path

FEATURES = {"double", "shout", "parse_pair", "mean", "clamp", "Stack.__init__", "Stack.push_all"}
"""The functions of ``core.py``: the only symbols allowed to be tasks."""
TEST_CODE = {"layoutkit/tests.py", "test.py", "layoutkit/check_core.py", "layoutkit/checks.py",
             "data/expected.json", "pytest.ini"}  # fmt: skip
"""Files that must be in no served tree (and define no task)."""

CORE = '''
def double(x):
    """Twice x."""
    result = x + x
    return result


def shout(text):
    """Upper case with an exclamation mark."""
    loud = text.upper()
    return loud + "!"


def parse_pair(text):
    """'a=b' -> ('a', 'b')."""
    key, _, value = text.partition("=")
    if not key or not _:
        raise ValueError(f"not a pair: {text!r}")
    return key.strip(), value.strip()


def mean(xs):
    """The arithmetic mean."""
    xs = list(xs)
    return sum(xs) / len(xs)


def clamp(x, lo, hi):
    """x limited to [lo, hi]."""
    if x < lo:
        return lo
    return min(x, hi)


class Stack:
    def __init__(self):
        self.items = []

    def push_all(self, values):
        """Push every value; the stack's new size."""
        for v in values:
            self.items.append(v)
        return len(self.items)
'''

CHECKS = '''
def _gap(a, b):
    return abs(a - b)


def assert_close(a, b, tol=1e-9):
    """Only tests call this: an assertion helper inside the package."""
    if _gap(a, b) > tol:
        raise AssertionError(f"{a} != {b}")


def raises(err, fn):
    """True iff fn() raises err (toolz's utils.raises)."""
    try:
        fn()
    except err:
        return True
    return False
'''

IN_PACKAGE_TESTS = """
from layoutkit.core import double, mean, clamp, Stack
from layoutkit.checks import assert_close, raises

CASES = [(1, 2), (2, 4), (-3, -6), (10, 20)]


def _expected(x):
    value = x * 2
    return value


def test_double():
    for x, want in CASES:
        assert double(x) == want
        assert double(x) == _expected(x)


def test_double_str():
    assert double("ab") == "abab"


def test_mean():
    assert_close(mean([1, 2, 3, 4]), 2.5)


def test_mean_empty():
    assert raises(ZeroDivisionError, lambda: mean([]))


def test_clamp():
    assert clamp(5, 0, 3) == 3
    assert clamp(-1, 0, 3) == 0
    assert clamp(2, 0, 3) == 2


def test_clamp_inside():
    assert clamp(1, 0, 9) == 1


def test_push_all():
    s = Stack()
    assert s.push_all([1, 2]) == 2
    assert s.push_all([3]) == 3
    assert s.items == [1, 2, 3]
"""

ROOT_TEST = """
import json
import os

from layoutkit.core import parse_pair, shout

HERE = os.path.dirname(os.path.abspath(__file__))


def load_expected():
    with open(os.path.join(HERE, "data", "expected.json")) as f:
        return json.load(f)


def test_shout():
    for word, want in load_expected()["shout"].items():
        assert shout(word) == want


def test_shout_empty():
    assert shout("") == "!"


def test_parse_pair():
    assert parse_pair("a = b") == ("a", "b")
"""

CHECK_CORE = """
import pytest

from layoutkit.core import parse_pair


def test_parse_pair_rejects():
    with pytest.raises(ValueError):
        parse_pair("nothing")


def test_parse_pair_values():
    assert parse_pair("k=v=w") == ("k", "v=w")
"""


def write_layout_repo(root: Path) -> Path:
    """Write the repository (module docstring) under ``root`` and return it."""
    pkg = root / "layoutkit"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "from layoutkit.core import Stack, clamp, double, mean, parse_pair, shout\n"
    )
    (pkg / "core.py").write_text(CORE.lstrip())
    (pkg / "checks.py").write_text(CHECKS.lstrip())
    (pkg / "tests.py").write_text(IN_PACKAGE_TESTS.lstrip())
    (pkg / "check_core.py").write_text(CHECK_CORE.lstrip())
    (root / "test.py").write_text(ROOT_TEST.lstrip())
    (root / "data").mkdir()
    expected = {"shout": {"hi": "HI!", "ok": "OK!", "Go": "GO!"}}
    (root / "data" / "expected.json").write_text(json.dumps(expected))
    (root / "pytest.ini").write_text("[pytest]\npython_files = tests.py test.py check_*.py\n")
    return root
