"""Grading a Feature Deletion submission so that the reward cannot be gamed.

* Only the task's target file is taken from the agent's workspace; it is written into a fresh
  copy of the source tree (no bytecode, no ``.git``, nothing else of the workspace: a planted
  ``conftest.py``, an edited test, a ``.pth`` file or a leftover ``.pyc`` never reaches the
  grading run).
* Split grading (:func:`split_run`): the suite runs on a pristine copy whose target function
  forwards each call to a second sandbox that imports the submitted file
  (sandbox/forward_client.py); only plain data comes back, so nothing the submission does can
  reach pytest, the report or the values the assertions compare.
* The suite runs with the pinned pytest command line and the per-test report
  (sandbox/pytest_suite.py): a target test counts only if reported passed (skipped, xfail,
  errors and missing count as failed), and every test that passed with the feature deleted
  must still pass (hidden tests included).
* A static check compares the submitted file with the original: constructs the original did
  not use and a rebuilt function has no business with (importing pytest or its internals,
  ``gc``/``ctypes``/frame introspection, ``os._exit``, ``sys.modules`` surgery, reading
  bytecode) are flagged; a flagged submission scores 0 (``GradeVerdict.flags``).

Reward: ``all_or_nothing`` 1.0 iff every target test passes and nothing regresses, else 0;
``fraction``: the share of the *strong* target tests passing (those no trivial body passes,
screen.py), 0 if anything regresses: a trivial body, or any mix of trivial bodies, earns 0
under both.
"""

from __future__ import annotations

import ast
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from composer_replication.envs.feature_deletion.forward import forwarding_text
from composer_replication.envs.feature_deletion.source import staged_copy, suite_files
from composer_replication.envs.feature_deletion.workspace import (
    candidate_of,
    task_state_text,
    workspace_flags,
)
from composer_replication.sandbox import pyast
from composer_replication.sandbox.infra import InfraFailure, ended_as, recheck
from composer_replication.sandbox.pytest_suite import SuiteReport, program_output, run_suite
from composer_replication.sandbox.sandbox import Sandbox

SUSPICIOUS_MODULES = {"pytest", "_pytest", "pluggy", "gc", "ctypes", "importlib", "marshal",
                      "atexit", "signal", "faulthandler", "builtins", "site", "unittest",
                      "doctest", "py_compile", "compileall", "zipimport"}  # fmt: skip
SUSPICIOUS_CALLS = {"_exit", "_getframe", "currentframe", "settrace", "setprofile",
                    "addaudithook", "__import__", "exec", "eval"}  # fmt: skip
SUSPICIOUS_NAMES = {"sys.modules", "sys.meta_path", "sys.path_hooks", "__builtins__", "__code__",
                    "__globals__", "f_back", "f_globals", "f_locals", "gi_frame", "tb_frame"}  # fmt: skip
SUSPICIOUS_STRINGS = (".pyc", "__pycache__", "site-packages", "conftest", "junit", "/proc/")
MAX_ADDED_CHARS = 256 << 10
"""How many characters longer than the original file a submission may be: a rebuilt function
is a body, not a file of its own. The static check parses the submission in the trainer's
process (4 MB of ``x = 1`` lines took 2.4 GB and 15 s there), and the shell tools leave a
file as large as their ``/repo`` (32-64 MB) without the file tools' 1 MiB cap: a larger
submission is refused unparsed (``oversized_submission``), before any sandbox starts."""
CALL_DEADLINE_S = 20.0
"""Longest wait for one answer of the submission's sandbox in split grading: a body that
loops fails that call and every later one at once (forward_client.connect), instead of
holding both sandboxes for the suite's whole timeout."""


@dataclass
class GradeVerdict:
    """The outcome of grading one submission."""

    reward: float
    passed: bool
    targets_passed: list[str]
    targets_failed: list[str]
    regressions: list[str]
    flags: list[str] = field(default_factory=list)
    feedback: str = ""
    report: SuiteReport | None = None
    infra: InfraFailure | None = None
    """Set when the machine failed the grading (no verdict: the rollout is masked)."""


def suspicious_constructs(source: str) -> set[str]:
    """Names of risky constructs in Python ``source`` (module docstring); ``syntax_error``
    if it does not parse: a syntax error, NUL bytes (``ValueError`` on older Pythons), or
    nesting too deep for the parser (``RecursionError``, ``MemoryError``: ``~~~...~1`` a few
    thousand deep), all of which an agent can write on purpose; the grader must not raise."""
    try:
        tree = pyast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return {"syntax_error"}
    found: set[str] = set()
    memo: dict[int, str | None] = {}  # node id -> what folded() made of it, for this tree
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {f"import:{a.name.split('.')[0]}" for a in node.names
                      if a.name.split(".")[0] in SUSPICIOUS_MODULES}  # fmt: skip
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] in SUSPICIOUS_MODULES:
                found.add(f"import:{node.module.split('.')[0]}")
        elif isinstance(node, ast.Call):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
            if name in SUSPICIOUS_CALLS:
                found.add(f"call:{name}")
        elif isinstance(node, ast.Attribute):
            dotted = f"{getattr(node.value, 'id', '')}.{node.attr}"
            if dotted in SUSPICIOUS_NAMES or node.attr in SUSPICIOUS_NAMES:
                found.add(f"name:{dotted if dotted in SUSPICIOUS_NAMES else node.attr}")
        elif isinstance(node, ast.Name) and node.id in SUSPICIOUS_NAMES:
            found.add(f"name:{node.id}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found |= {f"string:{s}" for s in SUSPICIOUS_STRINGS if s in node.value}
        found |= _resolved_names(node, memo)
    return found


_ATTR_NAMES = {n.rsplit(".", 1)[-1] for n in SUSPICIOUS_NAMES}
_DYNAMIC = {"getattr", "setattr", "hasattr", "delattr", "__getattribute__", "__import__",
            "import_module"}  # fmt: skip


def folded(node: ast.AST, memo: dict[int, str | None] | None = None) -> str | None:
    """The string an expression of constants spells (``"_get" + "frame"``, an f-string of
    constants, ``"".join([...])``, ``"a" "b"``), else None. ``memo`` (node id -> result, for
    the nodes of one tree) makes the check of a whole tree linear: it folds every ``+`` of a
    chain, and folding each one from scratch cost the chain's length squared (a 250 kB file
    of 800-term chains held the trainer's process for 14 s)."""
    if memo is not None and id(node) in memo:
        return memo[id(node)]
    out = None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        out = node.value
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = folded(node.left, memo), folded(node.right, memo)
        out = left + right if left is not None and right is not None else None
    elif isinstance(node, ast.JoinedStr):
        parts = [folded(v.value if isinstance(v, ast.FormattedValue) else v, memo)
                 for v in node.values]  # fmt: skip
        out = "".join(parts) if all(p is not None for p in parts) else None
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "join" and len(node.args) == 1
            and isinstance(node.args[0], (ast.List, ast.Tuple))):  # fmt: skip
        sep = folded(node.func.value, memo)
        parts = [folded(e, memo) for e in node.args[0].elts]
        if sep is not None and all(p is not None for p in parts):
            out = sep.join(parts)
    if memo is not None:
        memo[id(node)] = out
    return out


def _resolved_names(node: ast.AST, memo: dict[int, str | None] | None = None) -> set[str]:
    """Names reached through strings: ``getattr(sys, "_get" + "frame")``, ``vars(sys)[
    "modules"]``, ``__import__("g" + "c")``: the folded name is flagged as if spelled out;
    a name computed at run time (not foldable) in ``getattr`` and kin is ``dynamic:<fn>``.
    This is a bar, not a wall (a name decoded from bytes at run time is only ``dynamic``):
    what holds is split grading and the sandbox (docs/feature_deletion.md)."""
    out: set[str] = set()
    names: list[ast.AST] = []
    if isinstance(node, ast.Call):
        fn = node.func
        called = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
        if called in _DYNAMIC:
            arg = node.args[1] if called.endswith("attr") and len(node.args) > 1 else None
            arg = node.args[0] if called in ("__getattribute__", "__import__",
                                             "import_module") and node.args else arg  # fmt: skip
            if arg is not None:
                if folded(arg, memo) is None:
                    out.add(f"dynamic:{called}")
                names.append(arg)
    elif isinstance(node, ast.Subscript):
        names.append(node.slice)
    elif isinstance(node, (ast.BinOp, ast.JoinedStr)):
        names.append(node)
    for arg in names:
        text = folded(arg, memo)
        if text is None or (isinstance(arg, ast.Constant) and not isinstance(node, ast.Call)
                            and text not in (_ATTR_NAMES - {"modules"}) | SUSPICIOUS_CALLS):  # fmt: skip
            continue  # a literal key is the ordinary case, unless it names a frame or code
        root = text.split(".")[0]
        if text in SUSPICIOUS_CALLS:
            out.add(f"call:{text}")
        if text in _ATTR_NAMES:
            out.add(f"name:{text}")
        if root in SUSPICIOUS_MODULES:
            out.add(f"import:{root}")
        out |= {f"string:{s}" for s in SUSPICIOUS_STRINGS if s in text}
    return out


def submission_flags(original: str, submitted: str) -> list[str]:
    """Risky constructs the submitted file has and the original file had not."""
    return sorted(suspicious_constructs(submitted) - suspicious_constructs(original))


def grade_submission(
    box: Sandbox,
    source_root: Path,
    task: dict,
    target_text: str,
    reward: Literal["all_or_nothing", "fraction"] = "all_or_nothing",
) -> GradeVerdict:
    """Grade ``target_text`` as the new content of ``task['file']`` (module docstring)."""
    original = (Path(source_root) / task["file"]).read_text(encoding="utf-8")
    if len(target_text) > len(original) + MAX_ADDED_CHARS:
        why = f"refused: the file is more than {MAX_ADDED_CHARS} characters longer than before"
        return GradeVerdict(0.0, False, [], list(task["failing_tests"]), [],
                            ["oversized_submission"], why)  # fmt: skip
    flags = submission_flags(original, target_text)
    rep = _run(box, Path(source_root), task, target_text)
    if isinstance(rep, InfraFailure):  # no sandbox could start: the submission never ran
        return _not_graded(task, rep)
    if not rep.ok and not rep.tampered:  # the run did not finish: the machine's only if the
        again, fault = recheck(  # original body's run does not finish either, and a retry
            lambda: _control(box, Path(source_root), task, original),  # fails the same way
            lambda: _run(box, Path(source_root), task, target_text),
            lambda r: None if r.ok or r.tampered else ended_as(r.output),
        )
        if fault is not None:
            return _not_graded(task, fault)
        if isinstance(again, SuiteReport):
            rep = again
    targets = task["failing_tests"]
    ok = [t for t in targets if rep.passed(t)]
    bad = [t for t in targets if not rep.passed(t)]
    regressions = [t for t in task["passing_tests"] if not rep.passed(t)]
    if rep.tampered:
        flags.append("report_tampered")
    if flags or regressions or not rep.ok:
        score = 0.0
    elif reward == "fraction":  # only tests no trivial body passes (screen.py) pay
        strong = task.get("strong_tests") or targets
        score = sum(rep.passed(t) for t in strong) / len(strong)
    else:
        score = float(not bad)
    return GradeVerdict(score, score == 1.0, ok, bad, regressions, flags,
                        feedback(rep, targets, regressions, flags), rep)  # fmt: skip


def _run(box: Sandbox, root: Path, task: dict, text: str) -> SuiteReport | InfraFailure:
    try:
        return split_run(box, root, task, text)
    except InfraFailure as e:
        return e


def _control(box: Sandbox, root: Path, task: dict, original: str) -> InfraFailure | None:
    """The machine's failure the task's original body meets (a run that does not finish), or
    None when its run finishes (sandbox/infra.py ``recheck``)."""
    rep = _run(box, root, task, original)
    if isinstance(rep, InfraFailure) or rep.ok:
        return rep if isinstance(rep, InfraFailure) else None
    why = "timed out" if rep.timed_out else "did not finish"
    return InfraFailure(ended_as(rep.output), f"the original body's test run {why} too: "
                        f"{rep.output[:200]}")  # fmt: skip


def _not_graded(task: dict, fault: InfraFailure) -> GradeVerdict:
    why = f"not graded: the machine failed ({fault.kind}: {fault.detail})"
    return GradeVerdict(0.0, False, [], list(task["failing_tests"]), [], [], why, infra=fault)


def split_run(
    box: Sandbox,
    source_root: Path,
    task: dict,
    target_text: str,
    tests: list[str] | None = None,
) -> SuiteReport:
    """The suite (or ``tests`` of it) on a copy of the tree whose target function forwards to
    ``target_text`` loaded in a sandbox of its own (sandbox/forward_client.py): the tests never
    share an interpreter with the submission, and the submission's copy holds only the
    package's import closure (``task["served"]``, testcode.py): no test file, test helper
    module, configuration or test data (it cannot read the expected values of the tests it
    is graded by)."""
    suite_text = forwarding_text(task_state_text(source_root, task), candidate_of(task))
    root = Path(source_root)
    if "served" in task:
        keep = set(task["served"]) | {task["file"]}
        every = (p.relative_to(root).as_posix() for p in root.rglob("*.py"))
        hidden = tuple(sorted(r for r in every if r not in keep))
        served = staged_copy(root, {task["file"]: target_text}, prefix="cr-fd-served-",
                             only=tuple(sorted(keep)))  # fmt: skip
    else:  # a caller without the baseline's probe (tests of the wire): by name
        hidden = tuple(suite_files(source_root))
        served = staged_copy(source_root, {task["file"]: target_text}, prefix="cr-fd-served-",
                             leave_out=hidden)  # fmt: skip
    repo = staged_copy(source_root, {task["file"]: suite_text}, prefix="cr-fd-grade-")
    try:
        reqs = tuple(task.get("test_requirements", ()))
        return run_suite(box, str(repo), tests, requirements=reqs, served=str(served),
                         hidden=hidden, call_deadline_s=CALL_DEADLINE_S)  # fmt: skip
    finally:
        shutil.rmtree(repo, ignore_errors=True)
        shutil.rmtree(served, ignore_errors=True)


def feedback(rep: SuiteReport, targets: list[str], regressions: list[str], flags: list[str]) -> str:
    """What went wrong, in the words the self-distillation hint uses: the failing tests with
    their first assertion line, regressions, and flags. The grader's own summary: whatever
    the submission wrote (an exception message, a value in an assertion, a collection error)
    appears only quoted, cut to ``PROGRAM_OUTPUT_CHARS`` and marked as program output."""
    if not rep.ok and not rep.tampered:
        why = "timed out" if rep.timed_out else "did not finish (crash, exit or import error)"
        lines = [f"the test run {why}"]
        lines += [f"collection error in {k}{program_output(v)}"
                  for k, v in list(rep.collect_errors.items())[:3]]  # fmt: skip
        return "\n".join(lines)
    parts = []
    n_ok = sum(rep.passed(t) for t in targets)
    parts.append(f"{n_ok} of {len(targets)} target tests pass")
    summary = rep.failure_summary(targets)
    if summary:
        parts.append(summary)
    if regressions:
        parts.append(f"{len(regressions)} tests that passed before now fail:")
        parts.append(rep.failure_summary(regressions, limit=3))
    if flags:
        parts.append("refused: " + ", ".join(flags))
    return "\n".join(parts)


def grade_workspace(
    box: Sandbox,
    source_root: Path,
    task: dict,
    workspace: Path,
    reward: Literal["all_or_nothing", "fraction"] = "all_or_nothing",
) -> GradeVerdict:
    """Grade an agent's workspace: only the target file is taken (a missing or unreadable
    one grades as the deleted state); every other change is reported in ``flags``
    (``workspace.workspace_flags``) without reaching the grading run."""
    target = Path(workspace) / task["file"]
    try:
        text = target.read_text(encoding="utf-8") if not target.is_symlink() else None
    except (OSError, UnicodeDecodeError):
        text = None
    verdict = grade_submission(box, source_root, task, text or task_state_text(source_root, task),
                               reward)  # fmt: skip
    verdict.flags = workspace_flags(source_root, task, workspace) + verdict.flags
    return verdict
