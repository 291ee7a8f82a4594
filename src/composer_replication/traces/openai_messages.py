"""Generic OpenAI chat-messages logs.

Accepted shapes:

- JSONL, one conversation per line: ``{"messages": [...], "id"?: ...}``;
- JSONL, one message per line: ``{"role": ..., "content": ...}`` (the file is one conversation);
- a JSON document: a list of messages, or ``{"messages": [...]}``.

An LLM call log (``{"messages", "tools", "response", ...}``, one file per model call, as the
OpenHands SDK's completion logging writes them) gives one state: ``messages`` is the prefix,
the ``response`` (chat-completions ``choices[0].message``, or Responses-API ``output`` items) is
the action, ``tools`` its tool schemas and ``response.id`` its ``meta.response_id``. The
assistant messages inside ``messages`` are earlier decisions, each in its own call log: they
make no state here.

Messages use OpenAI chat format (``tool_calls``, ``role: tool`` + ``tool_call_id``). Assistant
``reasoning_content`` / ``reasoning`` / ``thinking`` fields go to ``Action.thinking``. Content may be
a string or a list of parts (``text``; images become placeholders).
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
    parts_text,
    run_jsonl,
)
from .schema import TraceState

FORMAT = "openai_messages"


def read(ctx: ReaderContext) -> Iterator[TraceState]:
    if ctx.path.suffix == ".jsonl":
        yield from _read_jsonl(ctx)
        return
    doc = load_document(ctx)
    if isinstance(doc, dict) and isinstance(doc.get("response"), dict):
        yield from read_call_log(ctx, doc)
        return
    msgs = doc if isinstance(doc, list) else as_list(as_dict(doc).get("messages"))
    if doc is not None and not msgs:
        ctx.report.skip_item(0, "no_messages")
    yield from read_message_list(ctx, ctx.path.stem, msgs)


def _read_jsonl(ctx: ReaderContext) -> Iterator[TraceState]:
    single: SessionBuilder | None = None

    def handle(line: int, rec: dict[str, Any]) -> str | None:
        nonlocal single
        if isinstance(rec.get("messages"), list):
            sid = as_str(rec.get("id")) or f"{ctx.path.stem}:{line}"
            b = SessionBuilder(ctx, sid)
            for i, msg in enumerate(rec["messages"]):
                reason = add_message(b, line, msg, i)
                if reason:
                    ctx.report.skip_item(i, reason)
            b.finish()
            return None
        if "role" in rec and ("content" in rec or "tool_calls" in rec):
            if single is None:
                single = SessionBuilder(ctx, ctx.path.stem)
            return add_message(single, line, rec, line)
        return "not_a_message"

    yield from run_jsonl(ctx, handle)
    if single is not None:
        single.finish()
    yield from ctx.drain()


def read_call_log(ctx: ReaderContext, doc: dict[str, Any]) -> Iterator[TraceState]:
    """One LLM call: ``messages`` -> prefix, ``response`` -> the action (module docstring)."""
    msgs = as_list(doc.get("messages"))
    ctx.item_index = True
    ctx.report.items = len(msgs) + 1
    tools = doc.get("tools") or as_dict(doc.get("kwargs")).get("tools")
    if isinstance(tools, list) and tools:
        ctx.tools = ctx.redactor.redact_obj(tools)  # schemas are text too (MCP descriptions)
    b = SessionBuilder(ctx, ctx.path.stem)
    for i, msg in enumerate(msgs, start=1):
        reason = add_message(b, i, msg, i)
        if reason:
            ctx.report.skip_item(i, reason)
    b.flush()
    ctx.out.clear()  # earlier decisions: each has its own call log
    resp = as_dict(doc.get("response"))
    n = len(msgs) + 1
    msg = _response_message(resp)
    reason = "response_without_message"
    if msg is not None:
        msg.setdefault("model", as_str(resp.get("model")))
        reason = add_message(b, n, msg, n, response_id=as_str(resp.get("id")) or None)
    b.finish(orphans=False)
    if not ctx.out:  # the response made no action (no role, a user's, nothing in it)
        ctx.report.skip_item(n, reason or "response_without_action")
    yield from ctx.drain()


def _response_message(resp: dict[str, Any]) -> dict[str, Any] | None:
    """The assistant message of a chat-completions response, or one built from Responses-API
    ``output`` items (message text, function calls, reasoning summaries)."""
    choices = as_list(resp.get("choices"))
    if choices:
        msg = as_dict(as_dict(choices[0]).get("message"))
        return dict(msg) if msg else None
    if not isinstance(resp.get("output"), list):
        return None
    text, calls, thinking = [], [], []
    for item in as_list(resp.get("output")):
        item = as_dict(item)
        kind = item.get("type")
        if kind == "message":
            text.append(message_text(item.get("content")))
        elif kind == "function_call":
            calls.append({"id": as_str(item.get("call_id")) or as_str(item.get("id")),
                          "function": {"name": as_str(item.get("name")),
                                       "arguments": as_str(item.get("arguments"))}})  # fmt: skip
        elif kind == "reasoning":
            thinking.append(message_text(item.get("summary")))
    return {"role": "assistant", "content": "\n".join(text), "tool_calls": calls,
            "reasoning_content": "\n".join(t for t in thinking if t)}  # fmt: skip


def read_message_list(ctx: ReaderContext, session_id: str, msgs: list[Any]) -> Iterator[TraceState]:
    """Feed an in-memory list of OpenAI messages (items numbered from 1) to one session."""
    if not msgs:
        return
    ctx.item_index = True
    ctx.report.items = (ctx.report.items or 0) + len(msgs)
    b = SessionBuilder(ctx, session_id)
    for i, msg in enumerate(msgs, start=1):
        try:
            reason = add_message(b, i, msg, i)
        except Exception as exc:  # noqa: BLE001
            reason = f"reader_error:{type(exc).__name__}"
        if reason:
            ctx.report.skip_item(i, reason)
        if ctx.out:
            yield from ctx.drain()
    b.finish()
    yield from ctx.drain()


def message_text(content: Any) -> str:
    """Text of an OpenAI chat message's content (a string or a list of parts)."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    return parts_text(content, frozenset({"text", "input_text", "output_text"}), "[{} part]")


def add_message(
    b: SessionBuilder, line: int, msg: Any, index: int, response_id: str | None = None
) -> str | None:
    """Add one OpenAI-format message to a session; returns a skip reason or None."""
    if not isinstance(msg, dict):
        return "message_not_an_object"
    role = msg.get("role")
    text = message_text(msg.get("content"))
    if role in ("system", "developer"):
        b.system(text)
    elif role == "user":
        b.user(text)
    elif role == "assistant":
        calls = []
        for j, tc in enumerate(as_list(msg.get("tool_calls"))):
            tc = as_dict(tc)
            fn = as_dict(tc.get("function"))
            call_id = as_str(tc.get("id")) or f"call_synth_{index}_{j}"
            name = as_str(fn.get("name")) or as_str(tc.get("name")) or "<unnamed>"
            calls.append(make_tool_call(call_id, name, dumps_str(fn.get("arguments", ""))))
        thinking = ""
        for key in ("reasoning_content", "reasoning", "thinking"):
            if isinstance(msg.get(key), str):
                thinking = msg[key]
                break
        model = as_str(msg.get("model")) or None
        b.assistant(line, text, calls, thinking, model=model, response_id=response_id)
    elif role in ("tool", "function"):
        ids = as_list(msg.get("tool_call_ids"))
        call_id = as_str(msg.get("tool_call_id")) or (as_str(ids[0]) if ids else "")
        b.tool_result(call_id, text, line)
    else:
        return "unknown_role"
    return None
