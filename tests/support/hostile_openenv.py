"""A scripted OpenEnv 0.10 WebSocket server (``/ws``: reset, step, close messages) that answers
whatever a test tells it to: lying rewards, odd tool schemas, huge results, silence.

``scripted_server(tools, on_call)`` runs on 127.0.0.1 in a daemon thread and yields its URL.
``on_call(tool_name, arguments)`` returns ``(observation_dict, reward)`` or ``None`` for no
answer at all."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

from websockets.asyncio.server import serve


def _observation(observation: dict, reward: Any = None, done: bool = False) -> str:
    data = {"observation": observation, "reward": reward, "done": done}
    return json.dumps({"type": "observation", "data": data})


@contextlib.contextmanager
def scripted_server(
    tools: list[dict],
    on_call: Callable[[str, dict], tuple[dict, Any] | None],
    reset_observation: dict | None = None,
    reset_error: Callable[[dict], dict | None] | None = None,
) -> Iterator[str]:
    """``reset_error(reset_data)``: the data of an error frame to answer that reset with (a
    server failing with, e.g., ``{"message": "internal error", "code": 500}``), or None."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def answer(ws, msg: dict) -> None:
        kind, data = msg.get("type"), msg.get("data") or {}
        if kind == "reset" and reset_error is not None and (error := reset_error(data)):
            await ws.send(json.dumps({"type": "error", "data": error}))
        elif kind == "reset":
            await ws.send(_observation(reset_observation or {"ok": True}))
        elif kind == "step" and data.get("type") == "list_tools":
            await ws.send(_observation({"tools": tools}))
        elif kind == "step" and data.get("type") == "call_tool":
            out = on_call(data.get("tool_name"), data.get("arguments") or {})
            if out is not None:
                await ws.send(_observation(out[0], out[1]))
        elif kind == "close":
            await ws.close()

    async def connection(ws) -> None:
        with contextlib.suppress(Exception):
            async for raw in ws:
                await answer(ws, json.loads(raw))

    loop = asyncio.new_event_loop()
    started, stop = threading.Event(), asyncio.Event()

    async def main() -> None:
        async with serve(connection, "127.0.0.1", port, max_size=2**28, ping_interval=None):
            started.set()
            await stop.wait()

    thread = threading.Thread(target=lambda: loop.run_until_complete(main()), daemon=True)
    thread.start()
    started.wait(10)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(5)


ECHO = {"name": "echo", "description": "Echo a text.",
        "input_schema": {"type": "object", "properties": {"text": {"type": "string"}},
                         "required": ["text"]}}  # fmt: skip
