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

The current OpenHands SDK (``software-agent-sdk``) writes typed events with a ``kind`` field
instead; they are read too: ``SystemPromptEvent`` -> system message; ``MessageEvent``
(``llm_message`` with text content, ``source`` user or agent) -> user / assistant text;
``ActionEvent`` -> a tool call from ``tool_call`` (id, name, JSON arguments; ``action`` fields
when absent), its ``thought`` as the assistant text and ``reasoning_content`` as thinking,
actions sharing ``llm_response_id`` (parallel calls) forming one step, also when the
observation of one is written before the next call (the results are held until the step ends);
``llm_response_id`` is the state's ``meta.response_id`` (an LLM call log of the same response
wins over it, see traces/ingest.py); ``ObservationEvent``
(``observation.content`` text items), ``AgentErrorEvent`` (``error``) and
``UserRejectObservation`` (``rejection_reason``) -> the result of their ``tool_call_id``;
``Condensation`` (``forgotten_event_ids``, ``summary``, ``summary_offset``) is a compaction:
the forgotten events' messages leave later prefixes and the summary takes their place (counted in
the report's ``context_changes``); state updates, pauses and token events produce nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson

from ._base import (
    EVENT_FILE,
    ReaderContext,
    SessionBuilder,
    as_dict,
    as_list,
    as_str,
    dumps_str,
    load_document,
    make_tool_call,
    run_jsonl,
    unreadable_reason,
)
from .detect import is_openhands_sdk_event
from .schema import TraceState

FORMAT = "openhands"

SILENT_ACTIONS = frozenset({"change_agent_state", "recall", "null", "condensation_request"})
SILENT_OBSERVATIONS = frozenset({"agent_state_changed", "null", "recall", "user_rejected"})
ARG_SKIP = frozenset({"thought", "is_confirmed", "action_risk", "security_risk", "keep_prompt"})


def read(ctx: ReaderContext) -> Iterator[TraceState]:
    if ctx.path.suffix == ".jsonl":
        yield from _read_jsonl(ctx)
        return
    doc = _load_event_dir(ctx) if ctx.path.is_dir() else load_document(ctx)
    if doc is None:
        return
    events = doc if isinstance(doc, list) else as_list(as_dict(doc).get("history"))
    if not events:
        ctx.report.skip_item(0, "no_events")
        return
    ctx.item_index = True
    if not ctx.path.is_dir():  # (an events/ directory counts its files as lines)
        ctx.report.items = len(events)
    # an SDK events/ directory is named after nothing: its conversation is the parent's name
    sid = ctx.path.parent.name if ctx.path.is_dir() else ctx.path.stem
    r = _Events(ctx, SessionBuilder(ctx, sid))
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


MAX_EVENT_FILE_BYTES = 64 << 20


def _load_event_dir(ctx: ReaderContext) -> list[Any]:
    """The events of an SDK ``events/`` directory in file order (``event-00000-...``), one
    file counted as one line of the report; an unreadable or invalid file is skipped."""
    rep, events = ctx.report, []
    files = sorted((f for f in ctx.path.iterdir() if EVENT_FILE.match(f.name)),
                   key=lambda f: (int(f.name.split("-")[1]), f.name))  # fmt: skip
    for i, f in enumerate(files, start=1):
        rep.total_lines += 1
        why = unreadable_reason(f)
        if why is None and f.stat().st_size > MAX_EVENT_FILE_BYTES:
            why = "event file too large"
        if why is None:
            try:
                data = f.read_bytes()
                events.append(orjson.loads(data))
                rep.parsed += 1
                rep.bytes += len(data)
                continue
            except (OSError, orjson.JSONDecodeError):
                why = "invalid_json"
        rep.skip(i, why.replace(" ", "_"))
    return events


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
        if (
            "action" in rec
            or "observation" in rec
            or is_openhands_sdk_event(rec)
            or rec.get("kind") == "Condensation"
        ):
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
        self.owner: list[Any] = []  # per prefix message: the id of the event that added it
        self._last_id: Any = None
        self._action_owner: Any = None  # id of the event that began the pending action

    def handle(self, line: int, ev: dict[str, Any]) -> str | None:
        self.seq += 1
        self._attribute()
        self._last_id = ev.get("id") if isinstance(ev.get("id"), (str, int)) else None
        if ev.get("kind") == "Condensation":
            return self._condensation(ev)
        if is_openhands_sdk_event(ev):
            reason = self._sdk_event(line, ev["kind"], ev)
            if self._action_owner is None and self.b.length_after_pending() > len(self.b.messages):
                self._action_owner = self._last_id  # the event that began the pending action
            return reason
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

    def _attribute(self) -> None:
        """Give the prefix messages added since the last event their event's id (the assistant
        message of an action joins the prefix only when the next event arrives)."""
        b, owner = self.b, self.owner
        if len(owner) > len(b.messages):
            del owner[len(b.messages) :]
        new = b.messages[len(owner) :]
        if new and new[0]["role"] == "assistant" and self._action_owner is not None:
            owner.append(self._action_owner)
            new = new[1:]
        if new or b.length_after_pending() == len(b.messages):
            self._action_owner = None
        owner.extend([self._last_id] * len(new))

    def _condensation(self, ev: dict[str, Any]) -> str | None:
        """SDK ``Condensation``: the events in ``forgotten_event_ids`` leave the context and
        ``summary`` (if any) takes their place at ``summary_offset``: a compaction."""
        forgotten = {x for x in as_list(ev.get("forgotten_event_ids")) if isinstance(x, str)}
        self.b.flush()
        self._attribute()
        kept = [m for m, o in zip(self.b.messages, self.owner, strict=True) if o not in forgotten]
        summary = as_str(ev.get("summary"))
        if summary:
            at = ev.get("summary_offset")
            at = at if type(at) is int and 0 <= at <= len(kept) else len(kept)
            kept.insert(at, {"role": "user", "content": summary})
        self.b.compact(kept)
        self.owner = [None] * len(self.b.messages)
        return None

    # ---- OpenHands SDK events (``kind``) --------------------------------------------------
    def _sdk_event(self, line: int, kind: str, ev: dict[str, Any]) -> str | None:
        ts = as_str(ev.get("timestamp")) or None
        if kind == "SystemPromptEvent":
            self.b.system(_sdk_text(ev.get("system_prompt")))
        elif kind == "MessageEvent":
            msg = as_dict(ev.get("llm_message"))
            role = as_str(msg.get("role")) or (
                "assistant" if ev.get("source") == "agent" else "user"
            )
            text = _sdk_text(msg.get("content"))
            if role == "assistant":
                thinking = as_str(msg.get("reasoning_content"))
                rid = as_str(ev.get("llm_response_id")) or None
                self.b.assistant(line, text, [], thinking, timestamp=ts, response_id=rid)
            elif role == "system":
                self.b.system(text)
            else:
                self.b.user(text)
        elif kind == "ActionEvent":
            return self._sdk_action(line, ev, ts)
        elif kind in ("ObservationEvent", "AgentErrorEvent", "UserRejectObservation"):
            call_id = as_str(ev.get("tool_call_id"))
            if not call_id:
                return "observation_without_call_id"
            obs = ev.get("observation")
            text = (
                _sdk_text(as_dict(obs).get("content")) if kind == "ObservationEvent"
                else as_str(ev.get("error")) or as_str(ev.get("rejection_reason"))
            )  # fmt: skip
            self.b.tool_result(call_id, text, line)
        return None

    def _sdk_action(self, line: int, ev: dict[str, Any], ts: str | None) -> str | None:
        tc = as_dict(ev.get("tool_call"))
        call_id = as_str(tc.get("id")) or as_str(ev.get("tool_call_id"))
        name = as_str(tc.get("name")) or as_str(ev.get("tool_name"))
        if not call_id or not name:
            return "action_without_tool_call"
        arguments = tc.get("arguments")
        if not isinstance(arguments, str):
            action = as_dict(ev.get("action"))
            arguments = dumps_str(arguments if isinstance(arguments, dict) else
                                  {k: v for k, v in action.items() if k != "kind"})  # fmt: skip
        rid = as_str(ev.get("llm_response_id")) or None
        first = rid is None or rid != self.last_response
        text = _sdk_text(ev.get("thought")) if first else ""
        thinking = as_str(ev.get("reasoning_content")) if first else ""
        self.last_response = rid
        call = make_tool_call(call_id, name, arguments)
        self.b.assistant(line, text, [call], thinking, timestamp=ts, response_id=rid)
        return None


def _sdk_text(content: Any) -> str:
    """Text of an SDK content field: a string, a ``TextContent`` or a list of them."""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        return as_str(content.get("text"))
    parts = [as_str(as_dict(c).get("text")) for c in as_list(content)]
    return "\n".join(p for p in parts if p)


def _arguments_from_response(tcm: dict[str, Any], call_id: str) -> str | None:
    resp = as_dict(tcm.get("model_response"))
    for choice in as_list(resp.get("choices")):
        for tc in as_list(as_dict(as_dict(choice).get("message")).get("tool_calls")):
            tc = as_dict(tc)
            if tc.get("id") == call_id:
                return dumps_str(as_dict(tc.get("function")).get("arguments", ""))
    return None
