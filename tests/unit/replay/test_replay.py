"""replay_trace against the scripted HTTP server: journal caching, per-teacher concurrency,
fault injection (every state completed or reported failed), tiers, tool inference."""

from __future__ import annotations

import asyncio

import pytest

from composer_replication.config import RemoteTeacherConfig
from composer_replication.replay.journal import Journal
from composer_replication.replay.replay import (
    TRANSIENT_KINDS,
    replay_trace,
    session_tools,
    tier_settled,
)

from .conftest import digest, make_states


def _specs(url: str, n: int = 2, **kw) -> list[RemoteTeacherConfig]:
    base = {"max_tokens": 16, "timeout_s": 2, "backoff_base_s": 0.01, "backoff_cap_s": 0.05,
            "price_in_per_mtok": 1.0, "price_out_per_mtok": 4.0}  # fmt: skip
    base.update(kw)
    return [
        RemoteTeacherConfig(name=f"t{i}", base_url=url, model=f"m{i}", **base) for i in range(n)
    ]


def test_replay_records_everything_and_rerun_sends_nothing(scripted, tmp_path):
    script, url = scripted
    states = make_states(10, tool_every=3)
    db = tmp_path / "r.db"
    r1 = asyncio.run(replay_trace(states, _specs(url), journal=db))
    assert r1.states_completed == 10 and r1.calls_sent == 20 and r1.calls_cached == 0
    assert sum(script.requests.values()) == 20
    assert r1.cost_usd > 0 and r1.prompt_tokens > 0
    before = sum(script.requests.values())
    r2 = asyncio.run(replay_trace(states, _specs(url), journal=db))
    assert sum(script.requests.values()) == before  # zero requests
    assert r2.calls_sent == 0 and r2.calls_cached == 20 and r2.cost_usd == 0
    assert r2.teacher_actions == r1.teacher_actions
    with Journal(db) as jr:
        assert [s.state_id for s in jr.states()] == [s.state_id for s in states]
        # a run's cost includes the worst case of attempts that gave no answer but may have
        # been billed (a timeout under load, then a retry): the journal keeps those apart
        assert jr.spent_usd() + jr.lost_usd("charged") == pytest.approx(r1.cost_usd)
        assert jr.lost_usd("charged") == pytest.approx(r1.charged_usd)
    # changing a request parameter changes the key: those calls are new
    r3 = asyncio.run(replay_trace(states, _specs(url, temperature=0.5), journal=db))
    assert r3.calls_sent == 20


def test_per_teacher_concurrency_limit(scripted):
    script, url = scripted
    script.delay_s = 0.05
    specs = _specs(url, n=1, max_concurrency=3)
    asyncio.run(replay_trace(make_states(12), specs))
    assert script.max_in_flight == 3


def test_fault_injection_every_state_completed_or_failed(scripted, tmp_path):
    """429 (Retry-After 0), 500, hangs past the 1 s timeout, invalid JSON, and 15% of
    conversations failing on every attempt: no crash; every state is completed or failed with a
    reason; failed calls are journaled with their error kind. (The timeout leaves a loaded
    machine room: at 0.3 s the invalid answers arrived late and counted as timeouts.)"""
    script, url = scripted
    script.p429, script.p500, script.phang, script.pinvalid = 0.15, 0.15, 0.05, 0.05
    script.always_fail, script.hang_s = 0.15, 2.0
    states = make_states(40)
    specs = _specs(url, timeout_s=1.0, max_retries=4, max_concurrency=8)
    db = tmp_path / "f.db"
    r = asyncio.run(replay_trace(states, specs, journal=db))
    assert r.states_completed + len(r.states_failed) == 40 and r.states_remaining == 0
    assert r.states_completed > 0 and r.states_failed
    assert all(reason for reason in r.states_failed.values())
    assert {"server", "malformed"} <= set(r.errors_by_kind)
    assert r.attempts > r.calls_sent  # retries happened
    with Journal(db) as jr:
        calls = list(jr.calls())
    assert len(calls) == 80
    failed_states = {c.state_id for c in calls if c.status == "error"}
    assert failed_states == set(r.states_failed)
    assert all(c.error_kind and c.error for c in calls if c.status == "error")
    # a plain re-run re-sends transient failures only (no answer was received for them) ...
    transient = [c for c in calls if c.status == "error" and c.error_kind in TRANSIENT_KINDS]
    assert transient and len(transient) < sum(c.status == "error" for c in calls)
    r2 = asyncio.run(replay_trace(states, specs, journal=db))
    assert r2.calls_sent == len(transient)
    with Journal(db) as jr:
        still_failed = sum(c.status == "error" for c in jr.calls())
    # ... and retry_failed re-sends every failure
    script.p429 = script.p500 = script.phang = script.pinvalid = script.always_fail = 0.0
    r3 = asyncio.run(replay_trace(states, specs, journal=db, retry_failed=True))
    assert r3.calls_sent == still_failed
    assert r3.states_completed == 40


def test_empty_prefix_is_skipped_not_failed(scripted):
    """Real ingest output starts every session with an empty-prefix state: skipping it is no
    failure (it made every replay of ingest output exit 1)."""
    _, url = scripted
    states = make_states(2)
    states[0].prefix = []
    r = asyncio.run(replay_trace(states, _specs(url)))
    assert not r.states_failed and r.states_completed == 1 and r.states_skipped_empty == 1
    assert "1 states skipped: empty prefix" in r.summary()


def test_tiers_escalate_only_on_disagreement(scripted):
    """Tier 0 = two teachers. With ``answer_by_model`` they always disagree -> every state asks
    tier 1; without it they agree -> tier 1 is never asked and its calls are reported saved."""
    script, url = scripted
    specs = _specs(url, n=2) + [
        RemoteTeacherConfig(name="big", base_url=url, model="big", tier=1, max_tokens=16,
                    price_in_per_mtok=10, price_out_per_mtok=40)
    ]  # fmt: skip
    states = make_states(6)
    r = asyncio.run(replay_trace(states, specs, tiered=True))
    assert r.calls_sent == 12 and r.calls_saved_tiers == 6 and r.calls_full_replay == 18
    mean_p, mean_c = r.prompt_tokens / 12, r.completion_tokens / 12
    assert r.usd_saved_estimate == pytest.approx(6 * specs[2].cost_usd(mean_p, mean_c))
    assert all(set(a) == {"t0", "t1"} for a in r.teacher_actions.values())
    script.answer_by_model = True
    r = asyncio.run(replay_trace(make_states(6, session="s2"), specs, tiered=True))
    assert r.calls_sent == 18 and r.calls_saved_tiers == 0


def test_gating_selection_skips_states(scripted):
    script, url = scripted
    states = make_states(8)
    keep = {s.state_id for s in states[:3]}
    r = asyncio.run(replay_trace(states, _specs(url), selected=keep))
    assert r.states_gated_out == 5 and r.calls_saved_gating == 10 and r.calls_sent == 6
    assert r.usd_saved_estimate is not None and r.usd_saved_estimate > 0
    assert {d for _, d in script.requests} == {digest(s.prefix) for s in states[:3]}


def test_tools_are_inferred_per_session(scripted):
    states = make_states(4, tool_every=2)
    tools = session_tools(states)
    assert [t["function"]["name"] for t in tools["s1"]] == ["bash"]
    assert tier_settled({"a": {"content": "X  y"}, "b": {"content": "x y"}}, 2, 0.6)
    assert not tier_settled({"a": {"content": "x"}, "b": {"content": "z"}}, 2, 0.6)


def test_duplicate_state_ids_are_replayed_and_paid_once(scripted, tmp_path):
    """The same states twice (e.g. a file ingested twice): each call is sent once, and the
    journal's spend equals what was paid."""
    script, url = scripted
    spec = RemoteTeacherConfig(name="t", base_url=url, model="m", max_tokens=8, price_in_per_mtok=1.0,
                       price_out_per_mtok=2.0, timeout_s=5)  # fmt: skip
    states = make_states(4)
    with Journal(tmp_path / "j.db") as jr:
        r = asyncio.run(replay_trace(states + states, [spec], journal=jr, budget_usd=1))
        assert r.cost_usd == pytest.approx(jr.spent_usd())
    assert sum(script.requests.values()) == 4 == r.calls_sent
    assert r.states_duplicate == 4 and "4 duplicate state ids replayed once" in r.summary()


def test_read_states_drops_repeated_ids_with_a_warning(tmp_path, capsys):
    from composer_replication.cli.replay import read_states

    f = tmp_path / "s.jsonl"
    lines = [s.to_json() + b"\n" for s in make_states(2)]
    f.write_bytes(b"".join(lines + lines))
    assert [s.state_id for s in read_states(f)] == ["st0000", "st0001"]
    assert "2 duplicate state ids skipped" in " ".join(capsys.readouterr().err.split())


def _refusing_journal(path, nth: int, error: str) -> Journal:
    """A journal whose ``nth`` outcome write fails as SQLite fails (locked, disk full)."""
    import sqlite3

    jr = Journal(path)
    real, n = jr.record, [0]

    def record(rec, *args):
        n[0] += 1
        if n[0] == nth:
            raise sqlite3.OperationalError(error)
        real(rec, *args)

    jr.record = record
    return jr


def test_journal_write_failure_stops_new_calls_and_keeps_paid_answers(scripted, tmp_path):
    """The journal refuses a write (database is locked / disk full) after two calls: no new call
    is started, the run ends with a summary naming the journal, and the answer the journal
    refused is saved next to it instead of being lost."""

    import orjson

    script, url = scripted
    spec = RemoteTeacherConfig(name="t", base_url=url, model="m", max_tokens=8, timeout_s=5,
                       max_concurrency=1)  # fmt: skip
    jr = _refusing_journal(tmp_path / "j.db", nth=3, error="database is locked")
    with jr:
        r = asyncio.run(replay_trace(make_states(6), [spec], journal=jr, max_states_in_flight=1))
    assert sum(script.requests.values()) == 3 and r.calls_unrecorded == 1
    assert "database is locked" in r.summary() and str(tmp_path / "j.db") in r.summary()
    assert r.states_not_started == 3
    saved = (tmp_path / "j.db.unrecorded.jsonl").read_bytes().splitlines()
    assert orjson.loads(saved[0])["response"]["content"].startswith("Answer ")


def test_next_run_imports_saved_answers_and_charges_them_once(scripted, tmp_path):
    """The answer a refused journal write left beside the journal is stored by the next run:
    not sent again, its cost counted once (its attempt's intent is cleared, not also adopted
    as a lost call), the file removed."""

    script, url = scripted
    spec = RemoteTeacherConfig(name="t", base_url=url, model="m", max_tokens=8, timeout_s=5,
                       max_concurrency=1, price_in_per_mtok=1.0, price_out_per_mtok=4.0)  # fmt: skip
    states = make_states(4)
    jr = _refusing_journal(tmp_path / "j.db", nth=2, error="disk I/O error")
    with jr:
        r1 = asyncio.run(replay_trace(states, [spec], journal=jr, max_states_in_flight=1))
    assert r1.calls_unrecorded == 1 and r1.calls_sent == 2
    with Journal(tmp_path / "j.db") as jr:
        assert jr.pending_intents() == 1  # the refused write also left its intent behind
    r2 = asyncio.run(replay_trace(states, [spec], journal=tmp_path / "j.db"))
    assert r2.calls_reimported == 1 and "1 paid answers an earlier run" in r2.summary()
    assert r2.calls_cached == 2 and r2.calls_sent == 2  # states 3 and 4 only
    assert sum(script.requests.values()) == 4  # every state sent exactly once over both runs
    assert r2.calls_maybe_paid_twice == 0 and r2.lost_usd == 0
    assert r2.journal_cost_usd == pytest.approx(r1.cost_usd + r2.cost_usd)
    assert not (tmp_path / "j.db.unrecorded.jsonl").exists()


def test_a_damaged_saved_answers_file_stops_the_run_naming_the_line(scripted, tmp_path):
    from composer_replication.replay.journal import JournalError

    script, url = scripted
    side = tmp_path / "j.db.unrecorded.jsonl"
    side.write_bytes(b'{"state_id": "s", "teacher": "t", "params_hash": "h", "status": "ok",'
                     b' "response": {}}\n{"state_id": "s2", "teach')  # fmt: skip
    with pytest.raises(JournalError, match=r"unrecorded\.jsonl:2: not JSON"):
        asyncio.run(replay_trace(make_states(2), _specs(url, n=1), journal=tmp_path / "j.db"))
    assert side.exists() and sum(script.requests.values()) == 0
    with Journal(tmp_path / "j.db") as jr:
        assert list(jr.calls()) == []  # nothing half-imported
