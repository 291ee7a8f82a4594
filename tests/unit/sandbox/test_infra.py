"""sandbox/infra.py: the rule that tells the machine's failures from the submission's, and
the slot wait that gives up (``slot_timeout``)."""

from __future__ import annotations

import threading

import pytest

from composer_replication.sandbox.infra import (
    GRADER_KILLED,
    SANDBOX_START,
    SLOT_TIMEOUT,
    InfraFailure,
    ended_as,
    recheck,
)
from composer_replication.sandbox.sandbox import Slots


def _rule(control_fails: bool, retry_fails: bool, control_kind: str = GRADER_KILLED):
    calls: list[str] = []
    fault = InfraFailure(control_kind, "the control failed too")

    def control():
        calls.append("control")
        return fault if control_fails else None

    def retry():
        calls.append("retry")
        return "failed again" if retry_fails else "graded"

    failed_as = lambda r: GRADER_KILLED if r == "failed again" else None  # noqa: E731
    return recheck(control, retry, failed_as), calls, fault


def test_a_passing_control_settles_it_without_running_the_submission_again():
    (again, fault), calls, _ = _rule(control_fails=False, retry_fails=True)
    assert (again, fault) == (None, None) and calls == ["control"]


def test_the_machines_failure_needs_the_control_and_the_retry_to_fail():
    (again, fault), calls, planted = _rule(control_fails=True, retry_fails=True)
    assert fault is planted and again == "failed again" and calls == ["control", "retry"]


def test_a_retry_that_does_not_fail_again_gives_its_verdict():
    (again, fault), _, _ = _rule(control_fails=True, retry_fails=False)
    assert (again, fault) == ("graded", None)


@pytest.mark.parametrize("control_kind", [SANDBOX_START, SLOT_TIMEOUT])
def test_a_retry_that_fails_another_way_than_the_control_keeps_its_zero(control_kind):
    """The control could not start (or got no slot) while the submission's retry ran and was
    killed: two unrelated failures, the submission's is its own (not masked)."""
    (again, fault), calls, _ = _rule(True, True, control_kind)
    assert (again, fault) == ("failed again", None) and calls == ["control", "retry"]


def test_a_retry_whose_sandbox_never_started_leaves_the_controls_failure():
    """Nothing of the submission ran in the retry: the control's failure is the machine's."""
    control = InfraFailure(GRADER_KILLED, "the control was killed")
    no_slot = InfraFailure(SLOT_TIMEOUT, "no slot")
    again, fault = recheck(lambda: control, lambda: no_slot, lambda r: GRADER_KILLED)
    assert again is no_slot and fault is control


def test_only_a_bwrap_error_first_on_the_output_is_a_sandbox_start():
    assert ended_as("  bwrap: Creating new namespace failed\n") == SANDBOX_START
    assert ended_as("Traceback ...\nbwrap: late\n") == GRADER_KILLED
    assert ended_as("") == GRADER_KILLED


def test_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="unknown infrastructure failure kind"):
        InfraFailure("the policy says so", "")


def test_a_slot_wait_past_its_limit_is_a_slot_timeout():
    slots, held, done = Slots(1), threading.Event(), threading.Event()

    def hog() -> None:
        with slots.held():
            held.set()
            done.wait(10)

    hogger = threading.Thread(target=hog)
    hogger.start()
    held.wait(10)
    try:
        with pytest.raises(InfraFailure) as err:
            slots.acquire(0.05)
    finally:
        done.set()
        hogger.join()
    assert err.value.kind == SLOT_TIMEOUT
    slots.acquire(0.05)  # free again: taken at once
    slots.release()
