"""A TCP proxy on 127.0.0.1 that holds every chunk the server sends for ``delay_s`` before
passing it on (an injected network latency: each request-reply round trip takes
``delay_s`` longer), run in a thread with its own event loop."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from urllib.parse import urlsplit


async def _pipe(reader, writer, delay_s: float) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()

    async def deliver() -> None:
        while (item := await queue.get()) is not None:
            due, chunk = item
            await asyncio.sleep(max(0.0, due - loop.time()))
            writer.write(chunk)
            await writer.drain()
        writer.close()

    sender = asyncio.create_task(deliver())
    try:
        while chunk := await reader.read(1 << 16):
            queue.put_nowait((loop.time() + delay_s, chunk))
    except ConnectionError:
        pass
    queue.put_nowait(None)
    with contextlib.suppress(ConnectionError):
        await sender


@contextlib.contextmanager
def delayed(url: str, delay_s: float) -> Iterator[str]:
    """Yield a URL that reaches ``url`` with ``delay_s`` added to every reply."""
    target = urlsplit(url)
    loop = asyncio.new_event_loop()
    started = threading.Event()
    box: dict = {}

    async def handle(c_reader, c_writer) -> None:
        s_reader, s_writer = await asyncio.open_connection(target.hostname, target.port)
        with contextlib.suppress(asyncio.CancelledError):  # shutdown cancels open connections
            await asyncio.gather(_pipe(c_reader, s_writer, 0.0), _pipe(s_reader, c_writer, delay_s))

    async def serve() -> None:
        box["server"] = await asyncio.start_server(handle, "127.0.0.1", 0)
        started.set()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(serve(), loop)
    started.wait(10)
    port = box["server"].sockets[0].getsockname()[1]

    async def shutdown() -> None:
        box["server"].close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    try:
        yield f"{target.scheme}://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(shutdown(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        loop.close()
