"""The network edge of every remote teacher: one error type for a call that did not produce an
answer (:class:`TeacherError`, its ``kind`` decides retrying and billing), backoff with full
jitter honouring ``Retry-After``, the ``openai`` SDK's errors classified, and bodies read up to
a byte limit within one deadline. Retries live here and nowhere else; replay's chat answers
(chat.py) and distillation's scoring (scoring.py) both call through it."""

from __future__ import annotations

import asyncio
import email.utils
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

RETRYABLE_STATUS = frozenset({408, 409, 429}) | frozenset(range(500, 600))


ErrorKind = Literal[
    "rate_limit", "server", "timeout", "connection", "transport", "malformed", "client",
    "incomplete", "other",
]  # fmt: skip
"""``connection``: nothing answered at the address (refused, DNS); ``transport``: a server
answered but the exchange broke (connection reset, redirect loop, protocol error);
``incomplete``: an answer arrived but was cut (:data:`INCOMPLETE_FINISH`): billed as answered,
never a consensus answer, not retried unless asked (the same request gets the same cut)."""

MAYBE_BILLED_KINDS = frozenset({"malformed", "timeout", "transport"})
"""Failures the provider may have billed although no answer was kept: an answer that arrived
but failed our checks (``malformed``: it was generated), one cut at the deadline (``timeout``:
it may have run to the end), an exchange broken after the request went out (``transport``).
Refused connections and HTTP errors are not billed. The replay charges each its worst case."""


class TeacherError(Exception):
    """A call that did not produce an answer (after retries, if the error was retryable)."""

    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        attempts: int = 1,
        status: int | None = None,
        answered: bool = False,
    ):
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message
        self.attempts = attempts
        self.status = status
        self.retry_after: float | None = None  # seconds the server asked us to wait
        self.answered = answered  # an answer arrived (and was refused while read): billed

    @property
    def retryable(self) -> bool:
        return self.kind in ("rate_limit", "server", "timeout", "connection", "transport")

    @property
    def maybe_billed(self) -> bool:
        return self.kind in MAYBE_BILLED_KINDS


OnRetry = Callable[[TeacherError], Awaitable[bool]]
"""Asked before a failed attempt is retried; False stops retrying (the error is raised)."""


def parse_retry_after(headers: Any) -> float | None:
    """Seconds to wait from ``retry-after-ms`` / ``Retry-After`` (seconds or an HTTP date)."""
    if headers is None:
        return None
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def backoff_delay(
    attempt: int, retry_after: float | None, base: float = 0.5, cap: float = 30.0
) -> float:
    """Full-jitter exponential backoff (AWS architecture blog, "Exponential Backoff and Jitter"):
    ``uniform(0, min(cap, base * 2**attempt))``; a server's Retry-After is a floor, itself capped
    at ``cap`` (the pool's ``backoff_cap_s`` is the longest any retry waits)."""
    delay = random.uniform(0, min(cap, base * 2**attempt))
    if retry_after is not None:
        delay = max(delay, min(retry_after, cap))
    return delay


def classify_openai_error(err: BaseException) -> TeacherError:
    """Map an ``openai`` SDK exception to a `TeacherError` (kind decides retrying)."""
    import openai

    if isinstance(err, openai.APITimeoutError):
        return TeacherError("timeout", str(err))
    if isinstance(err, openai.APIConnectionError):
        return _transport_error(err)
    if isinstance(err, openai.APIStatusError):
        status = err.status_code
        kind: ErrorKind = (
            "rate_limit" if status == 429 else "server" if status in RETRYABLE_STATUS else "client"
        )
        return TeacherError(kind, f"HTTP {status}: {str(err)[:300]}", status=status)
    return TeacherError("other", f"{type(err).__name__}: {err}")


def _transport_error(err: BaseException) -> TeacherError:
    """Tell "nothing listens there" from "the server broke the exchange": the SDK says
    "Connection error." for both; the transport error it wraps says which. Matched by class
    name: the SDK's HTTP library is ``httpx`` or a fork of it, depending on its version."""
    cause = err.__cause__
    if cause is None or any(k.__name__ == "ConnectError" for k in type(cause).__mro__):
        return TeacherError("connection", f"could not connect: {cause or err}")
    return TeacherError("transport", f"{type(cause).__name__}: {cause}"[:300])


ERROR_BODY_BYTES = 1 << 20
"""An error answer's (4xx/5xx) body is read up to this many bytes (the SDK reads it itself)."""


def http_client(timeout_s: float) -> Any:
    """The SDK's default HTTP client over a transport that cuts an error answer's body at
    :data:`ERROR_BODY_BYTES` (a transport error then): the SDK reads a 4xx/5xx body in full
    before our code sees it, so a server answering 500 with gigabytes would otherwise fill
    memory. A 200's body is bounded by :func:`read_capped`."""
    import importlib

    import openai

    client_class = openai.DefaultAsyncHttpxClient  # the SDK's HTTP library: httpx or a fork
    httpx = importlib.import_module(client_class.__mro__[1].__module__.split(".")[0])

    class ErrorBodyCap(httpx.AsyncByteStream):
        def __init__(self, inner: Any):
            self.inner = inner

        async def __aiter__(self):
            size = 0
            async for chunk in self.inner:
                size += len(chunk)
                if size > ERROR_BODY_BYTES:
                    raise httpx.ReadError(f"an error answer longer than {ERROR_BODY_BYTES} bytes")
                yield chunk

        async def aclose(self) -> None:
            await self.inner.aclose()

    class Transport(httpx.AsyncBaseTransport):
        def __init__(self):
            self.inner = httpx.AsyncHTTPTransport()

        async def handle_async_request(self, request: Any) -> Any:
            response = await self.inner.handle_async_request(request)
            if response.status_code >= 400:
                response.stream = ErrorBodyCap(response.stream)
            return response

        async def aclose(self) -> None:
            await self.inner.aclose()

    return client_class(transport=Transport(), timeout=timeout_s)


def unwrapped_http_error(err: BaseException) -> TeacherError | None:
    """The HTTP library's own error (read outside the SDK's wrapping) as a ``transport``
    failure; None for anything else. Matched by class name: the SDK's HTTP library is ``httpx``
    or a fork of it."""
    if any(k.__name__ == "HTTPError" for k in type(err).__mro__):
        return TeacherError("transport", f"{type(err).__name__}: {err}"[:300])
    return None


async def read_capped(response: Any, limit: int) -> bytes:
    """The body of an openai ``with_streaming_response`` answer, read in chunks and refused
    (``malformed``) once it passes ``limit`` bytes (a declared Content-Length past it is refused
    before reading), so a misbehaving server cannot make us hold an unbounded answer in memory."""
    declared = response.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise TeacherError(
            "malformed", f"the answer declares {declared} bytes, more than {limit}", answered=True
        )
    chunks, size = [], 0
    async for chunk in response.iter_bytes():
        size += len(chunk)
        if size > limit:
            raise TeacherError(
                "malformed",
                f"the answer is longer than {limit} bytes (not read further)",
                answered=True,
            )
        chunks.append(chunk)
    return b"".join(chunks)


async def post_capped(create: Any, kwargs: dict[str, Any], limit: int, timeout_s: float) -> bytes:
    """One request through the SDK's streaming ``create`` (``...with_streaming_response.create``):
    the answer's bytes, read up to ``limit`` (:func:`read_capped`) within an overall deadline of
    ``timeout_s`` (connect, send and a body that trickles in). Every failure is a
    :class:`TeacherError`: ``timeout``, the SDK's errors classified with the server's
    Retry-After, the HTTP library's own errors (a body read outside the SDK's wrapping, an error
    answer cut by :func:`http_client`) as ``transport``."""
    import openai

    try:
        async with asyncio.timeout(timeout_s), create(**kwargs) as response:
            return await read_capped(response, limit)
    except TimeoutError as err:
        raise TeacherError(
            "timeout", f"no complete answer within the {timeout_s:g} s deadline"
        ) from err
    except openai.APIError as err:
        terr = classify_openai_error(err)
        terr.retry_after = parse_retry_after(
            getattr(getattr(err, "response", None), "headers", None)
        )
        raise terr from err
    except Exception as err:
        if (terr := unwrapped_http_error(err)) is None:
            raise
        raise terr from err
