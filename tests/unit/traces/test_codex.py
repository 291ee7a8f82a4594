"""Codex CLI rollouts: rollbacks, encrypted compactions, hosted web search and message phases
change what later states see (issue 57, classes 3-5)."""

from __future__ import annotations

from pathlib import Path

from composer_replication.traces import ingest

CASES = Path(__file__).parents[2] / "fixtures" / "trace_cases" / "codex"


def _read(name: str):
    run = ingest([CASES / name], "codex")
    return list(run), run.report.files[0]


def _texts(state) -> list[str]:
    return [str(m.get("content")) for m in state.prefix]


def test_thread_rolled_back_drops_the_turn_from_later_prefixes() -> None:
    states, rep = _read("rollback.jsonl")
    assert [s.action.text for s in states] == [
        "first answer", "an answer that gets dropped", "better answer"
    ]  # fmt: skip
    last = states[-1]
    assert _texts(last) == ["first question", "first answer", "better question"]
    assert last.meta.segment == 1
    assert rep.context_changes["rollback"] == 1


def test_encrypted_compaction_is_marked_and_counted() -> None:
    states, rep = _read("compacted_encrypted.jsonl")
    last = states[-1]
    assert last.action.text == "done two"
    assert last.meta.after_compaction is True
    assert last.meta.context_complete is False
    assert last.meta.context_note == "encrypted_compaction"
    assert any("compacted" in t and "encrypted" in t for t in _texts(last))
    assert states[0].meta.context_complete is True
    assert rep.context_changes["compaction"] == 1


def test_hosted_web_search_is_its_own_decision_with_the_real_id() -> None:
    states, rep = _read("web_search.jsonl")
    search = states[0]
    assert [c["id"] for c in search.action.tool_calls] == ["ws_0123"]
    assert search.action.tool_calls[0]["function"]["name"] == "web_search"
    assert search.action.text == ""
    answer = states[1]
    assert answer.action.text == "2.0 dropped Python 3.8."
    assert answer.prefix[-1]["role"] == "tool"
    assert answer.prefix[-1]["tool_call_id"] == "ws_0123"
    assert answer.meta.context_complete is False  # the search results are not in the log
    assert answer.meta.context_note == "hosted_tool_result_not_logged"
    assert not rep.orphans


def test_final_answer_phase_ends_a_decision_commentary_does_not() -> None:
    states, _ = _read("web_search.jsonl")
    texts = [s.action.text for s in states]
    assert texts[2] == "Anything else?"  # a second final answer: a decision of its own
    run_tests = next(s for s in states if s.action.tool_calls and s.action.text)
    assert run_tests.action.text == "Running them now."  # commentary + its call: one action
    assert run_tests.action.tool_calls[0]["id"] == "call_7"


def test_a_rollback_in_an_event_only_rollout_drops_the_turn(tmp_path) -> None:
    """An older rollout with only ``event_msg`` messages: they are buffered until the reader
    knows no ``response_item`` copies them, and a rollback among them must cut the buffered
    turn (it was ignored: the later answer's prefix held the turn the user took back)."""
    import json

    def ev(kind: str, **kw) -> str:
        return json.dumps({"type": "event_msg", "payload": {"type": kind, **kw}})

    lines = [json.dumps({"type": "session_meta", "payload": {"id": "s1"}}),
             ev("user_message", message="first question"),
             ev("agent_message", message="first answer"),
             ev("user_message", message="a question I take back"),
             ev("agent_message", message="an answer that gets dropped"),
             ev("thread_rolled_back", num_turns=1),
             ev("user_message", message="better question"),
             ev("agent_message", message="better answer")]  # fmt: skip
    path = tmp_path / "rollout.jsonl"
    path.write_text("\n".join(lines) + "\n")
    run = ingest([path], "codex")
    states = list(run)
    assert states[-1].action.text == "better answer"
    assert _texts(states[-1]) == ["first question", "first answer", "better question"]
    assert run.report.files[0].context_changes["rollback"] == 1


def _items(tmp_path, items: list[dict]):
    import json

    lines = [json.dumps({"type": "session_meta", "payload": {"id": "s1"}})]
    lines += [json.dumps({"type": "response_item", "payload": it}) for it in items]
    path = tmp_path / "rollout.jsonl"
    path.write_text("\n".join(lines) + "\n")
    run = ingest([path], "codex")
    return list(run), run.report.files[0]


def _call(cid: str) -> dict:
    return {"type": "function_call", "call_id": cid, "name": "shell", "arguments": "{}"}


def _out(cid: str, text: str) -> dict:
    return {"type": "function_call_output", "call_id": cid, "output": text}


USER = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]}
DONE = {"type": "message", "role": "assistant",
        "content": [{"type": "output_text", "text": "done"}]}  # fmt: skip


def test_parallel_calls_with_results_between_them_are_one_decision(tmp_path) -> None:
    """Codex writes a response's parallel calls and their outputs interleaved (call A, call B,
    output B, call C, output A, output C). The model is sampled again only once every call has
    its output, so A, B and C are one decision that saw no result (before: B's output split
    them, A was closed as '[no tool result recorded]' and its output became an orphan)."""
    reasoning = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "plan"}]}
    states, rep = _items(tmp_path, [USER, reasoning, _call("A"), _call("B"), _out("B", "b"),
                                    _call("C"), _out("A", "a"), _out("C", "c"), DONE])  # fmt: skip
    assert [[c["id"] for c in s.action.tool_calls] for s in states] == [["A", "B", "C"], []]
    assert states[0].action.thinking == "plan" and _texts(states[0]) == ["go"]
    assert [(m["role"], m.get("tool_call_id")) for m in states[1].prefix[2:]] == [
        ("tool", "B"), ("tool", "A"), ("tool", "C")]  # fmt: skip
    assert not rep.orphans


def test_a_call_after_every_result_is_the_next_decision(tmp_path) -> None:
    states, rep = _items(tmp_path, [USER, _call("A"), _out("A", "a"), _call("B"), _out("B", "b"),
                                    DONE])  # fmt: skip
    assert [[c["id"] for c in s.action.tool_calls] for s in states] == [["A"], ["B"], []]
    assert _texts(states[1])[-1] == "a"
    assert not rep.orphans


def test_a_call_before_any_session_record_is_read(tmp_path: Path) -> None:
    """A legacy item first in the file (no ``session_meta`` yet) met the reader's response
    bookkeeping unset: ``reader_error:AttributeError`` (hypothesis found it in
    test_robustness)."""
    path = tmp_path / "rollout.jsonl"
    path.write_bytes(b'{"type":"function_call"}\n')
    run = ingest([path], "codex")
    (state,) = run  # the call is a decision, as any legacy item's
    assert state.action.tool_calls[0]["function"]["name"] == "function"
    rep = run.report.files[0]
    assert (rep.parsed, rep.skipped, dict(rep.skipped_by_reason)) == (1, 0, {})
