"""Shared machinery for readers: line iteration with accounting, and the session builder that
turns a stream of (user / assistant / tool) events into TraceStates."""

from __future__ import annotations

import json
import os
import re
import stat
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson

from .harness_tools import format_tools
from .redact import Redactor
from .report import FileReport
from .schema import (
    SCHEMA_VERSION,
    Action,
    Message,
    PrefixView,
    StateMeta,
    TraceState,
    compute_state_id,
    message_digest,
)

NO_RESULT = "[no tool result recorded]"
MAX_PATH_ENTRIES = 50_000  # bound for per-session uuid bookkeeping (Claude Code rewinds)
BOM = b"\xef\xbb\xbf"  # UTF-8 byte order mark, skipped at the start of a file
READ_BLOCK = 64 * 1024  # bytes of raw lines scanned and decoded at once (64 KB: stays in L2)

# A record handler returns None when the line was used, or a skip reason.
Handler = Callable[[int, dict[str, Any]], str | None]


class ReaderContext:
    """What a reader needs: the file, its report, the redactor, and an output buffer."""

    def __init__(self, path: Path, fmt: str, report: FileReport, redactor: Redactor) -> None:
        self.path = path
        self.file = str(path)
        self.format = fmt
        self.tools = format_tools(fmt)  # the source harness's tool schemas, if profiled
        self.report = report
        self.redactor = redactor
        self.out: list[TraceState] = []
        self.item_index = False  # True for whole-document formats: meta.line is an item index
        # True while a record from a raw line with no redaction trigger is handled (set by
        # ``run_jsonl(..., trigger_scan=True)``): its strings need no redaction
        self.clean_line = False

    def drain(self) -> list[TraceState]:
        out, self.out = self.out, []
        self.report.states += len(out)
        return out

    def redact(self, text: str) -> str:
        return self.redactor.redact(text) if text and not self.clean_line else text


def run_jsonl(
    ctx: ReaderContext,
    handle: Handler,
    *,
    trigger_scan: bool = False,
    decode: Callable[[bytes], Any] | None = None,
) -> Iterator[TraceState]:
    """Drive ``handle`` over the JSON-object lines of a JSONL file and yield the states it makes.

    Accounting is exact per line: a line that is not a JSON object is skipped with its reason; a
    handled line counts as parsed, or as skipped with the reason ``handle`` returns; a handler bug
    on one record is skipped as ``reader_error:<Exception>`` instead of ending the file. Reads
    blocks of whole lines (memory bounded by ``READ_BLOCK`` plus the longest line) and decodes
    each line from a view of its block (no copy).

    ``trigger_scan``: each block is scanned for redaction triggers (`Redactor.raw_scanner`) and
    ``ctx.clean_line`` is True while a line without one is handled. Only for readers that redact
    every string of a record while handling that record (never later, from a buffer).

    ``decode``: a typed decoder (msgspec) used instead of ``orjson.loads``; it must accept every
    JSON object. A line it rejects is classified by ``orjson.loads`` as usual; an object that
    orjson reads and it does not (nesting deeper than its recursion limit) is skipped as
    ``reader_error:<Exception>``.
    """
    scanner = ctx.redactor.raw_scanner() if trigger_scan else None
    rep = ctx.report
    loads = decode or orjson.loads
    lineno = parsed = 0
    try:
        with open(ctx.path, "rb") as fh:
            for block, pos, size in _line_spans(fh):
                rep.bytes += size - pos
                if lineno == 0 and block.startswith(BOM):  # Windows editors: not line 1's JSON
                    pos = len(BOM)
                view, find = memoryview(block), block.find
                # sorted end offsets of trigger matches; a line holds those in (start, end]
                hits: list[int] = []
                if scanner is not None:
                    hits = [pos + e for e in scanner.match_ends(view[pos:size])]
                    ctx.clean_line = not hits  # per line below only if the block has matches
                n_hits, k = len(hits), 0
                while pos < size:
                    end = find(b"\n", pos, size) + 1 or size
                    raw, start, pos = view[pos:end], pos, end
                    lineno += 1
                    try:
                        obj = loads(raw)
                    except Exception as exc:  # noqa: BLE001 - classified off the hot path
                        rep.skip(lineno, _unparsed_reason(bytes(raw), exc if decode else None))
                        continue
                    if decode is None and not isinstance(obj, dict):
                        rep.skip(lineno, "not_an_object")
                        continue
                    if hits:
                        while k < n_hits and hits[k] <= start:
                            k += 1
                        ctx.clean_line = k == n_hits or hits[k] > end
                    try:
                        reason = handle(lineno, obj)
                    except Exception as exc:  # noqa: BLE001 - reported per line
                        reason = f"reader_error:{type(exc).__name__}"
                    if reason is None:
                        parsed += 1
                    elif reason == "unknown_record_type":
                        rep.unknown(lineno, ctx.redactor.redact(_type_name(obj)))
                    else:
                        rep.skip(lineno, reason)
                    if ctx.out:  # (ctx.clean_line stays: nothing redacts while we are suspended)
                        out, ctx.out = ctx.out, []  # ctx.drain(), inlined
                        rep.states += len(out)
                        yield from out
    finally:
        ctx.clean_line = False
        rep.total_lines += lineno
        rep.parsed += parsed


def _line_spans(fh: Any) -> Iterator[tuple[bytearray, int, int]]:
    """``(buffer, start, end)``: ``buffer[start:end]`` holds about ``READ_BLOCK`` bytes of whole
    lines (the file's last line may lack its newline). One buffer is reused (refilled once the
    caller asks for the next span, so views of it must not outlive their span): no allocation
    per read, which also keeps the C heap from shrinking and regrowing (page faults)."""
    buf = bytearray(READ_BLOCK)
    have = 0  # bytes at the start of buf: the end of a line the previous read cut
    while True:
        if have == len(buf):  # a line longer than the buffer: grow it
            grown = bytearray(2 * len(buf))
            grown[:have] = buf
            buf = grown
        n = fh.readinto(memoryview(buf)[have:])
        if not n:
            if have:
                yield buf, 0, have
            return
        end = have + n
        cut = buf.rfind(b"\n", 0, end) + 1
        if not cut:
            have = end
            continue
        yield buf, 0, cut
        rest = buf[cut:end]
        buf[: len(rest)] = rest  # same length: allowed while views of buf exist
        have = len(rest)


def _unparsed_reason(raw: bytes, typed_error: Exception | None) -> str:
    """Why a line yields no object (blank lines fail to parse too, and land here)."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        if not raw.strip():
            return "blank_line"
        return "invalid_json" if raw.endswith(b"\n") else "truncated_json"
    if not isinstance(obj, dict):
        return "not_an_object"
    return f"reader_error:{type(typed_error).__name__}"


def _type_name(obj: Any) -> str:
    if not isinstance(obj, dict):  # a typed record
        t = getattr(obj, "type", None)
        return t if isinstance(t, str) else "<no type>"
    t = obj.get("type")
    if isinstance(t, str):
        p = obj.get("payload")
        if isinstance(p, dict) and isinstance(p.get("type"), str):
            return f"{t}:{p['type']}"
        return t
    return "<no type>"


def line_count(data: bytes) -> int:
    """Lines in ``data``, the last one counted also without its newline (0 when empty)."""
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def load_document(ctx: ReaderContext) -> Any:
    """Read a whole-file JSON document; all its lines count as parsed, or all as skipped."""
    rep = ctx.report
    data = ctx.path.read_bytes()
    rep.bytes += len(data)
    data = data.removeprefix(BOM)
    n = line_count(data)
    rep.total_lines += n
    if not data.strip():
        if n:
            rep.skip(1, "blank_line", n)
        return None
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        rep.skip(getattr(exc, "lineno", 1) or 1, "invalid_json", n)
        return None
    rep.parsed += n
    return obj


# ---------------------------------------------------------------- small type-safe getters


def as_str(x: Any) -> str:
    return x if isinstance(x, str) else ""


def as_dict(x: Any) -> dict[str, Any]:
    return x if isinstance(x, dict) else {}


def as_list(x: Any) -> list[Any]:
    return x if isinstance(x, list) else []


def dumps_str(x: Any) -> str:
    """JSON text of any decoded value (tool arguments); strings pass through unchanged."""
    if isinstance(x, str):
        return x
    try:
        return orjson.dumps(x, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:  # e.g. an integer beyond 64 bits (msgspec decodes those exactly)
        try:
            return json.dumps(x, ensure_ascii=False, separators=(",", ":"))
        except (TypeError, ValueError):
            return str(x)


def make_tool_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# ---------------------------------------------------------------- session builder


class SessionBuilder:
    """Accumulates one session's conversation and emits a TraceState per assistant action.

    Rules (shared by all readers):
    - consecutive assistant output (same response, or no response id) forms one action; the state
      is emitted when something else arrives, with the prefix as it was before the action;
    - the action's assistant message (text + tool_calls, never thinking) then joins the prefix;
    - a tool result whose call is unknown is reported orphaned and kept as a user message, so the
      prefix stays valid OpenAI chat; calls left without a result when the conversation moves on
      are reported orphaned and get a ``[no tool result recorded]`` tool message;
    - a call id repeated inside one action is renamed ``<id>#2``, ``#3``... (reported as
      ``duplicate_tool_call_id``) and the next results for that id go to the renamed calls in
      order, so every call is followed by exactly its own tool message;
    - a tool result that arrives while an action with a response id is pending, for one of that
      action's calls, is held until the action ends: a response's parallel calls are written
      interleaved with their results (Claude Code 2.1: call A, result A, call B), and the model
      chose B before it saw A's result, so A and B are one action (issue 57);
    - ``mark_incomplete`` flags every later state of the segment ``context_complete: false``
      (the context holds something the log lost), until a rewind cuts the gap off;
    - all text is redacted here, the single entry point for content;
    - states hold views of ``messages`` (`PrefixView`), not copies: the list is only ever
      appended to once a view of it exists; a cut (rewind, rollback, branch switch,
      compaction) starts a new list, so states made before it keep their prefixes.
    """

    def __init__(
        self,
        ctx: ReaderContext,
        session_id: str,
        *,
        subagent_id: str | None = None,
        is_sidechain: bool = False,
    ) -> None:
        self.ctx = ctx
        self.session_id = session_id
        self.subagent_id = subagent_id
        self.is_sidechain = is_sidechain
        self.messages: list[Message] = []  # append only while ``_viewed`` (see `_cut`)
        self._viewed = False  # a state holds a view of ``messages``
        self._digests: list[bytes] = [b""]
        self.pending: Action | None = None
        self._pending_line = 0
        self._pending_model: str | None = None
        self._pending_ts: str | None = None
        self._pending_rid: str | None = None
        self._pending_key: str | None = None  # the response id, or a reader's response key
        # call id -> line of the call, oldest first (dicts keep order: a result leaves in O(1))
        self._open_calls: dict[str, int] = {}
        self._renamed: dict[str, deque[str]] = {}  # repeated call id -> its renamed calls
        self._held: list[tuple[str, str, int]] = []  # results of the pending action's calls
        # counts kept beside the pending action, so that each call and result costs O(1) however
        # many a response holds (scans of the action made 8k parallel calls take a minute)
        self._pending_ids: set[str] = set()  # the pending action's call ids
        self._pending_base: Counter[str] = Counter()  # ... by id before a `#k` rename
        self._held_ids: Counter[str] = Counter()  # held results by call id
        self._next_copy: dict[str, int] = {}  # repeated call id -> its next free `#k`
        self._pending_note: str | None = None  # why the pending action's context is incomplete
        self._gap: tuple[int, str] | None = None  # (prefix length, note) of a lost context part
        self.step = 0
        self.segment = 0
        self.after_compaction = False
        self._session_bytes = session_id.encode("utf-8", "surrogatepass")
        ctx.report.sessions.add(session_id)

    # -- conversation events
    def system(self, text: str) -> None:
        self._close_turn()
        self._append({"role": "system", "content": self.ctx.redact(text)})

    def user(self, text: str) -> None:
        self._close_turn()
        ctx = self.ctx
        self._append({"role": "user", "content": text if ctx.clean_line else ctx.redact(text)})

    def tool_result(self, call_id: str, text: str, line: int) -> None:
        """Add a tool message. An empty ``call_id`` (formats that do not record it) links to the
        oldest call still waiting for its result."""
        if not self.ctx.clean_line:
            text = self.ctx.redact(text)
        act = self.pending
        if act is not None:
            if self._pending_key and call_id and self._is_pending_call(act, call_id):
                self._held.append((call_id, text, line))
                self._held_ids[call_id] += 1
                return
            self.flush()
        self._result(call_id, text, line)

    def hosted_result(self, call_id: str, text: str, line: int, note: str) -> None:
        """The result of a hosted (provider-run) tool, written inside the response: the call was
        a decision of its own, the output after it another one, which saw this result; the
        context is incomplete from here (``note``: the provider's full result is not logged)."""
        self.flush()
        self._result(call_id, text if self.ctx.clean_line else self.ctx.redact(text), line)
        self.mark_incomplete(note)

    def waits_for(self, call_id: str) -> bool:
        """A call ``call_id`` of this session is still without its result."""
        if not call_id:
            return False
        if self.pending is not None and call_id in self._pending_ids:
            return True
        return call_id in self._open_calls or bool(self._renamed.get(call_id))

    def _is_pending_call(self, act: Action, call_id: str) -> bool:
        """``act`` (the pending action) has a call ``call_id`` whose result is not held yet."""
        return self._pending_base[call_id] > self._held_ids[call_id]

    def _result(self, call_id: str, text: str, line: int) -> None:
        if not call_id and self._open_calls:
            call_id = next(iter(self._open_calls))
        if call_id not in self._open_calls and self._renamed.get(call_id):
            call_id = self._renamed[call_id].popleft()  # the next copy of a repeated id
        if call_id and call_id in self._open_calls:
            del self._open_calls[call_id]
            self._append({"role": "tool", "tool_call_id": call_id, "content": text})
            return
        shown = self.ctx.redactor.redact(call_id) if call_id else "<no id>"
        self.ctx.report.orphan("tool_result_without_call", line, shown)
        self._close_open_calls()
        label = f"[tool result for unknown call {shown}]"  # content: redacted like text
        self._append({"role": "user", "content": f"{label}\n{text}"})

    def assistant(
        self,
        line: int,
        text: str = "",
        tool_calls: Iterable[dict[str, Any]] = (),
        thinking: str = "",
        model: str | None = None,
        timestamp: str | None = None,
        response_id: str | None = None,
        note: str | None = None,
        response_key: str | None = None,
    ) -> None:
        """Add assistant output; ``note`` marks this action's context incomplete (why).
        ``response_key``: for formats that log no response id, the reader's key of the model
        response this output belongs to (e.g. calls made while a call of the response is
        unanswered): it groups and holds results as a response id does, and is not exported."""
        key = response_id or response_key
        if self._held and key != self._pending_key:
            self.flush()  # results came in and another response follows: they were seen
        act = self.pending
        if act is not None and key and self._pending_key != key:
            if self._pending_key:
                self.flush()
                act = None
        if act is None:
            if self._open_calls:
                self._close_open_calls()
            act = self.pending = Action()
            self._pending_ids.clear()
            self._pending_base.clear()
            self._next_copy.clear()
            self._pending_line = line
            self._pending_model = model
            self._pending_ts = timestamp
            self._pending_rid = response_id
            self._pending_key = key
            self._pending_note = None
        elif response_key and not self._pending_key:
            self._pending_key = response_key  # e.g. reasoning, then the response's calls
        if note:
            self._pending_note = note
        clean = self.ctx.clean_line
        if text:
            text = text if clean else self.ctx.redact(text)
            act.text = f"{act.text}\n{text}" if act.text else text
        if thinking:
            thinking = thinking if clean else self.ctx.redact(thinking)
            act.thinking = f"{act.thinking}\n{thinking}" if act.thinking else thinking
        for tc in tool_calls:
            if not clean:
                fn = tc["function"]
                fn["arguments"] = self._redact_arguments(fn["arguments"])
            base = tc["id"]
            if base in self._pending_ids:
                self._rename_repeated(tc, act, line)
            act.tool_calls.append(tc)
            self._pending_ids.add(tc["id"])
            self._pending_base[base.split("#")[0]] += 1
        if model and not self._pending_model:
            self._pending_model = model

    def _rename_repeated(self, tc: dict[str, Any], act: Action, line: int) -> None:
        """Give a call whose id is already used in this action a fresh one: two calls ``T1``
        followed by one ``T1`` result is no valid conversation for a teacher."""
        cid = tc["id"]
        used = self._pending_ids
        k = self._next_copy.get(cid, 2)  # #2 up to it are taken in this action
        while f"{cid}#{k}" in used:
            k += 1
        self._next_copy[cid] = k + 1
        tc["id"] = f"{cid}#{k}"
        self._renamed.setdefault(cid, deque()).append(tc["id"])
        self.ctx.report.orphan("duplicate_tool_call_id", line, self.ctx.redactor.redact(cid))

    def mark_incomplete(self, note: str, at: int | None = None) -> None:
        """The context from message ``at`` (default: here) on lacks what the model saw (``note``
        says what): later states are ``context_complete: false`` until a rewind cuts it off."""
        if self._gap is None:
            self._gap = (len(self.messages) if at is None else at, note)

    def compact(self, replacement: Iterable[Message] = ()) -> None:
        """Context was compacted: the prefix restarts from ``replacement`` (e.g. a summary)."""
        self.flush()
        self._close_open_calls(append=False)
        self._cut(0, "compaction")
        self._gap = None  # one marked on an empty prefix too
        self.after_compaction = True
        for msg in replacement:
            content = msg.get("content")
            if isinstance(content, str):
                msg = {**msg, "content": self.ctx.redact(content)}
            self._append(msg)

    def truncate(self, n: int, kind: str = "rewind") -> None:
        """Rewind (or ``kind``, e.g. rollback): the conversation continues from its first ``n``
        messages; counted in the report's ``context_changes`` when it drops any."""
        self.flush()
        if n >= len(self.messages):
            return
        self._cut(n, kind)
        self._reopen_trailing_calls()

    def tail(self, n: int) -> list[Message]:
        """The messages after the first ``n`` (what a rewind to ``n`` would cut off)."""
        self.flush()
        return self.messages[n:]

    def prefix_digest(self, n: int) -> bytes | None:
        """Digest of the first ``n`` messages, None when the prefix is shorter."""
        return self._digests[n] if n < len(self._digests) else None

    def restore(self, n: int, tail: list[Message]) -> None:
        """Go back to a branch a rewind cut off: keep the first ``n`` messages, then ``tail``
        (messages of this builder, already redacted) - a record continued that branch."""
        self.flush()
        self._cut(n, "branch_switch")
        self._open_calls.clear()  # the calls the tail answers, or reopened below
        self._renamed.clear()
        for msg in tail:
            self._append(msg)
        self._reopen_trailing_calls()

    def _cut(self, n: int, kind: str) -> None:
        """The one place a segment ends: keep the first ``n`` messages (calls left open by the
        cut are reported orphaned; a lost-context gap cut off is forgotten), start a new segment
        and count it in the report's ``context_changes`` as ``kind`` (rewind, rollback,
        branch_switch, compaction)."""
        if n < len(self.messages):
            self._close_open_calls(append=False)
            if self._viewed:  # states hold views of this list: cut a copy, never the list
                self.messages = self.messages[:n]
                self._viewed = False
            else:
                del self.messages[n:]
            del self._digests[n + 1 :]
            if self._gap is not None and n <= self._gap[0]:
                self._gap = None
        self.segment += 1
        self.ctx.report.context_changes[kind] += 1

    def _reopen_trailing_calls(self) -> None:
        """After a cut: the last assistant message's calls whose results were cut off wait for
        a result again (so the prefix stays valid OpenAI chat whatever comes next)."""
        answered: set[str] = set()
        for msg in reversed(self.messages):
            if msg["role"] == "tool":
                answered.add(msg.get("tool_call_id", ""))
                continue
            if msg["role"] == "assistant":
                for tc in msg.get("tool_calls") or ():
                    if tc["id"] not in answered:
                        self._open_calls[tc["id"]] = self._pending_line
            return

    def finish(self, orphans: bool = True) -> None:
        """End the session; calls still waiting for a result are reported as orphans unless
        ``orphans`` is False (an LLM call log ends on its decision: no result can follow)."""
        self.flush()
        if orphans:
            self._close_open_calls(append=False)
        self._open_calls.clear()

    def length_after_pending(self) -> int:
        """Prefix length once the pending action (if any) has joined it."""
        return len(self.messages) + (1 if self.pending is not None else 0)

    # -- internals
    def _redact_arguments(self, arguments: str) -> str:
        """Redact decoded string values (so line-anchored patterns see real newlines), then
        re-encode; non-JSON arguments are redacted as text."""
        red = self.ctx.redact
        if self.ctx.clean_line or len(arguments) < 8:
            return arguments
        if self.ctx.redactor.json_text_is_clean(arguments):
            return arguments
        try:
            value = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return red(arguments)
        if isinstance(value, str):
            return red(arguments)
        new = _redact_tree(value, red)
        return arguments if new is value else orjson.dumps(new).decode()

    def flush(self) -> None:
        act = self.pending
        if act is None:
            return
        self.pending = None
        if act.is_empty():
            return
        ctx, step = self.ctx, self.step
        note = self._pending_note or (self._gap[1] if self._gap is not None else None)
        state_id = compute_state_id(self._session_bytes, step, self._digests[-1], act)
        # positional arguments in field order (keywords cost ~4x as much for ten fields);
        # tests/unit/traces/test_schema.py pins the order
        meta = StateMeta(
            ctx.format,  # source_format
            ctx.file,  # file
            self._pending_line,  # line
            self._pending_model,  # model
            self._pending_ts,  # timestamp
            self.subagent_id,  # subagent_id
            self.is_sidechain,  # is_sidechain
            self.after_compaction,  # after_compaction
            self.segment,  # segment
            ctx.item_index,  # line_is_item_index
            note is None,  # context_complete
            note,  # context_note
            self._pending_rid,  # response_id
        )
        messages = self.messages
        self._viewed = True
        state = TraceState(state_id, self.session_id, step, PrefixView(messages, len(messages)),
                           act, meta, SCHEMA_VERSION, ctx.tools)  # fmt: skip
        ctx.out.append(state)
        self.step = step + 1
        if act.text or act.tool_calls:
            self._append(act.as_message())
            for tc in act.tool_calls:
                cid = tc["id"]
                if cid in self._open_calls:
                    continue
                self._open_calls[cid] = self._pending_line
        if self._held:
            held, self._held = self._held, []
            self._held_ids.clear()
            for cid, text, line in held:
                self._result(cid, text, line)

    def _close_turn(self) -> None:
        if self.pending is not None:
            self.flush()
        if self._open_calls:
            self._close_open_calls()

    def _close_open_calls(self, append: bool = True) -> None:
        if not self._open_calls:
            return
        for cid in self._open_calls:
            shown = self.ctx.redactor.redact(cid)
            self.ctx.report.orphan("tool_call_without_result", self._open_calls[cid], shown)
            if append:
                self._append({"role": "tool", "tool_call_id": cid, "content": NO_RESULT})
        self._open_calls.clear()
        self._renamed.clear()

    def _append(self, msg: Message) -> None:
        self.messages.append(msg)
        self._digests.append(message_digest(self._digests[-1], msg))


def _redact_tree(value: Any, red: Callable[[str], str]) -> Any:
    """Redact every string in a decoded JSON value; returns ``value`` itself when unchanged."""
    if isinstance(value, str):
        return red(value)
    if isinstance(value, dict):
        out, changed = {}, False
        for k, v in value.items():
            nv = _redact_tree(v, red)
            changed |= nv is not v
            out[k] = nv
        return out if changed else value
    if isinstance(value, list):
        items = [_redact_tree(v, red) for v in value]
        return items if any(a is not b for a, b in zip(items, value, strict=True)) else value
    return value


def parts_text(
    content: Any,
    text_types: frozenset[str],
    unknown: str,
    untyped: str | None = None,
    skip_types: frozenset[str] = frozenset(),
) -> str:
    """Text of a list of message content parts (OpenAI chat parts, Responses-API items):
    strings as they are, parts whose ``type`` is in ``text_types`` by their ``text``, images
    as ``[image]``, ``skip_types`` dropped, other types as ``unknown.format(type)`` and parts
    without a type as ``untyped`` (None: dropped). Joined by newlines."""
    parts = []
    for c in as_list(content):
        if isinstance(c, str):
            parts.append(c)
            continue
        ctype = as_str(as_dict(c).get("type"))
        if ctype in text_types:
            parts.append(as_str(as_dict(c).get("text")))
        elif "image" in ctype:
            parts.append("[image]")
        elif ctype in skip_types:
            continue
        elif ctype:
            parts.append(unknown.format(ctype))
        elif untyped is not None:
            parts.append(untyped)
    return "\n".join(parts)


# ---------------------------------------------------------------- files


EVENT_FILE = re.compile(r"^event-\d+-[^/]*\.json$")
"""One event of an OpenHands SDK conversation (``events/event-00003-<uuid>.json``)."""


def is_event_dir(path: Path, files: list[str] | None = None) -> bool:
    """True for an OpenHands SDK ``events`` directory: named ``events``, holding event files."""
    if path.name != "events":
        return False
    names = files if files is not None else [f.name for f in path.iterdir() if f.is_file()]
    return any(EVENT_FILE.match(n) for n in names)


def unreadable_reason(path: Path) -> str | None:
    """Why ``path`` cannot be read as a log (FIFO, device, symlink loop, dangling symlink, no
    permission), or None for a readable regular file. Never opens the file (a FIFO would block)."""
    try:
        st = os.stat(path)  # follows symlinks: ELOOP for a loop, ENOENT for a dangling link
    except OSError as err:
        return f"{err.strerror or type(err).__name__}"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if not os.access(path, os.R_OK):
        return "permission denied"
    return None
