"""An agent's answer as an identity: tool calls as ``name(canonical JSON args)`` in order,
else the text with whitespace collapsed and case folded. Replay counts distinct answers with
it; preference extraction groups teachers' answers by it (prefs/agreement.py)."""

from __future__ import annotations

import re
from typing import Any

import orjson

from composer_replication.traces.schema import Action

Message = dict[str, Any]
_WS = re.compile(r"\s+")


def as_message(action: Action | Message) -> Message:
    """An assistant message from an `Action` or a message dict."""
    if isinstance(action, Action):
        return action.as_message()
    msg: Message = {"role": "assistant", "content": action.get("content") or ""}
    if action.get("tool_calls"):
        msg["tool_calls"] = action["tool_calls"]
    return msg


def canonical_args(arguments: Any) -> str:
    """Tool-call arguments as canonical JSON (sorted keys); unparsable strings are kept as text."""
    if isinstance(arguments, str):
        try:
            arguments = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return _WS.sub(" ", arguments).strip()
    return orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS).decode()


def normalize_text(text: str) -> str:
    return _WS.sub(" ", text).strip().casefold()


def action_key(action: Action | Message) -> str:
    """Normalized identity of an answer (see the module docstring)."""
    msg = as_message(action)
    calls = msg.get("tool_calls") or []
    if calls:
        return "tools:" + ";".join(
            f"{c['function']['name']}({canonical_args(c['function'].get('arguments', '{}'))})"
            for c in calls
        )
    return "text:" + normalize_text(msg.get("content") or "")


def tool_names(action: Action | Message) -> tuple[str, ...]:
    return tuple(c["function"]["name"] for c in as_message(action).get("tool_calls") or [])
