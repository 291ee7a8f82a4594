"""The OpenAI-compatible server over a local model (a tiny random Llama with the embedded
tokenizer), called through the official openai SDK over real HTTP, and tool-call parsing."""

from __future__ import annotations

import asyncio

import openai
import pytest

from composer_replication.replay.local_model import (
    LocalChatModel,
    flatten_messages,
    parse_tool_calls,
)
from composer_replication.replay.server import create_app
from composer_replication.replay.teachers import OpenAITeacher, TeacherSpec

from .conftest import ServerThread


@pytest.fixture
def served(tokenizer, tiny_model):
    chat = LocalChatModel.from_objects(tiny_model, tokenizer, 64)
    with ServerThread(create_app(chat, "tiny")) as srv:
        yield srv.base_url


def test_models_and_completion_with_usage(served):
    async def go():
        client = openai.AsyncOpenAI(base_url=served, api_key="x", max_retries=0)
        models = await client.models.list()
        msgs = [{"role": "user", "content": "Say hi " * 50}]
        r = await client.chat.completions.create(
            model="tiny", messages=msgs, max_tokens=5, temperature=0
        )
        r2 = await client.chat.completions.create(
            model="tiny", messages=msgs, max_tokens=5, temperature=0
        )
        await client.close()
        return models, r, r2

    models, r, r2 = asyncio.run(go())
    assert [m.id for m in models.data] == ["tiny"]
    assert r.usage.completion_tokens <= 5 and r.usage.prompt_tokens == 64  # truncated to 64
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.choices[0].message.content == r2.choices[0].message.content  # greedy


def test_bad_requests_are_http_errors(served):
    async def go(**kw):
        client = openai.AsyncOpenAI(base_url=served, api_key="x", max_retries=0)
        try:
            await client.chat.completions.create(**kw)
        finally:
            await client.close()

    with pytest.raises(openai.NotFoundError):
        asyncio.run(go(model="other", messages=[{"role": "user", "content": "x"}]))
    with pytest.raises(openai.UnprocessableEntityError):
        asyncio.run(go(model="tiny", messages=[]))
    with pytest.raises(openai.BadRequestError):
        asyncio.run(go(model="tiny", messages=[{"role": "user", "content": "x"}], stream=True))


def test_teacher_client_against_server(served):
    spec = TeacherSpec(name="s", base_url=served, model="tiny", max_tokens=4,
                       price_in_per_mtok=1, price_out_per_mtok=1)  # fmt: skip

    async def go():
        t = OpenAITeacher(spec)
        try:
            return await t.complete([{"role": "user", "content": "hello"}])
        finally:
            await t.aclose()

    resp = asyncio.run(go())
    assert resp.prompt_tokens > 0 and 1 <= resp.completion_tokens <= 4


def test_tool_call_round_trip():
    text = 'Let me look.\n<tool_call>{"name": "bash", "arguments": {"cmd": "ls"}}</tool_call>'
    rest, calls = parse_tool_calls(text)
    assert rest == "Let me look."
    assert calls[0]["function"] == {"name": "bash", "arguments": '{"cmd":"ls"}'}
    rest, calls = parse_tool_calls("<tool_call>{not json}</tool_call>")
    assert calls == [] and "not json" in rest
    flat = flatten_messages(
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "tool_calls": calls or [
                {"id": "1", "type": "function",
                 "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}]},
            {"role": "tool", "tool_call_id": "1", "content": "a.txt"},
        ],
        tools=[{"type": "function", "function": {"name": "bash"}}],
    )  # fmt: skip
    assert [m["role"] for m in flat] == ["system", "user", "assistant", "user"]
    assert "bash" in flat[0]["content"] and "<tool_call>" in flat[2]["content"]
    assert flat[3]["content"].startswith("[tool result 1]")
