"""Serve one of our tool environments over OpenEnv on 127.0.0.1 (a free port) in a thread."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator


@contextlib.contextmanager
def served(env, max_tool_calls: int = 4) -> Iterator[str]:
    """Yield the base URL of ``env`` served by uvicorn until the block exits."""
    import uvicorn

    from composer_replication.envs.openenv.server import create_env_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(
            create_env_app(env, max_tool_calls),
            host="127.0.0.1",
            port=port,
            log_level="warning",
            ws="websockets",
        )  # fmt: skip
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the OpenEnv test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
