"""Reader behaviours on small hand-made logs (shapes the public fixtures lack or hide)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from composer_replication.traces import ingest


def _write(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return path


def _cc(kind: str, content, **kw) -> dict:
    return {"type": kind, "sessionId": "S", "message": {"role": kind, "content": content}, **kw}


def test_claude_images_reminders_queue_and_unknown_types(tmp_path: Path) -> None:
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "AAA"},
    }
    p = _write(
        tmp_path / "projects" / "x" / "S.jsonl",
        [
            _cc(
                "user",
                [
                    image,
                    {"type": "text", "text": "what is this?\n<system-reminder>r</system-reminder>"},
                ],
            ),
            {"type": "queue-operation", "operation": "enqueue", "content": "hi", "sessionId": "S"},
            _cc(
                "assistant",
                [{"type": "redacted_thinking", "data": "zz"}, {"type": "text", "text": "a cat"}],
            ),
            {"type": "brand-new-record", "sessionId": "S"},
            _cc("user", "thanks"),
        ],
    )
    run = ingest([p])
    (state,) = list(run)
    assert state.prefix == [
        {
            "role": "user",
            "content": "[image: image/png]\nwhat is this?\n<system-reminder>r</system-reminder>",
        }
    ]
    assert state.action.text == "a cat" and state.action.thinking == "[redacted thinking]"
    assert run.report.unknown_record_types() == {"brand-new-record": 1}
    assert run.report.files[0].balanced


def test_claude_parallel_tool_calls_split_records_and_orphans(tmp_path: Path) -> None:
    call = lambda i: {"type": "tool_use", "id": f"t{i}", "name": "Read", "input": {"i": i}}  # noqa: E731
    res = lambda i: {"type": "tool_result", "tool_use_id": f"t{i}", "content": f"r{i}"}  # noqa: E731
    p = _write(
        tmp_path / "S.jsonl",
        [
            _cc("user", "go"),
            {
                **_cc("assistant", [call(1)]),
                "message": {"id": "m1", "role": "assistant", "content": [call(1)]},
            },
            {
                **_cc("assistant", [call(2)]),
                "message": {"id": "m1", "role": "assistant", "content": [call(2)]},
            },
            _cc("user", [res(1)]),
            _cc("user", [res(2), res(9)]),
            _cc("assistant", [{"type": "text", "text": "done"}]),
        ],
    )
    run = ingest([p], format="claude_code")
    first, second = list(run)
    assert [tc["id"] for tc in first.action.tool_calls] == ["t1", "t2"]  # one action, one response
    assert [m["role"] for m in second.prefix] == ["user", "assistant", "tool", "tool", "user"]
    assert second.prefix[-1]["content"].startswith("[tool result for unknown call t9]")
    assert run.report.orphans() == {"tool_result_without_call": 1}


def test_subagent_file_is_a_sidechain_session(tmp_path: Path) -> None:
    _write(
        tmp_path / "S" / "subagents" / "agent-abc.jsonl",
        [
            _cc("user", "task", isSidechain=True),
            _cc("assistant", [{"type": "text", "text": "ok"}], isSidechain=True),
        ],
    )
    (s,) = list(ingest([tmp_path]))
    assert s.session_id == "S/agent-abc" and s.meta.is_sidechain and s.meta.subagent_id == "abc"


def test_codex_compaction_resets_prefix(tmp_path: Path) -> None:
    def item(payload):
        return {"type": "response_item", "payload": payload}

    def msg(role, t):
        return {
            "type": "message",
            "role": role,
            "content": [{"type": "input_text", "text": t}],
        }  # noqa: E731

    p = _write(
        tmp_path / "rollout-x.jsonl",
        [
            {"type": "session_meta", "payload": {"id": "X"}},
            item(msg("user", "one")),
            item(msg("assistant", "first")),
            {
                "type": "compacted",
                "payload": {"message": "", "replacement_history": [msg("user", "summary")]},
            },
            item(msg("user", "two")),
            item(msg("assistant", "second")),
        ],
    )
    a, b = list(ingest([p]))
    assert a.meta.segment == 0 and not a.meta.after_compaction
    assert b.meta.after_compaction and b.meta.segment == 1
    assert [m["content"] for m in b.prefix] == ["summary", "two"]


def test_claude_code_recent_record_types_and_split_messages(tmp_path):
    """Record types of recent Claude Code versions are known (not reported as unknown), a
    stop-hook ``system`` record is read, and one assistant message written as several records
    (one per content block, same ``message.id``) is one action with its text and tool call."""
    import orjson

    from composer_replication.traces import ingest

    sid = "recent"
    meta = [
        {"type": "cost-state", "sessionId": sid, "costUSD": 0.01},
        {"type": "mode", "sessionId": sid, "mode": "default"},
        {"type": "permission-mode", "sessionId": sid, "permissionMode": "default"},
        {"type": "ai-title", "sessionId": sid, "title": "fix the bug"},
        {"type": "last-prompt", "sessionId": sid, "lastPrompt": "fix it"},
    ]
    user = {"type": "user", "sessionId": sid, "uuid": "u1",
            "message": {"role": "user", "content": "fix the bug in x.py"}}  # fmt: skip
    part = {"type": "assistant", "sessionId": sid, "parentUuid": "u1"}
    text = {**part, "uuid": "a1", "message": {"id": "m1", "role": "assistant", "model": "claude-x",
            "content": [{"type": "text", "text": "Reading the file."}]}}  # fmt: skip
    call = {**part, "uuid": "a2", "parentUuid": "a1", "message": {
        "id": "m1", "role": "assistant", "model": "claude-x",
        "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {"path": "x.py"}}]}}  # fmt: skip
    result = {"type": "user", "sessionId": sid, "uuid": "u2", "parentUuid": "a2", "message": {
        "role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x"}]}}  # fmt: skip
    hook = {"type": "system", "sessionId": sid, "uuid": "s1", "parentUuid": "u2",
            "subtype": "stop_hook_summary", "content": "Stop hook ran", "level": "info"}  # fmt: skip
    lines = [*meta, user, text, call, result, hook]
    (tmp_path / "recent.jsonl").write_bytes(b"\n".join(orjson.dumps(x) for x in lines) + b"\n")
    run = ingest([tmp_path])
    states = list(run)  # the report fills as the files are read
    assert [f.format for f in run.report.files] == ["claude_code"]
    assert dict(run.report.unknown_record_types()) == {}
    assert len(states) == 1
    action = states[0].action
    assert "Reading the file." in str(action) and "Read" in str(action)


def _sdk_events() -> list[dict]:
    """An OpenHands SDK conversation (typed events with ``kind``), shaped after the SDK's event
    models: system prompt, user message, two parallel terminal calls from one LLM response, their
    observations, a state update, an agent error, and the agent's final message."""

    def call(i, cmd):
        return {"kind": "ActionEvent", "id": f"a{i}", "source": "agent", "timestamp": f"t{i}",
                "thought": [{"type": "text", "text": "Listing files." if i == 1 else ""}],
                "reasoning_content": "need the layout" if i == 1 else None,
                "action": {"kind": "TerminalAction", "command": cmd},
                "tool_name": "terminal", "tool_call_id": f"c{i}",
                "tool_call": {"id": f"c{i}", "name": "terminal",
                              "arguments": orjson.dumps({"command": cmd}).decode(), "origin": "completion"},
                "llm_response_id": "resp-1"}  # fmt: skip

    def obs(i, text):
        return {"kind": "ObservationEvent", "id": f"o{i}", "source": "environment",
                "tool_name": "terminal", "tool_call_id": f"c{i}", "action_id": f"a{i}",
                "observation": {"kind": "TerminalObservation", "is_error": False,
                                "content": [{"type": "text", "text": text}]}}  # fmt: skip

    return [
        {"kind": "SystemPromptEvent", "id": "s", "source": "agent",
         "system_prompt": {"type": "text", "text": "You are OpenHands agent."}, "tools": []},
        {"kind": "MessageEvent", "id": "m0", "source": "user",
         "llm_message": {"role": "user", "content": [{"type": "text", "text": "List the repo."}]}},
        call(1, "ls"), call(2, "git status"), obs(1, "README.md src"), obs(2, "clean"),
        {"kind": "ConversationStateUpdateEvent", "id": "u", "source": "environment",
         "key": "execution_status", "value": "running"},
        {"kind": "ActionEvent", "id": "a3", "source": "agent", "thought": [],
         "tool_name": "terminal", "tool_call_id": "c3", "llm_response_id": "resp-2",
         "tool_call": {"id": "c3", "name": "terminal", "arguments": '{"command": "cat x"}'}},
        {"kind": "AgentErrorEvent", "id": "e", "source": "agent", "tool_name": "terminal",
         "tool_call_id": "c3", "error": "x: no such file"},
        {"kind": "MessageEvent", "id": "m1", "source": "agent",
         "llm_message": {"role": "assistant", "content": [{"type": "text", "text": "Done."}]}},
    ]  # fmt: skip


@pytest.mark.parametrize("shape", ["json_list", "jsonl"])
def test_openhands_sdk_event_stream(tmp_path, shape):
    import orjson

    from composer_replication.traces import ingest

    events = _sdk_events()
    if shape == "json_list":
        (tmp_path / "events.json").write_bytes(orjson.dumps(events))
    else:
        (tmp_path / "events.jsonl").write_bytes(b"\n".join(orjson.dumps(e) for e in events))
    run = ingest([tmp_path])
    states = list(run)
    assert [f.format for f in run.report.files] == ["openhands"]
    assert len(states) == 3, [s.action for s in states]
    first = states[0]
    assert [m["role"] for m in first.prefix] == ["system", "user"]
    calls = first.action.tool_calls
    assert [c["function"]["name"] for c in calls] == ["terminal", "terminal"]  # one response
    assert "git status" in calls[1]["function"]["arguments"]
    assert first.action.text == "Listing files." and first.action.thinking == "need the layout"
    tool_msgs = [m for m in states[1].prefix if m["role"] == "tool"]
    assert [m["content"] for m in tool_msgs] == ["README.md src", "clean"]
    assert states[2].action.text == "Done."
    assert [m["content"] for m in states[2].prefix if m["role"] == "tool"][-1] == "x: no such file"
    report = run.report.files[0]
    assert not report.skipped_items and not report.skipped_by_reason and not report.orphans


def test_openhands_sdk_conversation_directory_public_fixture():
    """A real OpenHands SDK conversation as stored on disk (events/event-NNNNN-<id>.json, from
    OpenHands/software-agent-sdk, MIT; tests/fixtures/traces/MANIFEST.tsv): one state per agent
    step, with its tool call, and the observations in the later prefixes."""
    from composer_replication.traces import ingest

    conv = (
        Path(__file__).parents[2] / "fixtures/traces/openhands_sdk/cd94562403b9487ebdd4018e3f531dfd"
    )
    for target in (conv, conv / "events"):  # found under a directory, or named itself
        run = ingest([target])
        states = list(run)
        [rep] = run.report.files
        assert rep.format == "openhands" and rep.parsed == rep.total_lines == 8
        assert not rep.skipped and not rep.orphans and not rep.skipped_items
        assert [s.session_id for s in states] == ["cd94562403b9487ebdd4018e3f531dfd"] * 3
        assert [[c["function"]["name"] for c in s.action.tool_calls] for s in states] == [
            ["terminal"],
            ["finish"],
            [],
        ]
        assert [m["role"] for m in states[0].prefix] == ["system", "user"]
        assert "pwd > tool_output.txt" in states[0].action.tool_calls[0]["function"]["arguments"]
        roles = [m["role"] for m in states[2].prefix]
        assert roles.count("tool") == 2 and roles[-1] == "user"
        assert states[2].action.text.startswith("I executed")
