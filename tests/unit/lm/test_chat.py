"""Chat rendering (composer_replication/lm/chat.py): the tool-call text format, flattening for
templates without tool support, the rendered prompt, and one tool call giving the same text in
every caller (replay channel, local ``serve``, pair export). Expected strings are written out
by hand from the format in the module's docstring."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest

from composer_replication.lm.chat import (
    as_messages,
    flatten_messages,
    parse_tool_calls,
    render_prompt,
    supports_tools,
    to_text,
    tool_call_text,
)

SMOL_SYSTEM = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n"
)


def _call(name: str, arguments, call_id: str = "call_1") -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


LS = _call("shell", '{"command":["ls"],"cwd":"/tmp"}')
LS_TEXT = (
    '<tool_call>\n{"name": "shell", "arguments": {"command": ["ls"], "cwd": "/tmp"}}\n</tool_call>'
)
ASSISTANT = {"role": "assistant", "content": "I'll list the files.", "tool_calls": [LS]}
ASSISTANT_TEXT = "I'll list the files.\n" + LS_TEXT
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is here?"},
    ASSISTANT,
    {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"},
    {"role": "tool", "tool_call_id": "call_2", "content": "b.txt"},
]
CONVERSATION_CHATML = (
    "<|im_start|>system\nBe brief.<|im_end|>\n"
    "<|im_start|>user\nWhat is here?<|im_end|>\n"
    "<|im_start|>assistant\nI'll list the files.\n<tool_call>\n"
    '{"name": "shell", "arguments": {"command": ["ls"], "cwd": "/tmp"}}\n</tool_call><|im_end|>\n'
    "<|im_start|>user\n<tool_response>\na.txt\n</tool_response>\n"
    "<tool_response>\nb.txt\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n"
)


def test_tool_call_text_is_one_format_whatever_the_argument_encoding():
    assert tool_call_text(LS) == LS_TEXT
    # the same call with spaced wire JSON, with an object, and as a bare {name, arguments}
    assert tool_call_text(_call("shell", '{"command": ["ls"],  "cwd": "/tmp"}')) == LS_TEXT
    assert tool_call_text(_call("shell", {"command": ["ls"], "cwd": "/tmp"})) == LS_TEXT
    bare = {"name": "shell", "arguments": {"command": ["ls"], "cwd": "/tmp"}}
    assert tool_call_text(bare) == LS_TEXT
    assert tool_call_text(_call("say", '{"text": "café"}')) == (
        '<tool_call>\n{"name": "say", "arguments": {"text": "café"}}\n</tool_call>'
    )
    assert tool_call_text(_call("raw", "not json")) == (
        '<tool_call>\n{"name": "raw", "arguments": "not json"}\n</tool_call>'
    )
    with pytest.raises(ValueError, match="without a function name"):
        tool_call_text({"function": {"arguments": "{}"}})


def test_to_text_of_responses_and_conversations():
    assert to_text(ASSISTANT) == ASSISTANT_TEXT
    assert to_text([ASSISTANT]) == ASSISTANT_TEXT
    assert to_text({"role": "assistant", "content": None, "tool_calls": [LS]}) == LS_TEXT
    assert to_text("plain answer") == "plain answer"
    parts = {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image"}]}
    assert to_text([parts, {"role": "assistant", "content": ""}, CONVERSATION[3]]) == (
        "a\n\n<tool_response>\na.txt\n</tool_response>"
    )
    with pytest.raises(TypeError, match="got int"):
        to_text(3)


def test_as_messages_normalizes_and_names_bad_input():
    assert as_messages("hi") == [{"role": "user", "content": "hi"}]
    msgs = [{"role": "user", "content": "x"}]
    out = as_messages(msgs)
    assert out == msgs and out[0] is not msgs[0]
    with pytest.raises(ValueError, match="message 1: expected a mapping"):
        as_messages([{"role": "user", "content": "x"}, {"content": "no role"}])
    with pytest.raises(TypeError, match="got int"):
        as_messages(5)


def test_flatten_merges_tool_results_and_describes_tools():
    tools = [{"type": "function", "function": {"name": "shell", "description": "run"}}]
    flat = flatten_messages(CONVERSATION, tools=tools)
    assert flat == [
        {
            "role": "system",
            "content": "Be brief.\n\nYou can call these tools:\n- shell: run\nTo call one, "
            'answer with <tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>',
        },
        {"role": "user", "content": "What is here?"},
        {"role": "assistant", "content": ASSISTANT_TEXT},
        {
            "role": "user",
            "content": "<tool_response>\na.txt\n</tool_response>\n"
            "<tool_response>\nb.txt\n</tool_response>",
        },
    ]
    # a tool result after a user turn starts its own user turn; unknown roles become user
    flat = flatten_messages([{"role": "user", "content": "u"}, CONVERSATION[3]])
    assert [m["role"] for m in flat] == ["user", "user"]
    assert flatten_messages([{"role": "developer", "content": "d"}])[0]["role"] == "user"


def test_parse_tool_calls_inverts_the_text_format():
    rest, calls = parse_tool_calls(ASSISTANT_TEXT)
    assert rest == "I'll list the files."
    assert [c["function"] for c in calls] == [
        {"name": "shell", "arguments": '{"command":["ls"],"cwd":"/tmp"}'}
    ]
    assert to_text({"role": "assistant", "content": rest, "tool_calls": calls}) == ASSISTANT_TEXT
    rest, calls = parse_tool_calls('<tool_call>{"name":"x","arguments":{}}</tool_call>')
    assert rest == "" and calls[0]["function"] == {"name": "x", "arguments": "{}"}
    rest, calls = parse_tool_calls("<tool_call>{not json}</tool_call>")
    assert calls == [] and rest == "<tool_call>{not json}</tool_call>"


def test_render_prompt_through_smollm2_template(tokenizer):
    assert not supports_tools(tokenizer)
    assert render_prompt(tokenizer, CONVERSATION) == CONVERSATION_CHATML
    assert render_prompt(tokenizer, "2+2?") == (
        SMOL_SYSTEM + "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    )
    no_gen = render_prompt(tokenizer, "2+2?", add_generation_prompt=False)
    assert no_gen == SMOL_SYSTEM + "<|im_start|>user\n2+2?<|im_end|>\n"


def test_render_prompt_without_chat_template_joins_texts():
    base = SimpleNamespace(chat_template=None)
    assert render_prompt(base, "2+2?") == "2+2?"
    assert render_prompt(base, CONVERSATION[1:3]) == "What is here?\n" + ASSISTANT_TEXT


def test_flattened_chatml_equals_qwen25_native_tool_rendering(tokenizer):
    """Qwen2.5's template (shipped with TRL) renders tool_calls and tool results itself; the
    same conversation flattened through SmolLM2's plain ChatML template gives the same text."""
    from trl.chat_template_utils import qwen2_5_chat_template

    qwen = copy.deepcopy(tokenizer)
    qwen.chat_template = qwen2_5_chat_template
    assert supports_tools(qwen)
    assert render_prompt(qwen, CONVERSATION) == CONVERSATION_CHATML


def test_same_tool_call_text_for_replay_serve_and_export(tokenizer, tiny_model):
    """The replay channel's rejected answer, the conversation the local server renders and the
    exported pair all carry ASSISTANT_TEXT for the same assistant message."""
    from composer_replication.channels.replay import encode_pair
    from composer_replication.prefs.agreement import DPOPair
    from composer_replication.prefs.export import pair_record
    from composer_replication.teachers.local_model import LocalChatModel

    def ids(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    row = {"prompt": "What is here?", "chosen": "No idea.", "rejected": [ASSISTANT]}
    replay = encode_pair(tokenizer, row, max_length=512)
    assert replay.rejected_ids == ids(ASSISTANT_TEXT) + [tokenizer.eos_token_id]

    served, _ = LocalChatModel.from_objects(tiny_model, tokenizer).prompt_ids(
        [{"role": "user", "content": "What is here?"}, ASSISTANT], None
    )
    expected = (
        SMOL_SYSTEM + "<|im_start|>user\nWhat is here?<|im_end|>\n"
        f"<|im_start|>assistant\n{ASSISTANT_TEXT}<|im_end|>\n<|im_start|>assistant\n"
    )
    assert served == ids(expected)

    pair = DPOPair("s", [{"role": "user", "content": "What is here?"}], _t("No idea."),
                   ASSISTANT, 2, ["a", "b"])  # fmt: skip
    assert pair_record(pair)["rejected"] == [{"role": "assistant", "content": ASSISTANT_TEXT}]


def _t(text: str) -> dict:
    return {"role": "assistant", "content": text}
