"""Weight pushes without Ray (rollout_engine/weight_sync.py): the learner's publisher makes each
version's parts, a worker's model applies the parts it needs. ``delta``: the worker equals the
learner's mirror bit for bit after every push, the mirror is within the codec's bound of the
learner's weights, and error feedback sends the dropped part again; ``lora``: only the
adapter travels after the first push, and the worker equals the learner."""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_model

from composer_replication.config import PeftConfig
from composer_replication.lm.models import apply_lora
from composer_replication.rollout_engine.weight_sync import (
    Publisher,
    Push,
    apply_push,
    distinct_tensors,
    payload_bytes,
    state_checksum,
)


def _checksum(state) -> str:
    return state_checksum(distinct_tensors(state))


def _push(publisher: Publisher, model, version: int) -> tuple[Push, dict]:
    after = publisher.last
    full, update = publisher.parts(model, version)
    return Push(publisher.mode, full, update, after), {"full": full, "update": update}


def _apply(worker, push: Push, parts: dict, held: int) -> None:
    apply_push(worker, push, {n: parts[n] for n in push.needs(held)}, held)


def _step(model, seed: int, scale: float = 1e-2) -> None:
    """A stand-in for an optimizer step: every weight moves by a seeded random amount."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)


def _max_err(model, mirror) -> dict[str, float]:
    state = distinct_tensors(model.state_dict())
    return {k: float((state[k] - mirror[k]).abs().max()) for k in state}


@pytest.mark.parametrize("codec", ["int8", "bf16"])
def test_a_delta_worker_equals_the_mirror_and_the_mirror_tracks_the_weights(codec):
    """Five steps, a push after each: the worker applies only the encoded delta (it holds the
    version the delta applies to) and its checksum equals the mirror's every time; each
    tensor of the mirror is within the codec's bound of the learner's (int8: half a step of
    ``max|delta| / 127``; bf16: a relative 2^-8 of each element); the delta is a quarter
    (int8) or half (bf16) of the full push's bytes."""
    learner, worker = make_tiny_model(64, seed=1), make_tiny_model(64, seed=2)
    publisher = Publisher("delta", codec)
    push, parts = _push(publisher, learner, 0)
    full_bytes = payload_bytes(parts["full"])
    _apply(worker, push, parts, -1)
    assert _checksum(worker.state_dict()) == state_checksum(publisher.mirror)
    for version in range(1, 6):
        _step(learner, version)
        before = {k: v.clone() for k, v in publisher.mirror.items()}
        delta = {k: v - before[k] for k, v in distinct_tensors(learner.state_dict()).items()}
        push, parts = _push(publisher, learner, version)
        assert push.needs(version - 1) == ["update"]
        _apply(worker, push, parts, version - 1)
        assert _checksum(worker.state_dict()) == state_checksum(publisher.mirror)
        state = distinct_tensors(learner.state_dict())
        for name, d in delta.items():
            err = (state[name] - publisher.mirror[name]).abs()
            if codec == "int8":
                assert float(err.max()) <= float(d.abs().max()) / 254 * (1 + 1e-5) + 1e-12, name
            else:
                assert bool((err <= d.abs() * 2**-8 + 1e-12).all()), name
        ratio = payload_bytes(parts["update"]) / full_bytes
        assert ratio == pytest.approx(0.25 if codec == "int8" else 0.5)


def test_error_feedback_sends_what_the_codec_dropped_again():
    """A push with no step since the last one sends the residual the int8 codec dropped: the
    mirror's error shrinks at least a hundredfold (it would stay put without feedback)."""
    learner = make_tiny_model(64, seed=1)
    publisher = Publisher("delta", "int8")
    publisher.parts(learner, 0)
    _step(learner, 1, scale=0.1)
    publisher.parts(learner, 1)
    first = _max_err(learner, publisher.mirror)
    publisher.parts(learner, 2)
    second = _max_err(learner, publisher.mirror)
    assert max(first.values()) > 0
    assert all(second[k] <= first[k] / 100 for k in first)


def test_a_worker_that_missed_a_delta_loads_the_mirror():
    """A worker two versions behind (a replacement, a forced-staleness jump) fetches the
    version's whole mirror instead of the update, and equals it."""
    learner, late = make_tiny_model(64, seed=1), make_tiny_model(64, seed=3)
    publisher = Publisher("delta", "int8")
    push, parts = _push(publisher, learner, 0)
    _apply(late, push, parts, -1)
    for version in (1, 2):
        _step(learner, version)
        push, parts = _push(publisher, learner, version)
    assert push.needs(0) == ["full"]
    _apply(late, push, parts, 0)
    assert _checksum(late.state_dict()) == state_checksum(publisher.mirror)


def test_lora_pushes_only_the_adapter_after_the_first():
    """A PEFT learner: the first push is the whole PEFT model, later ones only the trainable
    (adapter) tensors, a small fraction of the bytes; a worker holding the same unmerged PEFT
    model equals the learner after each push, and a new worker (holding nothing) takes the
    first push and the newest adapter."""
    from peft import get_peft_model

    peft = PeftConfig(enabled=True, r=2, alpha=4)
    learner = apply_lora(make_tiny_model(64, seed=1), peft)
    config = learner.peft_config["default"]
    worker = get_peft_model(make_tiny_model(64, seed=2), config)
    publisher = Publisher("lora")
    push, parts = _push(publisher, learner, 0)
    first = parts["full"]
    _apply(worker, push, parts, -1)
    for version in (1, 2):
        with torch.no_grad():  # a stand-in for an optimizer step on the adapter
            for p in learner.parameters():
                if p.requires_grad:
                    p.add_(0.01 * version)
        push, parts = _push(publisher, learner, version)
        assert parts["full"] is None and parts["update"]
        assert all("lora_" in k for k in parts["update"])
        assert payload_bytes(parts["update"]) < payload_bytes(first) / 10
        _apply(worker, push, parts, version - 1)
        assert _checksum(worker.state_dict()) == _checksum(learner.state_dict())
    fresh = get_peft_model(make_tiny_model(64, seed=4), config)
    push = Push("lora", first, parts["update"], 1)
    assert push.needs(-1) == ["full", "update"]
    _apply(fresh, push, {"full": first, "update": parts["update"]}, -1)
    assert _checksum(fresh.state_dict()) == _checksum(learner.state_dict())
