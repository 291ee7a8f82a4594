"""One generator for every rollout path: requests from many threads (the agent proxy's
episodes, the native tool loop's turns, evaluation, a Ray rollout worker) are queued in
arrival order and generated together, each token's log-prob recorded by the generation
itself.

**Public interface** (what a rollout worker holds; thread-safe, one model copy per object)::

    gen = Generator(model, pad_id=tok.pad_token_id, eos_ids=[tok.eos_token_id])
    sampling = Sampling(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=256)
    outs = gen.generate([prompt_ids_a, prompt_ids_b], sampling)    # blocks; any thread
    outs = await gen.agenerate([prompt_ids_a], sampling)            # from asyncio
    fut = gen.submit(prompt_ids_a, sampling)                        # concurrent.futures.Future
    outs[0].ids, outs[0].logprobs, outs[0].queued_s                 # a Completion per prompt
    gen.close()

**Scheduling.** One worker thread owns the model. It takes the oldest waiting request and
every request behind it (first in, first out) with the same :class:`Sampling`, up to
``max_batch``, and generates them as one batch: one forward per decoding step for all of
them (``model.generate`` on the padded batch, the prompt prefix they share run once,
lm/prefix.py ``generate_with_prefix``). Requests arriving meanwhile wait for that batch to
end (at most its ``max_new_tokens`` decoding steps), then go in the next one with everything
queued before them: no episode's request waits behind more than the batch in progress,
however many requests another episode sends, unless more than ``max_batch`` requests (or
requests with other sampling settings) were queued ahead of it. Each :class:`Completion`
says how long it queued (``queued_s``) and how long its batch ran (``generate_s``); the
proxy does not count that time against the agent's time limit (agents/sandboxed.py).

**Log-probs** follow TRL's convention: ``log_softmax(logits / T)`` of each sampled token,
the raw logits of the model (before top-k/top-p truncation), ``T`` the sampling temperature
(1 when greedy). A logits processor (:class:`SampledLogprobs`) sees each step's ``[B, V]``
logits as ``generate`` computes them, keeps that step's ``[B, V]`` log-softmax until the next
step reveals the sampled tokens, gathers them, and drops it: never a ``[B, T, V]`` tensor,
never a second forward. Custom logits processors run before ``generate``'s temperature,
top-k and top-p warpers (transformers 5.17 to 5.24, ``_get_logits_processor``); processors
that change logits before the warpers (``repetition_penalty`` other than 1, ``min_p`` is a
warper and does not) are reflected in the log-probs, as in vLLM's processed log-probs.

**Why not transformers' continuous batching** (``init_continuous_batching``,
``add_request``/``get_result``, ``ContinuousBatchingConfig(return_logprobs=True)``; present
in 5.17 and 5.24), evaluated for this: its log-probs are ``log`` of the softmax of the
*processed* scores (after temperature, top-k and top-p: ``ModelRunner._sample``), not TRL's
convention whenever top-k or top-p truncates; it switches the model's attention to a paged
implementation (``switch_to_cb_friendly_attn``) and caches a manager on the model, i.e. on
the very module the trainer trains, between optimizer steps; its per-request settings
cover temperature, top-k and top-p only (``per_request_processors``); a logits processor sees
one row per scheduled request, in an order that changes as requests join and finish, and is
not told which request a row is (our raw-logit recorder cannot be attached); and our
shared-prefix forward (lm/prefix.py), the scripted test models that read
whole rows (``use_cache=False``) and sliding-window/recurrent models would each need a
second path. Requests joining a batch in progress (true continuous batching) is what this
module does not do; it is where a paged-cache backend would plug in behind the same
interface (docs/agents.md, "Not done: joining a batch in progress").
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from composer_replication.lm.prefix import generate_with_prefix


@dataclass(frozen=True)
class Sampling:
    """How one request is sampled. Requests with equal settings share a batch."""

    temperature: float = 1.0
    """0: greedy. Log-probs divide the logits by it (by 1 when greedy)."""
    top_p: float = 1.0
    top_k: int = 0
    """0: no top-k."""
    min_p: float | None = None
    repetition_penalty: float = 1.0
    max_new_tokens: int = 128
    generation_config: Any = field(default=None, compare=False, hash=False)
    """A ``GenerationConfig`` to hand ``generate`` as is (the trainer's, with its extra
    ``generation_kwargs``); the fields above are then read from it
    (:meth:`from_generation_config`)."""

    @classmethod
    def from_generation_config(cls, config: Any) -> Sampling:
        """The settings of a ``GenerationConfig`` (TRL's ``trainer.generation_config``)."""
        sampled = bool(config.do_sample)
        return cls(
            temperature=float(config.temperature or 1.0) if sampled else 0.0,
            top_p=float(config.top_p if config.top_p is not None else 1.0),
            top_k=int(config.top_k or 0),
            min_p=config.min_p,
            repetition_penalty=float(config.repetition_penalty or 1.0),
            max_new_tokens=int(config.max_new_tokens),
            generation_config=config,
        )

    @property
    def logprob_temperature(self) -> float:
        return self.temperature if self.temperature > 0 else 1.0

    def generate_kwargs(self) -> dict[str, Any]:
        """``generate`` arguments (greedy at temperature 0)."""
        if self.generation_config is not None:
            return {"generation_config": self.generation_config}
        kwargs: dict[str, Any] = {"max_new_tokens": self.max_new_tokens}
        if self.temperature <= 0:
            return kwargs | {"do_sample": False}
        kwargs |= {"do_sample": True, "temperature": self.temperature, "top_p": self.top_p,
                   "top_k": self.top_k}  # fmt: skip
        if self.min_p is not None:
            kwargs["min_p"] = self.min_p
        if self.repetition_penalty != 1.0:
            kwargs["repetition_penalty"] = self.repetition_penalty
        return kwargs

    def key(self) -> tuple:
        """What decides whether two requests may share a batch."""
        return (self.temperature, self.top_p, self.top_k, self.min_p, self.repetition_penalty,
                self.max_new_tokens, id(self.generation_config))  # fmt: skip


@dataclass
class Completion:
    """One request's answer: the new tokens up to and including the first end token, one
    log-prob per token, and where its time went."""

    ids: list[int]
    logprobs: list[float]
    queued_s: float = 0.0
    """From :meth:`Generator.submit` to the start of its batch."""
    generate_s: float = 0.0
    """Its batch's generation time."""
    batch_size: int = 1
    """Requests generated with it."""
    batch_index: int = 0
    """Which of the generator's batches it was in (0, 1, ...: the order they ran)."""


class SampledLogprobs(LogitsProcessor):
    """Records ``log_softmax(logits / T)`` of the sampled tokens, step by step (module
    docstring): each call gathers the previous step's log-softmax at the token the step
    appended, then keeps this step's; :meth:`finish` gathers the last step's."""

    def __init__(self, temperature: float):
        self.temperature = temperature
        self._last_logp_BV: torch.Tensor | None = None
        self.steps_B: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._last_logp_BV is not None:
            self._take(input_ids[:, -1])
        self._last_logp_BV = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def _take(self, tokens_B: torch.Tensor) -> None:
        index_B1 = tokens_B.to(self._last_logp_BV.device)[:, None]
        self.steps_B.append(self._last_logp_BV.gather(1, index_B1)[:, 0])
        self._last_logp_BV = None

    def finish(self, last_tokens_B: torch.Tensor) -> torch.Tensor:
        """``[B, N]`` log-probs of the ``N`` generated columns (``last_tokens_B``: the last)."""
        if self._last_logp_BV is not None:
            self._take(last_tokens_B)
        if not self.steps_B:
            return torch.zeros((last_tokens_B.shape[0], 0))
        return torch.stack(self.steps_B, dim=1).cpu()


@dataclass
class _Request:
    prompt_ids: list[int]
    sampling: Sampling
    future: Future
    submitted: float = field(default_factory=time.monotonic)


class Generator:
    """Generates for many callers at once (module docstring).

    Args:
        model: the causal LM (generation runs under ``no_grad``, in the model's mode).
        pad_id: the pad token id.
        eos_ids: end tokens: a completion stops at (and keeps) the first one.
        shared_prefix: run the prompt prefix a batch shares once (lm/prefix.py).
        max_batch: most requests per batch.
        model_context: a function returning a context manager that yields the model to
            generate with (the trainer's ``unwrap_model_for_generation``); default: ``model``.
    """

    def __init__(
        self,
        model: Any,
        pad_id: int,
        eos_ids: int | list[int],
        shared_prefix: bool = True,
        max_batch: int = 64,
        model_context: Callable[[], contextlib.AbstractContextManager] | None = None,
    ):
        self.model, self.pad_id = model, pad_id
        self.eos_ids = [eos_ids] if isinstance(eos_ids, int) else list(eos_ids)
        self.shared_prefix, self.max_batch = shared_prefix, max_batch
        self._model_context = model_context or self._plain_model
        self._queue: deque[_Request] = deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.batches = 0
        """Batches started so far (each: one ``generate`` call)."""

    # ---- public --------------------------------------------------------------------------
    def submit(self, prompt_ids: list[int], sampling: Sampling) -> Future:
        """Queue one request; its future resolves to a :class:`Completion` (or the error
        its batch raised)."""
        return self.submit_all([prompt_ids], sampling)[0]

    def submit_all(self, prompts: list[list[int]], sampling: Sampling) -> list[Future]:
        """Queue requests together (nothing queued by another thread comes between them)."""
        if any(not p for p in prompts):
            raise ValueError("a prompt needs at least one token")
        requests = [_Request(list(p), sampling, Future()) for p in prompts]
        with self._cond:
            if self._closed:
                raise RuntimeError("the generator is closed")
            self._queue.extend(requests)
            self._start_worker()
            self._cond.notify()
        return [r.future for r in requests]

    def generate(self, prompts: list[list[int]], sampling: Sampling) -> list[Completion]:
        """A :class:`Completion` per prompt, in order (queued together: one batch when
        they fit in ``max_batch``)."""
        return [f.result() for f in self.submit_all(prompts, sampling)]

    async def agenerate(self, prompts: list[list[int]], sampling: Sampling) -> list[Completion]:
        """:meth:`generate` for asyncio callers (the event loop is not blocked)."""
        futures = [asyncio.wrap_future(f) for f in self.submit_all(prompts, sampling)]
        return list(await asyncio.gather(*futures))

    def pending(self) -> int:
        """Requests queued and not yet in a batch."""
        with self._cond:
            return len(self._queue)

    def close(self, wait: bool = True) -> None:
        """Finish what is queued, then stop the worker thread; ``wait``: until it has stopped
        (else it stops by itself once the queue is served: no new request is taken)."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if wait and self._thread is not None:
            self._thread.join()

    def __enter__(self) -> Generator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- worker --------------------------------------------------------------------------
    def _start_worker(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="cr-generator", daemon=True)
            self._thread.start()

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                batch = self._take_batch()
            self._serve(batch)

    def _take_batch(self) -> list[_Request]:
        """The oldest request and those right behind it with the same sampling (FIFO)."""
        key = self._queue[0].sampling.key()
        batch = []
        while self._queue and len(batch) < self.max_batch and self._queue[0].sampling.key() == key:
            batch.append(self._queue.popleft())
        return batch

    def _serve(self, batch: list[_Request]) -> None:
        start, index = time.monotonic(), self.batches
        self.batches += 1
        try:
            outs = self._run([r.prompt_ids for r in batch], batch[0].sampling)
        except BaseException as e:  # the callers get it; the worker serves the next batch
            for r in batch:
                r.future.set_exception(e)
            return
        took = time.monotonic() - start
        for r, (ids, logprobs) in zip(batch, outs, strict=True):
            r.future.set_result(Completion(ids, logprobs, queued_s=start - r.submitted,
                                           generate_s=took, batch_size=len(batch),
                                           batch_index=index))  # fmt: skip

    def _run(self, prompts: list[list[int]], sampling: Sampling) -> list[tuple[list, list]]:
        """One batch: ``generate`` with the log-prob recorder; cut at the first end token."""
        recorder = SampledLogprobs(sampling.logprob_temperature)
        with self._model_context() as model, torch.no_grad():
            new_BN = generate_with_prefix(
                model, prompts, self.pad_id, self.shared_prefix,
                logits_processor=LogitsProcessorList([recorder]), pad_token_id=self.pad_id,
                eos_token_id=self.eos_ids, **sampling.generate_kwargs(),
            )  # fmt: skip
        new_BN = new_BN.cpu()
        logps_BN = recorder.finish(new_BN[:, -1]) if new_BN.shape[1] else None
        out = []
        for b, row in enumerate(new_BN.tolist()):
            ids = _until_end(row, self.eos_ids)
            out.append((ids, logps_BN[b, : len(ids)].tolist() if ids else []))
        return out

    @contextlib.contextmanager
    def _plain_model(self) -> Iterator[Any]:
        yield self.model


def _until_end(ids: list[int], ends: list[int]) -> list[int]:
    stops = set(ends)
    end = next((i for i, t in enumerate(ids) if t in stops), None)
    return ids if end is None else ids[: end + 1]
