"""A weight push sends each tied tensor once, and a worker loads it into a bit-identical model."""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_model

from composer_replication.rollout_engine.weight_sync import (
    distinct_tensors,
    load_distinct,
    state_checksum,
)


def test_a_tied_embedding_goes_once_and_loads_bit_identical():
    learner, worker = make_tiny_model(64, seed=1), make_tiny_model(64, seed=2)
    full = learner.state_dict()
    sent = distinct_tensors(full)
    assert set(full) - set(sent) == {"lm_head.weight"}  # the tie: one tensor, two names
    with torch.no_grad():
        learner.lm_head.weight.add_(1.0)  # through the tie: the embedding moves too
    load_distinct(worker, distinct_tensors(learner.state_dict()))
    assert state_checksum(worker.state_dict()) == state_checksum(learner.state_dict())
    assert worker.lm_head.weight.data_ptr() == worker.model.embed_tokens.weight.data_ptr()


def test_a_state_missing_a_real_weight_is_refused():
    model = make_tiny_model(64)
    state = distinct_tensors(model.state_dict())
    state.pop("model.norm.weight")
    with pytest.raises(ValueError, match="missing \\['model.norm.weight'\\]"):
        load_distinct(make_tiny_model(64), state)


def test_a_worker_generates_with_the_kv_cache_the_learners_config_turned_off(tokenizer):
    """transformers' ``Trainer`` sets ``use_cache=False`` in the learner's config; a worker's
    policy copy built from that config still generates with the KV cache (without it every
    step recomputed the whole prompt), and the learner's config is left as it was."""
    from transformers import LlamaForCausalLM

    from composer_replication.envs.arithmetic import ArithmeticEnv
    from composer_replication.lm.generator import Sampling
    from composer_replication.rollout_engine.worker import RolloutWorker, WorkerSettings

    learner = make_tiny_model(len(tokenizer))
    learner.config.use_cache = False  # what Trainer's init does
    settings = WorkerSettings(2, Sampling(temperature=1.0, max_new_tokens=4), 0)
    worker = RolloutWorker(0, None, LlamaForCausalLM, learner.config, tokenizer, ArithmeticEnv,
                           settings)  # fmt: skip
    assert worker.model.generation_config.use_cache is True
    assert learner.config.use_cache is False


def test_a_newest_lookup_older_than_a_concurrent_load_does_not_roll_back(monkeypatch):
    """Seen in CI (``test_delta_and_lora_pushes...[lora]``: a worker at version 1 after
    ``sync(2)``): the run loop looked up the newest weights (version 1), then waited for the
    load lock while a ``sync`` call loaded version 2; once it got the lock it applied version 1
    over 2. Here the lookup returns 1 while a concurrent load moves the worker to 2: the worker
    keeps 2 and applies nothing. A version asked for by number (``force_staleness``) is still
    loaded, older or not."""
    import threading
    from types import SimpleNamespace

    import ray

    from composer_replication.rollout_engine import worker as worker_mod

    applied = []
    monkeypatch.setattr(ray, "get", lambda ref, **_: ref)
    monkeypatch.setattr(
        worker_mod, "apply_push", lambda model, push, parts, held: applied.append(push)
    )
    w = object.__new__(worker_mod.RolloutWorker)
    push = SimpleNamespace(needs=lambda held: [])

    def latest(version):  # the lookup answers, then another thread loads version 2
        w.version = 2
        return (1, [push])

    w.hub = SimpleNamespace(latest_weights=SimpleNamespace(remote=latest))
    w.settings = SimpleNamespace(timeout_s=5.0)
    w.lock, w.load_lock, w.model, w.worker_id, w.version = (
        threading.Lock(),
        threading.Lock(),
        None,
        0,
        1,
    )
    w._load_weights(None)
    assert w.version == 2 and applied == []
    w._load_weights(1)  # asked for by number: loaded
    assert w.version == 1 and applied == [push]
