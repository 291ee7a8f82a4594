"""An OpenAI-compatible server over a local Hugging Face model (FastAPI + uvicorn).

    composer-replication serve --model embedded:smollm2-135m-instruct --port 8101

``GET /v1/models`` lists ``--served-model-name`` (default: the model reference);
``POST /v1/chat/completions`` answers non-streaming chat requests with ``usage`` and, when the
request lists ``tools``, ``tool_calls`` parsed from ``<tool_call>{...}</tool_call>`` blocks
(see local_model.py). ``POST /v1/completions`` scores given token ids the way vLLM does for
distillation teachers: a token-id ``prompt`` (or a list of them), ``max_tokens: 1`` and
``prompt_logprobs: k`` return, per prompt position, the top-k token ids with ``logprob`` and
``rank`` plus the token actually there (entry 0 is null), and the greedy next token as
``text``. ``GET /v1/tokenizer`` reports the tokenizer's fingerprint, so a distilling student
can check it shares the vocabulary before loading anything (teachers/scoring.py). Generation runs in a worker thread, one request at a time. uvicorn's access
log writes one line per request. Binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from composer_replication.config import UserError
from composer_replication.teachers.local_model import LocalChatModel


class ChatRequest(BaseModel):
    """The subset of the OpenAI chat-completions request this server honours (other fields are
    accepted and ignored, as OpenAI-compatible servers commonly do)."""

    model_config = ConfigDict(extra="allow")

    model: str = ""
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1, le=32768)
    max_completion_tokens: int | None = Field(None, ge=1, le=32768)
    temperature: float = Field(1.0, ge=0, le=5)
    top_p: float = Field(1.0, gt=0, le=1)
    seed: int | None = None
    n: int = Field(1, ge=1, le=1)
    stream: bool = False
    tools: list[dict[str, Any]] | None = None


class CompletionRequest(BaseModel):
    """The scoring subset of the OpenAI completions request (vLLM's ``prompt_logprobs``)."""

    model_config = ConfigDict(extra="allow")

    model: str = ""
    prompt: list[int] | list[list[int]] | str = Field(min_length=1)
    max_tokens: int = Field(1, ge=1, le=1)
    """Only scoring is served: one (greedy) token is generated, as vLLM does for it."""
    temperature: float = Field(1.0, gt=0, le=5)
    """Divides the logits before the reported log-probs (vLLM's processed log-probs)."""
    prompt_logprobs: int | None = Field(None, ge=0, le=1000)
    n: int = Field(1, ge=1, le=1)
    stream: bool = False


CHARS_PER_TOKEN = 32
"""A text prompt longer than this many characters per allowed token is refused untokenized."""
MAX_BODY_BYTES = 64 << 20
"""Larger request bodies (by their Content-Length) are refused with 413 before being read."""
MAX_PROMPTS_PER_REQUEST = 4096
"""As many prompts as a scorer sends at most (``rows_per_request``'s upper bound)."""


def create_app(
    chat_model: Any,
    served_model_name: str,
    default_max_tokens: int = 256,
    max_logprob_entries: int = 2_000_000,
):
    """The FastAPI app; ``chat_model`` has ``generate(messages, max_tokens=, temperature=, top_p=,
    seed=, tools=) -> Generation`` (a `LocalChatModel`). A scoring request is refused (400, saying
    which limit) past ``MAX_PROMPTS_PER_REQUEST`` prompts, a prompt longer than the model's
    ``max_prompt_tokens`` (a chat prompt is cut to it instead; a scored one cannot be), or past
    ``max_logprob_entries`` entries in the answer (prompt tokens x (prompt_logprobs + 1), about
    70 bytes of JSON each): the request a client can send is bounded in compute and memory."""
    import orjson
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response

    app = FastAPI(title="composer-replication teacher", docs_url=None, redoc_url=None)

    @app.middleware("http")
    async def body_limit(request: Request, call_next):
        size = request.headers.get("content-length", "")
        if size.isdigit() and int(size) > MAX_BODY_BYTES:
            return _error(
                JSONResponse, 413, f"the request body is larger than {MAX_BODY_BYTES} bytes"
            )
        return await call_next(request)

    created = int(time.time())

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": served_model_name, "object": "model", "created": created,
                      "owned_by": "composer-replication"}],
        }  # fmt: skip

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest):
        if (refused := _refuse(JSONResponse, req, served_model_name)) is not None:
            return refused
        gen = await asyncio.to_thread(
            chat_model.generate,
            req.messages,
            max_tokens=req.max_completion_tokens or req.max_tokens or default_max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            seed=req.seed,
            tools=req.tools,
        )
        return _completion(served_model_name, gen)

    @app.get("/v1/tokenizer")
    async def tokenizer() -> dict[str, Any]:
        from composer_replication.teachers.scoring import tokenizer_fingerprint

        tok = chat_model.tokenizer
        return {"fingerprint": tokenizer_fingerprint(tok), "vocab_size": len(tok)}

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest):
        if (refused := _refuse(JSONResponse, req, served_model_name)) is not None:
            return refused
        if (
            isinstance(req.prompt, str)
            and len(req.prompt) > CHARS_PER_TOKEN * chat_model.max_prompt_tokens
        ):
            return _error(JSONResponse, 400, f"a text prompt of {len(req.prompt)} characters is "
                          f"longer than {chat_model.max_prompt_tokens} tokens can be")  # fmt: skip
        prompts = await asyncio.to_thread(_token_prompts, chat_model.tokenizer, req.prompt)
        limits = (chat_model.max_prompt_tokens, max_logprob_entries)
        if (problem := _scoring_problem(prompts, req.prompt_logprobs, *limits)) is not None:
            return _error(JSONResponse, 400, problem)
        vocab = len(chat_model.tokenizer)
        if any(not 0 <= t < vocab for p in prompts for t in p):
            return _error(JSONResponse, 400, f"token ids must be in [0, {vocab})")

        def answer() -> bytes:  # scored and encoded off the event loop (orjson: ~10x json's speed)
            rows = score_prompts(chat_model, prompts, req.prompt_logprobs, req.temperature)
            return orjson.dumps(
                _text_completion(served_model_name, chat_model.tokenizer, prompts, rows)
            )

        return Response(await asyncio.to_thread(answer), media_type="application/json")

    return app


def _refuse(response_cls, req: Any, served_model_name: str):
    """The error answer for a streaming request or another model's, else None."""
    if req.stream:
        return _error(response_cls, 400, "stream=true is not supported by this server")
    if req.model and req.model != served_model_name:
        return _error(response_cls, 404, f"model {req.model!r} not served here")
    return None


def _scoring_problem(
    prompts: list[list[int]], k: int | None, max_tokens: int, max_entries: int
) -> str | None:
    """Why a scoring request is refused before any model work, or None."""
    if len(prompts) > MAX_PROMPTS_PER_REQUEST:
        return f"{len(prompts)} prompts in one request; this server takes at most {MAX_PROMPTS_PER_REQUEST}"
    for i, p in enumerate(prompts):
        if not p:
            return f"prompt {i} is empty: an empty prompt cannot be scored"
        if len(p) > max_tokens:
            return (f"prompt {i} has {len(p)} tokens; this server's maximum is {max_tokens} "
                    "(serve --max-prompt-tokens)")  # fmt: skip
    entries = sum(len(p) for p in prompts) * ((k or 0) + 1)
    if entries > max_entries:
        return (f"the answer would hold {entries} log-prob entries (prompt tokens x "
                f"(prompt_logprobs + 1)); this server's limit is {max_entries} "
                "(serve --max-logprob-entries): send fewer prompts per request or a smaller k")  # fmt: skip
    return None


def _token_prompts(tokenizer, prompt: Any) -> list[list[int]]:
    if isinstance(prompt, str):
        return [tokenizer(prompt, add_special_tokens=False)["input_ids"]]
    return [prompt] if isinstance(prompt[0], int) else prompt


def score_prompts(
    chat_model: Any, prompts: list[list[int]], k: int | None, temperature: float = 1.0
) -> list[tuple[int, list[dict[str, Any]] | None]]:
    """Per prompt: (the greedy next token, vLLM-style ``prompt_logprobs`` or None). Entry ``t``
    (``t >= 1``) maps the top-``k`` ids and the id at ``t`` to ``{logprob, rank}`` (rank 1 =
    most likely) under the model given ``prompt[:t]``; entry 0 is None."""
    import torch

    out = []
    with chat_model.lock, torch.no_grad():
        for ids in prompts:  # one at a time: no padding, exact per-prompt numbers
            logits = chat_model.model(input_ids=torch.tensor([ids])).logits[0].float()
            logp = torch.log_softmax(logits / temperature, dim=-1)
            nxt = int(logp[-1].argmax())
            out.append((nxt, _position_logprobs(logp, ids, k) if k is not None else None))
    return out


def _position_logprobs(logp_TV, ids: list[int], k: int) -> list[dict[str, Any] | None]:
    entries: list[dict[str, Any] | None] = [None]
    top = logp_TV[:-1].topk(min(k, logp_TV.shape[-1]), dim=-1) if k > 0 else None
    for t in range(1, len(ids)):
        row = logp_TV[t - 1]
        entry = {}
        if top is not None:
            for r, (tid, lp) in enumerate(
                zip(top.indices[t - 1].tolist(), top.values[t - 1].tolist(), strict=True)
            ):
                entry[str(tid)] = {"logprob": lp, "rank": r + 1}
        actual = ids[t]
        if str(actual) not in entry:
            lp = float(row[actual])
            entry[str(actual)] = {"logprob": lp, "rank": int((row > row[actual]).sum()) + 1}
        entries.append(entry)
    return entries


def _text_completion(model: str, tokenizer, prompts, rows) -> dict[str, Any]:
    choices = [
        {"index": i, "text": tokenizer.decode([nxt]), "logprobs": None, "finish_reason": "length",
         "prompt_logprobs": plp}
        for i, (nxt, plp) in enumerate(rows)
    ]  # fmt: skip
    n_prompt = sum(len(p) for p in prompts)
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": {"prompt_tokens": n_prompt, "completion_tokens": len(prompts),
                  "total_tokens": n_prompt + len(prompts)},
    }  # fmt: skip


def _error(response_cls, status: int, message: str):
    return response_cls(
        status_code=status,
        content={"error": {"message": message, "type": "invalid_request_error", "code": status}},
    )


def _completion(model: str, gen: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": gen.text}
    if gen.tool_calls:
        message["tool_calls"] = gen.tool_calls
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": gen.finish_reason}],
        "usage": {
            "prompt_tokens": gen.prompt_tokens,
            "completion_tokens": gen.completion_tokens,
            "total_tokens": gen.prompt_tokens + gen.completion_tokens,
        },
    }


def serve(
    model: str,
    port: int = 8000,
    host: str = "127.0.0.1",
    served_model_name: str | None = None,
    max_prompt_tokens: int = 2048,
    log_level: str = "info",
    max_logprob_entries: int = 2_000_000,
) -> None:
    """Load ``model`` and serve it until interrupted; prints the teacher-pool entry to use. The
    port is bound first: one taken, or a host that is not this machine's, fails at once."""
    import uvicorn

    sock = listen_socket(host, port)
    port = sock.getsockname()[1]  # --port 0: the one the kernel chose, for the pool entry
    chat_model = LocalChatModel(model, max_prompt_tokens=max_prompt_tokens)
    app = create_app(
        chat_model, served_model_name or model, max_logprob_entries=max_logprob_entries
    )
    print("teacher pool entry for this server (paste under `teachers:` in a pool YAML):")
    print(pool_entry(host, port, served_model_name or model), flush=True)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=True)
    uvicorn.Server(config).run(sockets=[sock])


class ServeError(UserError):
    """``serve`` cannot listen where it was asked to; the message names host and port."""


def listen_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host``:``port`` (uvicorn listens on it), or `ServeError`. Bound
    as uvicorn binds it: IPv6 for an address with a colon, else IPv4 (``localhost`` is
    127.0.0.1 even where the resolver lists ::1 first), an empty ``host`` every interface."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(
            host or None, port, family, socket.SOCK_STREAM, 0, socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as err:
        raise ServeError(f"--host {host} --port {port}: cannot listen there: {err}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
    except OSError as err:
        sock.close()
        raise ServeError(
            f"--host {host} --port {port}: cannot listen there: {err.strerror or err}"
        ) from None
    return sock


def pool_entry(host: str, port: int, model_id: str) -> str:
    """The ``teachers:`` YAML list item that points replay at a server started with ``serve``
    (one line; prices 0: a local model costs nothing per token)."""
    import json

    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    if ":" in shown:
        shown = f"[{shown}]"
    name = f"{model_id.split('/')[-1].split(':')[-1]}-{port}"
    name = "".join(c if c.isalnum() or c in "_.:@-" else "-" for c in name)
    entry = {"type": "remote", "name": name, "base_url": f"http://{shown}:{port}/v1",
             "model": model_id}  # fmt: skip
    return "  - " + json.dumps(entry)
