"""Tool-capable chat templates for models whose own template cannot render tool calls.

TRL's ``GRPOTrainer`` refuses a tokenizer whose template drops tool calls or tool results
(``trl.chat_template_utils.supports_tool_calling``), and parses generated tool calls with the
tokenizer's ``response_template`` (transformers >= 5.13 response parsing), which TRL only knows
for a few hub templates (``add_response_schema``). SmolLM2-135M-Instruct's template has neither,
so :func:`ensure_tool_template` installs ``templates/smollm2_tools.jinja`` and its matching
``response_template``. Format (docs/agents.md)::

    <|im_start|>system\n{system}\n\nYou can call these tools:\n{schema JSON per line}...<|im_end|>
    <|im_start|>assistant\n{text}<tool_call>{"name": "calculate", "arguments": {...}}</tool_call><|im_end|>
    <|im_start|>tool\n{result}<|im_end|>
"""

from __future__ import annotations

from importlib.resources import files
from typing import Any

SMOLLM2_TOOLS = "smollm2_tools.jinja"

# transformers' response-parsing spec for the template above (same shape as TRL's Qwen3 one):
# text up to the first <tool_call> is content; each <tool_call>JSON</tool_call> is one call.
SMOLLM2_TOOLS_RESPONSE_TEMPLATE: dict[str, Any] = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {
            "open": "<tool_call>",
            "close_pattern": r"</tool_call>\s*",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}


def load_template(name: str = SMOLLM2_TOOLS) -> str:
    """The text of a chat template shipped in ``composer_replication/templates``."""
    return files("composer_replication.lm.templates").joinpath(name).read_text(encoding="utf-8")


def _is_chatml(tokenizer: Any) -> bool:
    vocab = tokenizer.get_vocab()
    return "<|im_start|>" in vocab and tokenizer.eos_token == "<|im_end|>"


def ensure_tool_template(tokenizer: Any) -> bool:
    """Make ``tokenizer`` usable for TRL tool rollouts; returns True if it installed our template.

    A tokenizer whose template already renders tool calls is left as is (TRL sets its parser).
    Otherwise a ChatML tokenizer (SmolLM2) gets ``smollm2_tools.jinja`` and its response
    template; any other template is refused with a clear error rather than guessed at.
    """
    from trl.chat_template_utils import supports_tool_calling

    if supports_tool_calling(tokenizer):
        return False
    if not _is_chatml(tokenizer):
        raise ValueError(
            f"{type(tokenizer).__name__}: its chat template cannot render tool calls and it is not "
            "ChatML (<|im_start|> ... <|im_end|>), so composer_replication has no tool template "
            "for it; set tokenizer.chat_template and tokenizer.response_template yourself"
        )
    tokenizer.chat_template = load_template(SMOLLM2_TOOLS)
    tokenizer.response_template = SMOLLM2_TOOLS_RESPONSE_TEMPLATE
    return True
