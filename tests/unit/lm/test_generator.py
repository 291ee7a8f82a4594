"""The one generator (lm/generator.py) on a tiny random Llama in fp32: log-probs recorded by
the generation equal a fresh forward's, one forward per decoding step serves a whole batch
(no second forward for log-probs), requests are batched in arrival order, and callers on
threads and on asyncio are served together."""

from __future__ import annotations

import asyncio
import contextlib
import threading

import pytest
import torch
from conftest import make_tiny_model
from support.generation import counted_forwards, forward_logprobs, gated_context

from composer_replication.lm.generator import Generator, Sampling

SHARED = [11, 12, 13, 14, 15, 16, 17, 18]
"""A prompt prefix every test prompt repeats (a system prompt, tool schemas)."""


@pytest.fixture(scope="module")
def model():
    return make_tiny_model(300, seed=1, max_positions=512).eval()


def _prompts(n: int) -> list[list[int]]:
    return [SHARED + [20 + i, 40 + (i * 7) % 50] for i in range(n)]


@pytest.mark.parametrize("shared_prefix", [True, False], ids=["prefix", "plain"])
@pytest.mark.parametrize(
    "sampling",
    [Sampling(temperature=1.0, max_new_tokens=10),
     Sampling(temperature=0.7, max_new_tokens=10),
     Sampling(temperature=0.7, top_k=20, top_p=0.9, max_new_tokens=10),
     Sampling(temperature=0.0, max_new_tokens=10)],
    ids=["T1", "T0.7", "T0.7-top-k-top-p", "greedy"],
)  # fmt: skip
def test_recorded_logprobs_equal_a_fresh_forward(model, sampling, shared_prefix):
    """``log_softmax(raw logits / T)`` at every sampled token (T = 1 when greedy): top-k and
    top-p truncate the sampling, not the recorded log-probs (TRL's convention)."""
    torch.manual_seed(0)
    prompts = _prompts(5) + [[7, 8]]
    with Generator(model, pad_id=0, eos_ids=[2], shared_prefix=shared_prefix) as gen:
        outs = gen.generate(prompts, sampling)
    assert {o.batch_size for o in outs} == {len(prompts)}
    for prompt, out in zip(prompts, outs, strict=True):
        assert 1 <= len(out.ids) == len(out.logprobs) <= 10
        want = forward_logprobs(model, prompt, out.ids, sampling.logprob_temperature)
        torch.testing.assert_close(torch.tensor(out.logprobs), want, atol=1e-5, rtol=1e-5)
    assert len({tuple(o.ids) for o in outs}) > 1


@pytest.mark.parametrize("shared_prefix", [True, False], ids=["prefix", "plain"])
def test_a_model_whose_config_turns_the_cache_off_still_records_exact_logprobs(shared_prefix):
    """transformers' Trainer sets ``use_cache=False`` in the policy's config; a rollout
    worker's copy is built from it. Rows that share their whole prompt (a GRPO group) hand
    ``generate`` the prefix's cache: with the cache off it ran each row from its first token
    on top of it (the prefix twice; log-probs off by up to 3.6e-2 before the fix)."""
    model = make_tiny_model(300, seed=1, max_positions=512).eval()
    model.generation_config.use_cache = False
    prompt = SHARED + [19]
    torch.manual_seed(0)
    with Generator(model, pad_id=0, eos_ids=[2], shared_prefix=shared_prefix) as gen:
        outs = gen.generate([prompt] * 4, Sampling(temperature=0.7, max_new_tokens=8))
    for out in outs:
        want = forward_logprobs(model, prompt, out.ids, 0.7)
        torch.testing.assert_close(torch.tensor(out.logprobs), want, atol=1e-5, rtol=1e-5)


def test_one_generation_per_request_no_second_forward(model):
    """A request of N new tokens costs N forwards (the prompt's, then one per new token but
    the last), plus one for the shared prefix when it is run apart; eight requests queued
    together cost the forwards of the longest one, each forward carrying all eight rows.
    The old proxy policy ran a second full forward per request for its log-probs."""
    sampling = Sampling(temperature=1.0, max_new_tokens=12)
    net = model.model  # the decoder stack: every forward goes through it
    torch.manual_seed(1)
    for shared_prefix, extra in ((False, 0), (True, 1)):
        with Generator(model, 0, [2], shared_prefix=shared_prefix) as gen:
            with counted_forwards(net) as calls:
                (out,) = gen.generate([SHARED + [30]], sampling)
        assert len(calls) == len(out.ids) + extra, (shared_prefix, calls)
    gate = threading.Event()
    context = gated_context(model, gate)
    with Generator(model, 0, [2], model_context=context) as gen:
        first = gen.submit([5, 6], sampling)  # takes the worker, which waits at the gate
        while gen.pending():
            pass
        threads = [threading.Thread(target=lambda p=p: results.append(gen.generate([p], sampling)[0]))
                   for p in _prompts(8)]  # fmt: skip
        results: list = []
        with counted_forwards(net) as calls:
            for t in threads:
                t.start()
            while gen.pending() < 8:
                pass
            gate.set()
            first.result()
            for t in threads:
                t.join()
    batch = [c for c in calls if c != 1]  # the gated request's own forwards carry 1 row
    assert {r.batch_size for r in results} == {8} and len({r.batch_index for r in results}) == 1
    assert batch and set(batch) == {8}
    assert len(batch) == max(len(r.ids) for r in results)  # (the shared prefix: 1 row)


def test_requests_are_batched_in_arrival_order(model):
    """First in, first out: with two requests per batch, the batches run in the order the
    requests came, whatever thread sent them; one caller's five requests do not pass
    another's one."""
    sampling = Sampling(temperature=1.0, max_new_tokens=3)
    gate = threading.Event()
    order = ["b1", "b2", "a1", "b3", "b4", "b5"]
    gen = Generator(model, 0, [2], max_batch=2, model_context=gated_context(model, gate))
    futures = {"first": gen.submit([5], sampling)}
    while gen.pending():
        pass
    for i, name in enumerate(order):
        futures[name] = gen.submit([6, 7 + i], sampling)
    gate.set()
    done = {name: f.result() for name, f in futures.items()}
    gen.close()
    batches = [done[name].batch_index for name in order]
    assert batches == [1, 1, 2, 2, 3, 3]
    assert done["a1"].batch_index < done["b5"].batch_index
    assert all(done[n].queued_s >= 0 and done[n].generate_s > 0 for n in order)


def test_different_sampling_settings_never_share_a_batch(model):
    gate = threading.Event()
    hot, cold = (
        Sampling(temperature=1.0, max_new_tokens=4),
        Sampling(temperature=0.0, max_new_tokens=4),
    )
    context = gated_context(model, gate)
    with Generator(model, 0, [2], model_context=context) as gen:
        gen.submit([5], hot)
        while gen.pending():
            pass
        futures = gen.submit_all([[6, 7], [6, 8]], cold) + gen.submit_all([[6, 9]], hot)
        gate.set()
        outs = [f.result() for f in futures]
    assert [o.batch_size for o in outs] == [2, 2, 1]
    assert outs[0].batch_index == outs[1].batch_index < outs[2].batch_index


def test_asyncio_and_thread_callers_share_the_generator(model):
    """A Ray rollout worker calls from asyncio; the proxy from threads."""
    sampling = Sampling(temperature=1.0, max_new_tokens=5)
    with Generator(model, 0, [2]) as gen:

        async def main():
            return await asyncio.gather(*(gen.agenerate([p], sampling) for p in _prompts(4)))

        thread_out: list = []
        t = threading.Thread(target=lambda: thread_out.extend(gen.generate(_prompts(2), sampling)))
        t.start()
        outs = [o for group in asyncio.run(main()) for o in group]
        t.join()
    for prompt, out in zip(_prompts(4) + _prompts(2), outs + thread_out, strict=True):
        want = forward_logprobs(model, prompt, out.ids, 1.0)
        torch.testing.assert_close(torch.tensor(out.logprobs), want, atol=1e-5, rtol=1e-5)


def test_a_failing_batch_fails_its_callers_and_the_worker_goes_on(model):
    calls = [0]

    @contextlib.contextmanager
    def context():
        calls[0] += 1
        if calls[0] == 1:
            raise RuntimeError("device lost")
        yield model

    with Generator(model, 0, [2], model_context=context) as gen:
        with pytest.raises(RuntimeError, match="device lost"):
            gen.generate([[5, 6]], Sampling(max_new_tokens=2))
        (out,) = gen.generate([[5, 6]], Sampling(max_new_tokens=2))
    assert 1 <= len(out.ids) <= 2
    with pytest.raises(RuntimeError, match="closed"):
        gen.submit([5], Sampling())
    with pytest.raises(ValueError, match="at least one token"):
        Generator(model, 0, [2]).submit([], Sampling())
