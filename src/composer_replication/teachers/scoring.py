"""Scoring teachers: models that report their log-probs on *given* token ids (the student's own
completions), for on-policy distillation (channels/distill.py).

* :class:`LocalScorer` runs a Hugging Face model in this process on its own device and dtype,
  frozen (``requires_grad_(False)``, ``eval()``). It reports the same per-position data a
  server does and, for the full-vocabulary loss, its last hidden states and head.
* :class:`RemoteScorer` asks an OpenAI-compatible server through vLLM's protocol: ``POST
  /v1/completions`` with a token-id ``prompt`` (a batch of them), ``max_tokens: 1`` and
  ``prompt_logprobs: k``. ``choices[i].prompt_logprobs[t]`` maps token ids (as strings) to
  ``{"logprob", "rank"}`` for the top-k candidates at position ``t`` *plus* the token actually
  at ``t`` (vLLM's documented behaviour; entry 0 is null). ``composer-replication serve``
  answers the same protocol (replay/server.py). Requests are batched (``rows_per_request``),
  concurrent (``max_concurrency``), and retried only here, at the network edge (429, 5xx,
  timeouts, connection errors; backoff with full jitter, teachers/edge.py). A request that
  still fails, or a malformed answer, makes its rows a :class:`TeacherError`: the channel
  reports them unscored, never a silent 0.

Both use the student's tokenizer: :func:`tokenizer_fingerprint` hashes a tokenizer's vocabulary
and special tokens, and :func:`check_same_tokenizer` compares it before any model loads (a
server reports its fingerprint at ``GET /v1/tokenizer``). Cross-tokenizer distillation is out
of scope.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

from composer_replication.config import (
    ConfigError,
    LocalTeacherConfig,
    RemoteTeacherConfig,
    TeacherConfig,
)
from composer_replication.teachers.edge import (
    TeacherError,
    backoff_delay,
    classify_openai_error,
    http_client,
    post_capped,
)

TOKENIZER_PATH = "/tokenizer"
"""Path under a server's base URL that reports its tokenizer fingerprint."""


class TokenizerMismatchError(ConfigError):
    """A teacher whose tokenizer is not the student's (refused before any model loads)."""


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A short hash of what makes token ids mean the same thing: the vocabulary (token ->
    id, added tokens included) and the special tokens' ids."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    special = {k: getattr(tokenizer, f"{k}_token_id", None) for k in ("bos", "eos", "pad", "unk")}
    blob = json.dumps({"vocab": vocab, "special": special}, ensure_ascii=False).encode()
    return hashlib.sha256(blob).hexdigest()[:32]


def remote_fingerprint(spec: RemoteTeacherConfig, timeout_s: float = 10.0) -> str | None:
    """The fingerprint a server reports at ``GET {base_url}/tokenizer``; None if it reports
    none (a plain vLLM server); a :class:`ConfigError` if nothing answers."""
    import httpx

    url = spec.base_url.rstrip("/") + TOKENIZER_PATH
    try:
        r = httpx.get(url, timeout=timeout_s, headers=_auth_headers(spec))
    except httpx.HTTPError as err:
        raise ConfigError(f"distill.teachers: {spec.name!r}: cannot reach {url}: {err}") from None
    if r.status_code == 404:
        return None
    try:
        value = r.json().get("fingerprint") if r.status_code == 200 else None
    except ValueError:
        value = None
    return value if isinstance(value, str) else None


def check_served_model(spec: RemoteTeacherConfig, timeout_s: float = 10.0) -> None:
    """A remote teacher's ``model`` is one its server lists (``GET {base_url}/models``): a
    misspelt name would fail every scoring call (404) and the run would train without the
    channel. Nothing to check when ``model`` is empty (the server's first model is used) or
    the server cannot be asked (its calls then fail, reported per row)."""
    import httpx

    if not spec.model:
        return
    try:
        r = httpx.get(spec.base_url.rstrip("/") + "/models", timeout=timeout_s,
                      headers=_auth_headers(spec))  # fmt: skip
        ids = [m["id"] for m in r.json()["data"]] if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return
    if ids is not None and spec.model not in ids:
        raise ConfigError(
            f"distill.teachers: {spec.name!r}: model {spec.model!r} is not served at "
            f"{spec.base_url} (GET /models lists {ids[:10]}); fix model or leave it empty for "
            "the server's first model"
        )


def full_vocab_problem(teacher: str, student_rows: int, teacher_rows: int, ids: int) -> str | None:
    """Why the full-vocabulary loss cannot compare these two heads, or None: both softmaxes
    are taken over the rows they share, which must cover the tokenizer's ``ids`` (heads padded
    past it to different sizes are fine)."""
    if min(student_rows, teacher_rows) >= ids:
        return None
    return (f"distill.teachers: {teacher!r}: the full-vocabulary loss needs both heads to cover "
            f"the tokenizer's {ids} ids; the student's has {student_rows} rows, the teacher's "
            f"{teacher_rows}")  # fmt: skip


def check_same_tokenizer(student_ref: str, teachers: list[Any], full_vocab: bool = False) -> None:
    """Refuse (before any model loads) a teacher whose tokenizer differs from the student's:
    local teachers by their tokenizer files, remote ones by the fingerprint their server
    reports; and a remote teacher whose ``model`` its server does not list
    (:func:`check_served_model`). With ``full_vocab`` (the full-vocabulary loss), a local teacher whose head and the
    student's, as their configs declare them, share fewer rows than the tokenizer has ids is
    refused too (:func:`full_vocab_problem`; the channel checks the loaded heads again). Loads
    tokenizers and configs only."""
    from composer_replication.lm.models import ModelLoadError, head_rows, load_tokenizer

    student_tok = load_tokenizer(student_ref)
    mine = tokenizer_fingerprint(student_tok)
    student_rows = head_rows(student_ref) if full_vocab else None
    for t in teachers:
        if isinstance(t, LocalTeacherConfig):
            try:
                theirs, where = tokenizer_fingerprint(load_tokenizer(t.model)), t.model
                rows = head_rows(t.model) if student_rows is not None else None
            except ModelLoadError as err:
                raise ConfigError(f"distill.teachers: {t.name!r}: {err}") from None
            if rows is not None and student_rows is not None:
                if why := full_vocab_problem(t.name, student_rows, rows, len(student_tok)):
                    raise ConfigError(why)
        elif t.check_tokenizer:
            theirs, where = remote_fingerprint(t), t.base_url
            if theirs is None:
                raise TokenizerMismatchError(
                    f"distill.teachers: {t.name!r} reports no tokenizer fingerprint (GET "
                    f"{t.base_url.rstrip('/')}{TOKENIZER_PATH}); serve it with "
                    "`composer-replication serve`, or set check_tokenizer=false if it surely uses "
                    "the student's tokenizer"
                )
            check_served_model(t)
        else:
            _auth_headers(t)  # an unset api_key_env: its line now, not after the models load
            check_served_model(t)
            continue
        if theirs != mine:
            raise TokenizerMismatchError(
                f"distill.teachers: {t.name!r} ({where}) does not use the student's tokenizer "
                f"({student_ref}): fingerprints {theirs} != {mine}. Distillation compares token "
                "ids, so teacher and student must share one vocabulary (cross-tokenizer "
                "distillation is not supported)"
            )


@dataclass
class RowScores:
    """A teacher's view of one completion: per completion position ``t`` (``K`` of them)."""

    actual: list[float]
    """Log-prob of the token the student wrote at ``t`` (NaN if the teacher did not report it)."""
    top_ids: list[list[int]] = field(default_factory=list)
    """The teacher's top-k token ids at ``t``, by rank."""
    top_logps: list[list[float]] = field(default_factory=list)
    """Their log-probs."""


@dataclass
class ScoreStats:
    """Counters of one teacher over the run (the channel reports them as metrics)."""

    requests: int = 0
    failed_requests: int = 0
    scored_rows: int = 0
    failed_rows: int = 0
    scored_tokens: int = 0
    cost_usd: float = 0.0
    seconds: float = 0.0


LOGPROB_SLACK = 1e-3
"""Rounding allowed above 0 for a reported log-prob before the answer is refused."""

MASS_SLACK = 2e-2
"""Rounding allowed above 1 for the summed probability of one position's entries (top-k plus
the sampled token): a server computing in bfloat16 reaches ~1.01; the tail bucket clamps the
excess (losses/distill.py)."""

ZERO_LOGPROB = -9999.0
"""vLLM writes a log-prob of ``-inf`` as -9999.0 (JSON has no infinity): at or below it a
reported log-prob is read as ``-inf``, probability 0."""


ENTRY_BYTES = 256
"""Bytes of JSON one ``prompt_logprobs`` entry may take (``"id": {"logprob", "rank",
"decoded_token"}`` is about 70; a long decoded token, escaped, stays far below)."""


def scoring_byte_limit(seqs: list[list[int]], top_k: int) -> int:
    """The most bytes a ``prompt_logprobs`` answer for ``seqs`` is read to: per position top-k
    entries plus the sampled token's and one spare, :data:`ENTRY_BYTES` each, plus 1 MiB."""
    return sum(len(s) for s in seqs) * (top_k + 2) * ENTRY_BYTES + (1 << 20)


def parse_prompt_logprobs(
    entries: Any, sequence: list[int], prompt_len: int, top_k: int, vocab: int | None = None
) -> RowScores:
    """The completion part (positions ``prompt_len..``) of one choice's ``prompt_logprobs``.

    An answer is untrusted input: anything that is not vLLM's shape raises
    ``TeacherError('malformed')`` naming the position: the wrong number of entries, an entry
    that is not a mapping, a token id that is not a non-negative integer (``"7"`` or ``7``) or
    is past the student's ``vocab`` ids, the same id twice, a log-prob that is not a number (NaN, a bool, a string, a bare number
    instead of ``{"logprob": ...}``) or lies above 0, or entries whose probabilities sum
    past 1. The top-k are taken by log-prob (ties by id), never by the reported ``rank``;
    entries of probability 0 (``-inf``, or vLLM's -9999.0: :data:`ZERO_LOGPROB`) are left out
    of them. The sampled token's log-prob is NaN when the position does not report it, ``-inf``
    when the teacher gives it probability 0 (the channel masks both out of its losses)."""
    if not isinstance(entries, list) or len(entries) != len(sequence):
        got = len(entries) if isinstance(entries, list) else type(entries).__name__
        raise TeacherError(
            "malformed", f"prompt_logprobs has {got} entries for {len(sequence)} tokens"
        )
    row = RowScores(actual=[])
    for pos in range(prompt_len, len(sequence)):
        items = _position(entries[pos], pos, vocab)
        row.actual.append(items.get(sequence[pos], math.nan))
        top = sorted((-lp, tid) for tid, lp in items.items() if lp != -math.inf)[:top_k]
        row.top_ids.append([tid for _, tid in top])
        row.top_logps.append([-neg for neg, _ in top])
    return row


def _position(entry: Any, pos: int, vocab: int | None) -> dict[int, float]:
    """Token id -> log-prob of one position's entry (:func:`parse_prompt_logprobs`)."""
    if not isinstance(entry, dict):
        raise TeacherError("malformed", f"prompt_logprobs[{pos}] is not a mapping")
    out: dict[int, float] = {}
    for key, info in entry.items():
        tid = _token_id(key)
        lp = info.get("logprob") if isinstance(info, dict) else None
        if tid is None or tid in out or (vocab is not None and tid >= vocab):
            why = (
                "not a token id" if tid is None
                else f"token id {tid} reported twice" if tid in out
                else f"token id {tid} is outside the student's vocabulary ({vocab} ids)"
            )  # fmt: skip
            raise TeacherError("malformed", f"prompt_logprobs[{pos}][{str(key)[:20]!r}]: {why}")
        if isinstance(lp, bool) or not isinstance(lp, int | float) or not lp <= LOGPROB_SLACK:
            raise TeacherError("malformed", f"prompt_logprobs[{pos}][{str(key)[:20]!r}]: "
                               f"logprob {str(lp)[:20]} is not a log-prob")  # fmt: skip
        out[tid] = -math.inf if lp <= ZERO_LOGPROB else min(float(lp), 0.0)
    mass = sum(math.exp(lp) for lp in out.values())
    if mass > 1.0 + MASS_SLACK:
        raise TeacherError("malformed", f"prompt_logprobs[{pos}]: probabilities sum to {mass:.3g}")
    return out


def _token_id(key: Any) -> int | None:
    """A token id from a ``prompt_logprobs`` key (a decimal string, or an int), else None."""
    if isinstance(key, int) and not isinstance(key, bool):
        return key if key >= 0 else None
    if isinstance(key, str) and 0 < len(key) <= 12 and key.isascii() and key.isdigit():
        return int(key)
    return None


class LocalScorer:
    """A frozen local teacher (module docstring). ``model``/``tokenizer`` may be given loaded
    (tests); otherwise ``spec.model`` is loaded on ``device`` in ``spec.dtype``."""

    def __init__(self, spec: LocalTeacherConfig, device: Any, model: Any = None):
        import torch

        from composer_replication.lm.models import load_model

        self.spec = spec
        self.device = torch.device(device)
        if model is None:
            model = load_model(spec.model, dtype=spec.dtype)
        self.model = model.to(self.device).eval().requires_grad_(False)
        self.stats = ScoreStats()
        self.last_hidden = None
        self.vocab: int | None = None
        """The student's ids, ``[0, vocab)`` (the channel sets its head's rows): the head is
        cut to them, so a head padded past the student's never names an id it lacks."""

    def head_weight(self) -> Any:
        """The head (``[V, H_t]``), cut to :attr:`vocab` rows when set."""
        from composer_replication.lm.models import head_weight

        return head_weight(self.model).detach()[: self.vocab]

    def embedding_rows(self) -> int:
        """Token ids the teacher can read: ``[0, embedding_rows)``."""
        return self.model.get_input_embeddings().weight.shape[0]

    def hidden_states(self, sequences: list[list[int]], prompt_lens: list[int], pad_id: int):
        """``[R, K, H_t]`` last hidden states predicting each row's completion tokens (rows
        right-padded to the longest completion ``K``), on the teacher's device."""
        import torch

        from composer_replication.lm.models import backbone

        ids, mask, starts = _pad(sequences, prompt_lens, pad_id, self.device)
        k = max(len(s) - p for s, p in zip(sequences, prompt_lens, strict=True))
        with torch.no_grad():
            h = backbone(self.model)(input_ids=ids, attention_mask=mask).last_hidden_state
        idx = (
            torch.tensor(starts, device=self.device)[:, None]
            - 1
            + torch.arange(k, device=self.device)
        )
        idx = idx.clamp(max=h.shape[1] - 1)
        return h.gather(1, idx[..., None].expand(-1, -1, h.shape[-1]))

    def score(self, sequences: list[list[int]], prompt_lens: list[int], top_k: int, pad_id: int):
        """One :class:`RowScores` per sequence (a single padded forward). The hidden states
        stay in ``last_hidden`` (``[R, K, H_t]``, row order of the call) for the
        full-vocabulary loss, so it needs no second forward. A row holding an id past the
        teacher's embedding (a student head padded past the teacher's) is a malformed
        :class:`TeacherError`: it is read as padding, never indexed."""
        import torch

        t0 = time.perf_counter()
        limit = self.embedding_rows()
        bad = [any(t >= limit or t < 0 for t in seq) for seq in sequences]
        readable = [[pad_id] * len(s) if b else s for s, b in zip(sequences, bad, strict=True)]
        h = self.last_hidden = self.hidden_states(readable, prompt_lens, pad_id)
        with torch.no_grad():
            logp = torch.log_softmax(h.float() @ self.head_weight().float().T, dim=-1)
            top = logp.topk(min(top_k, logp.shape[-1]), dim=-1)
        out: list[Any] = []
        for r, (seq, p) in enumerate(zip(sequences, prompt_lens, strict=True)):
            if bad[r]:
                out.append(TeacherError("malformed", f"a token id past the teacher's {limit} "
                                        "embedding rows"))  # fmt: skip
                continue
            comp = torch.tensor(seq[p:], device=logp.device)
            n = len(comp)
            actual = logp[r, :n].gather(1, comp[:, None]).squeeze(1) if n else comp.float()
            out.append(
                RowScores(actual.tolist(), top.indices[r, :n].tolist(), top.values[r, :n].tolist())
            )
        self._count(sequences, sum(bad), time.perf_counter() - t0)
        return out

    def _count(self, sequences, failed: int, seconds: float) -> None:
        self.stats.requests += 1
        self.stats.scored_rows += len(sequences) - failed
        self.stats.failed_rows += failed
        self.stats.scored_tokens += sum(len(s) for s in sequences)
        self.stats.seconds += seconds

    async def ascore(self, sequences, prompt_lens, top_k: int, pad_id: int) -> list[Any]:
        """:meth:`score` in a worker thread; an exception makes every row a TeacherError."""
        try:
            return await asyncio.to_thread(self.score, sequences, prompt_lens, top_k, pad_id)
        except Exception as err:  # a local failure is reported per row, not raised into the step
            self.stats.failed_rows += len(sequences)
            return [TeacherError("other", f"{type(err).__name__}: {err}")] * len(sequences)

    async def aclose(self) -> None:
        return None


def _pad(sequences: list[list[int]], prompt_lens: list[int], pad_id: int, device: Any):
    """Left-padded ids and mask, and each row's completion start in the padded tensor."""
    import torch

    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    starts = []
    for r, (seq, p) in enumerate(zip(sequences, prompt_lens, strict=True)):
        off = width - len(seq)
        ids[r, off:] = torch.tensor(seq)
        mask[r, off:] = 1
        starts.append(off + p)
    return ids.to(device), mask.to(device), starts


def _auth_headers(spec: RemoteTeacherConfig) -> dict[str, str]:
    if not spec.api_key_env:
        return {}
    key = os.environ.get(spec.api_key_env, "")
    if not key:
        raise ConfigError(f"distill.teachers: {spec.name!r}: {spec.api_key_env} is not set")
    return {"Authorization": f"Bearer {key}"}


class RemoteScorer:
    """A teacher behind vLLM's ``prompt_logprobs`` protocol (module docstring)."""

    def __init__(self, spec: RemoteTeacherConfig, sleep=asyncio.sleep):
        self.spec = spec
        self.stats = ScoreStats()
        self._sleep = sleep
        self._client = None
        self.vocab: int | None = None
        """The student's ids, ``[0, vocab)`` (the channel sets it): an answer naming another
        id fails its row as malformed."""

    def _get_client(self):
        import openai

        if self._client is None:  # one client per event loop run (see aclose)
            key = _auth_headers(self.spec).get("Authorization", "Bearer none").split(" ", 1)[1]
            self._client = openai.AsyncOpenAI(
                base_url=self.spec.base_url, api_key=key, max_retries=0,
                timeout=self.spec.timeout_s, http_client=http_client(self.spec.timeout_s),
            )  # fmt: skip
        return self._client

    async def ascore(self, sequences, prompt_lens, top_k: int, pad_id: int) -> list[Any]:
        """One :class:`RowScores` or :class:`TeacherError` per row; ``rows_per_request`` rows per
        request, ``max_concurrency`` requests at once."""
        n = self.spec.rows_per_request
        gate = asyncio.Semaphore(self.spec.max_concurrency)
        chunks = [range(i, min(i + n, len(sequences))) for i in range(0, len(sequences), n)]

        async def one(rows: range) -> list[Any]:
            async with gate:
                try:
                    return await self._request(
                        [sequences[r] for r in rows], [prompt_lens[r] for r in rows]
                    )
                except ConfigError:
                    raise  # the run's configuration (an unset api_key_env): stop with its line
                except Exception as err:  # unforeseen: these rows fail, the step goes on
                    self.stats.failed_requests += 1
                    self.stats.failed_rows += len(rows)
                    return [TeacherError("other", f"{type(err).__name__}: {err}")] * len(rows)

        parts = await asyncio.gather(*(one(rows) for rows in chunks))
        return [x for part in parts for x in part]

    async def _request(self, seqs: list[list[int]], plens: list[int]) -> list[Any]:
        """One request for ``seqs`` (retried at the edge): per row its :class:`RowScores`, or a
        :class:`TeacherError` (the request failed, or that row's answer is malformed)."""
        t0 = time.perf_counter()
        for attempt in range(self.spec.max_retries + 1):
            self.stats.requests += 1
            try:
                body = await self._post(seqs)
            except TeacherError as err:
                err.attempts = attempt + 1
                if err.retryable and attempt < self.spec.max_retries:
                    await self._sleep(backoff_delay(attempt, err.retry_after, self.spec.backoff_base_s,
                                                   self.spec.backoff_cap_s))  # fmt: skip
                    continue
                if err.answered:  # an answer arrived (too long to read): billed
                    self._bill(seqs)
                self.stats.failed_requests += 1
                self.stats.failed_rows += len(seqs)
                return [err] * len(seqs)
            self._bill(seqs)  # answered: billed, whatever the body holds
            self.stats.seconds += time.perf_counter() - t0
            try:
                rows = self._parse(body, seqs, plens)
            except TeacherError as err:  # unreadable as a whole: not retried
                err.attempts = attempt + 1
                self.stats.failed_requests += 1
                self.stats.failed_rows += len(seqs)
                return [err] * len(seqs)
            failed = sum(isinstance(r, TeacherError) for r in rows)
            self.stats.scored_rows += len(seqs) - failed
            self.stats.failed_rows += failed
            return rows
        raise AssertionError("unreachable")

    def _bill(self, seqs: list[list[int]]) -> None:
        tokens = sum(len(s) for s in seqs)
        self.stats.scored_tokens += tokens
        self.stats.cost_usd += tokens * self.spec.price_in_per_mtok / 1e6

    async def _post(self, seqs: list[list[int]]) -> bytes:
        """The answer's bytes (read up to :func:`scoring_byte_limit`); raises TeacherError."""
        kwargs: dict[str, Any] = {
            "model": self.spec.model or await self._served_model(),
            "prompt": seqs,
            "max_tokens": 1,
            "temperature": 1.0,
            "extra_body": {"prompt_logprobs": self.spec.top_k},
        }
        create = self._get_client().completions.with_streaming_response.create
        limit = scoring_byte_limit(seqs, self.spec.top_k)
        return await post_capped(create, kwargs, limit, self.spec.timeout_s)

    async def _served_model(self) -> str:
        """The server's first listed model (``model`` left empty: the server's only one)."""
        import openai

        if not getattr(self, "_model_id", None):
            try:
                page = await self._get_client().models.list()
            except openai.APIError as err:
                raise classify_openai_error(err) from err
            if not page.data:
                raise TeacherError("malformed", "the server lists no model (GET /models)")
            self._model_id = page.data[0].id
        return self._model_id

    def _parse(self, body: bytes, seqs: list[list[int]], plens: list[int]) -> list[Any]:
        """Per row a :class:`RowScores` or a malformed-answer :class:`TeacherError`; raises
        ``TeacherError('malformed')`` when the answer as a whole is unreadable."""
        try:
            choices = json.loads(body)["choices"]
            by_index = {int(c.get("index", i)): c for i, c in enumerate(choices)}
            entries = [by_index[i]["prompt_logprobs"] for i in range(len(seqs))]
        except (
            ValueError,
            KeyError,
            TypeError,
            AttributeError,
            RecursionError,
            OverflowError,
        ) as err:
            raise TeacherError(
                "malformed", f"{type(err).__name__}: {err}; body={body[:120]!r}"
            ) from err
        out: list[Any] = []
        for e, s, p in zip(entries, seqs, plens, strict=True):
            try:
                out.append(parse_prompt_logprobs(e, s, p, self.spec.top_k, self.vocab))
            except TeacherError as err:
                out.append(err)
            except Exception as err:  # an answer no rule above foresaw: this row, not the step
                out.append(TeacherError("malformed", f"{type(err).__name__}: {err}"))
        return out

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None


def build_scorer(spec: TeacherConfig, student_device: Any, model: Any = None) -> Any:
    """The scoring client for one teacher: :class:`LocalScorer` on its device (``same``: the
    student's) for ``type: local``, :class:`RemoteScorer` for ``type: remote``. ``model``: an
    already loaded local model (tests)."""
    if isinstance(spec, LocalTeacherConfig):
        device = student_device if spec.device == "same" else spec.device
        return LocalScorer(spec, device, model)
    return RemoteScorer(spec)
