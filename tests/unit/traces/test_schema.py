from __future__ import annotations

import re
from dataclasses import fields

import orjson
import pytest

from composer_replication.traces.schema import (
    SCHEMA_VERSION,
    Action,
    StateMeta,
    TraceState,
    compute_state_id,
    message_digest,
)


def _state() -> TraceState:
    prefix = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
    ]
    digest = b""
    for m in prefix:
        digest = message_digest(digest, m)
    action = Action(text="done", thinking="secret plan")
    return TraceState(
        state_id=compute_state_id("s", 1, digest, action),
        session_id="s",
        step=1,
        prefix=prefix,
        action=action,
        meta=StateMeta(source_format="claude_code", file="f.jsonl", line=3, model="m"),
    )


def test_round_trip_is_exact() -> None:
    s = _state()
    back = TraceState.from_json(s.to_json())
    assert back == s
    assert back.to_json() == s.to_json()


def test_action_message_excludes_thinking() -> None:
    msg = _state().action.as_message()
    assert msg == {"role": "assistant", "content": "done"}


def test_state_id_depends_on_content() -> None:
    a = Action(text="x")
    base = compute_state_id("s", 0, b"", a)
    assert base == compute_state_id("s", 0, b"", Action(text="x"))
    assert base != compute_state_id("s", 0, b"", Action(text="y"))
    assert base != compute_state_id("s", 1, b"", a)
    assert base != compute_state_id("t", 0, b"", a)
    assert base != compute_state_id("s", 0, message_digest(b"", {"role": "user"}), a)


def test_from_json_names_missing_field() -> None:
    d = orjson.loads(_state().to_json())
    del d["prefix"]
    with pytest.raises(ValueError, match="prefix"):
        TraceState.from_json(orjson.dumps(d))
    with pytest.raises(ValueError, match="object"):
        TraceState.from_json(b"[1]")


def test_state_id_is_xxh3_128_of_the_documented_bytes() -> None:
    """The definition in docs/ingestion.md, spelled out with the xxhash library itself, and one
    pinned value: a change to the id definition must show up here (and be documented)."""
    import xxhash

    s = _state()
    digest = b""
    for m in s.prefix:
        digest = xxhash.xxh3_128(digest + orjson.dumps(m)).digest()
    head = b"s\x00" + b"1" + b"\x00" + digest
    assert s.state_id == xxhash.xxh3_128(head + orjson.dumps(s.action)).hexdigest()
    assert s.state_id == "db9ca7dd763c776347f38a10506cbe7f"
    assert compute_state_id(b"s", 1, digest, s.action) == s.state_id  # pre-encoded session


def test_field_order_used_by_the_session_builder() -> None:
    """`SessionBuilder.flush` passes these fields positionally (keywords cost ~4x as much)."""
    assert [f.name for f in fields(StateMeta)] == [
        "source_format",
        "file",
        "line",
        "model",
        "timestamp",
        "subagent_id",
        "is_sidechain",
        "after_compaction",
        "segment",
        "line_is_item_index",
        "context_complete",
        "context_note",
        "response_id",
    ]
    assert [f.name for f in fields(TraceState)][:6] == [
        "state_id",
        "session_id",
        "step",
        "prefix",
        "action",
        "meta",
    ]


BAD_FIELDS = [
    (lambda d: d.update(prefix="hello"), "field prefix: expected a list, got a string"),
    (lambda d: d["prefix"].insert(1, 5), "field prefix[1]: expected an object, got an integer"),
    (
        lambda d: d["prefix"][1]["tool_calls"][0].update(function=None),
        "field prefix[1].tool_calls[0].function: expected an object, got null",
    ),
    (lambda d: d["prefix"][2].update(tool_call_id=7), "field prefix[2].tool_call_id: expected"),
    (lambda d: d["prefix"][0].update(role=["user"]), "field prefix[0].role: expected one of"),
    (lambda d: d.update(step="zero"), "field step: expected an integer, got a string"),
    (lambda d: d.update(step=True), "field step: expected an integer, got a boolean"),
    (lambda d: d["action"].update(tool_calls=[{"id": 1}]), "action.tool_calls[0].id"),
    (lambda d: d["meta"].update(line="3"), "field meta.line: expected an integer"),
]


@pytest.mark.parametrize(("mutate", "message"), BAD_FIELDS)
def test_badly_typed_fields_are_rejected_naming_the_field(mutate, message) -> None:
    """Badly typed states (written by other tools) used to load and crash replay later, after
    being journaled: from_json rejects them with the field's path."""
    d = orjson.loads(_state().to_json())
    mutate(d)
    with pytest.raises(ValueError, match=re.escape(message)):
        TraceState.from_json(orjson.dumps(d))


def test_version_2_context_fields_and_version_1_files_still_load() -> None:
    """Schema 2 adds ``meta.context_complete``, ``meta.context_note`` and ``meta.response_id``;
    a state written by schema 1 (none of them) loads as complete."""
    assert SCHEMA_VERSION == 2
    d = orjson.loads(_state().to_json())
    assert d["meta"]["context_complete"] is True
    for key in ("context_complete", "context_note", "response_id"):
        del d["meta"][key]
    d["schema_version"] = 1
    old = TraceState.from_json(orjson.dumps(d))
    assert old.schema_version == 1 and old.meta.context_complete is True
    d["meta"]["context_complete"] = "no"
    with pytest.raises(ValueError, match="meta.context_complete: expected a boolean"):
        TraceState.from_json(orjson.dumps(d))
