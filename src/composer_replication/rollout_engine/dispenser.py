"""The learner-owned task dispenser: which training task each rollout group is for.

Workers pull *tickets* (a number and a task id) from the learner instead of iterating their own
copy of the data, so the task order is one seeded sequence whatever the number of workers,
resumable from a checkpoint (its state is the cursor and the tickets handed out but not yet
consumed, which are handed out again first), DAPO's refills and later samplers go through the
same place, and held-out tasks never reach training (refused at construction)."""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Ticket:
    """One group to generate: ``group_id`` is unique in the run; ``version`` (None: any) is
    the policy version the worker must generate with (``rollout.force_staleness``)."""

    group_id: int
    task_id: str
    version: int | None = None


class TaskDispenser:
    """Tickets over ``train_ids`` in seeded epochs (each epoch a fresh shuffle), resumable."""

    def __init__(self, train_ids: Sequence[str], seed: int, heldout_ids: Iterable[str] = ()):
        if not train_ids:
            raise ValueError("dispenser: no training tasks")
        leaked = sorted(set(train_ids) & set(heldout_ids))
        if leaked:
            raise ValueError(f"dispenser: held-out tasks in the training split: {leaked[:3]}")
        self.train_ids = list(train_ids)
        self.seed = seed
        self.cursor = 0
        """Tickets made so far (the next ticket's ``group_id``)."""
        self.outstanding: dict[int, str] = {}
        """Tickets handed out and not yet consumed (in flight on a worker, or queued)."""
        self.returned: list[int] = []
        """Outstanding tickets to hand out again before new ones (a lost worker's, a resume's)."""
        self.consumed = 0

    def task_at(self, index: int) -> str:
        """The task of ticket ``index``: position ``index % n`` of epoch ``index // n``'s
        shuffle (seeded by ``seed`` and the epoch), so any ticket is reproducible alone."""
        n = len(self.train_ids)
        epoch, pos = divmod(index, n)
        order = list(self.train_ids)
        random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order[pos]

    def next(self, version: int | None = None) -> Ticket:
        """The next ticket: a returned one first, else a new one."""
        if self.returned:
            gid = self.returned.pop(0)
            return Ticket(gid, self.outstanding[gid], version)
        gid = self.cursor
        self.cursor += 1
        self.outstanding[gid] = self.task_at(gid)
        return Ticket(gid, self.outstanding[gid], version)

    def consume(self, group_id: int) -> None:
        """Mark a ticket's group used (trained on, or dropped as stale): a second time is an
        error, so no group is ever used twice."""
        if group_id not in self.outstanding or group_id in self.returned:
            raise KeyError(f"dispenser: group {group_id} is not outstanding (used twice?)")
        del self.outstanding[group_id]
        self.consumed += 1

    def give_back(self, group_ids: Iterable[int]) -> int:
        """Hand these outstanding tickets out again (their worker died); returns how many."""
        back = [g for g in group_ids if g in self.outstanding and g not in self.returned]
        self.returned.extend(sorted(back))
        return len(back)

    def state_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "cursor": self.cursor,
            "outstanding": {str(k): v for k, v in self.outstanding.items()},
            "consumed": self.consumed,
            "n_train": len(self.train_ids),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the tickets outstanding at the save are handed out again
        (their groups were never trained on), then new ones from the saved cursor."""
        if state["seed"] != self.seed or state["n_train"] != len(self.train_ids):
            raise ValueError(
                f"dispenser state for seed {state['seed']} over {state['n_train']} tasks; this "
                f"run has seed {self.seed} over {len(self.train_ids)}"
            )
        self.cursor = int(state["cursor"])
        self.outstanding = {int(k): v for k, v in state["outstanding"].items()}
        self.returned = sorted(self.outstanding)
        self.consumed = int(state["consumed"])
