"""Teachers that answer chat requests (trace replay, replay/): :class:`OpenAITeacher` behind
any OpenAI-compatible endpoint, :class:`LocalHFTeacher` running a Hugging Face model in this
process; :func:`build_teacher` makes the client for a teacher's description
(config/teachers.py: ``type: remote`` or ``type: local``).

Remote teachers use the official ``openai`` SDK (``AsyncOpenAI`` with ``max_retries=0``); retries
live at the network edge (edge.py): exponential backoff with full jitter on 429, 5xx, timeouts
and connection errors, honouring ``Retry-After`` / ``retry-after-ms`` up to ``backoff_cap_s`` (a
longer requested wait fails the call at once, saying so; a re-run retries it). A response that
is not a valid chat completion is a `TeacherError` with ``kind="malformed"`` (recorded, never a
crash).
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from composer_replication.config import (
    LocalTeacherConfig,
    PoolError,
    RemoteTeacherConfig,
    TeacherConfig,
)
from composer_replication.teachers.edge import (
    OnRetry,
    TeacherError,
    backoff_delay,
    http_client,
    post_capped,
)


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


INCOMPLETE_FINISH = {
    "length": "it reached max_tokens ({max_tokens}): raise the teacher's max_tokens (or set "
    "keep_cut_answers)",
    "content_filter": "the provider's content filter withheld part of it",
}
"""``finish_reason`` values (OpenAI's) of an answer that is not the whole action, and why."""


class Teacher(Protocol):
    spec: TeacherConfig

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        on_retry: OnRetry | None = None,
    ) -> TeacherResponse: ...

    async def aclose(self) -> None: ...


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

    def __init__(self, spec: RemoteTeacherConfig, sleep=asyncio.sleep):
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
    """A teacher running a Hugging Face model in this process (``type: local``), on its
    ``device`` (``same``: where it loads) in its ``dtype``.

    Generation runs in a worker thread so the event loop keeps serving other teachers.
    """

    def __init__(self, spec: LocalTeacherConfig, chat_model: Any = None):
        from composer_replication.teachers.local_model import LocalChatModel

        self.spec = spec
        self.chat_model = chat_model or LocalChatModel(
            spec.model, dtype=spec.dtype, device=None if spec.device == "same" else spec.device
        )

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


def build_teacher(spec: TeacherConfig) -> Teacher:
    """The chat client for one teacher: in-process for ``type: local``, else the OpenAI SDK."""
    if isinstance(spec, LocalTeacherConfig):
        return LocalHFTeacher(spec)
    return OpenAITeacher(spec)
