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
