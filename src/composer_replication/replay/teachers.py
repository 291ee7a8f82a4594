"""Teachers: a pool of models that answer replayed states.

A pool is a YAML file validated by pydantic (field names are fixed so scripts can rely on them)::

    teachers:
      - name: smol-greedy
        base_url: http://127.0.0.1:8101/v1     # any OpenAI-compatible endpoint, or "local"
        model: smol                            # model id sent in the request
        api_key_env: OPENROUTER_API_KEY        # optional: the *name* of the env var holding the key
        price_in_per_mtok: 0.10                # USD per 1M prompt tokens
        price_out_per_mtok: 0.40               # USD per 1M completion tokens
        max_tokens: 32
        temperature: 0.0
        max_concurrency: 4
        timeout_s: 60
        tier: 0                                # tiered replay asks lower tiers first

``base_url: local`` runs ``model`` (hub id, directory, .gguf or ``embedded:NAME``) in process.

Remote teachers use the official ``openai`` SDK (``AsyncOpenAI`` with ``max_retries=0``); retries
live here, at the network edge: exponential backoff with full jitter on 429, 5xx, timeouts and
connection errors, honouring ``Retry-After`` / ``retry-after-ms`` up to ``backoff_cap_s`` (a
longer requested wait fails the call at once, saying so; a re-run retries it). A response that is
not a valid chat completion is a `TeacherError` with ``kind="malformed"`` (recorded, never a
crash).
"""

from __future__ import annotations

import asyncio
import email.utils
import os
import random
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from composer_replication.config import ConfigError, load_yaml_mapping, resolve_config_path

LOCAL_BASE_URL = "local"
RETRYABLE_STATUS = frozenset({408, 409, 429}) | frozenset(range(500, 600))


class TeacherSpec(BaseModel):
    """One teacher of a pool (see the module docstring for the YAML shape)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)  # "12" is no int

    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:/@-]+$")
    """Unique name in the pool; journal rows and pair provenance use it."""
    base_url: str = Field(min_length=1)
    """OpenAI-compatible base URL (e.g. ``https://openrouter.ai/api/v1``) or ``local``."""
    model: str = Field(min_length=1)
    """Model id sent to the endpoint (or, for ``local``, the model reference to load)."""
    api_key_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """Name of the environment variable holding the API key (never the key). None: no key."""
    price_in_per_mtok: float = Field(0.0, ge=0, le=10_000)
    """USD per million prompt tokens."""
    price_out_per_mtok: float = Field(0.0, ge=0, le=10_000)
    """USD per million completion tokens."""
    max_tokens: int = Field(256, ge=1, le=1_000_000)
    """Completion token limit per call (also the worst case the budget reserves)."""
    temperature: float = Field(0.0, ge=0, le=5)
    """Sampling temperature."""
    max_concurrency: int = Field(4, ge=1, le=1024)
    """Calls to this teacher in flight at once."""
    timeout_s: float = Field(120.0, gt=0, le=3600)
    """Per-attempt deadline, seconds: the whole attempt (connect, send, and a body that trickles
    in byte by byte) must finish within it, else it counts as a retryable timeout."""
    tier: int = Field(0, ge=0, le=100)
    """Tiered replay asks tier 0 first and escalates to higher tiers on low agreement."""
    weight: float = Field(1.0, gt=0, le=1000)
    """Vote weight for the ``weighted`` consensus strategy (optional)."""
    max_retries: int = Field(5, ge=0, le=50)
    """Retries after the first attempt on 429/5xx/timeouts/connection errors (optional)."""
    backoff_base_s: float = Field(0.5, gt=0, le=60)
    """First backoff window, seconds; doubles per retry (optional)."""
    backoff_cap_s: float = Field(30.0, gt=0, le=600)
    """Largest backoff window, seconds (optional)."""
    keep_cut_answers: bool = False
    """Keep an answer cut at ``max_tokens`` (``finish_reason: length``) as a whole answer. Off
    (default): it is billed but journaled as ``incomplete`` and is never a consensus answer (an
    action cut mid-call is not the action the teacher meant). On for demos with a small
    ``max_tokens`` (optional). A content-filtered answer is never kept."""

    @model_validator(mode="after")
    def _check_url(self) -> TeacherSpec:
        if self.base_url != LOCAL_BASE_URL and not self.base_url.startswith(
            ("http://", "https://")
        ):
            raise ValueError(f"base_url must be http(s)://... or {LOCAL_BASE_URL!r}")
        return self

    def cost_usd(self, prompt_tokens: int, completion_tokens: int) -> float:
        """Dollars for one call with this usage."""
        return (
            prompt_tokens * self.price_in_per_mtok + completion_tokens * self.price_out_per_mtok
        ) / 1e6

    def request_params(self) -> dict[str, Any]:
        """Everything besides the messages that shapes an answer (hashed into the journal key)."""
        return {
            "base_url": self.base_url,
            "model": self.model,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
        }


class TeacherPool(BaseModel):
    """A YAML teacher pool: ``teachers: [TeacherSpec, ...]`` with unique names."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)  # "12" is no int

    teachers: list[TeacherSpec] = Field(min_length=1)
    """The teachers; order is kept (ties in consensus break in this order)."""

    @model_validator(mode="after")
    def _unique(self) -> TeacherPool:
        names = [t.name for t in self.teachers]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"duplicate teacher names: {dup}")
        return self


class PoolError(ConfigError):
    """A teacher pool file is unreadable or invalid; the message names the file and field."""


def load_pool(path: str | os.PathLike[str]) -> TeacherPool:
    """Read and validate a teacher pool YAML file (a path, or a shipped pool such as
    ``teachers/local.yaml``)."""
    try:
        p = resolve_config_path(path)
        raw = load_yaml_mapping(p, "teacher pool")
    except ConfigError as err:
        raise PoolError(str(err)) from None
    try:
        return TeacherPool.model_validate(raw)
    except ValidationError as err:
        lines = [
            f"{p}: {'.'.join(str(x) for x in e['loc']) or '<root>'}: {e['msg']}"
            for e in err.errors()
        ]
        raise PoolError("invalid teacher pool\n" + "\n".join(lines)) from err


@dataclass
class TeacherResponse:
    """A teacher's answer: an assistant message plus usage."""

    text: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    prompt_tokens: int | None = 0
    """Reported prompt tokens; None when the server's value is missing or not a count."""
    completion_tokens: int | None = 0
    """Reported completion tokens; None when missing or not a count."""
    finish_reason: str | None = None
    attempts: int = 1
    latency_s: float = 0.0
    raw_usage: Any = None
    """The server's ``usage`` block as sent (journaled for audit, never trusted for billing)."""
    anomalies: list[str] = field(default_factory=list)
    """Odd but usable: another model answered, several choices came back (`parse_completion`)."""

    def as_message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": self.text}
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        return msg


ErrorKind = Literal[
    "rate_limit", "server", "timeout", "connection", "transport", "malformed", "client",
    "incomplete", "other",
]  # fmt: skip
"""``connection``: nothing answered at the address (refused, DNS); ``transport``: a server
answered but the exchange broke (connection reset, redirect loop, protocol error);
``incomplete``: an answer arrived but was cut (:data:`INCOMPLETE_FINISH`): billed as answered,
never a consensus answer, not retried unless asked (the same request gets the same cut)."""

INCOMPLETE_FINISH = {
    "length": "it reached max_tokens ({max_tokens}): raise the teacher's max_tokens (or set "
    "keep_cut_answers)",
    "content_filter": "the provider's content filter withheld part of it",
}
"""``finish_reason`` values (OpenAI's) of an answer that is not the whole action, and why."""


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


class Teacher(Protocol):
    spec: TeacherSpec

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        on_retry: OnRetry | None = None,
    ) -> TeacherResponse: ...

    async def aclose(self) -> None: ...


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


def token_count(value: Any) -> int | None:
    """A reported token count if it is a non-negative integer below 2**53, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if value != value or not 0 <= value < 2**53 or int(value) != value:
        return None
    return int(value)


def parse_completion(body: bytes, model: str | None = None) -> TeacherResponse:
    """Validate a chat-completion JSON body; raise ``TeacherError('malformed')`` otherwise. An
    answer that is valid but odd for the request (another ``model`` than ``model``, more than
    the one choice asked for) is kept and flagged in ``anomalies``."""
    try:
        obj = orjson.loads(body)
        msg = obj["choices"][0]["message"]
        usage = obj.get("usage")
        usage = usage if isinstance(usage, dict) else {}
        text = msg.get("content") or ""
        calls = msg.get("tool_calls") or []
        if not isinstance(text, str) or not isinstance(calls, list):
            raise TypeError("content must be a string and tool_calls a list")
        for c in calls:
            if not isinstance(c.get("function", {}).get("name"), str):
                raise TypeError("tool call without a function name")
        return TeacherResponse(
            text=text,
            tool_calls=[_clean_call(c) for c in calls],
            prompt_tokens=token_count(usage.get("prompt_tokens")),
            completion_tokens=token_count(usage.get("completion_tokens")),
            finish_reason=obj["choices"][0].get("finish_reason"),
            raw_usage=obj.get("usage"),
            anomalies=_anomalies(obj, model),
        )
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError) as err:
        snippet = body[:120].decode("utf-8", "replace")
        raise TeacherError("malformed", f"{type(err).__name__}: {err}; body={snippet!r}") from err


def _anomalies(obj: dict[str, Any], model: str | None) -> list[str]:
    """What is odd about a valid answer: the server says another model answered (a dated or
    provider-prefixed name of the same model is fine), or it sent several choices (one was
    asked for; the first is used, and the others may have been billed)."""
    out = []
    served = obj.get("model")
    if (
        model
        and served is not None
        and not (isinstance(served, str) and _same_model(served, model))
    ):
        out.append(f"answered by model {str(served)[:80]!r} (asked {model!r})")
    if len(obj["choices"]) != 1:
        out.append(f"{len(obj['choices'])} choices (1 asked; the first is used)")
    return out


_VERSION_SUFFIX = re.compile(r"(?:[-@:](?:\d{4}-?\d{2}-?\d{2}|\d{8}|latest|v?\d+(?:\.\d+)*))+")
"""What a provider may append to the name asked for and still serve that model: a date
(``-2024-08-06``, ``-20240806``), ``-latest``, a revision (``@001``, ``:2``)."""


def _same_model(served: str, asked: str) -> bool:
    """Whether ``served`` names the model asked for: equal up to case and a provider prefix
    (``openai/gpt-4o``), or that name plus a date or revision suffix. ``gpt-4o-mini`` is not
    ``gpt-4o``, nor is ``claude-3`` ``claude-3-5-sonnet``, nor is an empty name anything."""
    a, b = (m.rsplit("/", 1)[-1].lower() for m in (served, asked))
    if not a:
        return False
    return a == b or (a.startswith(b) and _VERSION_SUFFIX.fullmatch(a[len(b) :]) is not None)


def _clean_call(c: dict[str, Any]) -> dict[str, Any]:
    """One tool call in our shape. Its id must be a string (missing or null: ``""``, a server
    that does not number calls): an integer id would reach the journal and later break the
    preference dataset's typed columns, so it makes the answer malformed here, at the edge."""
    fn = c["function"]
    args = fn.get("arguments", "{}")
    call_id = c.get("id")
    if call_id is not None and not isinstance(call_id, str):
        raise TypeError(f"tool call id must be a string, got {type(call_id).__name__}")
    return {
        "id": call_id or "",
        "type": "function",
        "function": {
            "name": fn["name"],
            "arguments": args if isinstance(args, str) else orjson.dumps(args).decode(),
        },
    }


def answer_byte_limit(max_tokens: int) -> int:
    """The most bytes a chat answer of ``max_tokens`` tokens is read to: 1 KiB per token (a
    token's text, JSON-escaped, in the message and a tool call's arguments) plus 1 MiB."""
    return max_tokens * 1024 + (1 << 20)


class OpenAITeacher:
    """A teacher behind any OpenAI-compatible endpoint (OpenRouter, vLLM, SGLang, Ollama, ...)."""

    def __init__(self, spec: TeacherSpec, sleep=asyncio.sleep):
        import openai

        key = "not-needed"
        if spec.api_key_env:
            key = os.environ.get(spec.api_key_env, "")
            if not key:
                raise PoolError(
                    f"teacher {spec.name!r}: environment variable {spec.api_key_env} is not set"
                )
        self.spec = spec
        self._client = openai.AsyncOpenAI(
            base_url=spec.base_url, api_key=key, max_retries=0, timeout=spec.timeout_s,
            http_client=http_client(spec.timeout_s),
        )  # fmt: skip
        self._sleep = sleep

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        on_retry: OnRetry | None = None,
    ) -> TeacherResponse:
        """One answer, retrying transient failures with backoff; raises `TeacherError`.
        ``on_retry`` is asked before each retry (the replay reserves budget there for the next
        attempt when the failed one may have been billed)."""
        t0 = time.perf_counter()
        for attempt in range(self.spec.max_retries + 1):
            try:
                resp = await self._once(messages, tools)
            except TeacherError as err:
                err.attempts = attempt + 1
                if not err.retryable or attempt == self.spec.max_retries:
                    raise
                if err.retry_after is not None and err.retry_after > self.spec.backoff_cap_s:
                    raise self._too_long_to_wait(err) from None
                if on_retry is not None and not await on_retry(err):
                    raise
                await self._sleep(
                    backoff_delay(
                        attempt, err.retry_after, self.spec.backoff_base_s, self.spec.backoff_cap_s
                    )
                )
                continue
            resp.attempts = attempt + 1
            resp.latency_s = time.perf_counter() - t0
            return resp
        raise AssertionError("unreachable")

    def _too_long_to_wait(self, err: TeacherError) -> TeacherError:
        """Fail fast when a server asks for a longer wait than ``backoff_cap_s``: sleeping for it
        would stall the run silently; a re-run retries the call (the error stays transient)."""
        err.message += (
            f"; the server asked to wait {err.retry_after:g} s (Retry-After), more than "
            f"backoff_cap_s={self.spec.backoff_cap_s:g} s: not retried in this run"
        )
        return err

    async def _once(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> TeacherResponse:

        kwargs: dict[str, Any] = {
            "model": self.spec.model,
            "messages": messages,
            "max_tokens": self.spec.max_tokens,
            "temperature": self.spec.temperature,
        }
        if tools:
            kwargs["tools"] = tools
        create = self._client.chat.completions.with_streaming_response.create
        limit = answer_byte_limit(self.spec.max_tokens)
        body = await post_capped(create, kwargs, limit, self.spec.timeout_s)
        return parse_completion(body, self.spec.model)

    async def aclose(self) -> None:
        await self._client.close()


class LocalHFTeacher:
    """A teacher running a Hugging Face model in this process (``base_url: local``).

    Generation runs in a worker thread so the event loop keeps serving other teachers.
    """

    def __init__(self, spec: TeacherSpec, chat_model: Any = None):
        from .local_model import LocalChatModel

        self.spec = spec
        self.chat_model = chat_model or LocalChatModel(spec.model)

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        on_retry: OnRetry | None = None,  # one attempt, never retried
    ) -> TeacherResponse:
        t0 = time.perf_counter()
        try:
            gen = await asyncio.to_thread(
                self.chat_model.generate,
                messages,
                max_tokens=self.spec.max_tokens,
                temperature=self.spec.temperature,
                tools=tools,
            )
        except Exception as err:  # a local model failure is recorded, not raised to the loop
            raise TeacherError("other", f"{type(err).__name__}: {err}") from err
        return TeacherResponse(
            text=gen.text,
            tool_calls=gen.tool_calls,
            prompt_tokens=gen.prompt_tokens,
            completion_tokens=gen.completion_tokens,
            finish_reason=gen.finish_reason,
            latency_s=time.perf_counter() - t0,
            raw_usage={
                "prompt_tokens": gen.prompt_tokens,
                "completion_tokens": gen.completion_tokens,
            },
        )

    async def aclose(self) -> None:
        return None


def build_teacher(spec: TeacherSpec) -> Teacher:
    """The client for one spec: in-process for ``base_url: local``, else the OpenAI SDK."""
    if spec.base_url == LOCAL_BASE_URL:
        return LocalHFTeacher(spec)
    return OpenAITeacher(spec)
