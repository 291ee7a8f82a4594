"""OpenHands SDK: one event file of a conversation, LLM call logs, and one state per decision
when both are read (issue 57, classes 7 and 8)."""

from __future__ import annotations

from pathlib import Path

import orjson

from composer_replication.traces import ingest

CASES = Path(__file__).parents[2] / "fixtures" / "trace_cases" / "openhands_sdk"
CONV = CASES / "conversations" / "0f0e0d0c0b0a49f8a7b6c5d4e3f2a1b0"
CALL_LOG = CASES / "llm_logs" / "gpt-4o-2024-08-06-1777629600.500.json"


def test_one_event_file_reads_its_conversation() -> None:
    """``--format openhands`` on one ``event-NNNNN-<uuid>.json`` reads the conversation it
    belongs to (one event alone has no context)."""
    one = sorted((CONV / "events").iterdir())[2]
    for fmt in ("openhands", "auto"):
        run = ingest([one], fmt)
        states = list(run)
        assert len(states) == 1, fmt
        assert states[0].action.tool_calls[0]["id"] == "call_d1"
        assert run.report.files[0].path == str(CONV / "events")


def test_llm_call_log_response_is_the_state() -> None:
    run = ingest([CALL_LOG])
    states = list(run)
    assert len(states) == 1
    s = states[0]
    assert [m["role"] for m in s.prefix] == ["system", "user"]
    assert s.action.text == "Let me run date."
    assert s.action.tool_calls[0]["id"] == "call_d1"
    assert s.tools and s.tools[0]["function"]["name"] == "terminal"
    assert s.meta.response_id == "chatcmpl-9f1"
    assert s.meta.model == "gpt-4o-2024-08-06"


def test_events_and_call_logs_of_one_decision_give_one_state() -> None:
    """The call log wins: it holds the exact messages and tool schemas the model was sent."""
    for order in ([CASES], [CONV, CALL_LOG], [CALL_LOG, CONV]):
        run = ingest(order)
        states = list(run)
        assert len(states) == 1, order
        assert states[0].meta.file == str(CALL_LOG)
        assert run.report.duplicate_decisions == 1


def test_sdk_condensation_drops_forgotten_events_from_later_prefixes(tmp_path: Path) -> None:
    """Class 4 in OpenHands: a ``Condensation`` replaces forgotten events by its summary."""

    def msg(i: str, source: str, text: str) -> dict:
        role = "user" if source == "user" else "assistant"
        return {"kind": "MessageEvent", "id": i, "source": source,
                "llm_message": {"role": role, "content": [{"type": "text", "text": text}]}}  # fmt: skip

    events = [
        msg("e1", "user", "old task"),
        msg("e2", "agent", "old answer"),
        msg("e3", "user", "new task"),
        {"kind": "Condensation", "id": "c1", "source": "environment",
         "forgotten_event_ids": ["e1", "e2"], "summary": "The user asked an old task; done.",
         "summary_offset": 0},
        msg("e4", "agent", "new answer"),
    ]  # fmt: skip
    log = tmp_path / "events.jsonl"
    log.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
    run = ingest([log], "openhands")
    states = list(run)
    last = states[-1]
    assert last.action.text == "new answer"
    assert [m["content"] for m in last.prefix] == ["The user asked an old task; done.", "new task"]
    assert last.meta.after_compaction is True
    assert run.report.files[0].context_changes["compaction"] == 1


def test_a_secret_in_a_call_logs_tool_schemas_is_redacted(tmp_path: Path) -> None:
    """A call log's ``tools`` (or ``kwargs.tools``) become the state's ``tools``: a key in a
    tool's description (an MCP server's schema) must be redacted like any other text."""
    secret = "ghp_" + "aB3dE5gH7jK9mN1pQ3sT5vX7zA9cE1gI3kM5"
    doc = orjson.loads(CALL_LOG.read_bytes())
    tool = {"type": "function", "function": {"name": "fetch", "parameters": {},
            "description": f"GitHub proxy; header Authorization: token {secret}"}}  # fmt: skip
    for where in ("tools", "kwargs"):
        log = {k: v for k, v in doc.items() if k not in ("tools", "kwargs")}
        log[where] = [tool] if where == "tools" else {"tools": [tool]}
        path = tmp_path / f"{where}-1777629600.500.json"
        path.write_bytes(orjson.dumps(log))
        (state,) = list(ingest([path]))
        assert state.tools and state.tools[0]["function"]["name"] == "fetch", where
        assert secret not in orjson.dumps(state.tools).decode(), where
        assert "<REDACTED:" in state.tools[0]["function"]["description"], where


def test_a_call_log_whose_response_gives_no_action_is_not_understood(tmp_path: Path) -> None:
    """A response without a role, with a user's role, with tool calls that are no list or
    with no output: no state, and the report must not say every record was understood (the
    decision was silently dropped)."""
    doc = orjson.loads(CALL_LOG.read_bytes())
    responses = {
        "no_role": {"choices": [{"message": {"content": "hi"}}]},
        "user_role": {"choices": [{"message": {"role": "user", "content": "hi"}}]},
        "calls_not_a_list": {"choices": [{"message": {"role": "assistant", "tool_calls": "x"}}]},
        "no_output": {"output": []},
    }
    for name, resp in responses.items():
        path = tmp_path / f"{name}-1777629600.500.json"
        path.write_bytes(orjson.dumps(doc | {"response": resp}))
        run = ingest([path])
        assert list(run) == [], name
        rep = run.report.files[0]
        assert rep.records_understood == rep.records - 1, (name, rep.skipped_items)
