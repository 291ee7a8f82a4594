"""One description of a teacher, used by trace replay (a pool file, ``replay --pool``) and by
on-policy distillation (``distill.teachers``): a union keyed on ``type``.

* ``type: local`` -- a Hugging Face model run in this process (:class:`LocalTeacherConfig`).
* ``type: remote`` -- an OpenAI-compatible server (:class:`RemoteTeacherConfig`): replay asks
  it for chat answers (``/v1/chat/completions``), distillation for prompt log-probs of given
  token ids (``/v1/completions`` with vLLM's ``prompt_logprobs``).

A pool file is ``teachers: [...]`` (:class:`TeacherPool`, :func:`load_pool`)::

    teachers:
      - type: remote
        name: smol-greedy
        base_url: http://127.0.0.1:8101/v1
        model: smol
        api_key_env: OPENROUTER_API_KEY        # the *name* of the env var holding the key
        price_in_per_mtok: 0.10
        price_out_per_mtok: 0.40
        max_tokens: 32
        tier: 0
      - type: local
        name: smol-local
        model: embedded:smollm2-135m-instruct

Written before the two were one: a teacher without ``type`` is remote when it has a
``base_url``, local otherwise; ``base_url: local`` still loads as ``type: local``, with a
deprecation line naming the new key. The teacher clients live in ``teachers/`` (the package
both replay and the distill channel use). Imports no torch."""

from __future__ import annotations

import logging
import os
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from composer_replication.config.base import ConfigError, load_yaml_mapping, resolve_config_path

log = logging.getLogger(__name__)

TEACHER_NAME = r"^[A-Za-z0-9_.:/@-]+$"
"""A teacher's name: journal rows, pair provenance and metric keys carry it."""

LOCAL_BASE_URL = "local"
"""The old pool spelling of a local teacher (``base_url: local``): now ``type: local``."""


class TeacherBase(BaseModel):
    """What every teacher has, whichever room asks it. Strict: ``"12"`` is no int."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: str = Field(min_length=1, max_length=128, pattern=TEACHER_NAME)
    """Unique name among the teachers of a pool or a channel; journal rows, pair provenance and
    metrics (``distill/teacher/<name>/...``: no ``/`` there) use it."""
    max_concurrency: int = Field(4, ge=1, le=1024)
    """Calls (replay) or scoring requests (distill) to this teacher in flight at once."""
    price_in_per_mtok: float = Field(0.0, ge=0, le=10_000)
    """USD per million prompt tokens (replay's budget; ``distill.budget_usd`` counts the scored
    tokens at this price)."""
    price_out_per_mtok: float = Field(0.0, ge=0, le=10_000)
    """USD per million completion tokens (replay; scoring generates none)."""
    max_tokens: int = Field(256, ge=1, le=1_000_000)
    """Replay: completion token limit per answer (also the worst case the budget reserves)."""
    temperature: float = Field(0.0, ge=0, le=5)
    """Replay: sampling temperature of an answer (scoring always reads the teacher at 1)."""
    tier: int = Field(0, ge=0, le=100)
    """Replay: tiered replay asks tier 0 first and escalates to higher tiers on low agreement."""
    weight: float = Field(1.0, gt=0, le=1000)
    """Replay: vote weight for the ``weighted`` consensus strategy."""
    keep_cut_answers: bool = False
    """Replay: keep an answer cut at ``max_tokens`` (``finish_reason: length``) as a whole
    answer. Off (default): it is billed but journaled as ``incomplete`` and is never a
    consensus answer (an action cut mid-call is not the action the teacher meant). On for demos
    with a small ``max_tokens``. A content-filtered answer is never kept."""

    def cost_usd(self, prompt_tokens: int, completion_tokens: int) -> float:
        """Dollars for one call with this usage."""
        return (
            prompt_tokens * self.price_in_per_mtok + completion_tokens * self.price_out_per_mtok
        ) / 1e6


class LocalTeacherConfig(TeacherBase):
    """A teacher run in this process: a Hugging Face model, frozen, in its own dtype. Replay
    generates its chat answers in a worker thread; distillation scores the student's tokens with
    it (it must use the student's vocabulary)."""

    type: Literal["local"] = "local"
    model: str = Field(min_length=1)
    """Hub id, local directory, ``.gguf`` file or ``embedded:NAME`` (lm/models.py)."""
    device: str = Field("same", pattern=r"^(same|cpu|cuda(:\d+)?|mps|xpu(:\d+)?)$")
    """Where the teacher runs: ``same`` (distill: the student's device; replay: where the model
    loads by default), ``cpu``, ``cuda:1``, ..."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """The teacher's parameter dtype (independent of the student's)."""
    allow_student_weights: bool = False
    """Distill: a teacher whose ``model`` is the student's own ``model.name`` is refused (a
    frozen copy of the student teaches nothing) unless this is true."""

    def request_params(self) -> dict[str, Any]:
        """Everything besides the messages that shapes an answer (hashed into replay's journal
        key; ``base_url: local`` as pools wrote it before ``type``, so old journals match)."""
        return {"base_url": LOCAL_BASE_URL, "model": self.model,
                "max_tokens": self.max_tokens, "temperature": self.temperature}  # fmt: skip


class RemoteTeacherConfig(TeacherBase):
    """A teacher behind an OpenAI-compatible server (OpenRouter, vLLM, SGLang, Ollama,
    ``composer-replication serve``). Retries live at the network edge (teachers/edge.py):
    backoff with full jitter on 429, 5xx, timeouts and connection errors."""

    type: Literal["remote"] = "remote"
    base_url: str = Field(min_length=1, pattern=r"^https?://")
    """Base URL ending in ``/v1`` (e.g. ``https://openrouter.ai/api/v1``)."""
    model: str = ""
    """Model id sent in each request. Empty: the server's first listed model (distill only; a
    replay pool names it)."""
    api_key_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """Name of the environment variable holding the API key (never the key). None: no key."""
    timeout_s: float = Field(120.0, gt=0, le=3600)
    """Per-attempt deadline, seconds: the whole attempt (connect, send, and a body that trickles
    in byte by byte) must finish within it, else it counts as a retryable timeout."""
    max_retries: int = Field(3, ge=0, le=50)
    """Retries after the first attempt on 429/5xx/timeouts/connection errors."""
    backoff_base_s: float = Field(0.5, gt=0, le=60)
    """First backoff window, seconds; doubles per retry."""
    backoff_cap_s: float = Field(30.0, gt=0, le=600)
    """Largest backoff window, seconds; a server asking (``Retry-After``) for a longer wait
    fails the call at once, saying so."""
    top_k: int = Field(8, ge=1, le=1000)
    """Distill: log-probs per position requested (``prompt_logprobs``); vLLM caps it at 20
    unless the server runs with ``--max-logprobs -1``. The sampled token's always comes back."""
    rows_per_request: int = Field(8, ge=1, le=4096)
    """Distill: completions scored per request (a batched token-id prompt)."""
    check_tokenizer: bool = True
    """Distill: compare the server's tokenizer fingerprint (``GET /v1/tokenizer``) with the
    student's before any model loads. A server that reports none (plain vLLM) is refused while
    this is true; set false only when you know it serves the student's tokenizer."""

    def request_params(self) -> dict[str, Any]:
        """Everything besides the messages that shapes an answer (hashed into replay's journal
        key)."""
        return {"base_url": self.base_url, "model": self.model,
                "max_tokens": self.max_tokens, "temperature": self.temperature}  # fmt: skip


TeacherConfig = Annotated[LocalTeacherConfig | RemoteTeacherConfig, Field(discriminator="type")]
"""A teacher, keyed on ``type`` (``local`` or ``remote``)."""

_warned: set[str] = set()


def teacher_shorthand(item: Any, index: int, where: str = "teachers") -> Any:
    """A teacher as written, made a mapping with ``type``: a string is a model reference (a
    local teacher) or an ``http(s)://`` URL (a remote one); a mapping without ``type`` is
    remote if it has a ``base_url``, local otherwise; ``base_url: local`` (deprecated) is
    ``type: local``, with one line logged once per process."""
    if isinstance(item, str):
        if item.startswith(("http://", "https://")):
            return {"type": "remote", "name": f"teacher{index}", "base_url": item}
        return {"type": "local", "name": f"teacher{index}", "model": item}
    if not isinstance(item, dict) or "type" in item and item.get("base_url") != LOCAL_BASE_URL:
        return item
    if item.get("base_url") == LOCAL_BASE_URL:
        item = {k: v for k, v in item.items() if k != "base_url"}
        item.setdefault("type", "local")
        if where not in _warned:
            _warned.add(where)
            log.warning("%s[%d].base_url: local is deprecated: use type: local", where, index)
    kind = item.get("type") or ("remote" if "base_url" in item else "local")
    return {"type": kind, "name": f"teacher{index}", **item}


class TeacherPool(BaseModel):
    """A replay pool: ``teachers: [teacher, ...]`` with unique names."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    teachers: list[TeacherConfig] = Field(min_length=1)
    """The teachers; order is kept (ties in consensus break in this order)."""

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("teachers"), list):
            teachers = [teacher_shorthand(t, i) for i, t in enumerate(data["teachers"])]
            return {**data, "teachers": teachers}
        return data

    @model_validator(mode="after")
    def _check(self) -> TeacherPool:
        names = [t.name for t in self.teachers]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"duplicate teacher names: {dup}")
        unnamed = [t.name for t in self.teachers if not t.model]
        if unnamed:
            raise ValueError(f"teachers {unnamed}: model is empty (a pool names the model)")
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
        lines = [f"{p}: {_field(e['loc']) or '<root>'}: {e['msg']}" for e in err.errors()]
        raise PoolError("invalid teacher pool\n" + "\n".join(lines)) from err


def _field(loc: tuple[Any, ...]) -> str:
    """A validation error's place as the file spells it (``teachers.0.max_tokens``): the
    union's tag (``remote``, ``local``) pydantic puts after the index is left out."""
    kinds = ("local", "remote")
    parts = [x for i, x in enumerate(loc) if not (x in kinds and i and isinstance(loc[i - 1], int))]
    return ".".join(str(x) for x in parts)
