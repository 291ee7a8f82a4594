"""The SmolLM2 tool template: TRL accepts it, and a tool round trip parses back."""

from __future__ import annotations

import copy

import pytest
from trl.chat_template_utils import (
    is_chat_template_prefix_preserving,
    parse_response,
    supports_tool_calling,
)

from composer_replication.envs.calculator import CalculatorTools
from composer_replication.lm.chat_templates import ensure_tool_template


@pytest.fixture
def tool_tokenizer(tokenizer):
    tok = copy.deepcopy(tokenizer)
    assert not supports_tool_calling(tok)  # the check TRL's GRPOTrainer refuses SmolLM2 with
    assert ensure_tool_template(tok) is True
    return tok


def test_trl_accepts_the_template(tool_tokenizer):
    assert supports_tool_calling(tool_tokenizer)
    assert is_chat_template_prefix_preserving(tool_tokenizer)
    assert ensure_tool_template(tool_tokenizer) is False  # already tool-capable: left as is


def test_tool_call_round_trips_through_trl_parser(tool_tokenizer):
    tok, tools = tool_tokenizer, [CalculatorTools().calculate]
    call = {
        "type": "function",
        "function": {"name": "calculate", "arguments": {"expression": "24 * 74"}},
    }
    convo = [{"role": "user", "content": "What is 24 * 74?"}]
    turn = {"role": "assistant", "content": "Let me compute.", "tool_calls": [call]}
    prefix = tok.apply_chat_template(convo, tools=tools, add_generation_prompt=True, tokenize=False)
    full = tok.apply_chat_template(
        convo + [turn, {"role": "tool", "name": "calculate", "content": "1776"}],
        tools=tools,
        add_generation_prompt=True,
        tokenize=False,
    )
    assert full.startswith(prefix) and '"name": "calculate"' in prefix  # schema in the system turn
    assert "<|im_start|>tool\n1776<|im_end|>" in full
    generated = full[len(prefix) :].split("<|im_end|>")[0] + "<|im_end|>"
    ids = tok(generated, add_special_tokens=False)["input_ids"]
    prefix_ids = tok(prefix, add_special_tokens=False)["input_ids"]
    assert parse_response(tok, ids, prefix=prefix_ids, tools=tools) == turn
    answer = tok("1776<|im_end|>", add_special_tokens=False)["input_ids"]
    assert parse_response(tok, answer, prefix=prefix_ids, tools=tools) == {
        "role": "assistant",
        "content": "1776",
    }


def test_non_chatml_template_without_tools_is_refused(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    tok.eos_token = "<|endoftext|>"
    with pytest.raises(ValueError, match="not ChatML"):
        ensure_tool_template(tok)
