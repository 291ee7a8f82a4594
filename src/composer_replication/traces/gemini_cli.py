"""Gemini CLI chat logs (``~/.gemini/tmp/<project>/chats/session-*.json`` and the JSONL form).

JSON form: ``{"sessionId", "messages": [...]}``. JSONL form (CLI >= 0.40): a header line with
``sessionId``, then one message per line, plus ``{"$set": {...}}`` metadata updates.

Messages: ``type: "user"`` -> user; ``type: "gemini"`` -> an action with ``content`` (text),
``thoughts`` (``subject: description`` lines, kept as thinking) and ``toolCalls`` (each with
``id``, ``name``, ``args`` and, once run, ``result`` = function responses, which become the tool
messages that follow). ``info`` / ``error`` / ``warning`` messages are CLI notices, not model
input, and produce nothing.

Stream form (``gemini -p ... --output-format stream-json``, one event per line): ``init``
(``session_id``, ``model``: each ``init`` starts a session, one per run), ``message`` (``role``
user or assistant; assistant text arrives as ``delta`` chunks, joined as streamed),
``tool_use`` (``tool_name``, ``tool_id``, ``parameters``), ``tool_result`` (``tool_id``,
``status``, ``output`` or ``error.message``), ``error`` (a notice) and ``result`` (the run's end).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

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
    if ctx.path.suffix in (".jsonl", ".ndjson") or _starts_a_stream(ctx.path):
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
    ctx.report.items = len(msgs)
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


STREAM_TYPES = frozenset({"init", "message", "tool_use", "tool_result", "result"})


def _starts_a_stream(path: Path) -> bool:
    """A stream-json capture saved under another name (``run.json``): its first line is a
    whole stream event."""
    with open(path, "rb") as fh:
        first = fh.readline(1 << 16)
    try:
        obj = orjson.loads(first)
    except orjson.JSONDecodeError:
        return False
    return isinstance(obj, dict) and obj.get("type") in ("init", "message")


class _Stream:
    """stream-json events of one file: sessions per ``init``, deltas joined per message."""

    def __init__(self, ctx: ReaderContext) -> None:
        self.ctx = ctx
        self.b: SessionBuilder | None = None
        self.model: str | None = None
        self.text: list[str] = []
        self.text_line = 0
        self.ts: str | None = None

    def handle(self, line: int, rec: dict[str, Any], rtype: str) -> str | None:
        if rtype == "message" and rec.get("role") == "assistant":
            if not self.text:
                self.text_line, self.ts = line, as_str(rec.get("timestamp")) or None
            self.text.append(as_str(rec.get("content")))
            return None
        self._text_done()
        if rtype == "init":
            self.finish()
            self.model = as_str(rec.get("model")) or None
            self.b = SessionBuilder(self.ctx, as_str(rec.get("session_id")) or self.ctx.path.stem)
            return None
        b = self._builder()
        if rtype == "message":
            b.user(_text(rec.get("content")))
        elif rtype == "tool_use":
            call = make_tool_call(as_str(rec.get("tool_id")) or f"gemini_synth_{line}",
                                  as_str(rec.get("tool_name")) or "<unnamed>",
                                  dumps_str(rec.get("parameters", {})))  # fmt: skip
            ts = as_str(rec.get("timestamp")) or None
            b.assistant(line, "", [call], model=self.model, timestamp=ts)
        elif rtype == "tool_result":
            out = rec.get("output")
            if rec.get("status") == "error" or out is None:
                err = as_dict(rec.get("error"))
                out = f"[error] {as_str(err.get('message')) or dumps_str(out or '')}"
            b.tool_result(as_str(rec.get("tool_id")), dumps_str(out), line)
        else:  # result: the run ended
            b.flush()
        return None

    def _builder(self) -> SessionBuilder:
        if self.b is None:
            self.b = SessionBuilder(self.ctx, self.ctx.path.stem)
        return self.b

    def _text_done(self) -> None:
        if self.text:
            text, self.text = "".join(self.text), []
            self._builder().assistant(self.text_line, text, model=self.model, timestamp=self.ts)

    def finish(self) -> None:
        self._text_done()
        if self.b is not None:
            self.b.finish()
            self.b = None


def _read_jsonl(ctx: ReaderContext) -> Iterator[TraceState]:
    b: SessionBuilder | None = None
    stream = _Stream(ctx)

    def handle(line: int, rec: dict[str, Any]) -> str | None:
        nonlocal b
        rtype = rec.get("type")
        stream_event = isinstance(rtype, str) and rtype in STREAM_TYPES
        if stream_event and (rtype != "message" or isinstance(rec.get("content"), str)):
            return stream.handle(line, rec, rtype)
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
    stream.finish()
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
