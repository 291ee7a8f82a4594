"""Chat rendering: the one place that turns prompts, messages and tool calls into text.

Every caller goes through here: the trainer's prompt (evaluation, the SDPO teacher context),
the replay channel's preference pairs, the local OpenAI-compatible ``serve`` and in-process
teachers, value-of-information gating, pair export, and the plain text a reward or a hint
model reads.

Messages are OpenAI chat messages (``traces/schema.py``): ``role`` + ``content`` (a string,
``None`` or a list of content parts, whose text parts are kept), assistant ``tool_calls``
(``{"function": {"name": ..., "arguments": <JSON string or object>}}``) and ``tool`` results.

Tool-call text format (the Hermes / Qwen2.5 convention; TRL 1.16 parses exactly this back from
generated text: the Qwen response schemas in ``trl/chat_template_utils.py`` take every
``<tool_call>\\s*(.+?)\\s*</tool_call>`` block as one JSON object ``{"name", "arguments"}``)::

    I'll list the files.
    <tool_call>
    {"name": "shell", "arguments": {"command": ["ls"]}}
    </tool_call>

- the JSON is ``json.dumps({"name": ..., "arguments": ...}, ensure_ascii=False)``, which is what
  transformers' ``tojson`` filter writes in Qwen2.5's template (``", "`` / ``": "`` separators,
  keys in their given order). ``arguments`` given as a JSON string (OpenAI wire format) are
  parsed first, so whitespace or key spacing of the wire string never changes the text; a
  string that is not JSON stays a JSON string.
- an assistant message is its content, then one block per call, joined by newlines
  (empty content: the blocks only).
- a tool result is ``<tool_response>\\n{content}\\n</tool_response>`` in a ``user`` turn;
  consecutive tool results share one user turn, joined by a newline. The ``tool_call_id`` is
  not rendered (Qwen2.5's template does not render it either).

Through a ChatML template without tool support (SmolLM2's), the flattened conversation renders
to the same text Qwen2.5's tool-aware template gives the structured conversation (tested in
``tests/unit/lm/test_chat.py``), so a model that learns this format can later switch to a native
tool template without changing what it sees.

Rendering (`render_prompt`): a tokenizer whose chat template renders tool calls and tool results
(TRL's ``supports_tool_calling``, the same check TRL's ``GRPOTrainer`` makes before tool
rollouts) gets the structured messages (arguments as objects) and ``tools``; any other template
gets the flattened messages (`flatten_messages`), with a system note listing ``tools``; a
tokenizer without a chat template (a base model) sees the message texts joined by newlines.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

Message = dict[str, Any]
Prompt = str | Sequence[Mapping[str, Any]]

TOOL_CALL_RE = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)
_FLAT_ROLES = ("system", "user", "assistant")
_TOOL_SUPPORT: dict[str, bool] = {}


# ---- messages ------------------------------------------------------------------------------
def as_messages(prompt: Prompt) -> list[Message]:
    """A prompt as a list of chat messages (copies): a string becomes one user turn."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if not isinstance(prompt, Sequence):
        raise TypeError(
            f"a prompt must be a string or a list of chat messages, got {type(prompt).__name__}"
        )
    out = []
    for i, m in enumerate(prompt):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise ValueError(f"message {i}: expected a mapping with a string 'role', got {m!r:.80}")
        out.append(dict(m))
    return out


def content_text(message: Mapping[str, Any]) -> str:
    """The text of a message's content (``None`` is empty; of content parts, the text parts)."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, Mapping))
    raise TypeError(f"message content must be a string or content parts, got {content!r:.80}")


# ---- tool calls ----------------------------------------------------------------------------
def tool_arguments(arguments: Any) -> Any:
    """Tool-call arguments as an object: a JSON string is parsed; other strings stay strings."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return arguments


def tool_call_parts(call: Mapping[str, Any]) -> tuple[str, Any]:
    """(name, arguments as an object) of an OpenAI ``{"function": {...}}`` or a bare
    ``{"name", "arguments"}`` tool call."""
    fn = call.get("function", call)
    name = fn.get("name") if isinstance(fn, Mapping) else None
    if not isinstance(name, str):
        raise ValueError(f"tool call without a function name: {dict(call)!r:.120}")
    return name, tool_arguments(fn.get("arguments", {}))


def tool_call_text(call: Mapping[str, Any]) -> str:
    """One tool call as a ``<tool_call>`` block (see the module docstring)."""
    name, arguments = tool_call_parts(call)
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


def assistant_text(message: Mapping[str, Any]) -> str:
    """An assistant message's content followed by its tool calls, one block per call."""
    parts = [content_text(message), *(tool_call_text(c) for c in message.get("tool_calls") or [])]
    return "\n".join(p for p in parts if p)


def tool_response_text(message: Mapping[str, Any]) -> str:
    """A tool result as a ``<tool_response>`` block."""
    return f"<tool_response>\n{content_text(message)}\n</tool_response>"


def parse_tool_calls(text: str) -> tuple[str, list[Message]]:
    """Split generated text into (remaining text, OpenAI ``tool_calls``): the inverse of
    `tool_call_text`. Malformed blocks stay text. ``arguments`` become compact JSON strings
    (the OpenAI wire format)."""
    calls: list[Message] = []
    kept: list[str] = []
    pos = 0
    for m in TOOL_CALL_RE.finditer(text):
        try:
            obj = json.loads(m.group(1))
        except json.JSONDecodeError:
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            continue
        kept.append(text[pos : m.start()])
        pos = m.end()
        args = obj.get("arguments", {})
        wire = args if isinstance(args, str) else json.dumps(args, separators=(",", ":"))
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:12]}",
                "type": "function",
                "function": {"name": obj["name"], "arguments": wire},
            }
        )
    kept.append(text[pos:])
    return "".join(kept).strip(), calls


def tools_note(tools: Sequence[Mapping[str, Any]]) -> str:
    """System text listing the available tools and the call format (for templates without
    tool support)."""
    lines = []
    for t in tools:
        fn = t.get("function", t)
        desc = fn.get("description", "")
        lines.append(f"- {fn.get('name', '?')}" + (f": {desc}" if desc else ""))
    return (
        "You can call these tools:\n"
        + "\n".join(lines)
        + '\nTo call one, answer with <tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>'
    )


# ---- whole conversations -------------------------------------------------------------------
def flatten_messages(
    messages: Prompt, tools: Sequence[Mapping[str, Any]] | None = None
) -> list[dict[str, str]]:
    """Plain ``{role, content}`` messages any chat template renders: tool calls and results
    in the text format of the module docstring; ``tools`` described in the system message."""
    flat: list[dict[str, str]] = []
    prev_role = None
    for m in as_messages(messages):
        role = m["role"]
        if role == "tool":
            block = tool_response_text(m)
            if prev_role == "tool":
                flat[-1]["content"] += "\n" + block
            else:
                flat.append({"role": "user", "content": block})
        elif role == "assistant":
            flat.append({"role": "assistant", "content": assistant_text(m)})
        else:
            flat.append(
                {"role": role if role in _FLAT_ROLES else "user", "content": content_text(m)}
            )
        prev_role = role
    if tools:
        note = tools_note(tools)
        if flat and flat[0]["role"] == "system":
            flat[0]["content"] = f"{flat[0]['content']}\n\n{note}"
        else:
            flat.insert(0, {"role": "system", "content": note})
    return flat


def structured_messages(messages: Prompt) -> list[Message]:
    """Messages for a tool-aware template: text content, tool-call arguments as objects."""
    out = []
    for m in as_messages(messages):
        m["content"] = content_text(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [_structured_call(c) for c in m["tool_calls"]]
        out.append(m)
    return out


def _structured_call(call: Mapping[str, Any]) -> Message:
    name, arguments = tool_call_parts(call)
    extra = {k: v for k, v in call.items() if k not in ("function", "name", "arguments")}
    return {**extra, "type": "function", "function": {"name": name, "arguments": arguments}}


def to_text(value: str | Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> str:
    """Plain text of a response or a conversation: a string as is; messages flattened (tool
    calls and results in the text format above) and joined by newlines, empty ones skipped.
    This is the text of a preference pair's answer, of a completion a reward grades and of a
    prompt a hint model reads."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        value = [value]
    if not isinstance(value, Sequence):
        raise TypeError(
            f"expected a string, a chat message or a list of them, got {type(value).__name__}"
        )
    return "\n".join(m["content"] for m in flatten_messages(value) if m["content"])


# ---- the tokenizer's view ------------------------------------------------------------------
def supports_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template renders tool calls and tool results (TRL's check;
    cached per template)."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        return False
    key = template if isinstance(template, str) else json.dumps(template, sort_keys=True)
    if key not in _TOOL_SUPPORT:
        from trl.chat_template_utils import supports_tool_calling

        _TOOL_SUPPORT[key] = bool(supports_tool_calling(tokenizer))
    return _TOOL_SUPPORT[key]


def render_prompt(
    tokenizer: Any,
    prompt: Prompt,
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
) -> str:
    """The exact text the model sees for ``prompt`` (see the module docstring): its chat
    template with a generation prompt when it has one, else the message texts joined by
    newlines."""
    if not getattr(tokenizer, "chat_template", None):
        return "\n".join(m["content"] for m in flatten_messages(prompt, tools))
    if supports_tools(tokenizer):
        return tokenizer.apply_chat_template(
            structured_messages(prompt),
            tools=list(tools) if tools else None,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
        )
    return tokenizer.apply_chat_template(
        flatten_messages(prompt, tools), add_generation_prompt=add_generation_prompt, tokenize=False
    )
