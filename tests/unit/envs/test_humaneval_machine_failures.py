"""HumanEval gradings the machine failed are marked (``infra_failure``), and only those: each
machine failure is planted for real (a bwrap that cannot start, a grader the host kills, no
free slot), and submissions that crash, hang, exhaust memory or imitate a machine failure keep
their 0 (sandbox/infra.py: the canonical solution, the control, passes)."""

from __future__ import annotations

import os
import threading

import pytest
from support.planted_bwrap import BWRAP_ERROR, planted_bwrap, script_dir

from composer_replication.config import SandboxConfig
from composer_replication.envs.base import infra_kind
from composer_replication.envs.humaneval import HumanEvalEnv
from composer_replication.sandbox.infra import GRADER_KILLED, SANDBOX_START, SLOT_TIMEOUT
from composer_replication.sandbox.sandbox import SLOTS, set_sandbox_slots


@pytest.fixture(scope="module")
def env():
    return HumanEvalEnv(sandbox=SandboxConfig(wall_timeout_s=2, cpu_time_s=2, slot_wait_s=0.2))


@pytest.fixture(scope="module")
def task(env):
    return env.tasks("heldout")[0]


@pytest.fixture
def scripts():
    """A directory the sandbox's user can read (the grader drops to ``nobody`` as root)."""
    with script_dir() as path:
        yield path


@pytest.fixture
def bwrap_as(env, scripts):
    """Replace the sandbox's bwrap with a shell script for one test."""
    with planted_bwrap(env.sandbox, scripts) as plant:
        yield plant


def test_a_bwrap_that_cannot_create_its_namespace_is_a_sandbox_start_failure(env, task, bwrap_as):
    bwrap_as(BWRAP_ERROR)
    result = env.grade(task, task.data["canonical_solution"])
    assert infra_kind(result) == SANDBOX_START
    assert "Creating new namespace failed" in result.info["infra_detail"]


def test_a_bwrap_that_cannot_be_executed_is_a_sandbox_start_failure(env, task, tmp_path):
    real, env.sandbox.bwrap = env.sandbox.bwrap, str(tmp_path / "missing-bwrap")
    try:
        result = env.grade(task, "    return None\n")
    finally:
        env.sandbox.bwrap = real
    assert infra_kind(result) == SANDBOX_START  # before the program was sent: no control


def test_a_grader_the_host_kills_is_the_machines_failure(env, task, bwrap_as):
    bwrap_as("kill -9 $$")
    assert infra_kind(env.grade(task, task.data["canonical_solution"])) == GRADER_KILLED


def test_no_free_slot_in_time_is_a_slot_timeout(env, task):
    limit, held, done = SLOTS.limit, threading.Event(), threading.Event()

    def hog() -> None:
        with SLOTS.held():
            held.set()
            done.wait(10)

    set_sandbox_slots(1)
    hogger = threading.Thread(target=hog)
    hogger.start()
    try:
        held.wait(10)
        result = env.grade(task, task.data["canonical_solution"])
    finally:
        done.set()
        hogger.join()
        set_sandbox_slots(limit)
    assert infra_kind(result) == SLOT_TIMEOUT


def test_a_failure_the_retry_does_not_repeat_takes_the_retrys_verdict(env, task, bwrap_as, scripts):
    """The submission and the control meet a broken bwrap; the retry meets a working one and
    grades the (correct) submission: its verdict stands, nothing is masked."""
    count, real = scripts / "count", env.sandbox.bwrap
    bwrap_as(
        f"n=$(cat {count} 2>/dev/null || echo 0); echo $((n + 1)) > {count}\n"
        f'if [ "$n" -lt 2 ]; then {BWRAP_ERROR}; fi\nexec {real} "$@"'
    )
    result = env.grade(task, task.data["canonical_solution"])
    assert count.read_text().strip() == "3"  # submission, control, retry
    assert infra_kind(result) is None and result.passed


@pytest.mark.parametrize(
    "body",
    [
        "    x = bytearray(1 << 34)\n    return x\n",  # exhausts the address space
        "    x = []\n    while True:\n        x.append(bytearray(1 << 24))\n",  # fills memory
        "    import os\n    os._exit(137)\n",  # ends as if the host killed it
        "    import os, sys\n    sys.stderr.write('bwrap: no namespace\\n')\n    os._exit(1)\n",
        "    while True:\n        pass\n",  # hangs until the deadline
    ],
    ids=["address-space", "memory", "fake-kill", "fake-bwrap-error", "hang"],
)
def test_a_submission_that_breaks_its_own_grading_keeps_its_zero(env, task, body):
    result = env.grade(task, body)
    assert result.reward == 0.0 and not result.passed
    assert infra_kind(result) is None, result.feedback


def _control_meets(scripts, real: str, failure: str) -> str:
    """A bwrap whose second start (the control's, after the submission's) meets ``failure``;
    every other start is the real one."""
    count = scripts / "count"
    return (
        f"n=$(cat {count} 2>/dev/null || echo 0); echo $((n + 1)) > {count}\n"
        f'if [ "$n" -eq 1 ]; then {failure}; fi\nexec {real} "$@"'
    )


def test_a_submission_that_exits_while_the_control_cannot_start_keeps_its_zero(
    env, task, bwrap_as, scripts
):
    """The machine fails the control's sandbox start; the submission's own exit (its sandbox
    started, twice) is another failure, its own: not masked (the kinds must agree)."""
    bwrap_as(_control_meets(scripts, env.sandbox.bwrap, BWRAP_ERROR))
    result = env.grade(task, "    import os\n    os._exit(3)\n")
    assert (scripts / "count").read_text().strip() == "3"  # submission, control, retry
    assert infra_kind(result) is None and result.reward == 0.0, result.feedback


def test_a_fake_bwrap_error_while_the_control_is_killed_keeps_its_zero(
    env, task, bwrap_as, scripts
):
    """The host kills the control; the submission imitates a bwrap error: a sandbox-start
    failure is not the control's kind, so the submission keeps its 0."""
    bwrap_as(_control_meets(scripts, env.sandbox.bwrap, "kill -9 $$"))
    body = "    import os, sys\n    sys.stderr.write('bwrap: no namespace\\n')\n    os._exit(1)\n"
    result = env.grade(task, body)
    assert (scripts / "count").read_text().strip() == "3"
    assert infra_kind(result) is None and result.reward == 0.0, result.feedback


@pytest.mark.skipif(os.geteuid() != 0, reason="a grader that is not root runs no preexec step")
def test_a_sandbox_whose_cgroup_cannot_be_joined_is_a_sandbox_start_failure(env, task, monkeypatch):
    """The forked child fails its preexec step (joining the memory cgroup) before bwrap runs:
    ``subprocess`` raises ``SubprocessError`` (not ``OSError``); the machine's failure, not a
    crash of the step."""
    from composer_replication.sandbox.cgroup import MemoryCgroup

    def full(self) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(MemoryCgroup, "join", full)
    result = env.grade(task, task.data["canonical_solution"])
    assert infra_kind(result) == SANDBOX_START, result.feedback
