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

from ._base import (
    MAX_PATH_ENTRIES,
    ReaderContext,
    SessionBuilder,
    as_dict,
    as_list,
    as_str,
    dumps_str,
    iter_jsonl,
    load_document,
    make_tool_call,
    run_records,
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


def read(ctx: ReaderContext) -> Iterator[TraceState]:
    reader = _ClaudeReader(ctx)
    if ctx.path.suffix == ".json":
        yield from reader.read_document()
    else:
        yield from run_records(ctx, iter_jsonl(ctx, trigger_scan=True), reader.handle)
    reader.finish()
    yield from ctx.drain()


class _Session:
    """A builder plus the uuid -> prefix-length map used to resolve rewinds."""

    def __init__(self, builder: SessionBuilder) -> None:
        self.b = builder
        self.path_len: dict[str, int] = {}

    def remember(self, uuid: str) -> None:
        if not uuid:
            return
        if len(self.path_len) >= MAX_PATH_ENTRIES:
            self.path_len.pop(next(iter(self.path_len)))
        self.path_len[uuid] = self.b.length_after_pending()


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
                reason = self.handle(i, item)
            except Exception as exc:  # noqa: BLE001
                reason = f"reader_error:{type(exc).__name__}"
            if reason == "unknown_record_type":
                self.ctx.report.unknown_record_types[as_str(item.get("type")) or "<no type>"] += 1
            if reason is not None:
                self.ctx.report.skip_item(i, reason)
            yield from self.ctx.drain()

    def finish(self) -> None:
        for s in self.sessions.values():
            s.b.finish()

    # -- routing
    def _session(self, line: int, rec: dict[str, Any]) -> _Session:
        sid = rec.get("sessionId")
        if not (sid and isinstance(sid, str)):
            sid = as_str(rec.get("session_id")) or self.default_sid
        if rec.get("isSidechain") is not True and self.file_agent is None:
            return self.sessions.get(sid) or self._get(sid, sid, None, False)
        uuid = as_str(rec.get("uuid"))
        agent = as_str(rec.get("agentId")) or None
        agent = agent or self.file_agent
        if agent:
            key = f"{sid}/agent-{agent}"
        else:
            parent = as_str(rec.get("parentUuid"))
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
    def handle(self, line: int, rec: dict[str, Any]) -> str | None:
        rtype = rec.get("type")
        if not isinstance(rtype, str):
            return "missing_type"
        if rtype in ("user", "assistant"):
            msg = rec.get("message")
            if not isinstance(msg, dict):
                return "message_not_an_object"
            s = self._session(line, rec)
            if rtype == "user":
                reason = self._user(s, line, rec, msg)
            else:
                reason = self._assistant(s, line, rec, msg)
            s.remember(as_str(rec.get("uuid")))
            return reason
        if rtype == "system":
            s = self._session(line, rec)
            if rec.get("subtype") == "compact_boundary":
                s.b.compact()
                s.path_len.clear()
            s.remember(as_str(rec.get("uuid")))
            return None
        if rtype in KNOWN_META_TYPES:
            if "uuid" in rec and rec.get("sessionId"):
                self._session(line, rec).remember(as_str(rec.get("uuid")))
            return None
        return "unknown_record_type"

    def _user(self, s: _Session, line: int, rec: dict[str, Any], msg: dict[str, Any]) -> str | None:
        content = msg.get("content")
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
                continue
            block = as_dict(block)
            btype = block.get("type")
            if btype == "tool_result":
                call_id = as_str(block.get("tool_use_id")) or as_str(rec.get("sourceToolUseID"))
                s.b.tool_result(call_id, _result_text(block), line)
            elif btype == "text":
                texts.append(as_str(block.get("text")))
            else:
                texts.append(_placeholder(block))
        if texts:
            self._maybe_rewind(s, rec)
            s.b.user("\n".join(texts))
        return None

    def _maybe_rewind(self, s: _Session, rec: dict[str, Any]) -> None:
        parent = as_str(rec.get("parentUuid"))
        if parent and parent in s.path_len:
            s.b.flush()
            n = s.path_len[parent]
            if n < len(s.b.messages):
                s.b.truncate(n)
                stale = [u for u, k in s.path_len.items() if k > n]
                for u in stale:
                    del s.path_len[u]

    def _assistant(
        self, s: _Session, line: int, rec: dict[str, Any], msg: dict[str, Any]
    ) -> str | None:
        if rec.get("isApiErrorMessage") is True:
            return None
        content = msg.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        if not isinstance(content, list):
            return "missing_content"
        texts: list[str] = []
        thinking: list[str] = []
        calls: list[dict[str, Any]] = []
        for i, block in enumerate(content):
            block = as_dict(block)
            btype = block.get("type")
            if btype == "text":
                texts.append(as_str(block.get("text")))
            elif btype == "thinking":
                thinking.append(as_str(block.get("thinking")))
            elif btype == "redacted_thinking":
                thinking.append("[redacted thinking]")
            elif btype in ("tool_use", "server_tool_use"):
                call_id = as_str(block.get("id")) or f"toolu_synth_{line}_{i}"
                name = as_str(block.get("name")) or "<unnamed>"
                calls.append(make_tool_call(call_id, name, dumps_str(block.get("input", {}))))
            elif btype == "fallback":
                continue  # model-fallback marker, no content
            else:
                texts.append(_placeholder(block))
        model = as_str(msg.get("model")) or None
        s.b.assistant(
            line,
            "\n".join(filter(None, texts)),
            calls,
            "\n".join(filter(None, thinking)),
            model=None if model == "<synthetic>" else model,
            timestamp=as_str(rec.get("timestamp")) or None,
            response_id=as_str(msg.get("id")) or None,
        )
        return None


def _result_text(block: dict[str, Any]) -> str:
    content = block.get("content")
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
    if block.get("is_error") is True:
        text = f"[error] {text}"
    return text


def _placeholder(block: dict[str, Any]) -> str:
    btype = as_str(block.get("type")) or "unknown"
    if btype in ("image", "document"):
        media = as_str(as_dict(block.get("source")).get("media_type"))
        return f"[{btype}{': ' + media if media else ''}]"
    return f"[{btype} block]"
