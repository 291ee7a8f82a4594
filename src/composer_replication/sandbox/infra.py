"""Failures of the machine, told apart from failures of the submission.

A grading that fails because of the machine (the sandbox could not start, the host killed the
grader, no sandbox slot came free in time, an environment server answered 5xx) says nothing
about the policy. Scoring it 0 teaches the policy that a broken machine is its fault; masking
it (trainer/masking.py) takes the rollout out of the loss and out of its group's statistics.

But a mask turns a sure 0 into "no signal", so a policy that can *cause* such a failure on the
tasks it would fail learns to. The rule (docs/sandbox.md, "Machine failures"):

* a failure is the machine's when it happened **before the policy's first action** (the
  sandbox start, the wait for a slot, an environment's reset, an agent harness that could
  not start), or
* when the submission's grading ended abnormally, a **control** (a known-good submission, or
  the task's untouched state) graded on the same machine **also fails** and a **retry** of the
  submission in a fresh sandbox fails the same way **as the control** (the same kind), or
  cannot start at all (:func:`recheck`).

Everything else is the policy's 0: a submission that exhausts the grader's memory, hangs until
the deadline or writes a tree the host cannot sync fails alone, its control passes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

SANDBOX_START = "sandbox_start"
"""bubblewrap (or the process under it) could not start: ``fork``/``exec`` failed, or bwrap
exited with its own error before the grader's wire script ran."""
GRADER_KILLED = "grader_killed"
"""The host killed or lost a grading that a known-good submission cannot pass either."""
SLOT_TIMEOUT = "slot_timeout"
"""No sandbox slot came free within ``sandbox.slot_wait_s`` before the grading started."""
SERVER_ERROR = "server_error"
"""An environment or grading server answered 5xx (or not at all) to a request that does not
depend on the submission, or that a control request fails the same way."""

HARNESS_START = "harness_start"
"""An agent harness (``agent_proxy``) could not start: its shell found no program to run
(exit 126/127) before any request reached the policy. The policy had not acted yet, so the
outcome says nothing about it (agents/episodes.py ``not_started``)."""

KINDS = (SANDBOX_START, GRADER_KILLED, SLOT_TIMEOUT, SERVER_ERROR, HARNESS_START)
"""Every failure kind, in the order metrics and messages list them."""

T = TypeVar("T")


class InfraFailure(Exception):
    """A grading the machine failed; ``kind`` is one of :data:`KINDS`, ``detail`` one line of
    trusted text (never the submission's output)."""

    def __init__(self, kind: str, detail: str):
        if kind not in KINDS:
            raise ValueError(f"unknown infrastructure failure kind {kind!r}; use one of {KINDS}")
        super().__init__(f"{kind}: {detail}")
        self.kind, self.detail = kind, detail


def ended_as(output: str) -> str:
    """The kind of a grading whose sandbox started but whose run ended abnormally: a bwrap
    that exited with its own error (``bwrap: ...`` first on its output) is a sandbox-start
    failure, anything else (killed, exited, timed out) a grader the host killed. For a
    control the output is trusted; for a submission it is not (``bwrap:`` can be printed),
    which is why :func:`recheck` masks only when the control, whose kind is trusted, failed
    the same way."""
    return SANDBOX_START if output.lstrip().startswith("bwrap:") else GRADER_KILLED


def recheck(
    control: Callable[[], InfraFailure | None],
    retry: Callable[[], T | InfraFailure],
    failed_as: Callable[[T], str | None],
) -> tuple[T | InfraFailure | None, InfraFailure | None]:
    """After a submission's grading ended abnormally: is the failure the machine's?

    ``control()`` grades a known-good submission (or the untouched task) on the same machine
    and returns the failure it met, or None when it passed. A passing control settles it: the
    failure is the submission's (``(None, None)``: keep its 0), and the submission is not run
    again, so a policy that hangs or exhausts memory costs one short control, not a retry.
    Otherwise ``retry()`` grades the submission once more in a fresh sandbox. The failure is
    the machine's (``(retry, control's failure)``) when the retry's sandbox never started (an
    ``InfraFailure``: nothing of the submission ran), or when the retry ran and failed **the
    same way as the control** (``failed_as(retry)``, its kind, equals the control's). A
    retry that failed another way keeps its 0 (``(retry, None)``): a submission that hangs
    while the machine fails the control's start, or one that prints a bwrap error while the
    host kills the control, is not masked. A retry that did not fail (``failed_as`` None)
    gives its verdict (``(retry, None)``)."""
    fault = control()
    if fault is None:
        return None, None
    again = retry()
    if isinstance(again, InfraFailure):
        return again, fault
    return again, fault if failed_as(again) == fault.kind else None
