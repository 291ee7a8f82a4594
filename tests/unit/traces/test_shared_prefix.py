"""States of one session share the session's messages (`PrefixView`) instead of each holding a
copy of its prefix: memory that grows linearly with the session, prefixes that survive the
cuts made after them, and states equal to the copies they replace."""

from __future__ import annotations

import copy
import pickle
import tracemalloc
from pathlib import Path

import orjson
import pytest
from support.hostile_logs import _cx, _cx_msg, _gm, cc_answer, cc_user

from composer_replication.traces import TraceState, _base, ingest


def _write(path: Path, recs: list[dict]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in recs))
    return path


def _gemini(path: Path, turns: int) -> Path:
    recs = [{"sessionId": "G", "projectHash": "h", "startTime": "2026-01-01T00:00:00Z"}]
    for i in range(turns):
        recs += [{"id": f"u{i}", "type": "user", "content": [{"text": f"q{i}"}]},
                 _gm(i, (f"c{i}",))]  # fmt: skip
    return _write(path, recs)


def _copying(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference: every state copies its prefix (what `SessionBuilder.flush` did)."""
    monkeypatch.setattr(_base, "PrefixView", lambda messages, n: messages[:n])


def _held_bytes(path: Path, fmt: str) -> tuple[int, list[TraceState]]:
    """Bytes still allocated while every state of ``path`` is held (prefixes not read)."""
    list(ingest([_gemini(path.with_suffix(".warm"), 2)], "gemini_cli"))  # first-use caches
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        states = list(ingest([path], fmt))
        return tracemalloc.get_traced_memory()[0] - base, states
    finally:
        tracemalloc.stop()


def test_holding_a_sessions_states_costs_memory_linear_in_its_length(tmp_path: Path) -> None:
    """500 and 1,000 turns: twice the states, about twice the memory (copies: about 3.5x)."""
    small, s1 = _held_bytes(_gemini(tmp_path / "a.jsonl", 500), "gemini_cli")
    large, s2 = _held_bytes(_gemini(tmp_path / "b.jsonl", 1000), "gemini_cli")
    assert (len(s1), len(s2)) == (500, 1000)
    assert large < 2.5 * small, (small, large)
    assert s2[-1].prefix[-2:] == [
        {"role": "tool", "tool_call_id": "c998", "content": "r"},
        {"role": "user", "content": "q999"},
    ]
    assert len(s2[-1].prefix) == 3 * 999 + 1


def test_the_memory_test_fails_for_states_that_copy(tmp_path, monkeypatch) -> None:
    """The linear-memory bound above is one that copying prefixes breaks (not a loose one)."""
    _copying(monkeypatch)
    small, _ = _held_bytes(_gemini(tmp_path / "a.jsonl", 500), "gemini_cli")
    large, _ = _held_bytes(_gemini(tmp_path / "b.jsonl", 1000), "gemini_cli")
    assert large > 3 * small, (small, large)


def _cc_rewind() -> list[dict]:
    """u1 a1 u2 a2, then u3 answers a1: a rewind that cuts u2 a2 off after a2's state."""
    return [cc_user("u1", None, "one"), cc_answer("a1", "u1", "m1"),
            cc_user("u2", "a1", "two"), cc_answer("a2", "u2", "m2"),
            cc_user("u3", "a1", "three"), cc_answer("a3", "u3", "m3")]  # fmt: skip


def _cc_branch_switch() -> list[dict]:
    """The rewind above, then a record continues the branch it cut off (a branch switch)."""
    return [*_cc_rewind(), cc_user("u4", "a2", "back to two"), cc_answer("a4", "u4", "m4")]


def _codex_rollback() -> list[dict]:
    return [_cx("session_meta", {"id": "S"}), _cx_msg("user", "one"), _cx_msg("assistant", "x"),
            _cx_msg("user", "two"), _cx_msg("assistant", "y"),
            _cx("event_msg", {"type": "thread_rolled_back", "num_turns": 1}),
            _cx_msg("user", "three"), _cx_msg("assistant", "z")]  # fmt: skip


def _texts(state: TraceState) -> list[str]:
    return [m["content"] for m in state.prefix]


@pytest.mark.parametrize(
    ("fmt", "make", "want"),
    [
        ("claude_code", _cc_rewind, [["one"], ["one", "ok", "two"], ["one", "ok", "three"]]),
        ("claude_code", _cc_branch_switch, [["one"], ["one", "ok", "two"],
                                            ["one", "ok", "three"],
                                            ["one", "ok", "two", "ok", "back to two"]]),
        ("codex", _codex_rollback, [["one"], ["one", "x", "two"], ["one", "x", "three"]]),
    ],
)  # fmt: skip
def test_a_cut_leaves_the_prefixes_of_earlier_states(tmp_path, monkeypatch, fmt, make, want):
    """Every prefix is read after the whole log: a rewind, branch switch or rollback that cut
    the session's list in place would show the new branch in the states made before it."""
    path = _write(tmp_path / "s.jsonl", make())
    states = list(ingest([path], fmt))
    assert [_texts(s) for s in states] == want
    assert sorted({s.meta.segment for s in states}) == list(range(len(want) - 1))
    _copying(monkeypatch)
    assert states == list(ingest([path], fmt))


def test_states_equal_copying_states_on_the_fixtures(fixtures_dir: Path, monkeypatch) -> None:
    """Every fixture state (all formats) equals the state a copying reader makes: same JSON,
    same prefix, same fields."""
    shared = list(ingest([fixtures_dir]))
    shared_json = [s.to_json() for s in shared]  # before any prefix is read
    _copying(monkeypatch)
    copied = list(ingest([fixtures_dir]))
    assert len(shared) == len(copied) > 60
    assert shared_json == [s.to_json() for s in copied]
    assert [s.prefix for s in shared] == [s.prefix for s in copied]
    assert shared == copied
    assert [s.to_json() for s in shared] == shared_json  # and after


def test_a_read_prefix_is_the_states_own_list(tmp_path: Path) -> None:
    """Read, the prefix is a list owned by the state (as a copy was): changing it changes no
    other state; orjson, pickle and copy see the prefix, never the whole session."""
    states = list(ingest([_gemini(tmp_path / "g.jsonl", 50)], "gemini_cli"))
    first, last = states[1], states[-1]
    assert orjson.dumps(first) == first.to_json()  # orjson reads the attribute: it is kept
    assert first.prefix is first.prefix and isinstance(first.prefix, list)
    first.prefix.append({"role": "user", "content": "mine"})
    assert last.prefix[3] == {"role": "user", "content": "q1"}
    assert TraceState.from_json(first.to_json()).prefix[-1]["content"] == "mine"
    fresh = list(ingest([_gemini(tmp_path / "g.jsonl", 50)], "gemini_cli"))[1]
    short = list(ingest([_gemini(tmp_path / "h.jsonl", 2)], "gemini_cli"))[1]  # same prefix
    assert len(pickle.dumps(fresh)) == len(pickle.dumps(short))  # not the whole session
    assert pickle.loads(pickle.dumps(fresh)) == fresh == copy.deepcopy(fresh)
    assert copy.copy(fresh).prefix == fresh.prefix
    unread = list(ingest([_gemini(tmp_path / "g.jsonl", 50)], "gemini_cli"))[1]
    unread.prefix = []  # assigned before it was ever read: the assigned list is the prefix
    assert (
        orjson.loads(unread.to_json())["prefix"] == [] == pickle.loads(pickle.dumps(unread)).prefix
    )
