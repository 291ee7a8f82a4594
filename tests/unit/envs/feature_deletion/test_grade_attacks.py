"""Feature Deletion grading against a policy that games it: on five generated tasks of the
textkit fixture, restoring the original body scores 1, the deleted body 0, and every attack
scores 0: whatever it leaves in the workspace (a planted conftest hook, an edited test, a
leftover ``.pyc``) never reaches the grading run, and what runs when the submission is
imported (``pytest.skip``, ``os._exit`` at import, forged report frames, patching pytest's
reports or its runner, swapping a test's code, an object equal to everything, reading the
original from an installed or cached copy) runs in a sandbox of its own, apart from pytest
and the tests (split grading, sandbox/forward_client.py), and cannot reach them.

Several attacks are written to pass the static check (no flag) on purpose, so that the
isolation or the run-time integrity checks are what stops them. Nothing the code under test
writes to the report channel, signed or not, and no unparseable submission makes the grader
raise: they are refused and score 0."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import py_compile
import shutil
import sys
import time
from pathlib import Path

import pytest
from support.textkit import textkit_records

from composer_replication.config import TaskGenConfig
from composer_replication.envs.base import unit_hash
from composer_replication.envs.feature_deletion import grade as fd_grade
from composer_replication.envs.feature_deletion.candidates import STUB, original_body
from composer_replication.envs.feature_deletion.generate import generate_tasks, suite_sandbox
from composer_replication.envs.feature_deletion.grade import (
    grade_workspace,
    submission_flags,
    suspicious_constructs,
)
from composer_replication.envs.feature_deletion.source import (
    resolve_source,
    staged_copy,
    tree_digest,
)
from composer_replication.envs.feature_deletion.workspace import candidate_of, make_workspace
from composer_replication.sandbox.pytest_suite import parse_frames, run_suite
from composer_replication.sandbox.sandbox import Sandbox, bindable_dir

FIXTURE = Path(__file__).parents[3] / "fixtures" / "feature_deletion" / "textkit"
SYMBOLS = [
    "slugify",
    "ordinal",
    "titlecase",
    "truncate",
    "Counter.most_common",
]  # files: core, numbers
SOURCE = os.environ.get("CR_FD_ATTACK_SOURCE", str(FIXTURE))
"""Run the same attacks on another source's tasks (the first five, by hash order), e.g.
``CR_FD_ATTACK_SOURCE=toolz==1.2.0`` (fetched with pip); the default is the vendored fixture."""
ATTACK_TASKS = int(os.environ.get("CR_FD_ATTACK_TASKS", "2"))
"""Tasks every attack runs on (the attacks do not depend on the function; two tasks in two
different files keep the suite short, ``CR_FD_ATTACK_TASKS=5`` runs the full matrix)."""


@pytest.fixture(scope="module")
def generated(tmp_path_factory, textkit_tasks):
    source = resolve_source(SOURCE)
    if SOURCE == str(FIXTURE):
        tasks = textkit_records(textkit_tasks)  # the session's textkit set (tests/conftest.py)
    else:
        out = tmp_path_factory.mktemp("tasks")
        summary = generate_tasks(source, out, TaskGenConfig(workers=2), spec=SOURCE)
        lines = (summary.out_dir / "tasks.jsonl").read_text().splitlines()
        tasks = sorted(map(json.loads, lines), key=lambda t: unit_hash(t["task_id"]))
        return source, tasks[: len(SYMBOLS)]
    by_symbol = {t["symbol"]: t for t in tasks}
    return source, [by_symbol[s] for s in SYMBOLS]


@pytest.fixture(scope="module")
def box():
    return Sandbox(suite_sandbox(TaskGenConfig(suite_timeout_s=30)))


@pytest.fixture(scope="module")
def outside_copy(generated):
    """The original tree at a host path any user can read (an "installed" or cached copy):
    it exists outside the sandbox, and the attacks know where."""
    source, _ = generated
    path = Path(bindable_dir("cr-fd-installed-")) / source.name
    shutil.copytree(source.root, path)
    yield path
    shutil.rmtree(path.parent, ignore_errors=True)


def _replace_stub(ws: Path, task: dict, body: str) -> None:
    path = ws / task["file"]
    indent = task["indent"]
    lines = "".join(indent + ln + "\n" for ln in body.strip("\n").splitlines())
    text = path.read_text()
    assert STUB in text
    path.write_text(text.replace(indent + STUB + "\n", lines, 1))


def _restore(ws: Path, task: dict, source, outside=None) -> None:
    original = (source.root / task["file"]).read_text()
    body = original_body(original, candidate_of(task))
    path = ws / task["file"]
    path.write_text(path.read_text().replace(task["indent"] + STUB, body, 1))


def _append(ws: Path, task: dict, code: str) -> None:
    path = ws / task["file"]
    path.write_text(path.read_text() + "\n" + code.strip("\n") + "\n")


def attack_skip(ws, task, source, outside):
    _replace_stub(ws, task, "import pytest\npytest.skip('later')")


def attack_conftest_rewrites_failures(ws, task, source, outside):
    hook = (
        "import pytest\n\n"
        "@pytest.hookimpl(hookwrapper=True)\n"
        "def pytest_runtest_makereport(item, call):\n"
        "    outcome = yield\n"
        "    report = outcome.get_result()\n"
        "    report.outcome = 'passed'\n"
        "    report.longrepr = None\n"
    )
    (ws / "conftest.py").write_text(hook)
    for test_id in task["failing_tests"]:  # and next to every failing test file
        (ws / test_id.split("::")[0]).parent.joinpath("conftest.py").write_text(hook)


def attack_edit_failing_tests(ws, task, source, outside):
    for test_id in task["failing_tests"]:
        path = ws / test_id.split("::")[0]
        text = path.read_text()
        path.write_text(text.replace("assert ", "assert True or "))


def attack_os_exit_at_import(ws, task, source, outside):
    _restore(ws, task, source)  # even with the right body: a run that does not finish is 0
    _append(ws, task, "import os as _o\ngetattr(_o, '_ex' + 'it')(0)")


def attack_load_installed_copy(ws, task, source, outside):
    """Run the original module from wherever a copy may be (an installed/cached copy at a
    known host path, the generator's source tree, any site-packages) and take its function."""
    name = task["symbol"].split(".")[0]
    places = [str(outside / task["file"]), str(source.root / task["file"])]
    _replace_stub(
        ws,
        task,
        "import glob, runpy\n"
        f"paths = {places!r}\n"
        "import sys, sysconfig\n"
        "for d in [sysconfig.get_paths()['purelib'], sys.prefix]:\n"
        f"    paths += glob.glob(d + '/**/{task['file']}', recursive=True)\n"
        "for p in paths:\n"
        "    try:\n"
        f"        ns = runpy.run_path(p)\n"
        "    except OSError:\n"
        "        continue\n"
        f"    globals()['{name}'] = ns['{name}']\n"
        "raise RuntimeError('no copy of the original is visible')",
    )


def attack_leftover_pyc(ws, task, source, outside):
    """Bytecode of the original left in the workspace, loaded by the stub at import."""
    target = ws / task["file"]
    pyc = target.parent / "__pycache__" / f"{target.stem}.cpython-311.pyc"
    pyc.parent.mkdir(exist_ok=True)
    py_compile.compile(str(source.root / task["file"]), cfile=str(pyc), doraise=True)
    _append(
        ws,
        task,
        "import os as _o, runpy as _r\n"
        "_d = _o.path.join(_o.path.dirname(_o.path.abspath(__file__)), '__py' + 'cache__')\n"
        "for _f in (_o.listdir(_d) if _o.path.isdir(_d) else []):\n"
        "    globals().update({k: v for k, v in _r.run_path(_o.path.join(_d, _f)).items()\n"
        "                      if not k.startswith('__')})",
    )


def attack_forge_report_frames(ws, task, source, outside):
    frames = "".join(f"{'0' * 64} ('test', {t!r}, 'passed', '')\\n" for t in task["failing_tests"])
    _append(ws, task, _write_to_every_fd(f"{frames!r}.encode()"))


def _write_to_every_fd(data: str) -> str:
    """Module code writing the bytes expression ``data`` to fds 1-19 (whatever is open)."""
    return (
        "import os as _o\n"
        "for _fd in range(1, 20):\n"
        "    try:\n"
        f"        _o.write(_fd, {data})\n"
        "    except OSError:\n"
        "        pass"
    )


def attack_patch_pytest_reports(ws, task, source, outside):
    """Rewrite every report to 'passed' from inside the module, spelled so that no static
    flag fires (no import of pytest, no ``sys.modules``)."""
    _append(
        ws,
        task,
        "import sys as _s\n"
        "_mods = vars(_s)['mod' + 'ules']\n"
        "_rep = _mods.get('_py' + 'test.reports')\n"
        "if _rep is not None:\n"
        "    _init = _rep.TestReport.__init__\n"
        "    def _passed(self, *a, **k):\n"
        "        _init(self, *a, **k)\n"
        "        self.outcome = 'passed'\n"
        "        self.longrepr = None\n"
        "    _rep.TestReport.__init__ = _passed",
    )


def attack_swap_test_code(ws, task, source, outside):
    """When first called, replace the code of every test function with a no-op."""
    _replace_stub(
        ws,
        task,
        "import sys as _s\n"
        "for _n, _m in list(vars(_s)['mod' + 'ules'].items()):\n"
        "    if 'test' in _n:\n"
        "        for _k, _v in list(vars(_m).items()):\n"
        "            if _k.startswith('test') and callable(_v):\n"
        "                setattr(_v, '__co' + 'de__', getattr(lambda *a, **k: None,\n"
        "                                                     '__co' + 'de__'))\n"
        "raise AssertionError('nothing to see')",
    )


def attack_rebind_runner_globals(ws, task, source, outside):
    """Replace module-level names pytest's runner looks up on every test (its call wrapper)
    with a version that swallows the test's exception; the function stays deleted."""
    _append(
        ws,
        task,
        "import sys as _s\n"
        "_run = vars(_s)['mod' + 'ules'].get('_py' + 'test.runner')\n"
        "if _run is not None:\n"
        "    _Orig = _run.CallInfo\n"
        "    class _Quiet(_Orig):\n"
        "        @classmethod\n"
        "        def from_call(cls, func, when, reraise=None):\n"
        "            def swallowed():\n"
        "                try:\n"
        "                    return func()\n"
        "                except Exception:\n"
        "                    return None\n"
        "            return _Orig.from_call(swallowed if when == 'call' else func, when, reraise)\n"
        "    _run.CallInfo = _Quiet",
    )


def attack_equal_to_everything(ws, task, source, outside):
    """Return a str subclass that compares equal to any expected value (no pytest touched)."""
    _replace_stub(
        ws,
        task,
        "class _Everything(str):\n"
        "    def __eq__(self, other):\n"
        "        return True\n"
        "    def __ne__(self, other):\n"
        "        return False\n"
        "    __hash__ = str.__hash__\n"
        "return _Everything('x')",
    )


def attack_patch_builtins_in_shared_process(ws, task, source, outside):
    """Make every ``assert`` comparison the tests do succeed by patching the comparison
    helpers pytest's assertion rewriting and the tests' modules share with the target."""
    _append(
        ws,
        task,
        "import sys as _s\n"
        "for _n, _m in list(vars(_s)['mod' + 'ules'].items()):\n"
        "    if _n.startswith('test') or _n.startswith('tests'):\n"
        "        vars(_m)['@py_assert1'] = None\n"
        "_ar = vars(_s)['mod' + 'ules'].get('_py' + 'test.assertion.rewrite')\n"
        "if _ar is not None:\n"
        "    _ar._call_reprcompare = lambda *a, **k: None\n"
        "    _ar._format_explanation = lambda *a, **k: ''\n"
        "    _ar._should_repr_global_name = lambda *a, **k: False",
    )


def attack_report_non_ascii_line(ws, task, source, outside):
    """An odd line on every fd, the report's included: recorded as tampering, never raised
    (``hmac.compare_digest`` raised TypeError on a non-ASCII tag)."""
    _restore(ws, task, source)
    _append(ws, task, _write_to_every_fd("'\\u00e9 x\\n'.encode()"))


def attack_nesting_too_deep_to_parse(ws, task, source, outside):
    """An expression nested 20000 deep: ``ast.parse`` in the static check raises MemoryError
    (past the parser's fixed nesting limit, whatever the recursion limit; not SyntaxError);
    the submission is unparseable, so flagged."""
    _restore(ws, task, source)
    _append(ws, task, "_x = " + "~" * 20_000 + "1")


ATTACKS = {
    name.removeprefix("attack_"): fn for name, fn in dict(globals()).items()
    if name.startswith("attack_")
}  # fmt: skip
UNFLAGGED = {"load_installed_copy", "patch_pytest_reports", "swap_test_code",
             "forge_report_frames", "os_exit_at_import", "rebind_runner_globals",
             "equal_to_everything", "patch_builtins_in_shared_process",
             "report_non_ascii_line"}  # fmt: skip


def _grade(box, source, task, tmp_path, edit=None, outside=None):
    ws = make_workspace(source.root, task, tmp_path / "ws")
    if edit is not None:
        edit(ws, task, source, outside)
    return grade_workspace(box, source.root, task, ws)


@pytest.mark.parametrize("index", range(len(SYMBOLS)), ids=SYMBOLS)
def test_restored_body_scores_1_and_deleted_body_0(generated, box, tmp_path, index):
    source, tasks = generated
    task = tasks[index]
    deleted = _grade(box, source, task, tmp_path / "deleted")
    assert deleted.reward == 0.0 and deleted.targets_failed == task["failing_tests"]
    assert f"0 of {len(task['failing_tests'])} target tests pass" in deleted.feedback
    restored = _grade(box, source, task, tmp_path / "restored", _restore)
    assert restored.reward == 1.0, restored.feedback
    assert restored.flags == [] and restored.regressions == []


@pytest.mark.parametrize("attack", sorted(ATTACKS))
@pytest.mark.parametrize("index", range(ATTACK_TASKS), ids=SYMBOLS[:ATTACK_TASKS])
def test_attack_scores_0(generated, box, tmp_path, outside_copy, attack, index, monkeypatch):
    source, tasks = generated
    task = tasks[index]
    if attack in UNFLAGGED:  # stopped by isolation or run-time checks, not by a static flag:
        # since issue 37 the static check resolves names spelled from strings and flags some
        # of these; with it switched off they must still score 0
        monkeypatch.setattr(fd_grade, "submission_flags", lambda original, submitted: [])
    verdict = _grade(box, source, task, tmp_path, ATTACKS[attack], outside_copy)
    assert verdict.reward == 0.0, (attack, verdict.feedback, verdict.flags)
    if attack in UNFLAGGED:
        static = [f for f in verdict.flags if f.split(":")[0] in ("import", "call", "name")]
        assert static == [], (attack, static)
    assert tree_digest(source.root) == source.digest  # the source tree is untouched


def test_attacks_leave_their_marks_in_the_report(generated, box, tmp_path, outside_copy):
    """Each attack is stopped where the design says (so the zeros above are not luck): what
    it leaves in the workspace is flagged and never graded; what runs in the submission's
    own sandbox reaches neither pytest nor the report, so the report stays intact and the
    target tests fail on what the function returned or raised."""
    source, tasks = generated
    task = tasks[0]

    verdicts = {}

    def grade(name):
        if name not in verdicts:
            verdicts[name] = _grade(box, source, task, tmp_path / name, ATTACKS[name],
                                    outside_copy)  # fmt: skip
        return verdicts[name]

    assert "edited_config:conftest.py" in grade("conftest_rewrites_failures").flags
    assert any(f.startswith("edited_test:") for f in grade("edit_failing_tests").flags)
    assert any(f.startswith("bytecode:") for f in grade("leftover_pyc").flags)
    in_own_sandbox = ["skip", "os_exit_at_import", "forge_report_frames", "patch_pytest_reports",
                      "swap_test_code", "rebind_runner_globals", "equal_to_everything",
                      "patch_builtins_in_shared_process", "report_non_ascii_line"]  # fmt: skip
    for name in in_own_sandbox:
        verdict = grade(name)
        assert verdict.report.ok and verdict.report.tampered == [], name
        assert verdict.targets_failed == task["failing_tests"], name
    exited = grade("os_exit_at_import").feedback
    assert "gone" in exited or "could not be loaded" in exited
    assert "not plain data" in grade("equal_to_everything").feedback
    assert "syntax_error" in grade("nesting_too_deep_to_parse").flags


def test_an_oversized_submission_is_refused_unparsed(generated, box, tmp_path, monkeypatch):
    """Red-team pass 10: the shell tools (harness profiles, agents) leave a target file as
    large as their /repo (32-64 MB; the file tools cap a file at 1 MiB), and the static check
    parsed all of it in the trainer's process (4 MB of ``x = 1`` lines: 2.4 GB, 15 s). The
    right body with 300 kB of filler is refused, flagged and never parsed."""
    source, tasks = generated
    task = tasks[0]
    parsed = []
    monkeypatch.setattr(fd_grade, "suspicious_constructs",
                        lambda text: parsed.append(len(text)) or set())  # fmt: skip

    def bloat(ws, task, source, outside):
        _restore(ws, task, source)
        _append(ws, task, "x = 1\n" * 50_000)

    verdict = _grade(box, source, task, tmp_path, bloat)
    assert verdict.reward == 0.0 and "oversized_submission" in verdict.flags, verdict.feedback
    assert max(parsed, default=0) < 300_000


@pytest.mark.skipif(
    SOURCE != str(FIXTURE),
    reason="the control's attacks are written for the fixture's string functions "
    "(equal-to-everything fools an `==` on a string, not every other source's tests)",
)
@pytest.mark.parametrize("attack", ["rebind_runner_globals", "equal_to_everything"])
def test_control_in_one_process_the_same_attacks_pass(generated, box, tmp_path, attack):
    """Not vacuous: run the suite in the submission's interpreter (the design split grading
    replaced) and these two attacks make every target test report passed. They were written
    to pass the static check; since issue 37 it resolves names spelled from strings and flags
    ``rebind_runner_globals`` (``import:_pytest`` through ``sys.modules``), a bar on top of
    the isolation this control shows is needed."""
    source, tasks = generated
    task = tasks[0]
    ws = make_workspace(source.root, task, tmp_path / "ws")
    ATTACKS[attack](ws, task, source, None)
    text = (ws / task["file"]).read_text()
    flags = submission_flags((source.root / task["file"]).read_text(), text)
    assert flags == ([] if attack == "equal_to_everything" else ["import:_pytest", "name:modules"])
    repo = staged_copy(source.root, {task["file"]: text})
    try:
        rep = run_suite(box, str(repo))
    finally:
        shutil.rmtree(repo, ignore_errors=True)
    assert rep.ok and rep.tampered == []
    assert all(rep.passed(t) for t in task["failing_tests"])


KEY = b"k" * 32
M61 = (1 << 61) - 1  # ints that differ by a multiple of it share one hash


def _sign(body: str) -> str:
    return hmac.new(KEY, body.encode(), hashlib.sha256).hexdigest() + " " + body


ODD_LINES = {
    "non_ascii_tag": "\u00e9 x",  # compare_digest raised TypeError on non-ASCII str
    "lone_surrogate": "\ud800 x",  # not even encodable as UTF-8
    # signed (code under test can reach the key), but not a frame the runner sends:
    "too_few_fields": _sign("('test',)"),
    "too_many_fields": _sign("('test', 't', 'passed', '', 'extra')"),
    "str_count": _sign("('collected', 'three')"),
    "bool_status": _sign("('finished', True)"),
    "list_test_id": _sign("('test', ['t'], 'passed', '')"),
    "int_past_str_limit": _sign("('collected', 0x" + "f" * 5000 + ")"),
    "unknown_tag": _sign("('shout', 'x')"),
    "not_a_tuple": _sign("1"),
    "empty_tuple": _sign("()"),
    "unparseable": _sign("(["),
    "too_deep": _sign("(" * 300 + ")" * 300),
    "hash_flooded_set": _sign(
        "('test', {" + ",".join(str(k * M61) for k in range(30_000)) + "}, 'passed', '')"
    ),
}


@pytest.mark.parametrize("name", sorted(ODD_LINES))
def test_parse_frames_records_any_odd_line_as_tampering(name):
    """Whatever the code under test writes to the report fd, signed or not, is recorded as
    tampering within a bounded time (the set of colliding ints is hash flooding)."""
    ok = [_sign("('collected', 1)"), _sign("('test', 't', 'passed', '')"), _sign("('finished', 0)")]
    assert parse_frames("\n".join(ok), KEY).passed("t")
    start = time.process_time()  # CPU, not wall: a loaded machine must not fail it
    rep = parse_frames("\n".join([ok[0], ODD_LINES[name], *ok[1:]]), KEY)
    assert rep.tampered and not rep.passed("t") and not rep.ok
    assert time.process_time() - start < 2.0


@pytest.mark.parametrize(
    "source",
    ["_x = " + "~" * 3000 + "1\n", "_x = " + "~" * 100_000 + "1\n", "x = 1\0\n", "def f(:\n"],
    ids=["recursion", "memory", "nul", "syntax"],
)
def test_unparseable_submissions_are_flagged_not_raised(source):
    """``recursion`` needs the default recursion limit (another test's library may raise it:
    then 3000 levels parse), so the test sets it."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    try:
        assert suspicious_constructs(source) == {"syntax_error"}
        assert submission_flags("x = 1\n", source) == ["syntax_error"]
    finally:
        sys.setrecursionlimit(limit)


def test_the_static_check_folds_a_chain_of_strings_once(monkeypatch):
    """Red-team pass 10: every ``+`` of a chain was folded from scratch (calls of ``folded``
    grew as the chain's length squared: 250 kB of 800-term chains held the trainer's process
    for 14 s per check, twice per grading). Counted, not timed; the folded name is still
    flagged."""
    calls = []
    real = fd_grade.folded

    def counting(node, *memo):  # the old folded took the node only
        calls.append(1)
        return real(node, *memo)

    monkeypatch.setattr(fd_grade, "folded", counting)
    n = 400
    chain = "+".join(['"a"'] * n)
    assert suspicious_constructs(f"x = {chain} + '/pr' + 'oc/'\n") == {"string:/proc/"}
    assert len(calls) <= 10 * n, f"{len(calls)} folds for a chain of {n}"
