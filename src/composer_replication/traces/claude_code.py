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
- Causal order (issue 57): a record is read after its parent (``parentUuid``), not in file
  order: a record whose parent is not read yet waits (a tool result may be written before its
  own call), and is read right after its parent. It waits for at most ``WAIT_WINDOW`` later
  records (memory stays bounded); a parent that does not come by then, or by the end of the
  file, is missing: the record is read in file order and counted as a ``missing_parent``
  warning. Each root-to-leaf path of the tree is a segment: a record whose parent is an earlier
  point of the conversation (a rewind, a branch) truncates the prefix to what followed that
  parent (``meta.segment`` increments, the report counts a ``rewind``). Not handled: two
  branches interleaved record by record in the file (the later one continues from the latest
  path).
- Parallel tool calls: one response's ``tool_use`` blocks, written interleaved with their
  results, stay one action (see `SessionBuilder`).
- Thinking logged as an empty string (newer models log only a signature): the state is marked
  ``context_complete: false`` (``thinking_not_logged``).
- ``<system-reminder>`` text stays in user content: it is part of what the model saw.
- Known non-conversational records (summary, queue-operation, attachment, progress,
  file-history-snapshot, titles, modes, links, ...) are parsed and produce nothing; any other
  ``type`` is counted as an unknown record type.
- A whole-file export ``{"loglines": [...]}`` (claude-code-transcripts) is read item by item.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

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
    signature: Any = None


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


WAIT_WINDOW = 64
"""Records a record whose parent is not read yet may wait for it (then: missing parent)."""
SEEN_RECENT = 512
"""Recent uuids remembered across sessions; older ones are known by their session's rewind map
(``_Session.path_len``, cleared at a compaction): memory stays flat however long the file."""


def read(ctx: ReaderContext) -> Iterator[TraceState]:
    reader = _ClaudeReader(ctx)
    if ctx.path.suffix == ".json":
        yield from reader.read_document()
    else:
        yield from run_jsonl(ctx, reader.handle, trigger_scan=True, decode=_decode_record)
        reader.release_all(_late_line_skip(ctx))
        yield from ctx.drain()
    reader.finish()
    yield from ctx.drain()


def _late_line_skip(ctx: ReaderContext) -> Callable[[int, str], None]:
    """Skip a line already counted as parsed (it waited for its parent, then was refused)."""

    def skip(line: int, reason: str) -> None:
        ctx.report.parsed -= 1
        ctx.report.skip(line, reason)

    return skip


BRANCH_SWITCH_BUDGET = 500_000
"""Entries a file's branch switches may scan and messages they may rebuild (each switch pays
its session's uuid maps and the branch's length; a few seconds at most). Real logs switch
branches a handful of times; a log written to switch at every record (quadratic work) runs
out, and its later records continuing a cut-off branch stay on the current prefix, marked
``context_complete: false``, with one ``branch_switch_budget`` warning."""


class _Node(NamedTuple):
    """A record waiting for its parent."""

    line: int
    rec: _Record
    clean: bool  # the line held no redaction trigger
    session: _Session


class _Branch(NamedTuple):
    """Messages a rewind cut off: after the first ``n`` (whose digest was ``digest``)."""

    n: int
    digest: bytes | None
    tail: list[dict[str, Any]]


class _Session:
    """A builder plus the uuid -> prefix-length map used to resolve rewinds, and the branches
    rewinds cut off (uuid -> branch, prefix length after it), to return to one."""

    def __init__(self, builder: SessionBuilder, budget: list[int]) -> None:
        self.b = builder
        self.path_len: dict[str, int] = {}
        self.cut: dict[str, tuple[_Branch, int]] = {}
        self.budget = budget  # the file's switch budget left, shared by its sessions

    def cut_after(self, n: int) -> None:
        """Rewind to the first ``n`` messages; the records after are kept as a branch."""
        self._keep(n)
        self.b.truncate(n)

    def _keep(self, n: int) -> None:
        """Keep the records after the first ``n`` messages as a branch one can return to."""
        b = self.b
        branch = _Branch(n, b.prefix_digest(n), b.tail(n))
        stale = [(u, k) for u, k in self.path_len.items() if k > n]
        for u, k in stale:
            del self.path_len[u]
            if len(self.cut) >= MAX_PATH_ENTRIES:
                self.cut.pop(next(iter(self.cut)))
            self.cut[u] = (branch, k)

    def back_to(self, uuid: str) -> None:
        """A record continues the cut-off branch of ``uuid``: the prefix becomes that branch
        (when the messages it grew from are still the current prefix's)."""
        branch, k = self.cut.pop(uuid)
        b = self.b
        if b.prefix_digest(branch.n) != branch.digest:
            return  # a later rewind changed what the branch grew from: not recoverable
        cost = len(self.path_len) + len(self.cut) + len(branch.tail)
        if cost > self.budget[0]:
            if self.budget[0] >= 0:  # the first refusal of the file
                b.ctx.report.warnings["branch_switch_budget"] += 1
                self.budget[0] = -1
            b.mark_incomplete("branch_switch_budget: a cut-off branch was not rebuilt")
            return
        self.budget[0] -= cost
        self._keep(branch.n)  # the branch being left can be returned to as well
        b.restore(branch.n, branch.tail[: k - branch.n])
        for u, (br, kk) in list(self.cut.items()):
            if br is branch and kk <= k:
                del self.cut[u]
                self.path_len[u] = kk
        self.path_len[uuid] = k

    def remember(self, uuid: Any) -> None:
        """Record the prefix length after record ``uuid`` (ignored unless a non-empty str)."""
        if not uuid or type(uuid) is not str:
            return
        path_len = self.path_len
        if len(path_len) >= MAX_PATH_ENTRIES:
            path_len.pop(next(iter(path_len)))
        b = self.b  # b.length_after_pending(), inlined: this runs for every record
        path_len[uuid] = len(b.messages) + (b.pending is not None)


class _ClaudeReader:
    def __init__(self, ctx: ReaderContext) -> None:
        self.ctx = ctx
        self.sessions: dict[str, _Session] = {}
        self.switch_budget = [BRANCH_SWITCH_BUDGET]
        self.side_owner: dict[str, str] = {}  # sidechain uuid -> session key
        self.last_side: dict[str, str] = {}  # main session id -> latest sidechain key
        self.seen: dict[str, None] = {}  # recent uuids read (with each session's path_len)
        self.waiting: dict[str, list[_Node]] = {}  # parent uuid -> records waiting for it
        self.n_waiting = 0
        self.skip_late: Callable[[int, str], None] = _late_line_skip(ctx)
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
        self.ctx.report.items = len(items)
        self.skip_late = self.ctx.report.skip_item
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
        self.release_all(self.ctx.report.skip_item)
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
            s = self.sessions[key] = _Session(b, self.switch_budget)
        return s

    # -- records
    def handle(self, line: int, rec: _Record) -> str | None:
        """Route a record to its session and read it, or let it wait for its parent."""
        rtype = rec.type
        if rtype == "assistant" or rtype == "user":
            if type(rec.message) is not _Message:
                return "message_not_an_object"
            sid = rec.sessionId
            s = None
            if type(sid) is str and sid and rec.isSidechain is not True and not self.file_agent:
                s = self.sessions.get(sid)  # the common case of `_session`, inlined
            if s is None:
                s = self._session(line, rec)
        elif not isinstance(rtype, str):
            return "missing_type"
        elif rtype == "system":
            s = self._session(line, rec)
        elif rtype in KNOWN_META_TYPES:
            if rec.uuid is msgspec.UNSET or not rec.sessionId:
                return None  # outside the conversation tree: nothing to place
            s = self._session(line, rec)
        else:
            return "unknown_record_type"
        parent = rec.parentUuid
        if type(parent) is str and parent and parent not in self.seen and parent not in s.path_len:
            self._wait(parent, _Node(line, rec, self.ctx.clean_line, s))
            return None
        return self._run(s, line, rec)

    def _wait(self, parent: str, node: _Node) -> None:
        self.waiting.setdefault(parent, []).append(node)
        self.n_waiting += 1
        if self.n_waiting > WAIT_WINDOW:
            self._release_oldest()

    def _release_oldest(self) -> None:
        """The record that waited longest for a parent that is not itself waiting: that parent
        is missing, the record is read now (if all wait on each other: a ``parent_cycle``)."""
        waiting_uuids = {
            n.rec.uuid for nodes in self.waiting.values() for n in nodes if type(n.rec.uuid) is str
        }
        free = [p for p in self.waiting if p not in waiting_uuids]
        kind = "missing_parent" if free else "parent_cycle"
        parent = min(free or self.waiting, key=lambda p: self.waiting[p][0].line)
        nodes = self.waiting[parent]
        node = nodes.pop(0)
        if not nodes:
            del self.waiting[parent]
        self.n_waiting -= 1
        self.ctx.report.warnings[kind] += 1
        clean = self.ctx.clean_line
        self.ctx.clean_line = node.clean
        reason = self._run(node.session, node.line, node.rec, missing_parent=True)
        self.ctx.clean_line = clean
        if reason is not None:
            self.skip_late(node.line, reason)

    def release_all(self, skip: Callable[[int, str], None]) -> None:
        """End of the records: those still waiting have no parent here (file order)."""
        self.skip_late = skip
        while self.waiting:
            self._release_oldest()
        self.ctx.clean_line = False

    def _run(self, s: _Session, line: int, rec: _Record, missing_parent: bool = False):
        """Read a record, then the records that waited for it (depth first, file order)."""
        reason = self._apply(s, line, rec, missing_parent)
        kids = self.waiting.pop(rec.uuid, None) if type(rec.uuid) is str else None
        if not kids:
            return reason
        self.n_waiting -= len(kids)
        clean = self.ctx.clean_line
        stack = kids[::-1]
        while stack:
            node = stack.pop()
            self.ctx.clean_line = node.clean
            try:
                why = self._apply(node.session, node.line, node.rec)
            except Exception as exc:  # noqa: BLE001 - reported per record
                why = f"reader_error:{type(exc).__name__}"
            if why is not None:
                self.skip_late(node.line, why)
            more = self.waiting.pop(node.rec.uuid, None) if type(node.rec.uuid) is str else None
            if more:
                self.n_waiting -= len(more)
                stack.extend(reversed(more))
        self.ctx.clean_line = clean
        return reason

    def _apply(
        self, s: _Session, line: int, rec: _Record, missing_parent: bool = False
    ) -> str | None:
        if not missing_parent:
            self._follow(s, rec)
        uuid = rec.uuid
        if type(uuid) is str and uuid:
            if len(self.seen) >= SEEN_RECENT:
                self.seen.pop(next(iter(self.seen)))
            self.seen[uuid] = None
        rtype = rec.type
        if rtype == "user":
            reason = self._user(s, line, rec, rec.message)
        elif rtype == "assistant":
            reason = self._assistant(s, line, rec, rec.message)
        else:
            reason = None
            if rtype == "system" and rec.subtype == "compact_boundary":
                s.b.compact()
                s.path_len.clear()
                s.cut.clear()
        s.remember(rec.uuid)
        return reason

    def _follow(self, s: _Session, rec: _Record) -> None:
        """Before a record: if its parent is an earlier point of the conversation (a rewind,
        another branch of the tree), cut the prefix back to what followed that parent; if its
        parent is on a branch an earlier rewind cut off, go back to that branch."""
        parent = rec.parentUuid
        if type(parent) is not str:
            return
        if parent not in s.path_len:
            if parent in s.cut:
                s.back_to(parent)
            return
        n = s.path_len[parent]
        if n < s.b.length_after_pending():
            s.cut_after(n)

    def _user(self, s: _Session, line: int, rec: _Record, msg: _Message) -> str | None:
        content = msg.content
        if isinstance(content, str):
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
                call_id = as_str(block.tool_use_id)
                if not call_id:  # the record's id, if a call waits for it; else the oldest call
                    source = as_str(rec.sourceToolUseID)
                    call_id = source if s.b.waits_for(source) else ""
                s.b.tool_result(call_id, _result_text(block), line)
            elif block.type == "text":
                texts.append(as_str(block.text))
            else:
                texts.append(_placeholder(block))
        if texts:
            s.b.user("\n".join(texts))
        return None

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
        note = None
        for i, block in enumerate(content):
            btype = block.type if type(block) is _Block else None
            if btype == "text":
                t = block.text
                texts.append(t if type(t) is str else "")
            elif btype == "thinking":
                t = block.thinking
                thinking.append(t if type(t) is str else "")
                if not t:  # logged empty (a signature only): the reasoning is not in the log
                    note = "thinking_not_logged"
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
            elif type(btype) is str and btype.endswith("_tool_result") and block.tool_use_id:
                # a hosted tool's result inside the response (web search, code execution):
                # what came before is one decision, what follows saw this result
                if texts or calls or thinking:
                    self._emit(s, line, rec, msg, texts, calls, thinking, note)
                texts, thinking, calls, note = [], [], [], None
                s.b.hosted_result(as_str(block.tool_use_id), _hosted_text(block), line,
                                  "hosted_tool_result_not_logged")  # fmt: skip
            else:
                texts.append(_placeholder(block if btype is not None else None))
        self._emit(s, line, rec, msg, texts, calls, thinking, note)
        return None

    def _emit(
        self,
        s: _Session,
        line: int,
        rec: _Record,
        msg: _Message,
        texts: list[str],
        calls: list[dict[str, Any]],
        thinking: list[str],
        note: str | None,
    ) -> None:
        """Add one record's assistant output (its blocks up to a hosted result) to the action."""
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
            note,
        )


def _hosted_text(block: _Block) -> str:
    """A hosted tool result's text: each search result's title and URL (their page content is
    encrypted), an error's code, or placeholders."""
    content = block.content
    if isinstance(content, dict):
        code = as_str(content.get("error_code"))
        return f"[error] {code}" if code else _placeholder(content)
    lines = []
    for item in as_list(content):
        item = as_dict(item)
        title, url = as_str(item.get("title")), as_str(item.get("url"))
        lines.append(f"{title} <{url}>" if url else _placeholder(item))
    return "\n".join(lines) or f"[{as_str(block.type)}]"


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
