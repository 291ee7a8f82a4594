"""Gemini CLI chat logs (``~/.gemini/tmp/<project>/chats/session-*.json`` and the JSONL form).

JSON form: ``{"sessionId", "messages": [...]}``. JSONL form (CLI >= 0.40): a header line with
``sessionId``, then one message per line, plus ``{"$set": {...}}`` metadata updates.

Messages: ``type: "user"`` -> user; ``type: "gemini"`` -> an action with ``content`` (text),
``thoughts`` (``subject: description`` lines, kept as thinking) and ``toolCalls`` (each with
``id``, ``name``, ``args`` and, once run, ``result`` = function responses, which become the tool
messages that follow). ``info`` / ``error`` / ``warning`` messages are CLI notices, not model
input, and produce nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ._base import (
    ReaderContext,
    SessionBuilder,
    as_dict,
    as_list,
    as_str,
    dumps_str,
    load_document,
    make_tool_call,
    run_jsonl,
)
from .schema import TraceState

FORMAT = "gemini_cli"
NOTICE_TYPES = frozenset({"info", "error", "warning", "system"})


def read(ctx: ReaderContext) -> Iterator[TraceState]:
    if ctx.path.suffix == ".jsonl":
        yield from _read_jsonl(ctx)
        return
    doc = load_document(ctx)
    if doc is None:
        return
    d = as_dict(doc)
    msgs = as_list(d.get("messages"))
    if not msgs:
        ctx.report.skip_item(0, "no_messages")
        return
    ctx.item_index = True
    b = SessionBuilder(ctx, as_str(d.get("sessionId")) or ctx.path.stem)
    for i, msg in enumerate(msgs, start=1):
        try:
            reason = add_message(b, i, msg) if isinstance(msg, dict) else "not_an_object"
        except Exception as exc:  # noqa: BLE001
            reason = f"reader_error:{type(exc).__name__}"
        if reason:
            ctx.report.skip_item(i, reason)
        yield from ctx.drain()
    b.finish()
    yield from ctx.drain()


def _read_jsonl(ctx: ReaderContext) -> Iterator[TraceState]:
    b: SessionBuilder | None = None

    def handle(line: int, rec: dict[str, Any]) -> str | None:
        nonlocal b
        if "$set" in rec:
            return None
        if "type" not in rec and ("sessionId" in rec or "projectHash" in rec):
            if b is not None:
                b.finish()
            b = SessionBuilder(ctx, as_str(rec.get("sessionId")) or ctx.path.stem)
            return None
        if b is None:
            b = SessionBuilder(ctx, ctx.path.stem)
        return add_message(b, line, rec)

    yield from run_jsonl(ctx, handle)
    if b is not None:
        b.finish()
    yield from ctx.drain()


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for p in as_list(content):
        if isinstance(p, str):
            parts.append(p)
        elif isinstance(p, dict):
            if "text" in p:
                parts.append(as_str(p.get("text")))
            elif "inlineData" in p or "fileData" in p:
                parts.append("[file]")
    return "\n".join(parts)


def add_message(b: SessionBuilder, line: int, msg: dict[str, Any]) -> str | None:
    mtype = msg.get("type")
    if not isinstance(mtype, str):  # null, lists, objects: never hashed or compared
        return "missing_type"
    if mtype == "user":
        b.user(_text(msg.get("content")))
        return None
    if mtype in NOTICE_TYPES:
        return None
    if mtype != "gemini":
        return "unknown_record_type"
    thoughts = []
    for t in as_list(msg.get("thoughts")):
        t = as_dict(t)
        subject, desc = as_str(t.get("subject")), as_str(t.get("description"))
        thoughts.append(f"{subject}: {desc}" if subject else desc)
    calls, results = [], []
    for j, tc in enumerate(as_list(msg.get("toolCalls"))):
        tc = as_dict(tc)
        call_id = as_str(tc.get("id")) or f"gemini_synth_{line}_{j}"
        calls.append(
            make_tool_call(
                call_id, as_str(tc.get("name")) or "<unnamed>", dumps_str(tc.get("args", {}))
            )
        )
        out = []
        for r in as_list(tc.get("result")):
            resp = as_dict(as_dict(r).get("functionResponse")).get("response")
            if resp is not None:
                out.append(as_str(as_dict(resp).get("output")) or dumps_str(resp))
        if out:
            results.append((call_id, "\n".join(out)))
        elif isinstance(tc.get("resultDisplay"), str):
            results.append((call_id, tc["resultDisplay"]))
    b.assistant(
        line,
        _text(msg.get("content")),
        calls,
        "\n".join(t for t in thoughts if t),
        model=as_str(msg.get("model")) or None,
        timestamp=as_str(msg.get("timestamp")) or None,
        response_id=as_str(msg.get("id")) or None,
    )
    for call_id, text in results:
        b.tool_result(call_id, text, line)
    return None
