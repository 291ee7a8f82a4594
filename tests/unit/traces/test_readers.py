"""Reader behaviours on small hand-made logs (shapes the public fixtures lack or hide)."""

from __future__ import annotations

from pathlib import Path

import orjson

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
