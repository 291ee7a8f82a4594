"""A local Hugging Face chat model that answers OpenAI chat requests: shared by the in-process
teacher (`LocalHFTeacher`) and the OpenAI-compatible server (`server.py`).

Small chat templates (SmolLM2's, for one) only know ``role`` and ``content``. Messages are
therefore flattened before templating: an assistant message's ``tool_calls`` become
``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` lines (the Hermes / Qwen convention), a
``tool`` message becomes a ``user`` message ``[tool result <id>] ...``, and when the request lists
``tools`` a system note describes them and that format. Generated text is parsed back: each
well-formed ``<tool_call>`` block becomes an OpenAI ``tool_calls`` entry.
"""

from __future__ import annotations

import re
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson

TOOL_CALL_RE = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)


@dataclass
class Generation:
    """One answer of a local model, with honest token counts."""

    text: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = "stop"
    truncated_prompt_tokens: int = 0


def tool_call_text(call: dict[str, Any]) -> str:
    """Render one OpenAI tool call as a ``<tool_call>`` line."""
    fn = call.get("function") or {}
    args = fn.get("arguments", "{}")
    try:
        args_obj = orjson.loads(args) if isinstance(args, str) else args
    except orjson.JSONDecodeError:
        args_obj = args
    body = orjson.dumps({"name": fn.get("name", ""), "arguments": args_obj}).decode()
    return f"<tool_call>{body}</tool_call>"


def flatten_message(msg: dict[str, Any]) -> dict[str, str]:
    """An OpenAI chat message as a plain ``{role, content}`` message any chat template renders."""
    role = msg.get("role", "user")
    content = msg.get("content") or ""
    if isinstance(content, list):  # content parts: keep the text parts
        content = "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    if role == "tool":
        return {"role": "user", "content": f"[tool result {msg.get('tool_call_id', '')}] {content}"}
    if role == "assistant" and msg.get("tool_calls"):
        calls = "\n".join(tool_call_text(c) for c in msg["tool_calls"])
        content = f"{content}\n{calls}" if content else calls
    if role not in ("system", "user", "assistant"):
        role = "user"
    return {"role": role, "content": content}


def tools_note(tools: list[dict[str, Any]]) -> str:
    """System text listing the available tools and the call format we parse."""
    names = []
    for t in tools:
        fn = t.get("function", t)
        desc = fn.get("description", "")
        names.append(f"- {fn.get('name', '?')}" + (f": {desc}" if desc else ""))
    return (
        "You can call these tools:\n"
        + "\n".join(names)
        + '\nTo call one, answer with <tool_call>{"name": NAME, "arguments": {...}}</tool_call>.'
    )


def flatten_messages(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
) -> list[dict[str, str]]:
    """Flatten a whole conversation; tool descriptions join (or become) the system message."""
    flat = [flatten_message(m) for m in messages]
    if tools:
        note = tools_note(tools)
        if flat and flat[0]["role"] == "system":
            flat[0] = {"role": "system", "content": f"{flat[0]['content']}\n\n{note}"}
        else:
            flat.insert(0, {"role": "system", "content": note})
    return flat


def parse_tool_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """Split generated text into (remaining text, OpenAI tool_calls). Malformed blocks stay text."""
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    pos = 0
    for m in TOOL_CALL_RE.finditer(text):
        try:
            obj = orjson.loads(m.group(1))
        except orjson.JSONDecodeError:
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            continue
        kept.append(text[pos : m.start()])
        pos = m.end()
        args = obj.get("arguments", {})
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:12]}",
                "type": "function",
                "function": {
                    "name": obj["name"],
                    "arguments": args if isinstance(args, str) else orjson.dumps(args).decode(),
                },
            }
        )
    kept.append(text[pos:])
    return "".join(kept).strip(), calls


class LocalChatModel:
    """A causal LM + tokenizer answering chat requests; one generation at a time (a lock), since
    a CPU forward already uses every core.

    ``max_prompt_tokens`` keeps the last tokens of a longer prompt (the prompt's start is cut);
    ``usage.prompt_tokens`` counts the tokens actually fed.
    """

    def __init__(self, model_ref: str, max_prompt_tokens: int = 2048, dtype: str = "float32"):
        from composer_replication.models import load_model, load_tokenizer

        self.model_ref = model_ref
        self.tokenizer = load_tokenizer(model_ref)
        self.model = load_model(model_ref, dtype=dtype).eval()
        self.max_prompt_tokens = max_prompt_tokens
        self._lock = threading.Lock()

    @classmethod
    def from_objects(cls, model: Any, tokenizer: Any, max_prompt_tokens: int = 2048):
        """Wrap an already loaded model and tokenizer (tests, benchmarks)."""
        self = cls.__new__(cls)
        self.model_ref = getattr(model.config, "_name_or_path", "model")
        self.model, self.tokenizer = model.eval(), tokenizer
        self.max_prompt_tokens = max_prompt_tokens
        self._lock = threading.Lock()
        return self

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None):
        flat = flatten_messages(messages, tools)
        ids = self.tokenizer.apply_chat_template(
            flat, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        if hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        ids = list(ids)
        cut = max(0, len(ids) - self.max_prompt_tokens)
        return ids[cut:], cut

    def generate(
        self,
        messages: list[dict[str, Any]],
        *,
        max_tokens: int = 64,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> Generation:
        """Answer one chat request (greedy when ``temperature`` is 0)."""
        import torch

        ids, cut = self.prompt_ids(messages, tools)
        input_ids = torch.tensor([ids])
        kwargs: dict[str, Any] = {"max_new_tokens": max_tokens, "do_sample": temperature > 0}
        if temperature > 0:
            kwargs.update(temperature=temperature, top_p=top_p, top_k=0)
        with self._lock, torch.no_grad():
            if seed is not None:
                torch.manual_seed(seed)
            out = self.model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                pad_token_id=self.tokenizer.pad_token_id,
                **kwargs,
            )
        new = out[0, len(ids) :].tolist()
        eos = self.tokenizer.eos_token_id
        finish = "stop" if (new and new[-1] == eos) or len(new) < max_tokens else "length"
        text = self.tokenizer.decode(new, skip_special_tokens=True)
        content, calls = parse_tool_calls(text) if tools else (text.strip(), [])
        return Generation(
            text=content,
            tool_calls=calls,
            prompt_tokens=len(ids),
            completion_tokens=len(new),
            finish_reason="tool_calls" if calls else finish,
            truncated_prompt_tokens=cut,
        )
