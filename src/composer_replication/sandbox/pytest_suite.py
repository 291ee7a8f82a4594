"""Run a repository's pytest suite inside the sandbox and read back a per-test report.

The verdict is never pytest's exit code: a reporter plugin inside the sandbox sends one frame
per test (its final outcome over setup, call and teardown), and the trusted side
(:class:`SuiteReport`) counts a test as passed only if it was collected and reported passed:
skipped, xfailed/xpassed, errored, missing (the process died, e.g. ``os._exit(0)`` at import)
all count as not passed.

How the run is pinned down:

* pytest comes from a private copy of pytest and its pure-Python dependencies
  (:func:`pytest_tools`), bound read-only into the sandbox; the repository is bound read-only
  (nothing it runs can rewrite a test or a conftest); the interpreter's site-packages stay
  hidden, so an installed copy of the package under test is not importable.
* ``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1`` (no entry-point plugins), ``-p no:cacheprovider``,
  ``-o addopts=`` (no options from the repository's config), ``-B`` and a pycache prefix
  holding only bytecode the trusted interpreter compiled from the standard library and pytest
  (never the repository's), ``--import-mode=importlib`` is left to the repository.
* Frames carry an HMAC keyed with a per-run secret the runner reads from stdin before any
  repository code is imported, and the trusted side drops frames with a wrong tag, a repeated
  test, or arriving after the final one. Code under test can still reach that secret from
  inside the process (``gc``, frames, ``/proc/self/mem``; the audit hook refuses the first),
  so this raises the bar against printed or forged reports; it is not a proof.
* That is why grading passes ``served``: the function under grading then runs in a sandbox
  of its own and the suite calls it through a forwarding stub (sandbox/forward_client.py), so
  no submitted code runs in this process at all. Without ``served`` (the agent's own
  ``run_tests``, task generation on the original tree) the checks above are what there is.
"""

from __future__ import annotations

import atexit
import hashlib
import hmac
import os
import secrets
import shutil
import subprocess
import textwrap
import threading
from dataclasses import dataclass, field
from functools import lru_cache, wraps
from pathlib import Path

from composer_replication.sandbox import sandbox as sb
from composer_replication.sandbox import wire

TOOL_PACKAGES = ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "pygments", "py.py")
PASSED, FAILED, SKIPPED, ERROR, XFAIL, MISSING = (
    "passed",
    "failed",
    "skipped",
    "error",
    "xfail",
    "missing",
)

_RUNNER = r"""
import os, sys, hmac, hashlib
_key = os.read(0, 32)
_out = os.dup(1)
_null = os.open(os.devnull, os.O_RDONLY)
os.dup2(_null, 0)
os.close(_null)
os.dup2(2, 1)  # pytest's terminal output goes to stderr; stdout carries only frames
sys.path[:0] = {paths!r}
os.chdir({repo!r})
os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
_forward = {forward!r}
_probe = {probe!r}
if _probe:
    exec(compile({probe_code!r}, "_cr_probe", "exec"))
if _forward is not None:
    import _cr_forward
    _cr_forward.connect(_forward[0], _forward[1], {repo!r}, _forward[2], _forward[3])
import pytest


def _emit(*frame, _key=_key, _out=_out):
    body = repr(frame)
    tag = hmac.new(_key, body.encode(), hashlib.sha256).hexdigest()
    os.write(_out, (tag + " " + body + "\n").encode())


def _first_error(report):
    lines = (getattr(report, "longreprtext", "") or "").strip().splitlines()
    errors = [ln[1:].strip() for ln in lines if ln.startswith("E ")]
    return (errors[0] if errors else (lines[-1] if lines else ""))[:300]


import _pytest.reports, _pytest.runner, _pytest.skipping, _pytest.python


def _watched():
    r, rep, py = _pytest.runner, _pytest.reports, _pytest.python
    pairs = [(r, "call_and_report"), (r, "runtestprotocol"), (r, "pytest_runtest_makereport"),
             (r, "check_interactive_exception"), (r.CallInfo, "from_call"),
             (rep.TestReport, "__init__"), (rep.TestReport, "from_item_and_call"),
             (rep.BaseReport, "passed"), (rep.BaseReport, "failed"), (rep.BaseReport, "skipped"),
             (_pytest.skipping, "pytest_runtest_makereport"), (py.Function, "runtest"),
             (py, "pytest_pyfunc_call"), (_Reporter, "pytest_runtest_logreport"),
             (_Reporter, "pytest_sessionfinish"), (os, "write")]
    return [(o, n, vars(o).get(n)) for o, n in pairs]


class _Reporter:
    def __init__(self):
        self.state = {{}}
        self.code = {{}}
        self.watched = None

    def intact(self, item=None):
        if any(vars(o).get(n) is not v for o, n, v in self.watched):
            return False
        fn = getattr(item, "obj", None) if item is not None else None
        want = self.code.get(getattr(item, "nodeid", None))
        return want is None or getattr(fn, "__code__", None) is want

    def pytest_runtest_setup(self, item):
        if not self.intact(item):
            _emit("tampered", item.nodeid)

    def pytest_runtest_teardown(self, item):
        if not self.intact(item):
            _emit("tampered", item.nodeid)
        if _probe:  # what the test's request set up: getfixturevalue(name built at run time)
            try:
                names = list(getattr(getattr(item, "_request", None), "fixturenames", ()))
            except Exception:
                names = []
            _PROBE["fixtures"].setdefault(item.nodeid, []).extend(names)

    def pytest_collectreport(self, report):
        if report.failed:
            _emit("collect_error", report.nodeid, _first_error(report))

    def pytest_collection_finish(self, session):
        self.code = {{i.nodeid: getattr(getattr(i, "obj", None), "__code__", None)
                     for i in session.items}}
        if _probe:
            _PROBE["items"] = sorted({{str(getattr(i, "path", "")) for i in session.items}})
            _PROBE["fixtures"] = {{i.nodeid: list(getattr(i, "fixturenames", ()))
                                  for i in session.items}}
        _emit("collected", len(session.items))

    def pytest_runtest_protocol(self, item, nextitem):
        if _probe:
            _PROBE["current"] = item.nodeid

    def pytest_runtest_logreport(self, report):
        outcome = report.outcome
        if report.when == "call" and hasattr(report, "wasxfail"):
            outcome = "xfail"
        elif report.when != "call" and report.failed:
            outcome = "error"
        elif report.when == "setup" and report.skipped:
            outcome = "skipped"
        elif report.when != "call":
            outcome = None
        prev = self.state.get(report.nodeid)
        if outcome is not None and prev in (None, "passed"):
            self.state[report.nodeid] = outcome
            self.state.setdefault("_detail_" + report.nodeid, _first_error(report))
        if report.when == "teardown":
            final = self.state.get(report.nodeid, "missing")
            _emit("test", report.nodeid, final, self.state.get("_detail_" + report.nodeid, ""))

    def pytest_sessionfinish(self, session, exitstatus):
        if not self.intact():
            _emit("tampered", "session")
        if _probe:
            _emit("probe", _probe_report(session))
        _emit("finished", int(exitstatus))


_reporter = _Reporter()
_reporter.watched = _watched()
_plugins = [_reporter]
if _probe:

    class _Cover:
        # the tree's code a test ran (its setup, call and teardown) goes to that test's set;
        # a fixture shared by several tests (scope above function) is set up and finalized
        # inside one test's protocol: what it runs goes to "outside", as import-time code does
        def __init__(self):
            self.broad_done = False

        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_protocol(self, item, nextitem):
            _BUCKET[0] = _PROBE["by_test"].setdefault(item.nodeid, set())
            yield
            _BUCKET[0] = _PROBE["outside"]

        @pytest.hookimpl(hookwrapper=True)
        def pytest_fixture_setup(self, fixturedef, request):
            before = _BUCKET[0]
            if getattr(fixturedef, "scope", "function") != "function":
                _BUCKET[0] = _PROBE["outside"]
            try:
                yield
            finally:
                _BUCKET[0] = before

        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_teardown(self, item, nextitem):
            mine, here = _BUCKET[0], set()
            self.broad_done = False
            _BUCKET[0] = here
            yield
            (_PROBE["outside"] if self.broad_done else mine).update(here)
            _BUCKET[0] = mine

        def pytest_fixture_post_finalizer(self, fixturedef, request):
            if getattr(fixturedef, "scope", "function") != "function":
                self.broad_done = True

    _plugins.append(_Cover())
if {screen!r}:
    import types as _types

    _SCREEN = _types.SimpleNamespace(BODY=[0], fired=False, in_call=False)
    sys.modules["_cr_screen"] = _SCREEN

    import signal as _signal

    class _ScreenTimeout(BaseException):
        # not an Exception: a test's ``except Exception`` does not swallow it (pytest
        # reports any BaseException of a test's call as its failure)
        pass

    def _on_alarm(signum, frame):
        # raised only inside the test's call: a repeat landing in pytest's own reporting or
        # teardown after the call ended would break the run (the screen lost, as before)
        _SCREEN.fired = True
        if _SCREEN.in_call:
            raise _ScreenTimeout("the test ran past the screen's limit under this body")

    class _Screen:
        # every test once per body (the target's dispatch reads _cr_screen.BODY); a test that
        # runs past the limit under a body fails for that body (the alarm repeats, so a test
        # that catches the exception and loops on is interrupted again)
        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_call(self, item):
            _SCREEN.in_call = True
            try:
                yield
            finally:
                _SCREEN.in_call = False

        @pytest.hookimpl(tryfirst=True)
        def pytest_runtest_protocol(self, item, nextitem):
            from _pytest.runner import runtestprotocol

            bits = ""
            _signal.signal(_signal.SIGALRM, _on_alarm)
            for body in range({screen!r}):
                _SCREEN.BODY[0], _SCREEN.fired = body, False
                _signal.setitimer(_signal.ITIMER_REAL, {screen_test_s!r}, 0.25)
                try:
                    reports = runtestprotocol(item, nextitem=None, log=False)
                finally:
                    _signal.setitimer(_signal.ITIMER_REAL, 0)
                calls = [r for r in reports if r.when == "call"]
                ok = calls and all(r.passed and not hasattr(r, "wasxfail") for r in calls)
                ok = ok and not any(r.failed for r in reports) and not _SCREEN.fired
                bits += "1" if ok else "0"
            _emit("screened", item.nodeid, bits)
            return True

    _plugins.append(_Screen())
pytest.main({args!r}, plugins=_plugins)
"""


@dataclass
class SuiteReport:
    """Per-test outcomes of one sandboxed pytest run, as the trusted side accepted them."""

    outcomes: dict[str, str] = field(default_factory=dict)
    """Test id -> ``passed``/``failed``/``skipped``/``error``/``xfail``."""
    details: dict[str, str] = field(default_factory=dict)
    """Test id -> the first ``E`` line of its failure (or the last line of the report)."""
    collect_errors: dict[str, str] = field(default_factory=dict)
    collected: int | None = None
    finished: bool = False
    """The runner reached the end of the session (no crash, no ``os._exit``, no timeout)."""
    exit_status: int | None = None
    """pytest's exit status (0 all passed, 1 some failed, 2 interrupted, 3 internal error, 4
    usage error, 5 no tests): only used to refuse runs pytest itself did not complete."""
    tampered: list[str] = field(default_factory=list)
    """Why frames were rejected (bad tag, a test reported twice, frames after the end)."""
    timed_out: bool = False
    output: str = ""
    """pytest's terminal output (stderr of the run, capped)."""
    probe: str = ""
    """With ``run_suite(probe=True)``: what the run collected, opened and called (JSON;
    feature_deletion/testcode.py reads it)."""
    screened: dict[str, str] = field(default_factory=dict)
    """With ``run_suite(screen=n)``: test id -> one ``0``/``1`` per body (passed)."""
    seconds: float = 0.0

    def passed(self, test_id: str) -> bool:
        """True only for a test reported passed in an untampered, finished run."""
        return self.ok and self.outcomes.get(test_id) == PASSED

    @property
    def ok(self) -> bool:
        """The report can be trusted as a whole: pytest collected and finished the session
        normally (exit status 0, 1 or 5), nothing was tampered with, no timeout."""
        complete = self.finished and self.collected is not None and self.exit_status in (0, 1, 5)
        return complete and not self.tampered and not self.timed_out

    def passing(self) -> set[str]:
        return {t for t, o in self.outcomes.items() if o == PASSED} if self.ok else set()

    def failure_summary(self, tests: list[str], limit: int = 5) -> str:
        """``test id: outcome`` for the first ``limit`` of ``tests`` not passed, each with its
        first error line as quoted program output (:func:`program_output`): that text holds
        what the code under test raised or returned, and it becomes a self-distillation
        hint, so it is never passed on as the grader's own words."""
        bad = [t for t in tests if not self.passed(t)]
        lines = [f"{t}: {self.outcomes.get(t, MISSING)}{program_output(self.details.get(t, ''))}"
                 for t in bad[:limit]]  # fmt: skip
        more = len(bad) - limit
        return "\n".join(lines + ([f"... and {more} more"] if more > 0 else []))


PROGRAM_OUTPUT_CHARS = 200
"""Most characters of program output quoted into feedback per line."""


def program_output(text: str, limit: int = PROGRAM_OUTPUT_CHARS) -> str:
    """``text`` (written by the code under test) as a marked, quoted, bounded suffix:
    `` -- program output: '...'`` (``repr``, so no newline or quote of its own can end the
    quotation); '' for no text."""
    if not text:
        return ""
    return " -- program output: " + wire.preview(str(text), limit)


FRAME_FIELDS = {"test": (str, str, str), "tampered": (str,), "collect_error": (str, str),
                "collected": (int,), "finished": (int,), "probe": (str,),
                "screened": (str, str)}  # fmt: skip
"""The frames the runner emits: tag -> types of the fields after it."""


def _signed(tag: str, body: str, key: bytes) -> bool:
    """Whether ``tag`` is the HMAC of ``body``; compared as bytes, since the code under test
    can write any text to the report fd (``compare_digest`` raises on non-ASCII ``str``)."""
    want = hmac.new(key, body.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()
    return hmac.compare_digest(tag.encode("utf-8", "surrogatepass"), want.encode())


def _well_formed(body: str) -> tuple | None:
    """The frame in ``body`` if it is one the runner emits (``FRAME_FIELDS``, ints of at most
    32 bits), else None. Code under test may reach the key and sign anything (module
    docstring), so a signed frame must still never make the trusted side raise."""
    try:
        frame = wire.literal(body)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    if type(frame) is not tuple or not frame or type(frame[0]) is not str:
        return None
    fields = FRAME_FIELDS.get(frame[0])
    if fields is None or len(frame) != len(fields) + 1:
        return None
    typed = all(type(v) is t for v, t in zip(frame[1:], fields, strict=True))
    return frame if typed and all(v.bit_length() <= 32 for v in frame if type(v) is int) else None


def parse_frames(stdout: str, key: bytes) -> SuiteReport:
    """Accept the frames a run wrote (``tag repr(tuple)`` lines) whose HMAC is right and whose
    fields are well formed; record why any other line or frame was refused."""
    rep = SuiteReport()
    for line in stdout.splitlines():
        tag, _, body = line.partition(" ")
        if not _signed(tag, body, key):
            rep.tampered.append(f"unsigned line on the report channel: {line[:80]!r}")
            continue
        frame = _well_formed(body)
        if frame is None:
            rep.tampered.append(f"malformed signed frame on the report channel: {line[:80]!r}")
            continue
        if rep.finished:
            rep.tampered.append(f"frame after the end of the session: {frame[:2]!r}")
        elif frame[0] == "test":
            _, test_id, outcome, detail = frame
            if test_id in rep.outcomes:
                rep.tampered.append(f"test reported twice: {test_id}")
            rep.outcomes[test_id], rep.details[test_id] = outcome, detail
        elif frame[0] == "tampered":
            rep.tampered.append(f"pytest's reporting was modified during {frame[1]}")
        elif frame[0] == "collect_error":
            rep.collect_errors[frame[1]] = frame[2]
        elif frame[0] == "collected":
            rep.collected = int(frame[1])
        elif frame[0] == "finished":
            rep.finished, rep.exit_status = True, int(frame[1])
        elif frame[0] == "probe":
            rep.probe = frame[1]
        elif frame[0] == "screened":
            rep.screened[frame[1]] = frame[2]
    if rep.finished and rep.collected is not None and len(rep.outcomes) > rep.collected:
        rep.tampered.append(f"{len(rep.outcomes)} tests reported, {rep.collected} collected")
    return rep


def pytest_args(tests: list[str] | None, extra: tuple[str, ...] = ()) -> list[str]:
    """The pinned command line (module docstring); ``tests``: ids or paths (None: the suite)."""
    args = ["-q", "-p", "no:cacheprovider", "-o", "addopts=", "-o", "console_output_style=classic"]
    return [*args, "-p", "no:randomly", *extra, *(tests or [])]


def run_suite(
    box: sb.Sandbox,
    repo: str,
    tests: list[str] | None = None,
    extra: tuple[str, ...] = (),
    requirements: tuple[str, ...] = (),
    served: str | None = None,
    hidden: tuple[str, ...] = (),
    timeout_s: float | None = None,
    probe: bool = False,
    screen: int = 0,
    call_deadline_s: float | None = None,
    screen_test_s: float = 10.0,
) -> SuiteReport:
    """Run pytest on ``repo`` (a bindable directory, see ``sandbox.bindable_dir``) inside the
    sandbox and return the accepted per-test report; ``requirements``: the suite's own test
    dependencies (pip requirement strings) installed next to pytest. ``served``: a second
    tree, imported in a sandbox of its own, whose function the suite's forwarding stub calls
    (split grading, sandbox/forward_client.py); ``hidden``: files of ``repo`` (relative) the
    served tree leaves out, so functions defined there cross as handles, not by name;
    ``timeout_s``: a shorter wall limit for this run than the sandbox's own; ``probe``:
    also record what the run collected, opened and called (``SuiteReport.probe``: the
    collected test files, loaded conftests, ``python_files``, the tree's modules imported,
    the names its packages export, every function of the tree with its callers (the nearest
    function of the tree up the stack, ``file::qualname``),
    the files opened with the file and test that opened them, and each test's fixtures
    (``item.fixturenames``: those a plugin's mark or hook adds included, and what its request
    set up, ``request.getfixturevalue`` of a name built at run time too); about 2x slower);
    ``screen``: run every test once per body 0..n-1 of a target file whose body dispatches
    on ``_cr_screen.BODY[0]`` (feature_deletion/screen.py; ``SuiteReport.screened``), a
    test that runs past ``screen_test_s`` under a body failing for that body (SIGALRM);
    ``call_deadline_s``: with ``served``, the longest wait for one answer of the served side
    (a looping body fails its call and every later one at once)."""
    import time

    tools = pytest_tools(tuple(requirements))
    key = secrets.token_bytes(32)
    start = time.monotonic()
    if served is None:
        code = _runner(tools, repo, tests, extra, None, probe, screen, screen_test_s)
        res = box.run_python(code, binds=(tools, repo), stdin=key, wall_timeout_s=timeout_s)
    else:
        with box.module_server(served, binds=(tools,)) as server:
            forward = (*server.client_fds, hidden, call_deadline_s)
            code = _runner(tools, repo, tests, extra, forward)
            res = box.run_python(code, binds=(tools, repo), stdin=key,
                                 pass_fds=server.client_fds, wall_timeout_s=timeout_s)  # fmt: skip
    rep = parse_frames(res.stdout, key)
    rep.timed_out, rep.output, rep.seconds = res.timed_out, res.stderr, time.monotonic() - start
    return rep


def import_roots(repo: str) -> list[str]:
    """The directories of a tree its code imports from, as installing it would make them
    importable: the tree, and for a ``src`` layout (a ``src/`` directory that is no package
    itself) ``src/`` too: ``src/webcolors`` imports as ``webcolors`` once installed, and the
    sdist is never installed here (its build would run on the host), so without this its
    untouched suite fails to import (issue 60: webcolors 24.8.0)."""
    src = os.path.join(repo, "src")
    if os.path.isdir(src) and not os.path.exists(os.path.join(src, "__init__.py")):
        return [repo, src]
    return [repo]


def _runner(tools: str, repo: str, tests, extra, forward, probe=False, screen=0,
            screen_test_s: float = 10.0) -> str:  # fmt: skip
    args = pytest_args(tests, extra)
    code = _PROBE_CODE if probe else ""
    return _RUNNER.format(tools=tools, repo=repo, paths=[tools, *import_roots(repo)], args=args,
                          forward=forward, probe=probe, probe_code=code, screen=int(screen),
                          screen_test_s=float(screen_test_s))  # fmt: skip


_PROBE_CODE = r"""
import json as _json, os as _os, re as _re, sys as _sys, threading as _threading

_ROOT = _os.path.realpath(_os.getcwd()) + "/"
_PROBE = {"current": "", "items": [], "edges": set(), "opens": {}, "fixtures": {},
          "outside": set(), "by_test": {}, "spawned": set()}
_BUCKET = [_PROBE["outside"]]  # where a call of the tree's code is counted now: the running
# test's set, or "outside" (import, collection, a fixture shared by several tests)


def _nearest(frame, _root=_ROOT):
    while frame is not None and not frame.f_code.co_filename.startswith(_root):
        frame = frame.f_back
    return frame.f_code if frame is not None else None


def _profile(frame, event, arg, _root=_ROOT, _edges=_PROBE["edges"], _bucket=_BUCKET):
    if event == "call" and frame.f_code.co_filename.startswith(_root):
        _edges.add((frame.f_code, _nearest(frame.f_back)))
        _bucket[0].add(frame.f_code)


_SPAWNS = ("subprocess.Popen", "os.posix_spawn", "os.spawn", "os.exec", "os.fork", "os.system")


def _audit(event, args, _root=_ROOT, _probe=_PROBE):
    if event in _SPAWNS:  # a child process runs the tree's code where no hook counts it
        _probe["spawned"].add(_probe["current"])
    elif event == "open" and isinstance(args[0], str):
        path = _os.path.realpath(args[0])
        if path.startswith(_root) and not path.endswith((".py", ".pyc")):
            who = _nearest(_sys._getframe(1))
            who = who.co_filename if who is not None else ""
            _probe["opens"].setdefault(path, set()).add((who, _probe["current"]))


def _rel(path, _root=_ROOT):
    return path[len(_root):] if path.startswith(_root) else ""


def _probe_key(obj):
    # file::qualname of a function or class of the tree ('' for anything else)
    code = getattr(obj, "__code__", None)
    if code is not None:
        return _rel(code.co_filename) + "::" + code.co_qualname
    if isinstance(obj, type):
        mod = _sys.modules.get(getattr(obj, "__module__", ""))
        path = getattr(mod, "__file__", None)
        if isinstance(path, str):
            return _rel(_os.path.realpath(path)) + "::" + obj.__qualname__
    return ""


def _probe_report(session):
    _sys.setprofile(None)
    _threading.setprofile(None)
    calls, calls_by_line = {}, {}
    for code, caller in list(_PROBE["edges"]):
        key = _rel(code.co_filename) + "::" + code.co_qualname
        who = _rel(caller.co_filename) + "::" + caller.co_qualname if caller is not None else ""
        calls.setdefault(key, set()).add(who)
        if caller is not None and code.co_name != "<module>":
            calls_by_line.setdefault(_line_key(code), set()).add(_line_key(caller))
    modules = sorted({_rel(_os.path.realpath(m.__file__)) for m in list(_sys.modules.values())
                      if isinstance(getattr(m, "__file__", None), str)} - {""})
    exported = set()
    for m in list(_sys.modules.values()):
        if _rel(_os.path.realpath(str(getattr(m, "__file__", "") or ""))) not in modules:
            continue
        space = vars(m)
        names = getattr(m, "__all__", None)
        names = [n for n in names if isinstance(n, str)] if isinstance(names, (list, tuple)) else []
        if hasattr(m, "__path__"):  # a package's own namespace is its API
            names += list(space)
        for n in names:
            exported.add(_probe_key(space.get(n)))
    conftests = sorted({_rel(_os.path.realpath(p.__file__))
                        for p in session.config.pluginmanager.get_plugins()
                        if str(getattr(p, "__file__", "")).endswith("conftest.py")} - {""})
    merged = {}  # per test function (parameters merged), each distinct closure once: the
    for k, v in _PROBE["fixtures"].items():  # frame stays small for a large suite
        merged.setdefault(_re.sub(r"\[.*\]$", "", k, flags=_re.S), set()).update(
            n for n in v if isinstance(n, str))
    closures, index, by_def = [], {}, {}
    for k, v in sorted(merged.items()):
        names = tuple(sorted(v - {"request"}))
        by_def[k] = index.setdefault(names, len(closures))
        if by_def[k] == len(closures):
            closures.append(list(names))
    return _json.dumps({
        "coverage": _coverage(calls_by_line),
        "items": sorted({_rel(_os.path.realpath(p)) for p in _PROBE["items"]} - {""}),
        "conftests": conftests,
        "python_files": list(session.config.getini("python_files")),
        "calls": {k: sorted(v) for k, v in calls.items()},
        "modules": modules,
        "fixtures": by_def,
        "closures": closures,
        "exported": sorted(exported - {""}),
        "opens": {_rel(p): sorted({(_rel(w), t) for w, t in v})
                  for p, v in _PROBE["opens"].items()},
    }, sort_keys=True)


def _line_key(code):
    return _rel(code.co_filename) + ":" + str(code.co_firstlineno)


def _ranges(indices):
    # sorted ints as "0-4,7,9-12": the tests of one module call the same functions
    out, run = [], None
    for i in indices:
        if run is not None and i == run[1] + 1:
            run[1] = i
        else:
            if run is not None:
                out.append(run)
            run = [i, i]
    if run is not None:
        out.append(run)
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in out)


_COVERAGE_CHARS = 2_000_000  # the frame stays far under the sandbox's 4 MiB output cap


def _coverage(callers):
    # per function of the tree (file:first line), the tests that called it; what ran outside
    # a test's own protocol; the tests that started a process; the caller graph (by line)
    tests = list(_PROBE["by_test"])  # in the order they ran
    index = {t: i for i, t in enumerate(tests)}
    per = {}
    for t, codes in _PROBE["by_test"].items():
        for code in codes:
            if code.co_name != "<module>":
                per.setdefault(_line_key(code), []).append(index[t])
    out = {
        "tests": tests,
        "called": {k: _ranges(sorted(v)) for k, v in sorted(per.items())},
        "outside": sorted({_line_key(c) for c in _PROBE["outside"] if c.co_name != "<module>"}),
        "spawned": _ranges(sorted(index[t] for t in _PROBE["spawned"] if t in index)),
        "unowned_spawn": "" in _PROBE["spawned"],
        "callers": {k: sorted(v) for k, v in sorted(callers.items())},
    }
    size = len(_json.dumps(out))
    return out if size <= _COVERAGE_CHARS else {"too_large": size}


_sys.addaudithook(_audit)
_threading.setprofile(_profile)
_sys.setprofile(_profile)
"""


PYTEST_INSTALL = "pip install 'composer-replication[feature-deletion]'"
"""What installs the pytest that grades Feature Deletion tasks (the ``feature-deletion`` extra;
``dev`` includes it)."""


def _missing_tool(name: str) -> sb.SandboxUnavailableError:
    return sb.SandboxUnavailableError(
        f"Feature Deletion grades with a sandboxed copy of pytest, and {name!r} is not "
        f"installed: {PYTEST_INSTALL}"
    )


def require_pytest() -> None:
    """A `SandboxUnavailableError` naming the extra to install when pytest or one of its
    dependencies is missing: checked before a task set is generated or a run loads anything."""
    import importlib.util

    for name in TOOL_PACKAGES:
        if name != "py.py" and importlib.util.find_spec(name) is None:
            raise _missing_tool(name)


def _one_at_a_time(fn):
    """``fn`` (an ``lru_cache``) behind a lock: callers that ask at once (a suite's packages
    starting together) wait for the first build instead of each building a copy before the
    cache holds one (issue 60's run built 12 copies, each compiling pytest)."""
    lock = threading.Lock()

    @wraps(fn)
    def call(*args):
        with lock:
            return fn(*args)

    call.cache_clear = fn.cache_clear
    return call


@_one_at_a_time
@lru_cache(maxsize=8)
def pytest_tools(requirements: tuple[str, ...] = ()) -> str:
    """A world-readable copy of pytest and its pure-Python dependencies (bound read-only into
    every sandboxed run at the same path), with their bytecode and the standard library's
    they import compiled by the trusted interpreter into the sandbox's pycache (so a run does
    not recompile pytest: ~1 s). ``requirements`` (a suite's test dependencies, e.g.
    ``freezegun``: PEP 508 requirements by name only, config.env.requirement_problem) are
    installed into the same directory with pip from the package index, binary wheels only."""
    import importlib.util
    import sys

    from composer_replication.config.env import requirement_problem

    for text in requirements:  # also from a task record: checked again here
        if (problem := requirement_problem(text)) is not None:
            raise sb.SandboxUnavailableError(f"test requirement {text!r} {problem}")
    dest = sb.bindable_dir("cr-pytest-tools-")
    atexit.register(shutil.rmtree, dest, ignore_errors=True)  # also if building it fails
    if requirements:  # wheels only: no sdist is built (its setup.py would run on the host)
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-compile", "--only-binary",
               ":all:", "--no-input", "--disable-pip-version-check", "--target", dest, "--",
               *requirements]  # fmt: skip
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if res.returncode != 0:
            tail = " / ".join((res.stderr or res.stdout).strip().splitlines()[-3:])
            raise sb.SandboxUnavailableError(
                f"cannot install test requirements {requirements}: {tail}"
            )
    for name in TOOL_PACKAGES:
        spec = importlib.util.find_spec(name.removesuffix(".py"))
        if spec is None or spec.origin is None:
            if name == "py.py":
                continue
            raise _missing_tool(name)
        src = Path(spec.origin)
        if src.name == "__init__.py":
            shutil.copytree(src.parent, Path(dest) / src.parent.name, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
        else:
            shutil.copy2(src, Path(dest) / src.name)
    here = Path(__file__).parent
    shutil.copy2(here / "forward_client.py", Path(dest) / "_cr_forward.py")
    shutil.copy2(here / "wire.py", Path(dest) / "_cr_wire.py")
    _warm(dest)
    sb.world_readable(dest)
    return dest


def _warm(tools: str) -> None:
    """Import pytest from ``tools`` and collect an empty directory with the sandbox's flags,
    so pytest's modules and the standard-library modules it needs land in the pycache."""
    cache = sb.stdlib_pycache()
    empty = sb.bindable_dir("cr-pytest-warm-")
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {tools!r})
        import pytest, _pytest.junitxml, _pytest.doctest, _pytest.tmpdir, _pytest.monkeypatch
        import _cr_forward, _cr_wire
        import hmac, hashlib, unittest, doctest, tempfile, shutil, fnmatch, glob
        pytest.main(["-q", "-p", "no:cacheprovider", {empty!r}])
    """)
    flags = ["-I", "-S", "-X", f"pycache_prefix={cache}"]
    try:
        subprocess.run([sb.sandbox_interpreter(), *flags, "-c", code], timeout=120,
                       check=False, capture_output=True,
                       env={"PATH": "/usr/bin:/bin", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        pass  # slower runs, same results
    finally:
        shutil.rmtree(empty, ignore_errors=True)
    sb.world_readable(cache)
