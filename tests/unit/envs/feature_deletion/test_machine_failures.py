"""Feature Deletion gradings the machine failed are masked (``infra_failure``), and only those:
a bwrap that cannot start (before the submission runs, or with the original body failing the
same way) is the machine's; a submission that exhausts memory, or a workspace whose target the
host cannot read back, keeps its 0."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.planted_bwrap import BWRAP_ERROR, planted_bwrap, script_dir
from support.textkit import textkit_env

from composer_replication.envs.base import infra_kind
from composer_replication.envs.feature_deletion.candidates import STUB, original_body
from composer_replication.envs.feature_deletion.workspace import candidate_of
from composer_replication.sandbox.infra import SANDBOX_START

FIXTURE = Path(__file__).parents[3] / "fixtures" / "feature_deletion" / "textkit"


@pytest.fixture(scope="module")
def env(textkit_tasks):
    return textkit_env(textkit_tasks)


@pytest.fixture
def episode(env):
    task = next(
        t for t in env.tasks("train") + env.tasks("heldout") if t.data["symbol"] == "titlecase"
    )
    tools = env.tools_class()()
    tools.reset(**env.row(task))
    yield task, tools
    tools.episode.close()


def _grade(env, task, tools):
    [result] = env.grade_episodes([task], [[{"role": "assistant", "content": "done"}]], [tools])
    return result


def _write_body(task, tools, body: str) -> None:
    target = Path(tools.workspace) / task.data["file"]
    target.write_text(target.read_text().replace(task.data["indent"] + STUB, body))


@pytest.fixture
def bwrap_as(env):
    with script_dir() as scripts, planted_bwrap(env.box, scripts) as plant:
        yield plant


def test_a_bwrap_that_cannot_be_executed_is_masked(env, episode):
    task, tools = episode
    real, env.box.bwrap = env.box.bwrap, "/nonexistent/bwrap"
    try:
        result = _grade(env, task, tools)
    finally:
        env.box.bwrap = real
    assert infra_kind(result) == SANDBOX_START


def test_a_bwrap_that_fails_for_the_original_body_too_is_masked(env, episode, bwrap_as):
    task, tools = episode
    body = original_body((FIXTURE / task.data["file"]).read_text(), candidate_of(task.data))
    _write_body(task, tools, body)
    bwrap_as(BWRAP_ERROR)
    result = _grade(env, task, tools)
    assert infra_kind(result) == SANDBOX_START, result.info


def test_a_submission_that_exhausts_memory_keeps_its_zero(env, episode):
    task, tools = episode
    indent = task.data["indent"]
    _write_body(task, tools, f"{indent}x = bytearray(1 << 34)\n{indent}return x\n")
    result = _grade(env, task, tools)
    assert result.reward == 0.0 and infra_kind(result) is None


def test_a_target_the_host_cannot_read_back_keeps_its_zero(env, episode):
    """The agent replaced the target file by a directory: nothing to sync back, graded as
    the deleted state (0), never masked."""
    task, tools = episode
    target = Path(tools.workspace) / task.data["file"]
    target.unlink()
    target.mkdir()
    result = _grade(env, task, tools)
    assert result.reward == 0.0 and infra_kind(result) is None


def test_a_run_killed_while_the_original_body_cannot_start_is_not_masked(env, episode, bwrap_as):
    """Two sandboxes per run (served tree, suite). The submission's run and its retry are
    killed, the original body's run meets a bwrap error: two different failures, so the
    submission's is not shown to be the machine's (sandbox/infra.py compares the kinds)."""
    task, tools = episode
    real = env.box.bwrap
    count = bwrap_as("exit 1") / "count"  # the planted script's directory
    bwrap_as(
        f"n=$(cat {count} 2>/dev/null || echo 0); echo $((n + 1)) > {count}\n"
        f'if [ "$n" -eq 2 ] || [ "$n" -eq 3 ]; then echo "bwrap: no namespace" >&2; exit 1; fi\n'
        f'if [ "$n" -lt 6 ]; then kill -9 $$; fi\nexec {real} "$@"'
    )
    result = _grade(env, task, tools)
    assert count.read_text().strip() == "6"  # run, control, retry: two sandboxes each
    assert infra_kind(result) is None and result.reward == 0.0, result.feedback
