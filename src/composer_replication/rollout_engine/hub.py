"""The hub: one Ray actor between the rollout workers and the learner. It holds the learner's
task dispenser (workers pull tickets from it), the finished groups (workers push, the learner
takes), and the published weight versions (object-store references the workers load).

It owns no model and imports no torch: every method is quick, and Ray runs them one at a time,
so its state needs no lock. The learner owns the hub (it creates it, saves its dispenser state
with checkpoints, and stops it).

Bounded staleness at the source: a ticket is handed out only if the group, consumed in order
after the groups already outstanding, will be at most ``max_staleness`` steps old when the
learner takes it (the learner takes ``groups_per_step`` groups per step; a step whose groups
are already taken trains with the current weights and publishes the next version). So in steady
state no worker generates a group that would be dropped, and a long episode is not dropped for
being long unless it outlives the bound; the learner still drops (and counts) any group that
arrives too old."""

from __future__ import annotations

from collections import deque
from typing import Any

from composer_replication.rollout_engine.dispenser import TaskDispenser, Ticket
from composer_replication.rollout_engine.group import GroupRecord


class Hub:
    """Tickets, finished groups and weight versions (module docstring)."""

    def __init__(
        self,
        dispenser: TaskDispenser,
        groups_per_step: int,
        max_staleness: int,
        forced: bool = False,
        keep_versions: int = 2,
    ):
        self.dispenser = dispenser
        self.groups_per_step = groups_per_step
        self.max_staleness = max_staleness
        self.forced = forced
        """``rollout.force_staleness``: tickets only when the learner requests them."""
        self.keep_versions = keep_versions
        self.requested: deque[Ticket] = deque()
        self.queue: deque[GroupRecord] = deque()
        self.inflight: dict[int, set[int]] = {}
        self.weights: dict[int, list[Any]] = {}
        self.version = -1
        self.taken_at = -1
        """The learner version at which the learner last took groups."""
        self.produced: dict[int, int] = {}
        self.stopped = False

    # ---- workers ---------------------------------------------------------------------------
    def next_ticket(self, worker: int) -> Ticket | None | str:
        """A ticket for ``worker``; None: none now (ask again); ``"stop"``: the run is over."""
        if self.stopped:
            return "stop"
        if self.forced:
            ticket = self.requested.popleft() if self.requested else None
        elif self.version >= 0 and self._within_bound():
            ticket = self.dispenser.next()
        else:
            ticket = None
        if ticket is not None:
            self.inflight.setdefault(worker, set()).add(ticket.group_id)
        return ticket

    def _within_bound(self) -> bool:
        outstanding = len(self.dispenser.outstanding) - len(self.dispenser.returned)
        ahead = 1 if self.taken_at == self.version else 0
        return ahead + outstanding // self.groups_per_step <= self.max_staleness or bool(
            self.dispenser.returned
        )

    def put_group(self, worker: int, group: GroupRecord) -> None:
        self.inflight.get(worker, set()).discard(group.group_id)
        self.queue.append(group)
        self.produced[worker] = self.produced.get(worker, 0) + 1

    def latest_weights(self, version: int | None = None) -> tuple[int, list[Any]] | None:
        """``(version, [ref])`` of ``version`` (None: the newest), or None if not published."""
        v = self.version if version is None else version
        return (v, self.weights[v]) if v in self.weights else None

    # ---- learner ---------------------------------------------------------------------------
    def publish(self, version: int, refs: list[Any]) -> None:
        """A new weight version (``refs``: a list holding one ``weight_sync.Push`` of
        object-store references, so Ray passes the references, not the weights); old versions
        beyond ``keep_versions`` go."""
        self.weights[version] = refs
        self.version = max(self.version, version)
        for v in sorted(self.weights)[: -self.keep_versions]:
            del self.weights[v]

    def request(self, n: int, version: int) -> None:
        """Forced staleness: ``n`` tickets to be generated with weights ``version``."""
        for _ in range(n):
            t = self.dispenser.next(version)
            self.requested.append(t)

    def take(self, n: int) -> list[GroupRecord]:
        """Up to ``n`` finished groups, oldest first, each with its task's pass-rate estimate
        before its own rewards count (``info["task_estimate"]``: ``(pass_rate, rollouts)``,
        what the hack telemetry splits invalid tool calls by, envs/telemetry.py)."""
        self.taken_at = self.version
        groups = [self.queue.popleft() for _ in range(min(n, len(self.queue)))]
        for g in groups:
            g.info["task_estimate"] = tuple(self.dispenser.sampler.estimate(g.task_id))
        return groups

    def consume(self, groups: dict[int, list[float]]) -> None:
        """The learner used these groups (trained on, or dropped as stale): group id -> the
        rewards of its valid rollouts (they update the task sampler)."""
        for gid, rewards in groups.items():
            self.dispenser.consume(gid, rewards)

    def sampler_metrics(self) -> dict[str, float]:
        """The task sampler's ``sampler/*`` since the last call."""
        return self.dispenser.sampler.drain_metrics()

    def worker_lost(self, worker: int) -> int:
        """The tickets a dead worker held go back to the dispenser; returns how many."""
        return self.dispenser.give_back(self.inflight.pop(worker, set()))

    def stats(self) -> dict[str, Any]:
        return {
            "queue_depth": len(self.queue),
            "inflight": sum(len(v) for v in self.inflight.values()),
            "inflight_by_worker": {w: len(v) for w, v in self.inflight.items()},
            "produced": dict(self.produced),
            "version": self.version,
        }

    def state_dict(self) -> dict[str, Any]:
        return self.dispenser.state_dict()

    def stop(self) -> None:
        self.stopped = True
