"""A local Hugging Face chat model that answers OpenAI chat requests: shared by the in-process
teacher (`LocalHFTeacher`) and the OpenAI-compatible server (`server.py`).

Requests are rendered by `composer_replication.lm.chat.render_prompt` (tool calls, tool results and
listed ``tools`` included, in the format its docstring defines); when the request lists
``tools``, each well-formed ``<tool_call>`` block of the generated text becomes an OpenAI
``tool_calls`` entry (`composer_replication.lm.chat.parse_tool_calls`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from composer_replication.lm.chat import parse_tool_calls, render_prompt


@dataclass
class Generation:
    """One answer of a local model, with honest token counts."""

    text: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = "stop"
    truncated_prompt_tokens: int = 0


class LocalChatModel:
    """A causal LM + tokenizer answering chat requests; one generation at a time (a lock), since
    a CPU forward already uses every core.

    ``max_prompt_tokens`` keeps the last tokens of a longer prompt (the prompt's start is cut);
    ``usage.prompt_tokens`` counts the tokens actually fed.
    """

    def __init__(
        self,
        model_ref: str,
        max_prompt_tokens: int = 2048,
        dtype: str = "float32",
        device: str | None = None,
    ):
        from composer_replication.lm.models import load_model, load_tokenizer

        self.model_ref = model_ref
        self.tokenizer = load_tokenizer(model_ref)
        self.model = load_model(model_ref, dtype=dtype).eval()
        if device is not None:  # else where it loaded
            self.model = self.model.to(device)
        self.max_prompt_tokens = max_prompt_tokens
        self.lock = threading.Lock()  # one forward at a time (generation, scoring)

    @classmethod
    def from_objects(cls, model: Any, tokenizer: Any, max_prompt_tokens: int = 2048):
        """Wrap an already loaded model and tokenizer (tests, benchmarks)."""
        self = cls.__new__(cls)
        self.model_ref = getattr(model.config, "_name_or_path", "model")
        self.model, self.tokenizer = model.eval(), tokenizer
        self.max_prompt_tokens = max_prompt_tokens
        self.lock = threading.Lock()  # one forward at a time (generation, scoring)
        return self

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None):
        text = render_prompt(self.tokenizer, messages, tools=tools)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
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
        input_ids = torch.tensor([ids], device=next(self.model.parameters()).device)
        kwargs: dict[str, Any] = {"max_new_tokens": max_tokens, "do_sample": temperature > 0}
        if temperature > 0:
            kwargs.update(temperature=temperature, top_p=top_p, top_k=0)
        with self.lock, torch.no_grad():
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
            # a cut is "length" even after a whole call (OpenAI's rule: a later call may be cut)
            finish_reason="tool_calls" if calls and finish == "stop" else finish,
            truncated_prompt_tokens=cut,
        )
