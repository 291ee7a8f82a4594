"""An OpenAI-compatible ``/v1/chat/completions`` endpoint served by the policy being trained,
recording the tokens of every answer for training (FastAPI + uvicorn in a thread, on a unix
socket: agents reach it only through the sandbox's relay, agents/sandboxed.py).

* **One episode, one key.** :meth:`PolicyProxy.open_episode` issues a random API key (the
  agent's ``OPENAI_API_KEY``); each request's ``Authorization: Bearer <key>`` files its turn
  under that episode, so concurrent episodes never mix. An unknown key is refused (401), as is
  a request past the episode's ``max_requests`` (429) or after :meth:`close_episode`.
* **Rendering.** The request's messages (and ``tools``, when listed) are rendered with the
  tokenizer's chat template (`lm.chat.render_prompt`, our tool template for SmolLM2-style
  ChatML), tokenized without special tokens added; a prompt over ``max_prompt_tokens`` is
  refused (400, "maximum context length") rather than cut, so every recorded prompt is
  what the policy saw.
* **Generation** is the policy's (:class:`Policy`): the trainer's generator and sampling
  settings (agents/policy.py, lm/generator.py), whatever temperature or ``max_tokens`` the
  harness asks for. Requests of all episodes are handed to it as they come (no lock is held
  while generating: the lock below guards the episode table only); the generator batches
  them in arrival order, so one episode's request waits for at most the batch in progress.
  The recorded turn holds the prompt ids, the completion ids (up to and including the
  end-of-turn token) and their log-probs under the sampling distribution (logits divided by
  the temperature, TRL's convention), recorded by the generation itself.
* **Time accounting.** Per episode, the seconds its requests queued for the generator, the
  seconds they spent in the policy (queue and generation) and the seconds with at least one
  of them there (``waited_s``) are recorded (:meth:`PolicyProxy.close_episode_record`);
  :meth:`PolicyProxy.policy_wait` reads the last as it accrues: the agent's own-time limit
  does not count it (agents/sandboxed.py).
* **Bounded before read** (the agent is model-driven and untrusted; docs/sandbox.md, "Trust
  boundaries"). The socket is ``0600`` (``0660`` with the sandbox's group when the trainer
  is root) inside a directory only the trainer can enter (:func:`private_socket_dir`; the
  sandbox gets it through a bind staged by the trainer), and a connection whose peer is
  not the trainer's user or the sandbox's is closed at once (``SO_PEERCRED``). A request's
  key and ``Content-Length`` are checked before any of its body is read; the body is read
  in chunks against ``MAX_BODY_BYTES`` and ``body_timeout_s``; headers are capped
  (``MAX_HEADER_BYTES``) and must arrive within ``header_timeout_s``; at most
  ``max_connections`` connections and ``max_in_flight`` requests per key at once. A
  failure of the policy is a counted error (500, ``errors``, and the episode's refused
  count), not an uncounted crash of the request.
* **Answers.** With ``tools`` in the request, each well-formed ``<tool_call>{...}</tool_call>``
  block becomes an OpenAI ``tool_calls`` entry (`lm.chat.parse_tool_calls`), the rest is the
  content. ``stream=true`` is answered as a single server-sent event chunk followed by
  ``[DONE]`` (enough for clients that insist on streaming; the harness here does not).
"""

import asyncio
import json
import logging
import os
import secrets
import socket
import struct
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator

from composer_replication.lm.chat import parse_tool_calls, render_prompt
from composer_replication.lm.generator import Completion
from composer_replication.sandbox.sandbox import NOBODY

__all__ = ["Policy", "PolicyProxy", "Turn", "EpisodeRecord"]

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 4 << 20
"""Largest request body read (4 MiB): the agent is model-driven and untrusted."""
MAX_HEADER_BYTES = 16 << 10
"""Most bytes of a request line and headers (h11's incomplete-event limit)."""
HEADER_TIMEOUT_S = 10.0
"""Seconds a connection may take to send a request's headers (from its start, or from the
previous answer on a kept-alive connection) before it is closed."""
BODY_TIMEOUT_S = 30.0
"""Seconds a request may take to send its body once its headers are in."""
MAX_CONNECTIONS = 64
"""Connections open at once; more are closed as they come."""
MAX_IN_FLIGHT = 2
"""Requests of one key being read or answered at once; more are refused (429)."""


class Policy(Protocol):
    """What the proxy generates with: ``prompt_ids -> Completion`` (lm/generator.py) or
    ``(completion_ids, logprobs)``, one log-prob per completion token. Called from several
    threads at once."""

    def __call__(self, prompt_ids: list[int]) -> Completion | tuple[list[int], list[float]]: ...


@dataclass
class Turn:
    """One answered request of an episode."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    messages: list[dict[str, Any]]
    """The request's messages followed by the answer (for logging and blame)."""


@dataclass
class EpisodeRecord:
    """What one key's episode left: its turns in order, its refused requests, and where its
    requests' time went."""

    turns: list[Turn] = field(default_factory=list)
    requests: int = 0
    refused: int = 0
    queued_s: float = 0.0
    """Seconds its requests waited for the generator (other requests' batches)."""
    policy_s: float = 0.0
    """Seconds its requests spent in the policy (queue and generation), summed per request."""
    waited_s: float = 0.0
    """Seconds with at least one of its requests in the policy (concurrent requests counted
    once), up to the last one that left it: the time not counted against the agent's own
    time limit (agents/sandboxed.py)."""
    in_policy: int = 0
    """Its requests in the policy now."""
    wait_began: float = 0.0
    """``time.monotonic()`` when the wait in progress (``in_policy > 0``) began."""

    def enter_policy(self, now: float) -> None:
        if self.in_policy == 0:
            self.wait_began = now
        self.in_policy += 1

    def leave_policy(self, now: float) -> None:
        self.in_policy -= 1
        if self.in_policy == 0:
            self.waited_s += now - self.wait_began

    def waited(self, now: float) -> float:
        """``waited_s`` with the wait in progress so far."""
        return self.waited_s + (now - self.wait_began if self.in_policy else 0.0)


class _Function(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    arguments: str | dict[str, Any] = ""


class _ToolCall(BaseModel):
    model_config = ConfigDict(extra="allow")

    function: _Function


class _Message(BaseModel):
    """The shape of one chat message the prompt is rendered from (checked, so a malformed
    message is a 400 naming its field, not an error inside the chat template)."""

    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[_ToolCall] | None = None


class ChatRequest(BaseModel):
    """The part of an OpenAI chat request the proxy reads (other fields are ignored)."""

    model_config = ConfigDict(extra="allow")

    model: str = ""
    messages: list[dict[str, Any]] = Field(min_length=1, max_length=4096)
    tools: list[dict[str, Any]] | None = None
    stream: bool = False

    @field_validator("messages")
    @classmethod
    def _messages_have_chat_shape(cls, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for message in messages:
            _Message.model_validate(message)
        return messages  # kept as sent: they are rendered and recorded as dicts


class PolicyProxy:
    """The endpoint (module docstring). Use as a context manager, or ``start``/``stop``."""

    def __init__(
        self,
        policy: Policy,
        tokenizer: Any,
        socket_path: str,
        model_name: str = "policy",
        max_prompt_tokens: int = 4096,
        max_requests: int = 16,
        max_connections: int = MAX_CONNECTIONS,
        max_in_flight: int = MAX_IN_FLIGHT,
        header_timeout_s: float = HEADER_TIMEOUT_S,
        body_timeout_s: float = BODY_TIMEOUT_S,
        max_concurrent: int = 64,
    ):
        self.policy, self.tokenizer = policy, tokenizer
        self.socket_path, self.model_name = socket_path, model_name
        self.max_prompt_tokens, self.max_requests = max_prompt_tokens, max_requests
        self.max_connections, self.max_in_flight = max_connections, max_in_flight
        self.header_timeout_s, self.body_timeout_s = header_timeout_s, body_timeout_s
        self._episodes: dict[str, EpisodeRecord] = {}
        self._lock = threading.Lock()  # the episode table only; never held while generating
        self._text_lock = threading.Lock()  # the tokenizer (rendering, decoding): short
        self.max_concurrent = max_concurrent
        self._answers: ThreadPoolExecutor | None = None  # requests answered at once
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._listener: socket.socket | None = None
        # the HTTP layer's own state, touched only on the server's event loop (and at close)
        self._in_flight: dict[str, int] = {}
        self._io_refused: dict[str, int] = {}  # key -> requests refused before answer()
        self.errors = 0
        """Requests whose answer failed on our side (the policy raised): each a 500."""
        self.dropped = 0
        """Connections closed unheard: over ``max_connections``, a foreign peer, or headers
        not sent in time."""

    # ---- episodes --------------------------------------------------------------------------
    def open_episode(self) -> str:
        """A fresh API key whose requests are recorded as one episode."""
        key = "cr-" + secrets.token_urlsafe(24)
        with self._lock:
            self._episodes[key] = EpisodeRecord()
        return key

    def close_episode(self, key: str) -> tuple[list[Turn], int]:
        """The episode's turns in order and how many of its requests were refused; later
        requests with ``key`` are refused."""
        record = self.close_episode_record(key)
        return record.turns, record.refused

    def close_episode_record(self, key: str) -> EpisodeRecord:
        """:meth:`close_episode` with the episode's time accounting. A request still being
        generated when its episode closes is not recorded."""
        with self._lock:
            record = self._episodes.pop(key)
        record.refused += self._io_refused.pop(key, 0)
        return record

    def policy_wait(self, key: str) -> tuple[float, bool]:
        """(seconds the episode of ``key`` has waited for the policy so far, the wait in
        progress included; whether one of its requests is in the policy now): read as it
        accrues by the agent's own-time limit (agents/sandboxed.py). (0, False) for a key
        not open."""
        with self._lock:
            ep = self._episodes.get(key)
            if ep is None:
                return 0.0, False
            return ep.waited(time.monotonic()), ep.in_policy > 0

    # ---- serving ---------------------------------------------------------------------------
    def start(self) -> "PolicyProxy":
        """Serve on ``socket_path`` in a daemon thread; returns once the socket accepts. The
        socket is made and its mode set before it listens: ``0600``, or ``0660`` with the
        sandbox's group (``nobody``'s) when the trainer is root (module docstring)."""
        import uvicorn

        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)
        self._answers = ThreadPoolExecutor(self.max_concurrent, thread_name_prefix="cr-answer")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(self.socket_path)
            if os.geteuid() == 0:
                os.chown(self.socket_path, 0, NOBODY)
                os.chmod(self.socket_path, 0o660)
            else:
                os.chmod(self.socket_path, 0o600)
        except BaseException:
            sock.close()
            raise
        config = uvicorn.Config(self.app(), log_level="warning", access_log=False,
                                timeout_keep_alive=30, http=_guarded_protocol(self),
                                limit_concurrency=self.max_connections + 1,
                                h11_max_incomplete_event_size=MAX_HEADER_BYTES,
                                backlog=self.max_connections)  # fmt: skip
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        name="cr-proxy", daemon=True)  # fmt: skip
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"the policy proxy did not start on {self.socket_path}")
            time.sleep(0.01)
        self._listener = sock
        return self

    def peer_allowed(self, sock: socket.socket | None) -> bool:
        """Whether a connection's peer (``SO_PEERCRED``) is this process's user or, when the
        trainer is root, the sandbox's (``nobody``)."""
        if sock is None or sock.family != socket.AF_UNIX:
            return False
        try:
            raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        except OSError:
            return False
        _pid, uid, _gid = struct.unpack("3i", raw)
        return uid == os.geteuid() or (os.geteuid() == 0 and uid == NOBODY)

    def stop(self) -> None:
        """Stop serving and remove the socket."""
        if self._server is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
            self._server = None
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if self._answers is not None:
            self._answers.shutdown(wait=False, cancel_futures=True)
            self._answers = None
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)

    def __enter__(self) -> "PolicyProxy":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def app(self):
        """The FastAPI app (``/v1/models``, ``/v1/chat/completions``). This module has no
        ``from __future__ import annotations``: FastAPI reads the handler's ``Request``
        annotation as a class."""
        from fastapi import FastAPI, Request
        from fastapi.responses import JSONResponse, StreamingResponse
        from starlette.requests import ClientDisconnect

        app = FastAPI(title="composer-replication policy proxy", docs_url=None, redoc_url=None)

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            return {"object": "list", "data": [{"id": self.model_name, "object": "model",
                                                "owned_by": "composer-replication"}]}  # fmt: skip

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            key = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
            if key not in self._episodes:  # asked before a byte of the body is read;
                return self._refuse(key, 401, "unknown or closed API key",  # answer() asks
                                    "invalid_api_key")  # again under the lock  # fmt: skip
            if refused := _unreadable(request.headers):
                return self._refuse(key, *refused)
            if self._in_flight.get(key, 0) >= self.max_in_flight:
                return self._refuse(key, 429, f"at most {self.max_in_flight} requests of one "
                                    "key at a time", "rate_limit_exceeded")  # fmt: skip
            self._in_flight[key] = self._in_flight.get(key, 0) + 1
            try:
                try:
                    body = await self._read_body(request)
                except _TooLarge:
                    return self._refuse(key, 413, f"the request is larger than {MAX_BODY_BYTES} "
                                        "bytes", "invalid_request_error")  # fmt: skip
                except ClientDisconnect:
                    return self._refuse(key, 400, "the client went away", "invalid_request_error")
                except TimeoutError:
                    return self._refuse(key, 408, f"the body was not sent within "
                                        f"{self.body_timeout_s:g} s", "invalid_request_error")  # fmt: skip
                try:
                    loop = asyncio.get_running_loop()  # many at once: the generator batches them
                    status, answer = await loop.run_in_executor(
                        self._answers, self.answer, key, body
                    )
                except Exception as e:  # noqa: BLE001 - ours (the policy's): counted, a 500
                    self.errors += 1
                    logger.error("proxy: answering a request failed", exc_info=e)
                    return self._refuse(key, 500, f"the policy failed: {type(e).__name__}",
                                        "internal_error")  # fmt: skip
            finally:
                self._in_flight[key] -= 1
                if not self._in_flight[key]:
                    del self._in_flight[key]
            if status != 200:
                return JSONResponse(status_code=status, content=answer)
            if answer.pop("_stream", False):
                return StreamingResponse(_sse(answer), media_type="text/event-stream")
            return answer

        return app

    async def _read_body(self, request: Any) -> bytes:
        """The body, read in chunks: ``_TooLarge`` past ``MAX_BODY_BYTES`` (a chunked body
        has no length to check first), ``TimeoutError`` past ``body_timeout_s``."""
        body = bytearray()
        async with asyncio.timeout(self.body_timeout_s):
            async for chunk in request.stream():
                body += chunk
                if len(body) > MAX_BODY_BYTES:
                    raise _TooLarge
        return bytes(body)

    def _refuse(self, key: str, status: int, message: str, code: str):
        """A refusal of the HTTP layer, counted in the episode's refused requests (if the key
        has one). The connection is closed after it: a body left unread is not drained (a
        refused 400 MiB body cost the trainer 4 s of reading it into nothing)."""
        from fastapi.responses import JSONResponse

        if key in self._episodes:
            self._io_refused[key] = self._io_refused.get(key, 0) + 1
        return JSONResponse(status_code=status, content=_error(message, code),
                            headers={"connection": "close"})  # fmt: skip

    def answer(self, key: str, body: bytes) -> tuple[int, dict[str, Any]]:
        """(HTTP status, JSON body) for one chat request filed under ``key``. Many run at
        once (one per connection): the lock guards the episode table, not the generation."""
        with self._lock:
            ep = self._episodes.get(key)
            if ep is None:
                return 401, _error("unknown or closed API key", "invalid_api_key")
            ep.requests += 1
            if ep.requests > self.max_requests:
                ep.refused += 1
                return 429, _error(f"this episode's {self.max_requests} requests are used up",
                                   "rate_limit_exceeded")  # fmt: skip
        try:
            if len(body) > MAX_BODY_BYTES:
                raise ValueError(f"the request is larger than {MAX_BODY_BYTES} bytes")
            req = ChatRequest.model_validate(json.loads(body))
            with self._text_lock:
                prompt_ids = self._prompt_ids(req)
        except Exception as e:  # noqa: BLE001 - all of it is the client's input: refused
            with self._lock:  # (a JSON nested past the parser's limit, a template's error)
                ep.refused += 1
            if not isinstance(e, (ValueError, RecursionError)):  # may be a bug of ours
                logger.warning("proxy: a request refused by %s", type(e).__name__, exc_info=e)
            return 400, _error(f"{type(e).__name__}: {e}"[:500], "invalid_request_error")
        with self._lock:
            started = time.monotonic()
            ep.enter_policy(started)
        try:
            completion = _as_completion(self.policy(prompt_ids))
        finally:
            with self._lock:
                waited = time.monotonic() - started
                ep.leave_policy(started + waited)
        completion_ids, logprobs = completion.ids, completion.logprobs
        with self._text_lock:
            text = self.tokenizer.decode(completion_ids, skip_special_tokens=True)
        content, calls = parse_tool_calls(text) if req.tools else (text.strip(), [])
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        turn = Turn(prompt_ids, completion_ids, logprobs, [*req.messages, message])
        with self._lock:
            if self._episodes.get(key) is ep:  # not closed while this one was generated
                ep.turns.append(turn)
                ep.queued_s += completion.queued_s
                ep.policy_s += waited
        eos = self.tokenizer.eos_token_id
        done = bool(completion_ids) and completion_ids[-1] == eos
        finish = "tool_calls" if calls else ("stop" if done else "length")
        out = {
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
            "created": int(time.time()), "model": self.model_name,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(completion_ids),
                      "total_tokens": len(prompt_ids) + len(completion_ids)},
        }  # fmt: skip
        return 200, {**out, "_stream": req.stream}

    def _prompt_ids(self, req: ChatRequest) -> list[int]:
        text = render_prompt(self.tokenizer, req.messages, tools=req.tools)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) > self.max_prompt_tokens:
            raise ValueError(f"This model's maximum context length is {self.max_prompt_tokens} "
                             f"tokens; the messages have {len(ids)} tokens")  # fmt: skip
        return ids


class _TooLarge(Exception):
    """A request body past ``MAX_BODY_BYTES``."""


def _unreadable(headers: Any) -> tuple[int, str, str] | None:
    """(status, message, code) if the headers say the body must not be read: no length
    (and not chunked), a malformed length, or one over ``MAX_BODY_BYTES``."""
    length = headers.get("content-length")
    if length is None:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return None  # read against the cap chunk by chunk
        return 411, "a Content-Length is required", "invalid_request_error"
    if not length.strip().isdigit():
        return 400, "a malformed Content-Length", "invalid_request_error"
    if int(length) > MAX_BODY_BYTES:
        return 413, f"the request is larger than {MAX_BODY_BYTES} bytes", "invalid_request_error"
    return None


def private_socket_dir(prefix: str = "cr-proxy-") -> str:
    """A new directory for the proxy's socket that only this user can reach: a ``0700``
    directory under ``/var/tmp`` holding a ``0755`` one, which is returned. The sandbox
    reaches it through a bind that the trainer stages before it drops to ``nobody``
    (sandbox/sandbox.py ``_staged_binds``); no other local user can open a path to it.
    Remove it with :func:`remove_socket_dir`."""
    top = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}.", dir="/var/tmp")
    inner = os.path.join(top, "s")
    os.mkdir(inner)
    os.chmod(inner, 0o755)
    return inner


def remove_socket_dir(path: str) -> None:
    """Remove a directory made by :func:`private_socket_dir` (empty by then)."""
    os.rmdir(path)
    os.rmdir(os.path.dirname(path))


def _guarded_protocol(proxy: PolicyProxy) -> type:
    """uvicorn's h11 protocol with the proxy's connection rules (module docstring): a
    connection over ``max_connections`` or from a foreign peer is closed at once, and one
    that has not sent a request's headers within ``header_timeout_s`` (counted from its
    start, or from the last answer) is closed; uvicorn has no such deadline itself."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class Guarded(H11Protocol):
        _cr_timer: asyncio.TimerHandle | None = None
        _cr_cycle: Any = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            crowded = len(self.connections) > proxy.max_connections
            if crowded or not proxy.peer_allowed(transport.get_extra_info("socket")):
                proxy.dropped += 1
                transport.abort()
                return
            self._cr_arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._cr_timer is not None:
                self._cr_timer.cancel()
            super().connection_lost(exc)

        def on_response_complete(self) -> None:
            if not self.transport.is_closing():  # armed on the finished request: a pipelined
                self._cr_arm()  # one that super() starts now replaces it (no deadline then)
            super().on_response_complete()

        def _cr_arm(self) -> None:
            if self._cr_timer is not None:
                self._cr_timer.cancel()
            self._cr_cycle = self.cycle  # a new request replaces it
            self._cr_timer = self.loop.call_later(proxy.header_timeout_s, self._cr_expire)

        def _cr_expire(self) -> None:
            if self.cycle is self._cr_cycle and not self.transport.is_closing():
                proxy.dropped += 1
                self.transport.abort()

    return Guarded


def _as_completion(answer: Completion | tuple[list[int], list[float]]) -> Completion:
    if isinstance(answer, Completion):
        return answer
    ids, logprobs = answer
    return Completion(list(ids), list(logprobs))


def _error(message: str, code: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "code": code}}


async def _sse(answer: dict[str, Any]):
    """The whole answer as one chat.completion.chunk event, then ``[DONE]``."""
    choice = answer["choices"][0]
    delta = {k: v for k, v in choice["message"].items()}
    for i, call in enumerate(delta.get("tool_calls") or []):
        call["index"] = i
    chunk = {**answer, "object": "chat.completion.chunk",
             "choices": [{"index": 0, "delta": delta, "finish_reason": choice["finish_reason"]}]}  # fmt: skip
    yield f"data: {json.dumps(chunk)}\n\n"
    yield "data: [DONE]\n\n"
