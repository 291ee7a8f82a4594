"""Claude Code: one state per model response, in the causal order of the ``parentUuid`` tree
(issue 57, classes 1 and 2), and states whose thinking was not logged marked incomplete."""

from __future__ import annotations

from pathlib import Path

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from composer_replication.traces import ingest
from composer_replication.traces._base import NO_RESULT

CASES = Path(__file__).parents[2] / "fixtures" / "trace_cases" / "claude_code"


def _read(path: Path):
    run = ingest([path], "claude_code")
    return list(run), run.report.files[0]


def test_parallel_tool_calls_are_one_decision() -> None:
    """Calls A and B of one response (``msg_01``) are written call A, result A, call B: the
    model chose B before it saw A's result, so A and B are one action whose prefix holds
    neither result; the next response sees both results."""
    states, rep = _read(CASES / "parallel_tool_calls.jsonl")
    assert len(states) == 2
    first, second = states
    assert [c["id"] for c in first.action.tool_calls] == ["toolu_A", "toolu_B"]
    assert first.action.text == "I'll do both at once."
    assert [m["role"] for m in first.prefix] == ["user"]
    assert [m["role"] for m in second.prefix] == ["user", "assistant", "tool", "tool"]
    assert [m["tool_call_id"] for m in second.prefix[2:]] == ["toolu_A", "toolu_B"]
    assert second.action.text.startswith("There are two entries")
    assert not rep.orphans


def test_thinking_logged_empty_marks_the_state_incomplete() -> None:
    states, _ = _read(CASES / "parallel_tool_calls.jsonl")
    first, second = states
    assert first.meta.context_complete is False
    assert first.meta.context_note == "thinking_not_logged"
    assert second.meta.context_complete is True


def test_result_written_before_its_call_follows_the_parent_chain() -> None:
    """The tool result (line 2) names its call (line 4) as parent: read in causal order there
    is no orphan result before the call and no '[no tool result recorded]' after it."""
    states, rep = _read(CASES / "result_before_call.jsonl")
    assert len(states) == 2
    assert states[0].action.tool_calls[0]["id"] == "toolu_X"
    prefix = states[1].prefix
    assert [m["role"] for m in prefix] == ["user", "assistant", "tool"]
    assert prefix[2] == {"role": "tool", "tool_call_id": "toolu_X", "content": "a.txt"}
    assert not rep.orphans
    assert all(m.get("content") != NO_RESULT for m in prefix)


def _chain(n: int) -> list[dict]:
    """A session of ``n`` tool rounds, each record's parent the one before it."""
    recs, parent = [], None
    for i in range(n):
        for kind, body in (
            ("user", [{"type": "text", "text": f"prompt {i}"}] if i == 0 else None),
            ("assistant", [{"type": "tool_use", "id": f"t{i}", "name": "Bash", "input": {}}]),
            ("user", [{"type": "tool_result", "tool_use_id": f"t{i}", "content": f"out {i}"}]),
        ):
            if body is None:
                continue
            uuid = f"{kind[0]}{i}-{len(recs)}"
            msg = {"role": kind, "content": body}
            if kind == "assistant":
                msg["id"] = f"msg_{i}"
            recs.append({"type": kind, "uuid": uuid, "parentUuid": parent, "sessionId": "P",
                         "message": msg})  # fmt: skip
            parent = uuid
    recs.append({"type": "assistant", "uuid": "end", "parentUuid": parent, "sessionId": "P",
                 "message": {"role": "assistant", "id": "msg_end",
                             "content": [{"type": "text", "text": "done"}]}})  # fmt: skip
    return recs


def _states_of(tmp: Path, recs: list[dict]):
    p = tmp / "P.jsonl"
    p.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in recs))
    return _read(p)


@settings(max_examples=25, deadline=None)
@given(st.permutations(range(8)), st.sets(st.integers(0, 7), max_size=2))
def test_reordering_records_never_drops_or_duplicates_one(tmp_path_factory, order, cut) -> None:
    """Any order of the lines gives the states of the causal order; with some parents cut
    (dangling), every call and every result is still used exactly once."""
    recs = _chain(3)  # 1 prompt + 3 calls + 3 results + 1 answer = 8 records
    tmp = tmp_path_factory.mktemp("perm")
    want, _ = _states_of(tmp, recs)
    shuffled = [recs[i] for i in order]
    got, rep = _states_of(tmp, shuffled)
    assert [(s.prefix, s.action) for s in got] == [(s.prefix, s.action) for s in want]
    assert not rep.orphans
    for i in cut:  # dangling parents: file order for those records, each record once
        shuffled[i] = {**shuffled[i], "parentUuid": f"missing-{i}"}
    got, rep = _states_of(tmp, shuffled)
    calls = [c["id"] for s in got for c in s.action.tool_calls]
    assert sorted(calls) == ["t0", "t1", "t2"]
    for s in got:  # no record enters one context twice
        texts = [orjson.dumps(m) for m in s.prefix]
        assert len(texts) == len(set(texts)), texts
    assert rep.warnings["missing_parent"] == sum(
        1 for r in shuffled if str(r["parentUuid"]).startswith("missing-")
    )
    assert rep.parsed == 8


def test_rewind_branches_are_segments_and_reported(tmp_path: Path) -> None:
    """A prompt re-parented on an earlier record starts a new root-to-leaf path: its states
    never see the abandoned branch, the segment increments and the report counts a rewind."""
    recs = _chain(1)  # u, a(t0), r(t0), end
    root = recs[0]["uuid"]
    recs.append({"type": "user", "uuid": "again", "parentUuid": root, "sessionId": "P",
                 "message": {"role": "user", "content": "no, do something else"}})  # fmt: skip
    recs.append({"type": "assistant", "uuid": "alt", "parentUuid": "again", "sessionId": "P",
                 "message": {"role": "assistant", "id": "msg_alt",
                             "content": [{"type": "text", "text": "ok, else"}]}})  # fmt: skip
    states, rep = _states_of(tmp_path, recs)
    last = states[-1]
    assert [m["role"] for m in last.prefix] == ["user", "user"]
    assert last.meta.segment == 1
    assert rep.context_changes["rewind"] == 1


def test_hosted_web_search_inside_a_response_splits_the_decision(tmp_path: Path) -> None:
    """Class 5 in Claude Code: a ``server_tool_use`` web search and its
    ``web_search_tool_result`` are inside one response; the text after the result saw it."""
    blocks = [
        {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search",
         "input": {"query": "release 2.0"}},
        {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1",
         "content": [{"type": "web_search_result", "title": "2.0 notes",
                      "url": "https://example.org/2.0", "encrypted_content": "EqA"}]},
        {"type": "text", "text": "2.0 dropped Python 3.8."},
    ]  # fmt: skip
    recs = [{"type": "user", "uuid": "u", "parentUuid": None, "sessionId": "W",
             "message": {"role": "user", "content": "what changed in 2.0?"}}]  # fmt: skip
    for i, block in enumerate(blocks):
        recs.append({"type": "assistant", "uuid": f"a{i}", "parentUuid": recs[-1]["uuid"],
                     "sessionId": "W", "message": {"role": "assistant", "id": "msg_w",
                                                   "content": [block]}})  # fmt: skip
    states, rep = _states_of(tmp_path, recs)
    search, answer = states
    assert [c["id"] for c in search.action.tool_calls] == ["srvtoolu_1"]
    assert answer.prefix[-1] == {
        "role": "tool", "tool_call_id": "srvtoolu_1", "content": "2.0 notes <https://example.org/2.0>"
    }  # fmt: skip
    assert answer.action.text == "2.0 dropped Python 3.8."
    assert answer.meta.context_complete is False
    assert not rep.orphans


_UUIDS = st.sampled_from(["a", "b", "c", "d", None, 7])


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["user", "assistant"]), _UUIDS, _UUIDS), max_size=12))
def test_hostile_parent_graphs_read_every_record_once(tmp_path_factory, spec) -> None:
    """Cycles, records that are their own parent, repeated uuids and non-string ids: every
    line is parsed or skipped exactly once, no record crashes the reader, and no call or
    result is used twice."""
    recs = []
    for i, (kind, uuid, parent) in enumerate(spec):
        content = [{"type": "tool_use", "id": f"t{i}", "name": "Bash", "input": {}}]
        if kind == "user":
            content = [{"type": "tool_result", "tool_use_id": f"t{i - 1}", "content": "r"}]
        msg = {"id": f"m{i}", "content": content}
        recs.append({"type": kind, "uuid": uuid, "parentUuid": parent, "sessionId": "P",
                     "message": msg})  # fmt: skip
    path = tmp_path_factory.mktemp("graph") / "s.jsonl"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in recs))
    states, rep = _read(path)
    assert rep.parsed + rep.skipped == rep.total_lines == len(recs)
    assert not [r for r in rep.skipped_by_reason if r.startswith("reader_error")]
    calls = [c["id"] for s in states for c in s.action.tool_calls]
    assert len(calls) == len(set(calls)) == sum(1 for k, _, _ in spec if k == "assistant")
