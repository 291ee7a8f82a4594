"""Claude Code session logs (``~/.claude/projects/<project>/<session>.jsonl``).

Records (one JSON object per line) handled:

- ``user`` / ``assistant``: ``message`` in Anthropic Messages format. Blocks: ``text``,
  ``thinking`` / ``redacted_thinking`` (kept on the action only), ``tool_use`` /
  ``server_tool_use`` (tool calls), ``tool_result`` (tool messages, linked by ``tool_use_id``),
  ``image`` / ``document`` (placeholders). Assistant records sharing ``message.id`` (Claude Code
  writes one record per content block) form one action. ``isApiErrorMessage`` assistant records
  are CLI-made, not model output, and are not actions.
- ``system`` with ``subtype == "compact_boundary"``: the context was compacted; the next
  ``isCompactSummary`` user record (the summary) starts the new prefix.
- ``isSidechain`` records (sub-agents, Task tool) become separate sessions: keyed by ``agentId``
  when present (``<session>/subagents/agent-<id>.jsonl`` files), else by their root record.
- Rewinds: a user prompt whose ``parentUuid`` points to an earlier record of the current
  conversation truncates the prefix there (``meta.segment`` increments).
- ``<system-reminder>`` text stays in user content: it is part of what the model saw.
- Known non-conversational records (summary, queue-operation, attachment, progress,
  file-history-snapshot, titles, modes, links, ...) are parsed and produce nothing; any other
  ``type`` is counted as an unknown record type.
- A whole-file export ``{"loglines": [...]}`` (claude-code-transcripts) is read item by item.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import msgspec

from ._base import (
    MAX_PATH_ENTRIES,
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

FORMAT = "claude_code"

KNOWN_META_TYPES = frozenset(
    {
        "summary",
        "queue-operation",
        "file-history-snapshot",
        "progress",
        "attachment",
        "permission-mode",
        "cost-state",
        "mode",
        "agent-name",
        "custom-title",
        "ai-title",
        "last-prompt",
        "frame-link",
        "pr-link",
        "worktree-state",
        "relocated",
        "bridge-session",
        "atis-latch",
        "started",
        "result",
        "tag",
    }
)

_AGENT_FILE = re.compile(r"(?:^|[/\\_])agent-([A-Za-z0-9_\-]+)\.jsonl$")

# Typed records: msgspec decodes only the fields the reader uses and skips the rest of a line
# (``toolUseResult`` copies of tool output, thinking signatures, usage, ...) without building
# Python objects for it. Every field accepts any JSON value (the handlers check types
# themselves), so a JSON object always decodes; see `run_jsonl` for the rest.
_NotObject = list | str | int | float | bool | None  # a JSON value that is not an object


class _Block(msgspec.Struct, gc=False):
    """A content block (``tool_use.input`` is ``UNSET`` when the key is absent)."""

    type: Any = None
    text: Any = None
    thinking: Any = None
    id: Any = None
    name: Any = None
    input: Any = msgspec.UNSET
    content: Any = None
    tool_use_id: Any = None
    is_error: Any = None
    source: Any = None


class _Message(msgspec.Struct, gc=False):
    content: list[_Block | _NotObject] | str | int | float | bool | None | dict = None
    model: Any = None
    id: Any = None


class _Record(msgspec.Struct, gc=False):
    """One log line (``uuid`` is ``UNSET`` when the key is absent)."""

    type: Any = None
    message: _Message | _NotObject = None
    sessionId: Any = None  # noqa: N815 - the log's own key names
    session_id: Any = None
    isSidechain: Any = None  # noqa: N815
    agentId: Any = None  # noqa: N815
    uuid: Any = msgspec.UNSET
    parentUuid: Any = None  # noqa: N815
    subtype: Any = None
    isApiErrorMessage: Any = None  # noqa: N815
    timestamp: Any = None
    sourceToolUseID: Any = None  # noqa: N815


_decode_record = msgspec.json.Decoder(_Record).decode


def read(ctx: ReaderContext) -> Iterator[TraceState]:
    reader = _ClaudeReader(ctx)
    if ctx.path.suffix == ".json":
        yield from reader.read_document()
    else:
        yield from run_jsonl(ctx, reader.handle, trigger_scan=True, decode=_decode_record)
    reader.finish()
    yield from ctx.drain()


class _Session:
    """A builder plus the uuid -> prefix-length map used to resolve rewinds."""

    def __init__(self, builder: SessionBuilder) -> None:
        self.b = builder
        self.path_len: dict[str, int] = {}

    def remember(self, uuid: Any) -> None:
        """Record the prefix length after record ``uuid`` (ignored unless a non-empty str)."""
        if not uuid or type(uuid) is not str:
            return
        path_len = self.path_len
        if len(path_len) >= MAX_PATH_ENTRIES:
            path_len.pop(next(iter(path_len)))
        b = self.b  # b.length_after_pending(), inlined: this runs for every record
        path_len[uuid] = len(b.messages) + (b._pending is not None)


class _ClaudeReader:
    def __init__(self, ctx: ReaderContext) -> None:
        self.ctx = ctx
        self.sessions: dict[str, _Session] = {}
        self.side_owner: dict[str, str] = {}  # sidechain uuid -> session key
        self.last_side: dict[str, str] = {}  # main session id -> latest sidechain key
        m = _AGENT_FILE.search(ctx.file)
        self.file_agent = m.group(1) if m and "subagents" in ctx.file else None
        self.default_sid = ctx.path.stem

    def read_document(self) -> Iterator[TraceState]:
        doc = load_document(self.ctx)
        if doc is None:
            return
        items = as_list(as_dict(doc).get("loglines")) if isinstance(doc, dict) else as_list(doc)
        if not items and doc:
            self.ctx.report.skip_item(0, "no_loglines")
        self.ctx.item_index = True
        for i, item in enumerate(items, start=1):
            if not isinstance(item, dict):
                self.ctx.report.skip_item(i, "not_an_object")
                continue
            try:
                reason = self.handle(i, msgspec.convert(item, _Record))
            except Exception as exc:  # noqa: BLE001
                reason = f"reader_error:{type(exc).__name__}"
            if reason == "unknown_record_type":
                kind = self.ctx.redactor.redact(as_str(item.get("type"))) or "<no type>"
                self.ctx.report.unknown_record_types[kind] += 1  # shown in the report
            if reason is not None:
                self.ctx.report.skip_item(i, reason)
            yield from self.ctx.drain()

    def finish(self) -> None:
        for s in self.sessions.values():
            s.b.finish()

    # -- routing
    def _session(self, line: int, rec: _Record) -> _Session:
        sid = rec.sessionId
        if not (sid and isinstance(sid, str)):
            sid = as_str(rec.session_id) or self.default_sid
        if rec.isSidechain is not True and self.file_agent is None:
            return self.sessions.get(sid) or self._get(sid, sid, None, False)
        uuid = as_str(rec.uuid)
        agent = as_str(rec.agentId) or None
        agent = agent or self.file_agent
        if agent:
            key = f"{sid}/agent-{agent}"
        else:
            parent = as_str(rec.parentUuid)
            if parent and parent in self.side_owner:
                key = self.side_owner[parent]
            elif parent and sid in self.last_side:  # dangling parent: latest sidechain
                key = self.last_side[sid]
            else:
                key = f"{sid}/sidechain-{uuid or line}"
            if uuid:
                if len(self.side_owner) >= MAX_PATH_ENTRIES:
                    self.side_owner.pop(next(iter(self.side_owner)))
                self.side_owner[uuid] = key
            self.last_side[sid] = key
        return self._get(key, key, agent or key.rsplit("/", 1)[-1], True)

    def _get(self, key: str, sid: str, agent: str | None, side: bool) -> _Session:
        s = self.sessions.get(key)
        if s is None:
            b = SessionBuilder(self.ctx, sid, subagent_id=agent, is_sidechain=side)
            s = self.sessions[key] = _Session(b)
        return s

    # -- records
    def handle(self, line: int, rec: _Record) -> str | None:
        rtype = rec.type
        if rtype == "assistant" or rtype == "user":
            msg = rec.message
            if type(msg) is not _Message:
                return "message_not_an_object"
            sid = rec.sessionId
            s = None
            if type(sid) is str and sid and rec.isSidechain is not True and not self.file_agent:
                s = self.sessions.get(sid)  # the common case of `_session`, inlined
            if s is None:
                s = self._session(line, rec)
            if rtype == "user":
                reason = self._user(s, line, rec, msg)
            else:
                reason = self._assistant(s, line, rec, msg)
            s.remember(rec.uuid)
            return reason
        if not isinstance(rtype, str):
            return "missing_type"
        if rtype == "system":
            s = self._session(line, rec)
            if rec.subtype == "compact_boundary":
                s.b.compact()
                s.path_len.clear()
            s.remember(rec.uuid)
            return None
        if rtype in KNOWN_META_TYPES:
            if rec.uuid is not msgspec.UNSET and rec.sessionId:
                self._session(line, rec).remember(rec.uuid)
            return None
        return "unknown_record_type"

    def _user(self, s: _Session, line: int, rec: _Record, msg: _Message) -> str | None:
        content = msg.content
        if isinstance(content, str):
            self._maybe_rewind(s, rec)
            s.b.user(content)
            return None
        if not isinstance(content, list):
            return "missing_content"
        texts: list[str] = []
        for block in content:
            if isinstance(block, str):
                texts.append(block)
            elif type(block) is not _Block:
                texts.append(_placeholder(None))
            elif block.type == "tool_result":
                call_id = as_str(block.tool_use_id) or as_str(rec.sourceToolUseID)
                s.b.tool_result(call_id, _result_text(block), line)
            elif block.type == "text":
                texts.append(as_str(block.text))
            else:
                texts.append(_placeholder(block))
        if texts:
            self._maybe_rewind(s, rec)
            s.b.user("\n".join(texts))
        return None

    def _maybe_rewind(self, s: _Session, rec: _Record) -> None:
        parent = as_str(rec.parentUuid)
        if parent and parent in s.path_len:
            s.b.flush()
            n = s.path_len[parent]
            if n < len(s.b.messages):
                s.b.truncate(n)
                stale = [u for u, k in s.path_len.items() if k > n]
                for u in stale:
                    del s.path_len[u]

    def _assistant(self, s: _Session, line: int, rec: _Record, msg: _Message) -> str | None:
        if rec.isApiErrorMessage is True:
            return None
        content = msg.content
        if isinstance(content, str):
            content = [_Block(type="text", text=content)]
        if not isinstance(content, list):
            return "missing_content"
        texts: list[str] = []
        thinking: list[str] = []
        calls: list[dict[str, Any]] = []
        for i, block in enumerate(content):
            btype = block.type if type(block) is _Block else None
            if btype == "text":
                t = block.text
                texts.append(t if type(t) is str else "")
            elif btype == "thinking":
                t = block.thinking
                thinking.append(t if type(t) is str else "")
            elif btype == "redacted_thinking":
                thinking.append("[redacted thinking]")
            elif btype in ("tool_use", "server_tool_use"):
                call_id, name, args = block.id, block.name, block.input
                if not call_id or type(call_id) is not str:
                    call_id = f"toolu_synth_{line}_{i}"
                if not name or type(name) is not str:
                    name = "<unnamed>"
                args = "{}" if args is msgspec.UNSET else dumps_str(args)
                calls.append(make_tool_call(call_id, name, args))
            elif btype == "fallback":
                continue  # model-fallback marker, no content
            else:
                texts.append(_placeholder(block if btype is not None else None))
        # str fields, None when absent, empty or not a string (as_str(x) or None, inlined)
        model, ts, rid = msg.model, rec.timestamp, msg.id
        s.b.assistant(
            line,
            _join(texts),
            calls,
            _join(thinking),
            model if type(model) is str and model and model != "<synthetic>" else None,
            ts if type(ts) is str and ts else None,
            rid if type(rid) is str and rid else None,  # response id
        )
        return None


def _join(parts: list[str]) -> str:
    """Non-empty parts joined by newlines (zero or one part: no join)."""
    if len(parts) < 2:
        return parts[0] if parts else ""
    return "\n".join(filter(None, parts))


def _result_text(block: _Block) -> str:
    content = block.content
    if isinstance(content, str):
        text = content
    else:
        parts = []
        for item in as_list(content):
            if isinstance(item, str):
                parts.append(item)
            elif isinstance(item, dict):
                if item.get("type") == "text":
                    parts.append(as_str(item.get("text")))
                else:
                    parts.append(_placeholder(item))
        text = "\n".join(parts)
    if block.is_error is True:
        text = f"[error] {text}"
    return text


def _placeholder(block: _Block | dict[str, Any] | None) -> str:
    """``[image: image/png]`` for a block the reader does not convert (``None``: not an object;
    a dict: an item inside tool-result content)."""
    if block is None:
        btype, source = "unknown", None
    elif isinstance(block, dict):
        btype, source = as_str(block.get("type")) or "unknown", block.get("source")
    else:
        btype, source = as_str(block.type) or "unknown", block.source
    if btype in ("image", "document"):
        media = as_str(as_dict(source).get("media_type"))
        return f"[{btype}{': ' + media if media else ''}]"
    return f"[{btype} block]"
