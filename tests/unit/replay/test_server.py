"""The OpenAI-compatible server over a local model (a tiny random Llama with the embedded
tokenizer), called through the official openai SDK over real HTTP (its chat rendering and
tool-call parsing: tests/unit/lm/test_chat.py)."""

from __future__ import annotations

import asyncio

import openai
import pytest
from support.scripted_openai import ask_teacher

from composer_replication.config import RemoteTeacherConfig
from composer_replication.replay.server import create_app
from composer_replication.teachers.local_model import LocalChatModel

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
    spec = RemoteTeacherConfig(name="s", base_url=served, model="tiny", max_tokens=4,
                       price_in_per_mtok=1, price_out_per_mtok=1)  # fmt: skip

    resp = ask_teacher(spec, content="hello")
    assert resp.prompt_tokens > 0 and 1 <= resp.completion_tokens <= 4


@pytest.mark.parametrize(
    ("host", "model_id", "url"),
    [
        ("127.0.0.1", "smol", "http://127.0.0.1:8101/v1"),
        ("0.0.0.0", "embedded:smollm2-135m-instruct", "http://127.0.0.1:8101/v1"),
        ("::1", "org/Model", "http://[::1]:8101/v1"),
    ],
)
def test_pool_entry_is_a_valid_teacher_pool_line(tmp_path, host, model_id, url):
    """What `serve` prints parses, pasted under `teachers:`, as a pool pointing at the server."""
    from composer_replication.config import load_pool
    from composer_replication.replay.server import pool_entry

    path = tmp_path / "pool.yaml"
    path.write_text("teachers:\n" + pool_entry(host, 8101, model_id) + "\n")
    [teacher] = load_pool(path).teachers
    assert teacher.type == "remote" and teacher.base_url == url and teacher.model == model_id


@pytest.mark.parametrize("host", ["", "127.0.0.1", "::1"])
def test_serve_binds_every_host_it_used_to(host):
    """``--host ""`` (all interfaces: uvicorn bound ``("", port)``, and `pool_entry` shows it as
    127.0.0.1) was refused as 'Name or service not known' once the port was bound before
    the model loads; an IPv6 address binds an IPv6 socket. Port 0: the kernel's choice."""
    import socket

    from composer_replication.replay.server import listen_socket

    sock = listen_socket(host, 0)
    try:
        assert sock.getsockname()[1] > 0
        assert sock.family == (socket.AF_INET6 if ":" in host else socket.AF_INET)
    finally:
        sock.close()


def test_serve_on_port_0_prints_the_port_it_got(monkeypatch, capsys):
    """``--port 0`` lets the kernel pick; the pool entry named port 0, a URL no replay can
    reach. The socket is bound before the entry is printed, so it names the real port."""
    import uvicorn

    import composer_replication.replay.server as server

    served = {}
    monkeypatch.setattr(server, "LocalChatModel", lambda *a, **k: object())
    monkeypatch.setattr(server, "create_app", lambda *a, **k: object())
    monkeypatch.setattr(
        uvicorn.Server, "run", lambda self, sockets: served.update(port=sockets[0].getsockname()[1])
    )
    server.serve("smol", port=0)
    entry = capsys.readouterr().out.splitlines()[-1]
    assert served["port"] > 0 and f'"base_url": "http://127.0.0.1:{served["port"]}/v1"' in entry
