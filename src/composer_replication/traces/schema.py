"""`TraceState`: one decision point of a recorded agent session, ready for teacher replay.

A state is "everything the agent had seen" (``prefix``, OpenAI chat-completions messages) plus
"what the agent did next" (``action``). Teacher replay sends ``prefix`` as-is to a teacher and
compares the teacher's answer with ``action``.

Message shapes in ``prefix`` (OpenAI chat format, https://platform.openai.com/docs/api-reference/chat):

- ``{"role": "system" | "user", "content": str}``
- ``{"role": "assistant", "content": str, "tool_calls": [ToolCall, ...]}`` (``tool_calls`` only
  when non-empty); a ToolCall is ``{"id": str, "type": "function",
  "function": {"name": str, "arguments": str}}`` with ``arguments`` a JSON string
- ``{"role": "tool", "tool_call_id": str, "content": str}``

Thinking / reasoning text is never part of ``prefix``; it stays on ``Action.thinking`` of the
step that produced it. All text has been through redaction before a state is created.

The schema is versioned (``SCHEMA_VERSION``); field names are stable.

States of one session share their messages (`PrefixView`): a reader's states hold views of
the session's message list instead of copies of it, so making a session's n states costs O(n)
time and holding them O(n) memory, not O(n^2) (all states of a 10,000-turn Gemini CLI session
held: 2.15 s and 1.18 GB with copies, 0.20 s and 35 MB with views; docs/benchmarks.md "Long
sessions: shared prefixes"). A state's prefix list is made when it is first read.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

import orjson
from xxhash import xxh3_128_digest, xxh3_128_hexdigest

SCHEMA_VERSION = 2
"""2 (issue 57): ``meta.context_complete``, ``meta.context_note`` and ``meta.response_id``.
Version 1 states load with their defaults (complete, no note, no response id)."""

Message = dict[str, Any]


class PrefixView:
    """The first ``n`` messages of ``messages``: what `TraceState` holds until its prefix is
    read, instead of a copy. Valid while ``messages`` is only appended to; whoever owns the
    list (``traces._base.SessionBuilder``) starts a new list instead of cutting this one."""

    __slots__ = ("messages", "n")

    def __init__(self, messages: list[Message], n: int) -> None:
        self.messages = messages
        self.n = n

    def materialize(self) -> list[Message]:
        """The messages as a new list (the messages themselves are shared, not copied)."""
        return self.messages[: self.n]


class _SharedPrefix:
    """The slot a `TraceState` keeps its `PrefixView` in until the prefix is first read."""

    __slots__ = ("_prefix_view",)


@dataclass(slots=True)
class Action:
    """What the agent produced at one step: visible text, tool calls, and hidden thinking."""

    text: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    thinking: str = ""

    def as_message(self) -> Message:
        """The assistant message this action adds to the conversation (thinking excluded)."""
        msg: Message = {"role": "assistant", "content": self.text}
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        return msg

    def is_empty(self) -> bool:
        return not (self.text or self.tool_calls or self.thinking)


@dataclass(slots=True)
class StateMeta:
    """Where a state came from.

    ``line`` is the 1-based line in ``file`` of the record that started the action (for whole-file
    JSON formats, the 1-based index of the item inside the document, flagged by
    ``line_is_item_index``). ``segment`` increments whenever the live context is rebuilt inside a
    session (compaction, or a rewind to an earlier message); within one segment the prefix only
    grows. ``subagent_id`` is set for sidechain / sub-agent sessions.

    ``context_complete`` is False when the log cannot give back what the model saw at this
    step; ``context_note`` says why (``encrypted_compaction``: the summary that replaced the
    context is encrypted; ``hosted_tool_result_not_logged``: a hosted tool's results, such as
    Codex web search, ran on the provider's side; ``thinking_not_logged``: this response's
    thinking was logged empty). ``replay`` and ``pairs`` skip such states unless asked.
    ``response_id`` is the model response's id when the log has one (two sources of one
    decision are deduplicated by it).
    """

    source_format: str
    file: str
    line: int
    model: str | None = None
    timestamp: str | None = None
    subagent_id: str | None = None
    is_sidechain: bool = False
    after_compaction: bool = False
    segment: int = 0
    line_is_item_index: bool = False
    context_complete: bool = True
    context_note: str | None = None
    response_id: str | None = None


@dataclass(slots=True, init=False)
class TraceState(_SharedPrefix):
    """One replayable step of an agent session. See the module docstring for message shapes.

    ``prefix`` is a list of messages; a state made by a reader holds a `PrefixView` of its
    session's messages instead, and makes the list the first time ``prefix`` is read (then it
    is this state's own list, as a copy was before: changing it changes no other state).
    `to_json` serializes such a state without keeping that list.
    """

    state_id: str
    session_id: str
    step: int
    prefix: list[Message]
    action: Action
    meta: StateMeta
    schema_version: int = SCHEMA_VERSION
    tools: list[dict[str, Any]] | None = None
    """The source harness's tool schemas (OpenAI ``tools`` list) when its vocabulary has a
    harness profile (traces/harness_tools.py: Claude Code, Codex CLI); replay sends them to
    teachers. Not part of ``state_id``."""

    def __init__(
        self,
        state_id: str,
        session_id: str,
        step: int,
        prefix: list[Message] | PrefixView,
        action: Action,
        meta: StateMeta,
        schema_version: int = SCHEMA_VERSION,
        tools: list[dict[str, Any]] | None = None,
    ) -> None:
        self.state_id = state_id
        self.session_id = session_id
        self.step = step
        if type(prefix) is PrefixView:
            self._prefix_view = prefix  # ``prefix`` stays unset: `__getattr__` makes it
        else:
            self.prefix = prefix
        self.action = action
        self.meta = meta
        self.schema_version = schema_version
        self.tools = tools

    def __getattr__(self, name: str) -> Any:
        """Called only for an attribute that is not set: ``prefix`` of a state that holds a
        `PrefixView`. The list is kept (orjson, like other C code, reads an attribute expecting
        the object to hold what it returns)."""
        view = self._view() if name == "prefix" else None
        if view is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        prefix = view.materialize()
        self.prefix = prefix
        self._drop_view()  # this state no longer holds on to the session's list
        return prefix

    def _drop_view(self) -> None:
        try:
            del self._prefix_view
        except AttributeError:  # another thread read the prefix at the same time
            pass

    def _view(self) -> PrefixView | None:
        """The `PrefixView` this state holds while its ``prefix`` is unset, else None."""
        try:
            view = self._prefix_view  # unset: `__getattr__` raises AttributeError
        except AttributeError:
            return None
        try:
            _PREFIX_SLOT.__get__(self)  # set: a prefix assigned after the state was made wins
        except AttributeError:
            return view
        self._drop_view()
        return None

    def _prefix_list(self) -> list[Message]:
        """``prefix`` without keeping the list a `PrefixView` makes."""
        view = self._view()
        return self.prefix if view is None else view.materialize()

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle (and `copy`) the prefix's messages, never the whole session a view is of."""
        prefix = self._prefix_list()
        return type(self), tuple(prefix if k == "prefix" else getattr(self, k) for k in _FIELDS)

    def to_json(self) -> bytes:
        """Serialize to one JSON document (bytes, no trailing newline). A state holding a
        `PrefixView` is serialized from it without keeping the list it makes."""
        if self._view() is None:
            return orjson.dumps(self)
        prefix = self._prefix_list()  # the same keys in the same order as orjson.dumps(self)
        return orjson.dumps({k: prefix if k == "prefix" else getattr(self, k) for k in _FIELDS})

    @classmethod
    def from_json(cls, data: bytes | str) -> TraceState:
        """Inverse of `to_json`. Raises ValueError naming the missing/invalid field (such as
        ``field prefix[1]: expected an object, got int``): states written by other tools are
        checked here, before a replay journals them or sends them anywhere."""
        obj = orjson.loads(data)
        if not isinstance(obj, dict):
            raise ValueError("TraceState JSON must be an object")
        check_types(obj)
        try:
            return cls(
                state_id=obj["state_id"],
                session_id=obj["session_id"],
                step=obj["step"],
                prefix=obj["prefix"],
                action=Action(**obj["action"]),
                meta=StateMeta(**obj["meta"]),
                schema_version=obj.get("schema_version", SCHEMA_VERSION),
                tools=obj.get("tools"),
            )
        except KeyError as exc:
            raise ValueError(f"TraceState JSON is missing field {exc.args[0]!r}") from exc
        except TypeError as exc:
            raise ValueError(f"TraceState JSON has an invalid field: {exc}") from exc

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_FIELDS = tuple(f.name for f in fields(TraceState))
_PREFIX_SLOT = TraceState.prefix  # the slot's descriptor: reads it without `__getattr__`

STATE_TYPES: dict[str, tuple[type, ...]] = {
    "state_id": (str,),
    "session_id": (str,),
    "step": (int,),
    "prefix": (list,),
    "action": (dict,),
    "meta": (dict,),
    "schema_version": (int,),
    "tools": (list, type(None)),
}
ACTION_TYPES: dict[str, tuple[type, ...]] = {
    "text": (str,),
    "tool_calls": (list,),
    "thinking": (str,),
}
META_TYPES: dict[str, tuple[type, ...]] = {
    "source_format": (str,),
    "file": (str,),
    "line": (int,),
    "model": (str, type(None)),
    "timestamp": (str, type(None)),
    "subagent_id": (str, type(None)),
    "is_sidechain": (bool,),
    "after_compaction": (bool,),
    "segment": (int,),
    "line_is_item_index": (bool,),
    "context_complete": (bool,),
    "context_note": (str, type(None)),
    "response_id": (str, type(None)),
}
ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})


class FieldError(ValueError):
    """A TraceState field of the wrong type; the message names the field's path."""

    def __init__(self, where: str, expected: str, got: Any):
        super().__init__(f"field {where}: expected {expected}, got {_kind(got)}")


KIND_NAMES = {
    dict: "an object",
    list: "a list",
    str: "a string",
    int: "an integer",
    bool: "a boolean",
    float: "a number",
    type(None): "null",
}


def _kind(x: Any) -> str:
    return KIND_NAMES.get(type(x), type(x).__name__)


def _check(obj: dict[str, Any], types: dict[str, tuple[type, ...]], where: str) -> None:
    """Type-check the fields of ``obj`` that ``types`` names (missing ones are left to the
    constructor, which names them); a bool is not an int here."""
    for key, allowed in types.items():
        if key in obj:
            v = obj[key]
            if not isinstance(v, allowed) or (isinstance(v, bool) and bool not in allowed):
                names = " or ".join(KIND_NAMES[t] for t in allowed)
                raise FieldError(f"{where}{key}", names, v)


def check_types(obj: dict[str, Any]) -> None:
    """Raise `FieldError` if a field of a decoded TraceState has the wrong type, down to each
    prefix message and tool call (the shapes in the module docstring)."""
    _check(obj, STATE_TYPES, "")
    for i, msg in enumerate(obj.get("prefix") or ()):
        _check_message(msg, f"prefix[{i}]")
    action = obj.get("action")
    if isinstance(action, dict):
        _check(action, ACTION_TYPES, "action.")
        _check_calls(action.get("tool_calls"), "action.tool_calls")
    if isinstance(obj.get("meta"), dict):
        _check(obj["meta"], META_TYPES, "meta.")


def _check_message(msg: Any, where: str) -> None:
    if not isinstance(msg, dict):
        raise FieldError(where, "an object", msg)
    role = msg.get("role")
    if not isinstance(role, str) or role not in ROLES:  # (a list role is unhashable)
        raise FieldError(f"{where}.role", "one of " + ", ".join(sorted(ROLES)), role)
    content = msg.get("content")
    if not isinstance(content, (str, list, type(None))):
        raise FieldError(f"{where}.content", "a string, a list of parts or null", content)
    for j, part in enumerate(content if isinstance(content, list) else ()):
        if not isinstance(part, dict):
            raise FieldError(f"{where}.content[{j}]", "an object", part)
    if msg["role"] == "tool" and not isinstance(msg.get("tool_call_id"), str):
        raise FieldError(f"{where}.tool_call_id", "a string", msg.get("tool_call_id"))
    _check_calls(msg.get("tool_calls"), f"{where}.tool_calls")


def _check_calls(calls: Any, where: str) -> None:
    if calls is None:
        return
    if not isinstance(calls, list):
        raise FieldError(where, "a list", calls)
    for k, call in enumerate(calls):
        at = f"{where}[{k}]"
        if not isinstance(call, dict):
            raise FieldError(at, "an object", call)
        if not isinstance(call.get("id"), str):
            raise FieldError(f"{at}.id", "a string", call.get("id"))
        fn = call.get("function")
        if not isinstance(fn, dict):
            raise FieldError(f"{at}.function", "an object", fn)
        for key in ("name", "arguments"):
            if not isinstance(fn.get(key), str):
                raise FieldError(f"{at}.function.{key}", "a string", fn.get(key))


def message_digest(prev: bytes, message: Message) -> bytes:
    """Chain hash: XXH3-128 of (previous digest, this message's JSON). A prefix's digest is the
    fold over its messages, so it is computed once per message, not once per state."""
    return xxh3_128_digest(prev + orjson.dumps(message))


def compute_state_id(
    session_id: str | bytes, step: int, prefix_digest: bytes, action: Action
) -> str:
    """Stable content hash of (session, step, prefix, action): same input bytes, same id.

    XXH3-128 (https://github.com/Cyan4973/xxHash, output format frozen since v0.8.0) of
    ``session_id`` (UTF-8; may be passed pre-encoded), ``\\0<step>\\0``, the prefix's
    `message_digest` chain and the action's JSON. A 128-bit hash makes accidental collisions
    negligible; XXH3 is not cryptographic, so logs crafted to collide could share an id.
    """
    if isinstance(session_id, str):
        session_id = session_id.encode("utf-8", "surrogatepass")
    head = b"%b\x00%d\x00%b" % (session_id, step, prefix_digest)
    return xxh3_128_hexdigest(head + orjson.dumps(action))
