"""The hub without Ray (a plain object; Ray runs its methods one at a time): tickets only
within the staleness bound, forced-staleness tickets only on request, a dead worker's tickets
handed out again, weight versions kept and dropped."""

from __future__ import annotations

from composer_replication.rollout_engine.dispenser import TaskDispenser
from composer_replication.rollout_engine.group import GroupRecord, Rollout, Sequence
from composer_replication.rollout_engine.hub import Hub

IDS = [f"t{i}" for i in range(8)]


def _group(ticket, version: int) -> GroupRecord:
    seq = Sequence([1], [2], [0.0], [1], [version])
    return GroupRecord(ticket.group_id, ticket.task_id, {}, [Rollout([seq], 0.0)])


def _drain(hub: Hub, worker: int = 0) -> list:
    out = []
    while (t := hub.next_ticket(worker)) is not None:
        out.append(t)
    return out


def test_no_ticket_before_weights_and_none_past_the_bound():
    """2 groups a step, max_staleness 1: before any weights, nothing; at version 0, 4 tickets
    (this step's 2 and the next step's 2, made with version-0 weights: 1 step stale when
    taken); once step 1 took its groups, nothing more until version 1 is published."""
    hub = Hub(TaskDispenser(IDS, 0), groups_per_step=2, max_staleness=1)
    assert hub.next_ticket(0) is None
    hub.publish(0, ["w0"])
    tickets = _drain(hub)
    assert len(tickets) == 4
    for t in tickets:
        hub.put_group(0, _group(t, 0))
    taken = hub.take(2)
    hub.consume({g.group_id: [] for g in taken})
    assert hub.next_ticket(0) is None  # the next 2 would be 2 steps stale at step 2
    hub.publish(1, ["w1"])
    assert len(_drain(hub)) == 2


def test_at_staleness_zero_workers_wait_for_each_version():
    hub = Hub(TaskDispenser(IDS, 0), groups_per_step=2, max_staleness=0)
    hub.publish(0, ["w0"])
    first = _drain(hub)
    assert len(first) == 2
    for t in first:
        hub.put_group(0, _group(t, 0))
    hub.consume({g.group_id: [] for g in hub.take(2)})
    assert hub.next_ticket(0) is None  # generating now would use version 0 for step 2
    hub.publish(1, ["w1"])
    assert len(_drain(hub)) == 2


def test_forced_tickets_name_their_version_and_come_only_on_request():
    hub = Hub(TaskDispenser(IDS, 0), groups_per_step=2, max_staleness=4, forced=True,
              keep_versions=3)  # fmt: skip
    for v in range(4):
        hub.publish(v, [f"w{v}"])
    assert hub.next_ticket(0) is None
    hub.request(2, version=1)
    assert [t.version for t in _drain(hub)] == [1, 1]
    assert hub.latest_weights(1) == (1, ["w1"]) and hub.latest_weights(0) is None  # dropped
    assert hub.latest_weights() == (3, ["w3"])


def test_a_dead_workers_tickets_are_handed_out_again():
    hub = Hub(TaskDispenser(IDS, 0), groups_per_step=2, max_staleness=0)
    hub.publish(0, ["w0"])
    a, b = hub.next_ticket(0), hub.next_ticket(1)
    assert hub.stats()["inflight_by_worker"] == {0: 1, 1: 1}
    assert hub.worker_lost(0) == 1
    again = hub.next_ticket(1)
    assert again.group_id == a.group_id and again.task_id == a.task_id
    assert b.group_id != a.group_id
    hub.stop()
    assert hub.next_ticket(1) == "stop"
