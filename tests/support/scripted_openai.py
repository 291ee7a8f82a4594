"""Test harness for replay: a scripted OpenAI-compatible HTTP server (real HTTP over 127.0.0.1,
answers derived from the request, deterministic) with configurable faults (429 with Retry-After,
500, hangs past the client's timeout, invalid JSON, permanently failing conversations), a helper
that runs any ASGI app in a uvicorn thread, and synthetic TraceStates.

Used by the test suite and benchmarks (``PYTHONPATH=src:tests python -m support.scripted_openai
--port N`` serves it); not part of the library."""

from __future__ import annotations

import asyncio
import hashlib
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import orjson
from fastapi import Request


@dataclass
class Script:
    """Fault rates are per attempt; ``always_fail`` fails every attempt for that fraction of
    conversations (chosen by hash). ``answer_by_model``: teachers with different models give
    different answers (else every model answers the same, so teachers agree)."""

    p429: float = 0.0
    p500: float = 0.0
    phang: float = 0.0
    pinvalid: float = 0.0
    always_fail: float = 0.0
    hang_s: float = 3.0
    retry_after: str = "0"
    delay_s: float = 0.0
    usage_patch: dict | None = None  # fields overriding the honest usage block (lying servers)
    no_usage: bool = False  # answer without a usage block
    drip_s: float = 0.0  # > 0: stream each answer's body one byte per drip_s seconds
    completion_tokens: int = 5
    answer_by_model: bool = False
    finish_by_model: dict = field(default_factory=dict)  # model -> finish_reason (else "stop")
    seed: int = 0
    requests: Counter = field(default_factory=Counter)  # (model, digest) -> attempts
    answered: Counter = field(default_factory=Counter)  # (model, digest) -> 200 answers
    in_flight: int = 0
    max_in_flight: int = 0
    bodies: list = field(default_factory=list)  # raw request bodies, in arrival order


def digest(messages) -> str:
    return hashlib.sha1(orjson.dumps(messages)).hexdigest()


async def _drip(data: bytes, every_s: float):
    """Yield ``data`` one byte at a time, each within any sane per-read timeout."""
    for i in range(len(data)):
        await asyncio.sleep(every_s)
        yield data[i : i + 1]


def make_app(script: Script):
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, Response, StreamingResponse

    app = FastAPI()

    @app.get("/stats")
    async def stats():
        return {"requests": sum(script.requests.values()), "answered": sum(script.answered.values()),
                "max_in_flight": script.max_in_flight}  # fmt: skip

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "scripted", "object": "model"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        raw = await request.body()
        script.bodies.append(raw)
        body = orjson.loads(raw)
        d = digest(body["messages"])
        key = (body["model"], d)
        script.requests[key] += 1
        attempt = script.requests[key]
        rng = random.Random(f"{script.seed}:{key}:{attempt}")
        script.in_flight += 1
        script.max_in_flight = max(script.max_in_flight, script.in_flight)
        try:
            if script.delay_s:
                await asyncio.sleep(script.delay_s)
            if int(d[:8], 16) / 0xFFFFFFFF < script.always_fail:
                return JSONResponse({"error": {"message": "permanent"}}, status_code=500)
            roll = rng.random()
            edges = [script.p429, script.p500, script.phang, script.pinvalid]
            if roll < edges[0]:
                return JSONResponse(
                    {"error": {"message": "slow down"}},
                    status_code=429,
                    headers={"Retry-After": script.retry_after},
                )
            roll -= edges[0]
            if roll < edges[1]:
                return JSONResponse({"error": {"message": "boom"}}, status_code=500)
            roll -= edges[1]
            if roll < edges[2]:
                await asyncio.sleep(script.hang_s)
                return JSONResponse({"error": {"message": "late"}}, status_code=500)
            roll -= edges[2]
            if roll < edges[3]:
                return Response(b'{"choices": [', media_type="application/json")
            script.answered[key] += 1
            salt = body["model"] if script.answer_by_model else ""
            text = f"Answer {hashlib.sha1((d + salt).encode()).hexdigest()[:6]}"
            prompt_tokens = len(orjson.dumps(body["messages"])) // 4 + 3
            answer = {
                "id": "x",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": script.finish_by_model.get(body["model"], "stop"),
                    }
                ],  # fmt: skip
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": script.completion_tokens,
                    "total_tokens": prompt_tokens + script.completion_tokens,
                },
            }
            answer["usage"].update(script.usage_patch or {})
            if script.no_usage:
                del answer["usage"]
            if script.drip_s:
                return StreamingResponse(
                    _drip(orjson.dumps(answer), script.drip_s), media_type="application/json"
                )
            return answer
        finally:
            script.in_flight -= 1

    return app


class ServerThread:
    """uvicorn on 127.0.0.1:<port> (default: a free one) in a daemon thread."""

    def __init__(self, app, port: int = 0):
        import uvicorn

        cfg = uvicorn.Config(
            app, host="127.0.0.1", port=port, log_level="warning", access_log=False,
            timeout_graceful_shutdown=1,
        )  # fmt: skip
        self.server = uvicorn.Server(cfg)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("scripted server did not start")
            time.sleep(0.02)
        sock = self.server.servers[0].sockets[0]
        self.port = sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def ask_teacher(spec, content: str = "q", sleep=asyncio.sleep):
    """One completion of ``[{"role": "user", "content": content}]`` from an ``OpenAITeacher``
    built from ``spec`` (its client closed after); its errors propagate."""
    from composer_replication.teachers.chat import OpenAITeacher

    async def go():
        teacher = OpenAITeacher(spec, sleep=sleep)
        try:
            return await teacher.complete([{"role": "user", "content": content}])
        finally:
            await teacher.aclose()

    return asyncio.run(go())


def synthetic_states(n: int, session: str = "s1", tool_every: int = 0):
    """Small synthetic TraceStates (prefix: system + user turn; action: text or a tool call)."""
    from composer_replication.traces.schema import Action, StateMeta, TraceState

    states = []
    for i in range(n):
        prefix = [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": f"Task {i}: fix bug #{i * 7 % 13} in module m{i}."},
        ]
        if tool_every and i % tool_every == 0:
            action = Action(
                tool_calls=[{"id": f"c{i}", "type": "function",
                             "function": {"name": "bash", "arguments": f'{{"cmd": "ls {i}"}}'}}]
            )  # fmt: skip
        else:
            action = Action(text=f"Agent answer {i}")
        states.append(
            TraceState(
                state_id=f"st{i:04d}",
                session_id=session,
                step=i,
                prefix=prefix,
                action=action,
                meta=StateMeta(source_format="openai_messages", file="synthetic", line=i + 1),
            )  # fmt: skip
        )
    return states


def main() -> None:  # pragma: no cover - used by bench/bench_replay.py
    """``python -m support.scripted_openai --port N [--delay-s S]``: serve a
    fault-free scripted endpoint (answers in ``delay_s``) on 127.0.0.1."""
    import argparse

    import uvicorn

    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--delay-s", type=float, default=0.0)
    a = ap.parse_args()
    uvicorn.run(make_app(Script(delay_s=a.delay_s)), host="127.0.0.1", port=a.port,
                log_level="warning", access_log=False)  # fmt: skip


if __name__ == "__main__":  # pragma: no cover
    main()
