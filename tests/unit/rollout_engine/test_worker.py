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
