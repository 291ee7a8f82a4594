"""The task dispenser: seeded order, held-out tasks refused, no group used twice, a lost
worker's tickets handed out again, and a resume that continues the order."""

from __future__ import annotations

import pytest

from composer_replication.config.data import AdaptiveSamplerConfig
from composer_replication.envs.sampler import TaskSampler
from composer_replication.rollout_engine.dispenser import TaskDispenser

IDS = [f"t{i}" for i in range(5)]


def test_the_order_is_seeded_and_each_epoch_covers_every_task():
    a, b, c = TaskDispenser(IDS, 1), TaskDispenser(IDS, 1), TaskDispenser(IDS, 2)
    order_a = [a.next().task_id for _ in range(10)]
    assert order_a == [b.next().task_id for _ in range(10)]
    assert order_a != [c.next().task_id for _ in range(10)]
    assert sorted(order_a[:5]) == IDS and sorted(order_a[5:]) == IDS
    assert order_a[:5] != order_a[5:]  # a fresh shuffle per epoch


def test_heldout_tasks_are_refused():
    with pytest.raises(ValueError, match="held-out tasks in the training split: \\['t3'\\]"):
        TaskDispenser(IDS, 0, heldout_ids=["t3", "h1"])


def test_a_group_is_consumed_once():
    d = TaskDispenser(IDS, 0)
    t = d.next()
    d.consume(t.group_id)
    with pytest.raises(KeyError, match="used twice"):
        d.consume(t.group_id)


def test_a_lost_workers_tickets_come_back_first():
    d = TaskDispenser(IDS, 0)
    tickets = [d.next() for _ in range(3)]
    d.consume(tickets[0].group_id)
    assert d.give_back([tickets[2].group_id, tickets[0].group_id]) == 1  # consumed: not again
    again = d.next()
    assert (again.group_id, again.task_id) == (tickets[2].group_id, tickets[2].task_id)
    assert d.next().group_id == 3


def test_resume_hands_out_the_in_flight_tickets_then_continues():
    """A run killed after handing out tickets 0-3 and consuming 0 and 1: the resumed run
    regenerates 2 and 3 (never trained on), then continues with 4, 5... exactly the order an
    uninterrupted run would have drawn."""
    d = TaskDispenser(IDS, 7)
    for _ in range(4):
        d.next()
    d.consume(0), d.consume(1)
    resumed = TaskDispenser(IDS, 7)
    resumed.load_state_dict(d.state_dict())
    got = [(t.group_id, t.task_id) for t in (resumed.next() for _ in range(4))]
    fresh = TaskDispenser(IDS, 7)
    assert got == [(g, fresh.task_at(g)) for g in (2, 3, 4, 5)]
    with pytest.raises(ValueError, match="seed 7 over 5 tasks; this run has seed 8"):
        TaskDispenser(IDS, 8).load_state_dict(d.state_dict())


def _adaptive(seed: int = 3) -> TaskDispenser:
    sampler = TaskSampler(IDS, 4, seed, AdaptiveSamplerConfig(type="adaptive"))
    return TaskDispenser(IDS, seed, sampler=sampler)


def _run(d: TaskDispenser, n: int, verdicts: dict[str, list[float]]) -> list[str]:
    """Hand out and consume ``n`` tickets, each group scored by its task's fixed verdicts."""
    out = []
    for _ in range(n):
        t = d.next()
        d.consume(t.group_id, verdicts[t.task_id])
        out.append(t.task_id)
    return out


def test_an_adaptive_dispenser_draws_mixed_tasks_more_and_resumes_the_same_draws():
    """Consumed groups update the run's sampler: after a warm-up, tasks every rollout passes
    or fails are drawn less than the mixed one; a dispenser restored from the state draws
    exactly what the uninterrupted one draws, given the same verdicts."""
    verdicts = {"t0": [0.0] * 4, "t1": [0.0] * 4, "t2": [1.0, 0.0, 1.0, 0.0],
                "t3": [1.0] * 4, "t4": [1.0] * 4}  # fmt: skip
    d = _adaptive()
    _run(d, 15, verdicts)  # warm-up: three rounds of the five tasks' estimates
    later = _run(d, 60, verdicts)
    assert later.count("t2") > 2 * max(later.count(t) for t in IDS if t != "t2")
    assert d.sampler.drain_metrics()["sampler/signal_frac"] > 0.0
    saved = d.state_dict()
    resumed = _adaptive()
    resumed.load_state_dict(saved)
    assert _run(resumed, 20, verdicts) == _run(d, 20, verdicts)
    with pytest.raises(ValueError, match="tasks depend on the verdicts"):
        d.task_at(0)


def test_a_dispenser_refuses_a_sampler_over_other_tasks():
    with pytest.raises(ValueError, match="other tasks or another seed"):
        TaskDispenser(IDS, 0, sampler=TaskSampler(IDS[:3], 4, 0))
    with pytest.raises(ValueError, match="other tasks or another seed"):
        TaskDispenser(IDS, 0, sampler=TaskSampler(IDS, 4, 1))
