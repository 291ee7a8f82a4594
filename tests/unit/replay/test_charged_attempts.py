"""Attempts that get no kept answer but may have been billed (a rejected 200 answer, a timeout, a
broken exchange) are charged their worst case, each retry of such an attempt reserves budget of
its own, and nothing is sent once the journal has failed, even by a call that was waiting for
budget room."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

from composer_replication.config import RemoteTeacherConfig
from composer_replication.replay.budget import worst_case_cost, worst_case_prompt_tokens
from composer_replication.replay.journal import Journal
from composer_replication.replay.replay import replay_trace

from .conftest import make_states


def _spec(url: str, **kw) -> RemoteTeacherConfig:
    base = {"name": "t", "base_url": url, "model": "m", "max_tokens": 8, "timeout_s": 5,
            "backoff_base_s": 0.01, "backoff_cap_s": 0.05, "price_in_per_mtok": 10.0,
            "price_out_per_mtok": 10.0}  # fmt: skip
    return RemoteTeacherConfig(**{**base, **kw})


def _worst(spec: RemoteTeacherConfig, state) -> float:
    return worst_case_cost(spec, worst_case_prompt_tokens(state.prefix))


def test_a_rejected_200_answer_is_charged_and_retry_failed_cannot_outspend_the_budget(
    scripted, tmp_path
):
    """Every answer is a truncated 200 body (generated, so billed by a real provider): it used
    to be journaled at $0, and `retry_failed` resent it on every run without the budget
    moving. Now each is charged its worst case, so repeated runs stop at the budget."""
    script, url = scripted
    script.pinvalid = 1.0
    spec, states = _spec(url, max_retries=0), make_states(2)
    worst = _worst(spec, states[0])
    budget = 5.5 * worst
    db = tmp_path / "j.db"
    for _ in range(10):
        r = asyncio.run(replay_trace(states, [spec], journal=db, budget_usd=budget,
                                     retry_failed=True))  # fmt: skip
    sent = sum(script.requests.values())
    assert sent == 5  # 5 worst cases fit in 5.5; then every run stops at the budget
    assert r.budget_exhausted and r.journal_cost_usd == pytest.approx(5 * worst)
    with Journal(db) as jr:
        assert jr.lost_usd("charged") == pytest.approx(5 * worst) and jr.lost_usd("killed") == 0


def test_each_timed_out_attempt_is_charged_and_a_retry_needs_room_of_its_own(scripted):
    """A server that never answers in time: every attempt may have run to the end and been
    billed. Three attempts allowed, budget for two: the third is not sent and the error says
    why; the run's cost is the two attempts' worst case."""
    script, url = scripted
    script.phang, script.hang_s = 1.0, 2.0
    spec, states = _spec(url, max_retries=2, timeout_s=0.3), make_states(1)
    worst = _worst(spec, states[0])
    r = asyncio.run(replay_trace(states, [spec], budget_usd=2.5 * worst))
    assert sum(script.requests.values()) == 2
    assert r.attempts_charged == 2 and r.cost_usd == pytest.approx(2 * worst)
    reason = next(iter(r.states_failed.values()))
    assert "timeout" in reason and "not retried: the budget left" in reason
    assert "2 attempts without a kept answer" in r.summary()


def test_retries_of_unbilled_failures_share_one_reservation(scripted):
    """HTTP 500s are not billed: retries of them are free and the answer is billed once."""
    script, url = scripted
    script.always_fail = 1.0  # a permanent 500 for every conversation
    spec, states = _spec(url, max_retries=3), make_states(1)
    r = asyncio.run(replay_trace(states, [spec], budget_usd=1.2 * _worst(spec, states[0])))
    assert sum(script.requests.values()) == 4  # 1 + 3 retries inside one worst case
    assert r.attempts_charged == 0 and r.cost_usd == 0


def test_a_call_waiting_for_budget_room_is_not_sent_after_the_journal_failed(scripted, tmp_path):
    """Budget room for one call at a time, three states in flight: the first outcome's write is
    refused while the others wait in the ledger. They must not go out once it has failed."""
    script, url = scripted
    script.delay_s = 0.3
    spec, states = _spec(url, max_concurrency=4), make_states(3)
    jr = Journal(tmp_path / "j.db")

    def refuse(*args):
        raise sqlite3.OperationalError("database is locked")

    jr.record = refuse
    with jr:
        r = asyncio.run(replay_trace(states, [spec], journal=jr,
                                     budget_usd=1.5 * _worst(spec, states[0])))  # fmt: skip
    assert sum(script.requests.values()) == 1 == r.calls_unrecorded
    assert r.states_not_started == 2 and "no new call was started" in r.summary()
