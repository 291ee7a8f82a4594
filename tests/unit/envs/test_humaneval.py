import gzip
import json

import pytest

from composer_replication.config import SandboxConfig
from composer_replication.envs.humaneval import HumanEvalEnv, build_program, humaneval_path


@pytest.fixture(scope="module")
def env():
    return HumanEvalEnv()


@pytest.fixture(scope="module")
def solutions():
    with gzip.open(humaneval_path(), "rt") as fh:
        return {r["task_id"]: r["canonical_solution"] for r in map(json.loads, fh)}


def test_all_164_problems_split_disjointly(env):
    train = {t.task_id for t in env.tasks("train")}
    held = {t.task_id for t in env.tasks("heldout")}
    assert len(train | held) == 164 and not train & held
    assert 15 <= len(held) <= 50


def test_canonical_solutions_pass(env, solutions):
    for task in env.tasks("heldout")[:6]:
        result = env.grade(task, solutions[task.task_id])
        assert result.passed, (task.task_id, result.feedback)
        assert result.reward == 1.0


def test_wrong_solution_fails_with_the_assertion(env):
    task = env.tasks("heldout")[0]
    result = env.grade(task, "    return None\n")
    assert not result.passed and result.reward == 0.0
    assert result.feedback.startswith("failing test: assert candidate(")


def test_fenced_whole_function_reply_is_used(env, solutions):
    task = env.tasks("heldout")[0]
    entry = task.data["entry_point"]
    signature = next(ln for ln in task.prompt.splitlines() if ln.startswith(f"def {entry}"))
    reply = f"Here you go:\n```python\n{signature}\n{solutions[task.task_id]}```\n"
    assert env.grade(task, reply).passed


def test_infinite_loop_completion_times_out():
    env = HumanEvalEnv(sandbox=SandboxConfig(wall_timeout_s=1.0))
    task = env.tasks("heldout")[0]
    result = env.grade(task, "    while True:\n        pass\n")
    assert not result.passed and "timed out" in result.feedback


def test_program_assembly():
    """A body continues the prompt; a whole-function reply keeps only the prompt's imports."""
    prompt = "from typing import List\n\ndef f(x):\n"
    assert build_program(prompt, "    return x\n", "f") == prompt + "    return x\n"
    whole = build_program(prompt, "```python\ndef f(x):\n    return 2 * x\n```", "f")
    assert whole == "from typing import List\ndef f(x):\n    return 2 * x\n"
