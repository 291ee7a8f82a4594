"""Which tests a deletion can fail: per-test call coverage from the baseline's probe run.

The baseline's first run (``run_suite(probe=True)``) records, per test, the functions of the
tree whose code it called (setup, call and teardown; ``sys.setprofile`` ``call`` events on
code objects of the tree's files, keyed ``file:first line``, so a property's getter and
setter are two keys), the caller graph, what ran outside any single test (import and
collection, fixtures shared by several tests: scope above ``function``), and the tests that
started a process. A deletion then runs only :func:`selected` tests:

* a function called outside a single test's protocol runs the **whole suite** (``None``): its
  deletion can break an import (``collect_error``) or a shared fixture, which fails tests that
  never called it;
* otherwise the tests that called it, or called any function that (transitively) called it
  (a cache in a caller, ``lru_cache`` on it: a test whose call was answered from a cache an
  earlier test filled calls the stub once that test failed), plus every test that started a
  process (its child imports the tree where no hook counts calls);
* an empty selection is ``no_failure`` without a run: the deleted body raises only when it
  runs, and up to the first call of the function a run of the deleted tree is the baseline
  run itself (flaky tests are already out of the baseline), so a function no test called is
  called by none.

Any sign that the selection is off (a run that is not complete, a selected test the run did
not report, a collection error) makes the generator run the whole suite instead
(generate._try). docs/feature_deletion.md, "Test selection", argues where this can still
differ from a whole-suite run, and tests/unit/envs/feature_deletion/test_selection.py
compares the two on the textkit fixture and on a real package's candidates.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from composer_replication.envs.feature_deletion.candidates import Candidate
from composer_replication.sandbox import pyast

_RANGES = re.compile(r"^(\d{1,7}(-\d{1,7})?(,\d{1,7}(-\d{1,7})?)*)?$")
_KEY = re.compile(r"^[^\x00]{1,1000}:\d{1,7}$")
MAX_TESTS = 200_000


@dataclass(frozen=True)
class Coverage:
    """The baseline's per-test call coverage (module docstring), decoded."""

    tests: tuple[str, ...]
    """Test ids in the order the baseline ran them."""
    called: dict[str, frozenset[int]]
    """``file:first line`` of a function -> indices (into ``tests``) of the tests calling it."""
    outside: frozenset[str]
    """Functions called outside a single test's protocol."""
    spawned: frozenset[int]
    """Tests that started a process."""
    callers: dict[str, tuple[str, ...]]
    """Function -> the functions of the tree it was called from (nearest frame of the tree)."""


def decode_ranges(text: str, limit: int) -> frozenset[int]:
    """``"0-4,7"`` -> {0, 1, 2, 3, 4, 7}; ``ValueError`` for anything else or an index at or
    beyond ``limit``."""
    if not isinstance(text, str) or not _RANGES.match(text):
        raise ValueError("not a list of ranges")
    out: set[int] = set()
    for part in filter(None, text.split(",")):
        a, _, b = part.partition("-")
        lo, hi = int(a), int(b or a)
        if not 0 <= lo <= hi < limit:
            raise ValueError(f"range {part} outside 0..{limit - 1}")
        out.update(range(lo, hi + 1))
    return frozenset(out)


def read_coverage(data: object) -> Coverage | None:
    """The :class:`Coverage` of a probe's ``coverage`` entry (written inside the sandbox:
    checked field by field), or None when there is none to trust (absent, malformed, too
    large for the frame, a process started outside any test): every deletion then runs the
    whole suite, as before test selection."""
    if not isinstance(data, dict) or data.get("unowned_spawn") is not False:
        return None
    try:
        tests = data["tests"]
        if not (isinstance(tests, list) and len(tests) <= MAX_TESTS
                and all(isinstance(t, str) for t in tests)):  # fmt: skip
            return None
        n = len(tests)
        called = {k: decode_ranges(v, n) for k, v in data["called"].items() if _KEY.match(k)}
        if len(called) != len(data["called"]):
            return None
        outside = data["outside"]
        callers = data["callers"]
        if not (isinstance(outside, list) and all(isinstance(k, str) for k in outside)
                and isinstance(callers, dict)
                and all(isinstance(v, list) and all(isinstance(c, str) for c in v)
                        for v in callers.values())):  # fmt: skip
            return None
        return Coverage(tuple(tests), called, frozenset(outside),
                        decode_ranges(data["spawned"], n),
                        {str(k): tuple(v) for k, v in callers.items()})  # fmt: skip
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def line_key(root: Path, cand: Candidate, _cache: dict | None = None) -> str:
    """``file:line`` of the candidate's ``def`` as its code object names it: the line of its
    first decorator, else of the ``def`` (``co_firstlineno``)."""
    from composer_replication.envs.feature_deletion.forward import function_at

    cache = _cache if _cache is not None else {}
    if cand.file not in cache:
        cache[cand.file] = pyast.parse((Path(root) / cand.file).read_text(encoding="utf-8"))
    node = function_at(cache[cand.file], cand)
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return f"{cand.file}:{first}"


def selected(cov: Coverage, key: str, passing: list[str]) -> list[str] | None:
    """The baseline-passing tests a deletion of the function ``key`` (``file:line``) can
    fail, in the order the baseline ran them; None: run the whole suite (module docstring)."""
    if key in cov.outside:
        return None
    reach, todo = {key}, [key]
    while todo:  # the function and every function that (transitively) called it
        for caller in cov.callers.get(todo.pop(), ()):
            if caller not in reach:
                reach.add(caller)
                todo.append(caller)
    hit = set(cov.spawned)
    for k in reach:
        hit |= cov.called.get(k, frozenset())
    keep = set(passing)
    return [t for i, t in enumerate(cov.tests) if i in hit and t in keep]
