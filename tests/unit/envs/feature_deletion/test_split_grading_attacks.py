"""Third red-team pass on Feature Deletion's split grading (docs/feature_deletion.md, "Attacks").

Each test runs one attack through the real grader (two bubblewrap sandboxes) and asserts that
it earns NO credit (or does no harm): a test that fails here is an attack that works.

Fixtures: the vendored textkit tree, and ``unitkit``, a copy of it with one more module
(``textkit/extra.py``: ``roman`` and ``shout``) whose tests are written in two common styles:
unittest.TestCase methods (``tests/test_extra.py``) and a pytest test that walks
``zip(map(f, inputs), expected)`` (``tests/test_extra_map.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from support.textkit import textkit_records

from composer_replication.config import TaskGenConfig
from composer_replication.envs.feature_deletion.candidates import STUB
from composer_replication.envs.feature_deletion.generate import generate_tasks, suite_sandbox
from composer_replication.envs.feature_deletion.grade import grade_submission, submission_flags
from composer_replication.envs.feature_deletion.source import resolve_source
from composer_replication.envs.feature_deletion.workspace import task_state_text
from composer_replication.sandbox.sandbox import Sandbox

FIXTURE = Path(__file__).parents[3] / "fixtures" / "feature_deletion" / "textkit"

EXTRA = '''"""Extra helpers."""


def roman(n):
    """The Roman numeral of ``n`` (1..3999)."""
    vals = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
            (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]
    out = ""
    for v, s in vals:
        while n >= v:
            out += s
            n -= v
    return out


def shout(text):
    """``text`` in capitals with an exclamation mark."""
    return text.upper() + "!"
'''
UNITTEST_TESTS = """import unittest

from textkit.extra import roman


class TestRoman(unittest.TestCase):
    def test_small(self):
        self.assertEqual(roman(4), "IV")

    def test_large(self):
        self.assertEqual(roman(1994), "MCMXCIV")
"""
MAP_TESTS = """from textkit.extra import shout


def test_shout_many():
    for got, want in zip(map(shout, ["a", "bc"]), ["A!", "BC!"]):
        assert got == want
"""


def _tasks(source, out: Path, max_candidates: int | None = None) -> dict[str, dict]:
    cfg = TaskGenConfig(workers=1, max_candidates=max_candidates)
    summary = generate_tasks(source, out, cfg, spec=str(source.root))
    lines = (summary.out_dir / "tasks.jsonl").read_text().splitlines()
    return {t["symbol"]: t for t in map(json.loads, lines)}


@pytest.fixture(scope="module")
def textkit(textkit_tasks):
    source = resolve_source(str(FIXTURE))  # the session's textkit set (tests/conftest.py)
    return source, {t["symbol"]: t for t in textkit_records(textkit_tasks)}


@pytest.fixture(scope="module")
def unitkit(tmp_path_factory):
    root = tmp_path_factory.mktemp("src") / "unitkit"
    shutil.copytree(FIXTURE, root, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "textkit" / "extra.py").write_text(EXTRA)
    (root / "tests" / "test_extra.py").write_text(UNITTEST_TESTS)
    (root / "tests" / "test_extra_map.py").write_text(MAP_TESTS)
    source = resolve_source(str(root))
    return source, _tasks(source, tmp_path_factory.mktemp("tasks"))


@pytest.fixture(scope="module")
def box():
    return Sandbox(suite_sandbox(TaskGenConfig(suite_timeout_s=30)))


def _submission(source, task, body: str, prelude: str = "") -> str:
    """The task's file with the stub replaced by ``body`` and ``prelude`` at the end."""
    text = task_state_text(source.root, task)
    ind = task["indent"]
    lines = "".join(ind + ln + "\n" for ln in body.strip("\n").splitlines())
    assert ind + STUB + "\n" in text
    return text.replace(ind + STUB + "\n", lines, 1) + "\n" + prelude


def _grade(box, source, task, body, prelude="", reward="all_or_nothing"):
    text = _submission(source, task, body, prelude)
    return grade_submission(box, source.root, task, text, reward)


def _no_credit(box, source, task, body, prelude=""):
    """Grade the submission and assert it passes no target and earns nothing."""
    v = _grade(box, source, task, body, prelude)
    assert v.reward == 0.0 and v.targets_passed == [], v.feedback
    return v


# ---- forged credit -------------------------------------------------------------------------


DISGUISED_SHOULD_STOP = """
class _Stop(Exception):
    pass


# forward_client._exception used to resolve (module, qualname) by walking vars() from any
# module of the suite's tree; a unittest-style test module binds `unittest`, so this path
# reached unittest.case._ShouldStop, which unittest's testPartExecutor swallows (a "pass").
_Stop.__module__ = "test_extra"
_Stop.__qualname__ = "unittest.case._ShouldStop"
"""


def test_should_stop_reached_through_a_test_modules_import_gets_no_credit(unitkit, box):
    source, tasks = unitkit
    task = tasks["roman"]
    assert all("TestRoman" in t for t in task["failing_tests"])
    assert (
        submission_flags(
            task_state_text(source.root, task),
            _submission(source, task, "raise _Stop()", DISGUISED_SHOULD_STOP),
        )
        == []
    )
    _no_credit(box, source, task, "raise _Stop()", DISGUISED_SHOULD_STOP)


DISGUISED_STOP_ITERATION = """
class _End(Exception):
    pass


# module "textkit.core" is in the tree; textkit.core.re.enum.bltns is the builtins module
# (enum.py: `import builtins as bltns`), so this rebuilds StopIteration from a plain call,
# around the check that only lets an iterator's next raise it: the test's map() ends at once
# and its zip loop asserts nothing.
_End.__module__ = "textkit.core"
_End.__qualname__ = "re.enum.bltns.StopIteration"
"""


def test_stop_iteration_reached_through_a_module_walk_gets_no_credit(unitkit, box):
    source, tasks = unitkit
    task = tasks["shout"]
    assert task["failing_tests"] == ["tests/test_extra_map.py::test_shout_many"]
    _no_credit(box, source, task, "raise _End()", DISGUISED_STOP_ITERATION)


def test_plain_builtin_stop_iteration_is_still_refused(unitkit, box):
    """Control (blocked today): the same without the disguise is a RuntimeError."""
    source, tasks = unitkit
    _no_credit(box, source, tasks["shout"], "raise StopIteration")


def test_skip_test_reached_through_a_module_walk_is_not_a_pass(unitkit, box):
    """Blocked (skips count as failures), but the same walk rebuilds unittest.SkipTest."""
    source, tasks = unitkit
    prelude = DISGUISED_SHOULD_STOP.replace("unittest.case._ShouldStop", "unittest.SkipTest")
    _no_credit(box, source, tasks["roman"], "raise _Stop('later')", prelude)


def _vendored_copies(module: str, symbol: str) -> list[str]:
    """Files under /usr (bound into every sandbox) named like ``module`` that define
    ``symbol``: copies of the package vendored by some other software."""
    out = []
    for d, _subs, files in os.walk("/usr"):
        for f in files:
            if f == f"{module}.py":
                p = os.path.join(d, f)
                try:
                    if f"def {symbol}(" in Path(p).read_text(errors="replace"):
                        out.append(p)
                except OSError:
                    pass
    return out


INFLECTION = Path.home() / ".cache/composer_replication/feature_deletion/src/inflection-0.5.1"

LOAD_VENDORED = """
return _vendored_camelize()(string, uppercase_first_letter)
"""

# the walk of /usr runs once per graded process, not once per call of the function (the
# inflection suite calls it hundreds of times); a failed search is remembered too
FIND_VENDORED = """
_FOUND = []


def _vendored_camelize():
    import os as _os, runpy as _runpy
    if not _FOUND:
        for _d, _subs, _files in _os.walk("/usr"):
            if "inflection.py" in _files:
                try:
                    _ns = _runpy.run_path(_os.path.join(_d, "inflection.py"))
                except Exception:
                    continue
                if "camelize" in _ns:
                    _FOUND.append(_ns["camelize"])
                    break
        else:
            _FOUND.append(None)
    if _FOUND[0] is None:
        raise RuntimeError("no copy")
    return _FOUND[0]
"""


@pytest.mark.skipif(not INFLECTION.is_dir(), reason="inflection 0.5.1 not in the local cache")
def test_a_copy_vendored_under_usr_is_not_readable(tmp_path_factory, box):
    """/usr was bound whole, only this interpreter's site-packages masked: on this machine the
    Google Cloud SDK vendors inflection 0.5.1 (bq/third_party), a source of the default recipe,
    and the submission ran it. Skipped where no such copy exists; the machine-independent
    check is tests/unit/sandbox/test_sandbox.py (no importable package under /usr)."""
    if not _vendored_copies("inflection", "camelize"):
        pytest.skip("no vendored inflection under /usr on this machine")
    control: dict = {}
    exec(FIND_VENDORED, control)  # outside the sandbox the attack finds a working copy
    assert control["_vendored_camelize"]()("foo_bar", True) == "FooBar"
    source = resolve_source(str(INFLECTION))
    # camelize is the second function of inflection/__init__.py (after _irregular)
    tasks = _tasks(source, tmp_path_factory.mktemp("tasks"), max_candidates=2)
    task = tasks["camelize"]
    v = _grade(box, source, task, LOAD_VENDORED, FIND_VENDORED)
    assert v.flags == []
    assert v.reward == 0.0, v.feedback


# ---- resources -----------------------------------------------------------------------------

SPAWN = """
import os as _os, sys as _sys, _posixsubprocess as _pps


def _spawn(code):
    r, w = _os.pipe()
    er, ew = _os.pipe()
    exe = _sys.executable
    argv = [exe, "-I", "-S", "-c", code.replace("FD", str(w))]
    _pps.fork_exec(argv, [exe.encode()], True, (w,), None, None, -1, -1, -1, -1, -1, -1,
                   er, ew, True, False, -1, None, None, None, -1, None, False)
    _os.close(w)
    _os.close(ew)
    return r


_HELD = []
"""

HOLD = """
if not _HELD:
    code = ("import os, time\\nb = bytearray(MB * 2**20)\\nfor i in range(0, len(b), 4096): b[i] = 1\\n"
            "os.write(FD, b'ok')\\ntime.sleep(SLEEP)  # MARK")
    rs = [_spawn(code) for _ in range(KIDS)]
    _HELD.append(sum(_os.read(r, 2) == b"ok" for r in rs))
raise ValueError("held_mb=%d" % (_HELD[0] * MB))
"""


def test_children_cannot_hold_more_memory_than_the_limit(textkit):
    """The audit hook refuses os.fork/posix_spawn/subprocess, but _posixsubprocess.fork_exec
    raises no audit event, and every child gets its own RLIMIT_AS: the submission's sandbox
    held max_processes x memory_mb (64 x 2 GB by default). It now has one process."""
    source, tasks = textkit
    mem = 384
    small = Sandbox(suite_sandbox(TaskGenConfig(suite_timeout_s=30, memory_mb=mem)))
    body = HOLD.replace("MB", "160").replace("KIDS", "3").replace("SLEEP", "2")
    v = _grade(small, source, tasks["ordinal"], body, SPAWN)
    held = [
        int(x.split("held_mb=")[1].split()[0]) for x in v.feedback.split("\n") if "held_mb=" in x
    ]
    assert v.reward == 0.0
    assert not held or max(held) <= mem, f"the submission's children held {max(held)} MB > {mem} MB"


def _marked_processes(mark: str) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if mark.encode() in (p / "cmdline").read_bytes():
                    out.append(int(p.name))
            except OSError:
                pass
    return out


def test_no_child_of_the_submission_survives_grading(textkit, box):
    """Blocked: the PID namespace dies with the grading."""
    source, tasks = textkit
    mark = f"rt3-mark-{os.getpid()}-{time.time_ns()}"
    body = (
        HOLD.replace("MB", "1")
        .replace("KIDS", "2")
        .replace("SLEEP", "120")
        .replace("# MARK", "# " + mark)
    )
    v = _grade(box, source, tasks["ordinal"], body, SPAWN)
    assert v.reward == 0.0
    time.sleep(0.5)
    assert _marked_processes(mark) == []


# ---- the wire: blocked today (regression tests) ---------------------------------------------

WIRE = """
import __main__ as _h  # the harness (module mode): the submission can write any frame
"""


@pytest.mark.parametrize(
    "name,body",
    [
        # a str with a lone surrogate in an exception: rebuilt in the suite, printed by pytest
        ("lone_surrogate_message", "raise ValueError('\\ud800' + str(n))"),
        # complex NaN passes the sender's check_plain (only float NaN is refused) but its
        # repr '(nan+0j)' is not a literal: the suite's side must refuse it, not raise
        ("complex_nan", "return complex(float('nan'), 0.0)"),
        # complex infinity is a literal ('1e999j' parses): plain but useless
        ("complex_inf", "return complex(0.0, float('inf'))"),
        # a reply sent ahead of the question, then the real one
        ("unsolicited_frame", "_h._IO['channel'].send('value', str(n) + 'th', [])\nreturn 'x'"),
        # a handle of the suite's objects it never handed over
        ("bogus_theirs_handle", "_h._IO['channel'].send('theirs', 10**6, [])\nraise SystemExit"),
        # write-back aimed at every index
        (
            "effects_everywhere",
            "_h._IO['channel'].send('value', 'x', [(i, {'a': 1}) for i in range(-3, 4)])\nraise SystemExit",
        ),
        # a frame nested deeper than MAX_DEPTH on the wire
        (
            "deep_frame",
            "import os as _o\n_o.write(_h._IO['channel'].wfd, (\"('value', \" + '[' * 90 + ']' * 90 + ', [])\\n').encode())\nraise SystemExit",
        ),
        # the served process exits in the middle of the suite
        (
            "exit_mid_suite",
            "import os as _o\nif n == 3:\n    _o.kill(_o.getpid(), 9)\nreturn str(n) + 'st'",
        ),
    ],
)
def test_wire_tricks_get_no_credit_and_never_raise(textkit, box, name, body):
    source, tasks = textkit
    v = _grade(box, source, tasks["ordinal"], body, WIRE)
    assert v.reward == 0.0
    assert v.targets_passed == [] or name == "exit_mid_suite"


def test_fraction_reward_counts_only_true_answers(textkit, box):
    """Hard-coding what the test ids show (the agent can read the tests) is overfitting, not
    forging: with the 'fraction' reward only the cases answered right count."""
    source, tasks = textkit
    v = _grade(
        box, source, tasks["ordinal"], "return {1: '1st', 2: '2nd'}.get(n, '')", reward="fraction"
    )
    assert v.reward == pytest.approx(2 / 5)
