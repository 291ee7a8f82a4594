"""Claude Code: one state per model response, in the causal order of the ``parentUuid`` tree
(issue 57, classes 1 and 2), and states whose thinking was not logged marked incomplete."""

from __future__ import annotations

from pathlib import Path

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from support.chat import assert_valid_openai_prefix

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


def test_a_record_continuing_a_cut_off_branch_returns_to_it(tmp_path: Path) -> None:
    """A rewind cuts a branch off; a later record whose parent is on that branch continues
    it: its state sees that branch (not the one written in between), counted a branch switch."""
    recs = _chain(1)  # u, a(t0), r(t0), end
    root = recs[0]["uuid"]
    recs.append({"type": "user", "uuid": "again", "parentUuid": root, "sessionId": "P",
                 "message": {"role": "user", "content": "no, do something else"}})  # fmt: skip
    recs.append({"type": "user", "uuid": "more", "parentUuid": "end", "sessionId": "P",
                 "message": {"role": "user", "content": "and then?"}})  # fmt: skip
    recs.append({"type": "assistant", "uuid": "last", "parentUuid": "more", "sessionId": "P",
                 "message": {"role": "assistant", "id": "msg_last",
                             "content": [{"type": "text", "text": "then this"}]}})  # fmt: skip
    states, rep = _states_of(tmp_path, recs)
    last = states[-1]
    assert last.action.text == "then this"
    assert [m["content"] for m in last.prefix] == ["prompt 0", "", "out 0", "done", "and then?"]
    assert rep.context_changes["rewind"] == 1 and rep.context_changes["branch_switch"] == 1
    assert not rep.orphans


def test_results_without_call_ids_answer_the_call_that_has_none(tmp_path: Path) -> None:
    """A call logged without an id, then two sibling results naming other ids only in
    ``sourceToolUseID`` (a retried result): each branch answers that call, the next response
    follows the branch it names, and no result becomes an orphan user message."""

    def user(uuid: str, parent: str, source: str, text: str) -> dict:
        return {"type": "user", "uuid": uuid, "parentUuid": parent, "sessionId": "P",
                "sourceToolUseID": source, "message": {"role": "user", "content": [
                    {"type": "tool_result", "content": text}]}}  # fmt: skip

    recs = [
        {"type": "user", "uuid": "u", "parentUuid": None, "sessionId": "P",
         "message": {"role": "user", "content": "list"}},
        {"type": "assistant", "uuid": "a", "parentUuid": "u", "sessionId": "P",
         "message": {"role": "assistant", "content": [
             {"type": "tool_use", "name": "Bash", "input": {"command": "ls"}}]}},
        user("r1", "a", "src_1", "file1"),
        user("r2", "a", "src_2", "denied"),
        {"type": "assistant", "uuid": "b", "parentUuid": "r1", "sessionId": "P",
         "message": {"role": "assistant", "content": [{"type": "text", "text": "Done."}]}},
    ]  # fmt: skip
    states, rep = _states_of(tmp_path, recs)
    assert [s.action.text for s in states][-1] == "Done."
    prefix = states[-1].prefix
    assert_valid_openai_prefix(prefix)
    assert [m["content"] for m in prefix[2:]] == ["file1"]
    assert not rep.orphans


_TREE = st.lists(
    st.tuples(
        st.sampled_from(["user", "assistant"]),
        st.integers(-1, 12),  # parent: an earlier record's index (-1, or a later one: none)
        st.sampled_from(["t0", "t1", "t2", None]),  # call id / result id
        st.sampled_from(["t0", "t1", None]),  # sourceToolUseID
        st.booleans(),  # compaction boundary before the record
    ),
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(_TREE)
def test_any_tree_of_calls_and_results_gives_valid_chat_prefixes(tmp_path_factory, spec) -> None:
    """Branches, rewinds back and forth, calls without ids, results naming unknown or no
    calls, repeated ids, compactions: every state's prefix is valid OpenAI chat (each call
    followed by exactly its tool messages, no tool message elsewhere)."""
    recs: list[dict] = []
    for i, (kind, parent, cid, source, compact) in enumerate(spec):
        if compact:
            recs.append({"type": "system", "subtype": "compact_boundary", "uuid": f"c{i}",
                         "sessionId": "P"})  # fmt: skip
        block = {"type": "tool_use", "name": "Bash", "input": {}}
        if kind == "user":
            block = {"type": "tool_result", "content": "r"}
            if cid:
                block["tool_use_id"] = cid
        elif cid:
            block["id"] = cid
        rec = {"type": kind, "uuid": f"r{i}", "sessionId": "P",
               "parentUuid": f"r{parent}" if 0 <= parent < i else None,
               "message": {"role": kind, "content": [block]}}  # fmt: skip
        if source:
            rec["sourceToolUseID"] = source
        recs.append(rec)
    path = tmp_path_factory.mktemp("tree") / "s.jsonl"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in recs))
    states, rep = _read(path)
    assert rep.parsed + rep.skipped == rep.total_lines
    for s in states:
        assert_valid_openai_prefix(s.prefix)


def _branch_loop(pairs: int) -> list[dict]:
    """Two branches from one root, extended alternately: every record after the first rewind
    continues the branch the one before it cut off (a branch switch each)."""

    def user(u: str, parent: str | None, text: str) -> dict:
        return {"type": "user", "uuid": u, "parentUuid": parent, "sessionId": "P",
                "message": {"role": "user", "content": text}}  # fmt: skip

    def answer(u: str, parent: str, text: str) -> dict:
        return {"type": "assistant", "uuid": u, "parentUuid": parent, "sessionId": "P",
                "message": {"role": "assistant", "id": f"msg_{u}",
                            "content": [{"type": "text", "text": text}]}}  # fmt: skip

    recs = [user("root", None, "start"), answer("a0", "root", "A"), user("b0", "root", "B")]
    last = {"a": "a0", "b": "b0"}
    for i in range(1, pairs):
        for side in "ab":
            recs.append(user(f"{side}{i}u", last[side], f"more {side} {i}"))
            recs.append(answer(f"{side}{i}", f"{side}{i}u", f"{side}{i}"))
            last[side] = f"{side}{i}"
    return recs


def test_a_branch_switch_loop_is_bounded(tmp_path: Path) -> None:
    """Attack: two branches written alternately switch branch at every record, and each switch
    re-built the whole branch (400 pairs: 1.3 s; 2000: 250 s on this machine, superquadratic).
    Switches are paid from a per-file budget of moved messages and scanned entries; once spent,
    a record continuing a cut-off branch stays on the current prefix, its states are marked
    ``context_complete: false`` and the report warns ``branch_switch_budget``. Under the budget
    (the first switches) the states are those of the branch the record continues."""
    import time

    recs = _branch_loop(2500)
    t = time.process_time()
    states, rep = _states_of(tmp_path, recs)
    assert time.process_time() - t < 20  # 250+ s before
    assert rep.parsed == len(recs) and len(states) == 2 * 2500 - 1
    assert rep.warnings["branch_switch_budget"] == 1
    assert 0 < rep.context_changes["branch_switch"] < 2 * 2500
    early = next(s for s in states if s.action.text == "b3")
    assert [m["content"] for m in early.prefix] == ["start", "B", "more b 1", "b1", "more b 2",
                                                   "b2", "more b 3"]  # fmt: skip
    assert early.meta.context_complete
    late = states[-1]
    assert not late.meta.context_complete
    for s in states:
        assert_valid_openai_prefix(s.prefix)
