"""The budget ledger: worst-case reservation keeps spend under the ceiling with many calls in
flight; exhaustion stops the run cleanly and says how many states remain."""

from __future__ import annotations

import asyncio
import random

import pytest

from composer_replication.config import RemoteTeacherConfig
from composer_replication.replay.budget import (
    BudgetLedger,
    billed_usage,
    min_tokens,
    prompt_chars,
    worst_case_prompt_tokens,
)
from composer_replication.replay.journal import Journal
from composer_replication.replay.replay import replay_trace
from composer_replication.teachers.chat import TeacherResponse

from .conftest import make_states


def test_reserve_refuses_what_does_not_fit():
    """budget 1.0: reserve 0.6 ok; 0.5 does not fit while 0.6 is held (0.6+0.5 > 1)."""
    led = BudgetLedger(1.0)
    a = led.try_reserve(0.6)
    assert a is not None and led.try_reserve(0.5) is None

    async def go():
        await led.settle(a, 0.2)  # real cost 0.2: 0.8 left
        b = await led.reserve(0.5)
        assert b is not None and led.spent_usd == pytest.approx(0.2)
        await led.settle(b, 0.5)
        return await led.reserve(0.5)  # 0.3 left, nothing in flight -> refused

    assert asyncio.run(go()) is None
    assert led.exhausted and led.smallest_refused_usd == 0.5
    assert led.try_reserve(0.3) is not None  # a call that fits still goes ahead
    assert led.max_committed_usd <= 1.0 + 1e-12


def test_waiting_reservation_gets_freed_room():
    """budget 1.0: a 0.6 call holds 0.6; a second 0.6 waits, then fits once the first settles
    at 0.1 (0.1 + 0.6 <= 1)."""
    led = BudgetLedger(1.0)

    async def go():
        a = await led.reserve(0.6)
        waiter = asyncio.create_task(led.reserve(0.6))
        await asyncio.sleep(0.01)
        assert not waiter.done()
        await led.settle(a, 0.1)
        return await waiter

    assert asyncio.run(go()) is not None and not led.exhausted


def test_negative_budget_rejected():
    with pytest.raises(ValueError, match="budget_usd"):
        BudgetLedger(-1)


def test_worst_case_bound_covers_real_tokenizer(tokenizer):
    """The byte bound is >= the real token count of the chat-templated prompt."""
    msgs = [
        {"role": "system", "content": "You are helpful. " * 20},
        {"role": "user", "content": "héllo wörld ✓ 漢字 " * 30},
    ]
    real = len(tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True,
                                             return_dict=False))  # fmt: skip
    assert worst_case_prompt_tokens(msgs) >= real


def test_spend_never_exceeds_budget_concurrency_16(scripted, tmp_path):
    """20 runs, 2 teachers x concurrency 16, random tiny budgets: the ledger's committed maximum,
    the run's spend and the journal's spend stay <= budget; every state is accounted for."""
    script, url = scripted
    script.delay_s = 0.005
    rng = random.Random(0)
    states = make_states(24)
    specs = [
        RemoteTeacherConfig(name=f"t{i}", base_url=url, model=f"m{i}", price_in_per_mtok=2.0 + i,
                    price_out_per_mtok=8.0, max_tokens=16, max_concurrency=16, timeout_s=5)
        for i in range(2)
    ]  # fmt: skip
    exhausted_runs = 0
    for run in range(20):
        budget = rng.uniform(0.0005, 0.008)
        with Journal(tmp_path / f"b{run}.db") as jr:
            r = asyncio.run(replay_trace(states, specs, journal=jr, budget_usd=budget))
            journal_spend = jr.spent_usd()
            recomputed = sum(
                specs[int(c.teacher[1])].cost_usd(c.prompt_tokens, c.completion_tokens)
                for c in jr.calls()
            )
        assert r.max_committed_usd <= budget + 1e-12
        assert r.cost_usd <= budget + 1e-12 and journal_spend <= budget + 1e-12
        assert journal_spend == pytest.approx(recomputed) and r.cost_usd == pytest.approx(
            recomputed
        )
        total = r.states_completed + len(r.states_failed) + r.states_remaining
        assert total == len(states)
        if r.budget_exhausted:
            exhausted_runs += 1
            assert r.states_remaining > 0 and "states remain" in r.summary()
    assert script.max_in_flight > 2  # calls really overlapped
    assert exhausted_runs >= 15  # tiny budgets: most runs hit the ceiling


def test_budget_spans_resumed_runs(scripted, tmp_path):
    """A resumed run counts what the journal already spent: two runs with the same budget spend
    no more than that budget in total."""
    _, url = scripted
    spec = RemoteTeacherConfig(name="t", base_url=url, model="m", price_in_per_mtok=5, price_out_per_mtok=5,
                       max_tokens=16, max_concurrency=16)  # fmt: skip
    states = make_states(30)
    db = tmp_path / "r.db"
    r1 = asyncio.run(replay_trace(states, [spec], journal=db, budget_usd=0.004))
    r2 = asyncio.run(replay_trace(states, [spec], journal=db, budget_usd=0.004))
    assert r1.budget_exhausted and r1.states_remaining > 0
    assert r2.journal_cost_usd <= 0.004 + 1e-12
    r3 = asyncio.run(replay_trace(states, [spec], journal=db, budget_usd=1.0))
    assert r3.states_completed == 30 and not r3.budget_exhausted
    assert r3.calls_cached >= r1.states_completed


def _resp(text: str, prompt: int | None, completion: int | None) -> TeacherResponse:
    usage = {"prompt_tokens": prompt, "completion_tokens": completion}
    return TeacherResponse(text, [], prompt, completion, raw_usage=usage)


def test_usage_reported_too_low_is_billed_at_the_upper_bound():
    """A server claiming 0 tokens for a 1000-character answer to a non-empty prompt is not free:
    both counts are replaced by the worst-case bound and the call is flagged."""
    spec = RemoteTeacherConfig(name="t", base_url="http://x/v1", model="m", max_tokens=64)
    msgs = [{"role": "user", "content": "word " * 100}]
    bound, floor = worst_case_prompt_tokens(msgs), min_tokens(prompt_chars(msgs))
    assert floor == 500 // 8
    bill = billed_usage(spec, bound, _resp("word " * 200, 0, 0), prompt_floor=floor)
    assert (bill.prompt_tokens, bill.completion_tokens) == (bound, 64)
    assert "prompt_tokens=0 <" in bill.misreport and "completion_tokens=0 <" in bill.misreport
    bill = billed_usage(spec, bound, _resp("x" * 40, 120, 2), prompt_floor=floor)  # 40/8 = 5 > 2
    assert bill.completion_tokens == len('"' + "x" * 40 + '"[]') and bill.prompt_tokens == 120


def test_plausible_low_usage_is_trusted():
    """Counts at or above characters/8 are real (dense code, a reply cut at max_tokens)."""
    spec = RemoteTeacherConfig(name="t", base_url="http://x/v1", model="m", max_tokens=16)
    bill = billed_usage(spec, 1000, _resp("y" * 400, 50, 16), prompt_floor=50)
    assert (bill.prompt_tokens, bill.completion_tokens, bill.misreport) == (50, 16, None)
    assert billed_usage(spec, 1000, _resp("", 50, 0), prompt_floor=1).misreport is None


def test_a_state_that_does_not_fit_is_skipped_and_the_rest_replayed(scripted, tmp_path):
    """One state whose worst case alone exceeds the budget comes first: it is skipped and
    reported, and the small states after it are still replayed (it used to stop the run)."""
    script, url = scripted
    spec = RemoteTeacherConfig(name="t", base_url=url, model="m", max_tokens=8, price_in_per_mtok=1.0,
                       price_out_per_mtok=1.0, timeout_s=5)  # fmt: skip
    states = make_states(5)
    states[0].prefix[1]["content"] = "x" * 20_000  # worst case ~$0.02
    small = worst_case_prompt_tokens(states[1].prefix) + 8
    budget = 5 * small / 1e6
    with Journal(tmp_path / "j.db") as jr:
        r = asyncio.run(replay_trace(states, [spec], journal=jr, budget_usd=budget,
                                     max_states_in_flight=1))  # fmt: skip
        assert jr.spent_usd() <= budget
    assert r.states_completed == 4 and r.states_remaining == 1 and r.budget_exhausted
    assert sum(script.requests.values()) == 4
    assert "1 states remain" in r.summary() and "the smallest needs $0.02" in r.summary()
