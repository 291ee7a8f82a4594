"""OpenAI Codex CLI rollouts (``~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl``).

Current envelope format: ``{"timestamp", "type", "payload"}`` with ``type`` one of
``session_meta`` (session id, sub-agent source), ``turn_context`` (model), ``response_item``
(the model conversation in Responses-API items: ``message``, ``reasoning``, ``function_call``,
``custom_tool_call``, ``local_shell_call``, ``tool_search_call``, ``web_search_call`` and their
``*_output`` items), ``event_msg`` (UI events), ``compacted`` (``replacement_history`` becomes the
new prefix). Legacy rollouts have a bare ``{"id", "timestamp"}`` header followed by raw items
without the envelope.

``response_item`` records are the source of truth. Sessions whose rollout has no message items
(older CLIs, replayed sub-agent threads) fall back to ``event_msg`` ``user_message`` /
``agent_message`` / ``agent_reasoning`` events. MCP tools appear as ``function_call`` items whose
name is ``mcp__server__tool``. Reasoning summaries go to ``Action.thinking``;
``encrypted_content`` is dropped (encrypted reasoning carries no text we can read).

What changes later contexts (issue 57), each counted in the report's ``context_changes``:

- ``event_msg`` ``thread_rolled_back`` (``num_turns``): the last user turns leave the context;
  later prefixes are cut back to before them (``rollback``, ``meta.segment`` increments);
- ``compacted``: ``replacement_history`` becomes the prefix; an encrypted ``compaction`` item
  in it becomes a marker message and later states are ``context_complete: false``
  (``encrypted_compaction``);
- hosted ``web_search_call``: a decision of its own, under the id that ``web_search_begin`` /
  ``web_search_end`` carry, followed by a tool message saying its results are not in the log;
  later states of the segment are ``context_complete: false``.

A ``final_answer`` message (``phase``) ends its action; ``commentary`` joins the calls after it.
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
    make_tool_call,
    parts_text,
    run_jsonl,
)
from .schema import Message, TraceState

FORMAT = "codex"

KNOWN_TOP = frozenset(
    {"session_meta", "turn_context", "response_item", "event_msg", "compacted", "world_state"}
)
KNOWN_TOP_META = frozenset({"inter_agent_communication_metadata"})
CALL_ITEMS = {
    "function_call": "arguments",
    "custom_tool_call": "input",
    "local_shell_call": "action",
    "tool_search_call": "arguments",
}
OUTPUT_ITEMS = frozenset(
    {
        "function_call_output",
        "custom_tool_call_output",
        "local_shell_call_output",
        "tool_search_output",
        "mcp_tool_call_output",
    }
)
SILENT_ITEMS = frozenset({"ghost_snapshot", "image_generation_call", "compaction"})
EVENT_BUFFER_MAX = 64
CONTEXT_PREFIXES = ("<environment_context>", "<user_instructions>", "# AGENTS.md instructions")
"""User-role messages Codex writes itself: not user turns (a rollback counts user turns)."""
COMPACTION_ITEMS = frozenset({"compaction", "compaction_summary"})
COMPACTED_MARK = "[context compacted: the summary is encrypted and not in the log]"
COMPACTED_MARK_MSG: Message = {"role": "user", "content": COMPACTED_MARK}
HOSTED_RESULT = "[hosted {}: results are not in the log]"
WEB_SEARCH_EVENTS = frozenset({"web_search_begin", "web_search_end"})


def read(ctx: ReaderContext) -> Iterator[TraceState]:
    r = _CodexReader(ctx)
    yield from run_jsonl(ctx, r.handle)
    r.end_session()
    yield from ctx.drain()


def content_text(content: Any) -> str:
    """Text of a Responses-API content list / output value (images become placeholders)."""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        if "text" in content:
            return as_str(content.get("text"))
        if "content" in content:
            return content_text(content.get("content"))
        return dumps_str(content)
    return parts_text(
        content,
        frozenset({"input_text", "output_text", "text", "summary_text", "reasoning_text"}),
        unknown="[{} content]",
        untyped="[unknown content]",
        skip_types=frozenset({"encrypted_content"}),
    )


def item_to_message(item: dict[str, Any]) -> Message | None:
    """A ``message`` item as an OpenAI chat message (developer -> system)."""
    if item.get("type", "message" if "role" in item else None) != "message":
        return None
    role = as_str(item.get("role"))
    role = {"developer": "system"}.get(role, role)
    if role not in ("system", "user", "assistant"):
        return None
    return {"role": role, "content": content_text(item.get("content"))}


class _CodexReader:
    def __init__(self, ctx: ReaderContext) -> None:
        self.ctx = ctx
        self.b: SessionBuilder | None = None
        self.session_id: str | None = None
        self.subagent: str | None = None
        self.model: str | None = None
        self.mode: str | None = None  # None (undecided) | "items" | "events"
        self.events: list[tuple[int, str, str, str | None]] = []
        self.turns: list[int] = []  # prefix index of each user turn (rollbacks drop turns)
        self.hosted: dict[str, Any] | None = None  # a hosted call waiting for its real id
        self.search_ids: dict[str, None] = {}  # web_search_* call ids not yet given to a call
        self.given_ids: set[str] = set()  # ... and those given
        self.unanswered: set[str] = set()  # calls of the current model response w/o result
        self.responses = 0

    # -- sessions
    def builder(self) -> SessionBuilder:
        if self.b is None:
            sid = self.session_id or self.ctx.path.stem
            self.b = SessionBuilder(
                self.ctx, sid, subagent_id=self.subagent, is_sidechain=self.subagent is not None
            )
        return self.b

    def end_session(self) -> None:
        if self.mode is None and self.events:
            self._replay_events()
        self._close_hosted(0)
        if self.b is not None:
            self.b.finish()
        self.b = None
        self.mode = None
        self.events = []
        self.turns = []
        self.search_ids = {}
        self.given_ids = set()
        self.unanswered = set()
        self.responses = 0

    def _session_meta(self, payload: dict[str, Any]) -> None:
        sid = as_str(payload.get("id")) or as_str(payload.get("session_id"))
        if sid and sid == self.session_id:
            return
        self.end_session()
        self.session_id = sid or None
        source = payload.get("source")
        sub = as_dict(as_dict(source).get("subagent")) if isinstance(source, dict) else {}
        if sub or payload.get("parent_thread_id"):
            self.subagent = sid or "subagent"
        else:
            self.subagent = None

    # -- records
    def handle(self, line: int, rec: dict[str, Any]) -> str | None:
        payload = rec.get("payload")
        rtype = rec.get("type")
        if not isinstance(payload, dict):
            return self._legacy(line, rec)
        ts = as_str(rec.get("timestamp")) or None
        if self.hosted is not None and payload.get("type") not in WEB_SEARCH_EVENTS:
            self._close_hosted(line)
        if rtype == "session_meta":
            self._session_meta(payload)
        elif rtype == "turn_context":
            self.model = as_str(payload.get("model")) or self.model
        elif rtype == "response_item":
            return self._item(line, payload, ts)
        elif rtype == "event_msg":
            self._event(line, payload, ts)
        elif rtype == "compacted":
            self._compacted(payload)
        elif isinstance(rtype, str) and (rtype in KNOWN_TOP or rtype in KNOWN_TOP_META):
            return None
        else:
            return "unknown_record_type"
        return None

    def _legacy(self, line: int, rec: dict[str, Any]) -> str | None:
        if rec.get("record_type") == "state":
            return None
        if isinstance(rec.get("type"), str):
            return self._item(line, rec, as_str(rec.get("timestamp")) or None)
        if "id" in rec and "timestamp" in rec:
            self._session_meta(rec)
            return None
        return "missing_type"

    def _item(self, line: int, item: dict[str, Any], ts: str | None) -> str | None:
        itype = as_str(item.get("type")) or ("message" if "role" in item else "")
        b = self.builder()
        if itype in ("message", "agent_message"):
            self._use_items()
        elif self.mode is None and self.events:
            self._replay_events()  # events so far were real content, not item duplicates
        if itype == "message":
            msg = item_to_message(item)
            if msg is None:
                return "unknown_role"
            if msg["role"] == "assistant":
                b.assistant(line, msg["content"], model=self.model, timestamp=ts,
                            response_key=self._open_response())  # fmt: skip
                if item.get("phase") == "final_answer":
                    b.flush()  # the turn's answer: what follows is another decision
            elif msg["role"] == "system":
                self.unanswered.clear()
                b.system(msg["content"])
            else:
                self.unanswered.clear()
                b.user(msg["content"])
                if not msg["content"].startswith(CONTEXT_PREFIXES):
                    self.turns.append(len(b.messages) - 1)
        elif itype == "reasoning":
            text = content_text(item.get("summary"))
            extra = content_text(item.get("content")) if item.get("content") else ""
            thinking = "\n".join(t for t in (text, extra) if t)
            b.assistant(line, thinking=thinking, model=self.model, timestamp=ts,
                        response_key=self._open_response())  # fmt: skip
        elif itype in CALL_ITEMS:
            call_id = as_str(item.get("call_id")) or as_str(item.get("id")) or f"call_synth_{line}"
            name = as_str(item.get("name")) or itype.removesuffix("_call")
            args = dumps_str(item.get(CALL_ITEMS[itype], ""))
            if not self.unanswered:
                self.responses += 1
            self.unanswered.add(call_id)
            b.assistant(
                line,
                tool_calls=[make_tool_call(call_id, name, args)],
                model=self.model,
                timestamp=ts,
                response_key=f"response-{self.responses}",
            )
        elif itype == "web_search_call":
            self._hosted_call(b, line, item, ts)
        elif itype in OUTPUT_ITEMS:
            call_id = as_str(item.get("call_id"))
            self.unanswered.discard(call_id)
            out = item.get("output")
            if itype == "tool_search_output" and out is None:
                out = item.get("tools")
            b.tool_result(call_id, content_text(out), line)
        elif itype == "agent_message":  # message from another agent thread: input to this one
            author = as_str(item.get("author")) or "agent"
            b.user(f"[message from {author}]\n{content_text(item.get('content'))}")
        elif itype in SILENT_ITEMS:
            return None
        else:
            return "unknown_record_type"
        return None

    def _open_response(self) -> str | None:
        """The key of the model response still waiting for results of its calls (None: none).
        The Responses API samples the model again only once every call of a response has its
        output, so output written while one of its calls is unanswered is that response's:
        parallel calls are one decision, and results logged between them were not seen by it
        (the rule Claude Code's response ids give, issue 57)."""
        return f"response-{self.responses}" if self.unanswered else None

    def _use_items(self) -> None:
        if self.mode is None:
            self.mode = "items"
            self.events = []  # event copies of item messages: duplicates

    def _hosted_call(self, b: SessionBuilder, line: int, item: dict[str, Any], ts: str | None):
        """A hosted (provider-run) web search: its own decision, closed by `_close_hosted`."""
        call_id = as_str(item.get("id")) or self._next_search_id()
        self.given_ids.add(call_id)
        call = make_tool_call(call_id or f"ws_synth_{line}", "web_search",
                              dumps_str(item.get("action", {})))  # fmt: skip
        b.flush()  # text written before the search was another output of the model
        b.assistant(line, tool_calls=[call], model=self.model, timestamp=ts)
        self.hosted = call if not call_id else None
        if call_id:
            self._hosted_result(b, call_id, line)

    def _close_hosted(self, line: int) -> None:
        call, self.hosted = self.hosted, None
        if call is not None and self.b is not None:
            self._hosted_result(self.b, call["id"], line)

    def _hosted_result(self, b: SessionBuilder, call_id: str, line: int) -> None:
        b.tool_result(call_id, HOSTED_RESULT.format("web_search"), line)
        b.mark_incomplete("hosted_tool_result_not_logged")

    def _search_event(self, line: int, payload: dict[str, Any]) -> None:
        call_id = as_str(payload.get("call_id"))
        if not call_id:
            return
        if self.hosted is not None:  # the call was written before its events: give it its id
            self.hosted["id"] = call_id
            self.given_ids.add(call_id)
            self._close_hosted(line)
        elif call_id not in self.search_ids and call_id not in self.given_ids:
            # (begin, then end: one id); a dict, not a list: a log of many searches whose call
            # never comes cost quadratic time (40k events: 46 s), and at most EVENT_BUFFER_MAX
            # wait (the oldest's call never came)
            self.search_ids[call_id] = None
            if len(self.search_ids) > EVENT_BUFFER_MAX:
                del self.search_ids[next(iter(self.search_ids))]

    def _next_search_id(self) -> str:
        """The oldest web_search_* id not yet given to a call ('' if none)."""
        if not self.search_ids:
            return ""
        call_id = next(iter(self.search_ids))
        del self.search_ids[call_id]
        return call_id

    def _rollback(self, payload: dict[str, Any]) -> None:
        self.unanswered.clear()
        if self.mode is None and self.events:
            # no message item came before: the buffered events are the turns (an item is
            # written before its event copy), read now so the rollback can cut them
            self._replay_events()
        n = payload.get("num_turns")
        if type(n) is not int or n < 1 or not self.turns or self.b is None:
            return
        start = self.turns[-min(n, len(self.turns))]
        del self.turns[-n:]
        self.b.truncate(start, "rollback")

    def _event(self, line: int, payload: dict[str, Any], ts: str | None) -> None:
        etype = payload.get("type")
        if etype in WEB_SEARCH_EVENTS:
            self._search_event(line, payload)
            return
        if etype == "thread_rolled_back":
            self._rollback(payload)
            return
        if etype not in ("user_message", "agent_message", "agent_reasoning"):
            return
        text = as_str(payload.get("message")) or as_str(payload.get("text"))
        if self.mode == "items" or not text:
            return
        self.events.append((line, etype, text, ts))
        if self.mode == "events" or len(self.events) > EVENT_BUFFER_MAX:
            self.mode = "events"
            self._replay_events()

    def _replay_events(self) -> None:
        b = self.builder()
        for line, etype, text, ts in self.events:
            if etype == "user_message":
                b.user(text)
                self.turns.append(len(b.messages) - 1)
            elif etype == "agent_message":
                b.assistant(line, text, model=self.model, timestamp=ts)
            else:
                b.assistant(line, thinking=text, model=self.model, timestamp=ts)
        self.events = []

    def _compacted(self, payload: dict[str, Any]) -> None:
        self.unanswered.clear()
        msgs: list[Message] = []
        encrypted = False
        for item in as_list(payload.get("replacement_history")):
            item = as_dict(item)
            if item.get("type") in COMPACTION_ITEMS:
                encrypted = True
                msgs.append(COMPACTED_MARK_MSG)
            elif (msg := item_to_message(item)) is not None:
                msgs.append(msg)
        summary = as_str(payload.get("message"))
        if summary:
            msgs.append({"role": "user", "content": summary})
        if self.mode is None and self.events:
            self._replay_events()
        b = self.builder()
        b.compact(msgs)
        self.turns = [i for i, m in enumerate(b.messages) if m["role"] == "user"
                      and not str(m["content"]).startswith(CONTEXT_PREFIXES)]  # fmt: skip
        if encrypted:
            b.mark_incomplete("encrypted_compaction", msgs.index(COMPACTED_MARK_MSG))
