"""The task sampler (envs/sampler.py) on simulated groups: the adaptive sampler finds the
tasks whose groups carry a GRPO signal, retires solved ones, keeps a floor for hopeless ones,
never draws held-out tasks, and its state resumes the same draws."""

from __future__ import annotations

import random

import pytest

from composer_replication.config.data import AdaptiveSamplerConfig, DataConfig
from composer_replication.envs.sampler import (
    TaskSampler,
    beta_tail,
    mixed_probability,
)

G = 4
GROUPS_PER_STEP = 8


def thirds(n: int = 30) -> dict[str, float]:
    """Task id -> success probability: a third at 0, a third at 1, a third at 0.5."""
    return {f"t{i:02d}": (0.0, 1.0, 0.5)[i % 3] for i in range(n)}


def simulate(sampler: TaskSampler, probs: dict[str, float], steps: int, seed: int = 0):
    """Per step: draw the step's groups, score each with rewards drawn from its task's
    probability, update; returns the per-step signal fractions and drawn task ids."""
    rng = random.Random(seed)
    fracs, drawn = [], []
    for _ in range(steps):
        tasks = sampler.next_tasks(GROUPS_PER_STEP)
        for task in tasks:
            sampler.update(task, [rng.random() < probs[task] for _ in range(G)])
        fracs.append(sampler.drain_metrics()["sampler/signal_frac"])
        drawn.append(tasks)
    return fracs, drawn


def test_adaptive_finds_twice_uniforms_signal_after_warm_up():
    probs = thirds()
    warm_up, steps = 10, 40
    signal = {}
    for kind in ("uniform", "adaptive"):
        cfg = DataConfig(sampler=kind).sampler
        sampler = TaskSampler(list(probs), G, seed=3, config=cfg)
        fracs, _ = simulate(sampler, probs, steps)
        signal[kind] = sum(fracs[warm_up:]) / (steps - warm_up)
    assert signal["adaptive"] >= 2 * signal["uniform"], signal


def test_solved_tasks_retire_and_hopeless_ones_keep_the_floor():
    probs = thirds()
    sampler = TaskSampler(list(probs), G, seed=0, config=AdaptiveSamplerConfig(floor=0.05))
    simulate(sampler, probs, 40)
    solved = [t for t, p in probs.items() if p == 1.0]
    hopeless = [t for t, p in probs.items() if p == 0.0]
    assert all(sampler.retired(t) for t in solved if sampler.rollouts(t) >= 3 * G)
    assert sum(sampler.retired(t) for t in solved) >= len(solved) // 2
    assert not any(sampler.retired(t) for t in hopeless)
    assert min(sampler.weight(t) for t in hopeless) == pytest.approx(0.05)
    retired = {t for t in solved if sampler.retired(t)}
    _, drawn = simulate(sampler, probs, 20, seed=1)
    late = [t for step in drawn for t in step]
    assert not retired & set(late)  # solved tasks only pass: once retired, never drawn
    assert any(t in hopeless for t in late)  # revisited, rarely
    assert sum(t in hopeless for t in late) < sum(probs[t] == 0.5 for t in late) / 3


def test_heldout_tasks_are_refused_and_never_drawn():
    with pytest.raises(ValueError, match="held-out"):
        TaskSampler(["a", "b", "h1"], G, 0, AdaptiveSamplerConfig(), heldout_ids=["h1"])
    sampler = TaskSampler(["a", "b"], G, 0, AdaptiveSamplerConfig(), heldout_ids=["h1", "h2"])
    drawn = {t for _ in range(50) for t in sampler.next_tasks(3)}
    assert drawn == {"a", "b"}
    with pytest.raises(KeyError, match="unknown task"):
        sampler.update("h1", [True])


def test_state_dict_resumes_the_same_draws():
    probs = thirds(12)
    cfg = AdaptiveSamplerConfig()
    whole = TaskSampler(list(probs), G, seed=5, config=cfg)
    _, drawn_whole = simulate(whole, probs, 12)
    first = TaskSampler(list(probs), G, seed=5, config=cfg)
    simulate(first, probs, 6)
    resumed = TaskSampler(list(probs), G, seed=5, config=cfg)
    resumed.load_state_dict(first.state_dict())
    rng = random.Random(0)
    for _ in range(6 * GROUPS_PER_STEP * G):  # the verdict stream where the whole run is
        rng.random()
    tail = []
    for _ in range(6):
        tasks = resumed.next_tasks(GROUPS_PER_STEP)
        for task in tasks:
            resumed.update(task, [rng.random() < probs[task] for _ in range(G)])
        tail.append(tasks)
    assert tail == drawn_whole[6:]
    other = TaskSampler(list(probs)[:-1], G, seed=5, config=cfg)
    with pytest.raises(ValueError, match="task sampler state"):
        other.load_state_dict(first.state_dict())


def test_uniform_walks_seeded_epochs():
    sampler = TaskSampler([f"t{i}" for i in range(5)], G, seed=1)
    first, second = sampler.next_tasks(5), sampler.next_tasks(5)
    assert sorted(first) == sorted(second) == [f"t{i}" for i in range(5)]
    assert TaskSampler([f"t{i}" for i in range(5)], G, seed=1).next_tasks(5) == first


def test_posterior_arithmetic():
    assert mixed_probability(1, 1, 4) == pytest.approx(3 / 5)  # (G-1)/(G+1) under Beta(1,1)
    assert mixed_probability(1e6, 1e6, 4) == pytest.approx(1 - 2 * 0.5**4, rel=1e-4)
    assert beta_tail(1, 1, 0.3) == pytest.approx(0.7)
    assert beta_tail(3, 1, 0.5) == pytest.approx(1 - 0.5**3)  # Beta(3,1): cdf x^3
