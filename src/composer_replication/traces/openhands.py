"""OpenHands event streams.

Accepted shapes: a JSON list of events (trajectory export / replay file), JSONL with one event per
line, and resolver output JSONL where each line holds a ``history`` list (one session per line).

Events are actions (``"action"`` key) or observations (``"observation"`` key):

- ``message`` actions: ``source == "user"`` -> user message, ``source == "agent"`` -> assistant
  text; events without ``source`` (older schema) count as user unless ``wait_for_response``;
- ``system`` action -> system message; bookkeeping actions (``change_agent_state``, ``recall``)
  are parsed and produce nothing;
- any other agent action is a tool call. With ``tool_call_metadata`` the call id, function name,
  arguments, model and the assistant text come from the raw ``model_response``; actions from one
  model response form one step. Without metadata the call is ``<action>(args)`` with id
  ``oh_<event id>`` and the text is the action's ``thought``;
- observations are tool results linked by ``tool_call_metadata.tool_call_id`` or by ``cause``
  (the action's event id); state-change / null observations produce nothing.
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

FORMAT = "openhands"

SILENT_ACTIONS = frozenset({"change_agent_state", "recall", "null", "condensation_request"})
SILENT_OBSERVATIONS = frozenset({"agent_state_changed", "null", "recall", "user_rejected"})
ARG_SKIP = frozenset({"thought", "is_confirmed", "action_risk", "security_risk", "keep_prompt"})


def read(ctx: ReaderContext) -> Iterator[TraceState]:
    if ctx.path.suffix == ".jsonl":
        yield from _read_jsonl(ctx)
        return
    doc = load_document(ctx)
    if doc is None:
        return
    events = doc if isinstance(doc, list) else as_list(as_dict(doc).get("history"))
    if not events:
        ctx.report.skip_item(0, "no_events")
        return
    ctx.item_index = True
    r = _Events(ctx, SessionBuilder(ctx, ctx.path.stem))
    for i, ev in enumerate(events, start=1):
        try:
            reason = r.handle(i, ev) if isinstance(ev, dict) else "not_an_object"
        except Exception as exc:  # noqa: BLE001
            reason = f"reader_error:{type(exc).__name__}"
        if reason:
            ctx.report.skip_item(i, reason)
        yield from ctx.drain()
    r.b.finish()
    yield from ctx.drain()


def _read_jsonl(ctx: ReaderContext) -> Iterator[TraceState]:
    stream: _Events | None = None

    def handle(line: int, rec: dict[str, Any]) -> str | None:
        nonlocal stream
        history = rec.get("history")
        if isinstance(history, list):
            sid = as_str(rec.get("instance_id")) or f"{ctx.path.stem}:{line}"
            r = _Events(ctx, SessionBuilder(ctx, sid))
            for i, ev in enumerate(history):
                reason = r.handle(line, ev) if isinstance(ev, dict) else "not_an_object"
                if reason:
                    ctx.report.skip_item(i, reason)
            r.b.finish()
            return None
        if "action" in rec or "observation" in rec:
            if stream is None:
                stream = _Events(ctx, SessionBuilder(ctx, ctx.path.stem))
            return stream.handle(line, rec)
        return "not_an_event"

    yield from run_jsonl(ctx, handle)
    if stream is not None:
        stream.b.finish()
    yield from ctx.drain()


class _Events:
    def __init__(self, ctx: ReaderContext, builder: SessionBuilder) -> None:
        self.ctx = ctx
        self.b = builder
        self.last_response: str | None = None
        self.seq = 0

    def handle(self, line: int, ev: dict[str, Any]) -> str | None:
        self.seq += 1
        if "action" in ev:
            return self._action(line, ev)
        if "observation" in ev:
            return self._observation(line, ev)
        if "content" in ev and len(ev) <= 3:  # bare first message in some exports
            self.b.user(as_str(ev.get("content")))
            return None
        return "not_an_event"

    def _action(self, line: int, ev: dict[str, Any]) -> str | None:
        action = as_str(ev.get("action"))
        args = as_dict(ev.get("args")) or ev
        source = ev.get("source")
        ts = as_str(ev.get("timestamp")) or None
        if action == "message":
            text = as_str(args.get("content")) or as_str(ev.get("message"))
            if source == "agent" or (source is None and args.get("wait_for_response") is True):
                self._assistant(line, ev, text, [], ts)
            else:
                self.b.user(text)
            return None
        if action == "system":
            self.b.system(as_str(args.get("content")) or as_str(ev.get("message")))
            return None
        if action in SILENT_ACTIONS or source == "environment":
            return None
        if not action:
            return "missing_action"
        tcm = as_dict(ev.get("tool_call_metadata"))
        call_id = as_str(tcm.get("tool_call_id")) or f"oh_{ev.get('id', f'seq{self.seq}')}"
        name = as_str(tcm.get("function_name")) or action
        arguments = _arguments_from_response(tcm, call_id)
        if arguments is None:
            arguments = dumps_str({k: v for k, v in args.items() if k not in ARG_SKIP | {"action"}})
        text = as_str(args.get("thought")) or as_str(ev.get("thought"))
        self._assistant(line, ev, text, [make_tool_call(call_id, name, arguments)], ts)
        return None

    def _assistant(
        self, line: int, ev: dict[str, Any], text: str, calls: list, ts: str | None
    ) -> None:
        resp = as_dict(as_dict(ev.get("tool_call_metadata")).get("model_response"))
        rid = as_str(resp.get("id")) or None
        model = as_str(resp.get("model")) or None
        if rid:
            choice = as_dict((as_list(resp.get("choices")) or [{}])[0])
            msg = as_dict(choice.get("message"))
            # the response text is shared by all actions of one response: add it once
            text = as_str(msg.get("content")) if rid != self.last_response else ""
            thinking = as_str(msg.get("reasoning_content"))
        else:
            thinking = ""
        self.last_response = rid
        self.b.assistant(line, text, calls, thinking, model=model, timestamp=ts, response_id=rid)

    def _observation(self, line: int, ev: dict[str, Any]) -> str | None:
        obs = as_str(ev.get("observation"))
        if obs in SILENT_OBSERVATIONS:
            return None
        tcm = as_dict(ev.get("tool_call_metadata"))
        call_id = as_str(tcm.get("tool_call_id"))
        if not call_id and ev.get("cause") is not None:
            call_id = f"oh_{ev.get('cause')}"
        content = ev.get("content")
        text = content if isinstance(content, str) else as_str(ev.get("message"))
        self.b.tool_result(call_id, text, line)
        return None


def _arguments_from_response(tcm: dict[str, Any], call_id: str) -> str | None:
    resp = as_dict(tcm.get("model_response"))
    for choice in as_list(resp.get("choices")):
        for tc in as_list(as_dict(as_dict(choice).get("message")).get("tool_calls")):
            tc = as_dict(tc)
            if tc.get("id") == call_id:
                return dumps_str(as_dict(tc.get("function")).get("arguments", ""))
    return None
