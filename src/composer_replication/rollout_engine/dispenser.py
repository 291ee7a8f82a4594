"""The learner-owned task dispenser: which training task each rollout group is for.

Workers pull *tickets* (a number and a task id) from the learner instead of iterating their own
copy of the data, so the task order is one seeded sequence whatever the number of workers,
resumable from a checkpoint (its state is the cursor and the tickets handed out but not yet
consumed, which are handed out again first), DAPO's refills and later samplers go through the
same place, and held-out tasks never reach training (refused at construction).

Which task a new ticket is for is the run's task sampler's choice (``data.sampler``,
envs/sampler.py: seeded epochs, or adaptive by difficulty estimated during the run); a ticket
handed out again keeps its task. Consuming a group with its rewards updates the sampler, and
the sampler's state travels in the dispenser's."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from composer_replication.envs.sampler import TaskSampler


@dataclass(frozen=True)
class Ticket:
    """One group to generate: ``group_id`` is unique in the run; ``version`` (None: any) is
    the policy version the worker must generate with (``rollout.force_staleness``)."""

    group_id: int
    task_id: str
    version: int | None = None


class TaskDispenser:
    """Tickets over ``train_ids``, their tasks drawn by ``sampler`` (default: uniform, in
    seeded epochs, each a fresh shuffle), resumable."""

    def __init__(
        self,
        train_ids: Sequence[str],
        seed: int,
        heldout_ids: Iterable[str] = (),
        sampler: TaskSampler | None = None,
    ):
        if not train_ids:
            raise ValueError("dispenser: no training tasks")
        heldout_ids = list(heldout_ids)
        leaked = sorted(set(train_ids) & set(heldout_ids))
        if leaked:
            raise ValueError(f"dispenser: held-out tasks in the training split: {leaked[:3]}")
        self.train_ids = list(train_ids)
        self.seed = seed
        self.sampler = sampler or TaskSampler(self.train_ids, 1, seed, heldout_ids=heldout_ids)
        if set(self.sampler.task_ids) != set(self.train_ids) or self.sampler.seed != seed:
            raise ValueError("dispenser: its sampler draws over other tasks or another seed")
        self.cursor = 0
        """Tickets made so far (the next ticket's ``group_id``)."""
        self.outstanding: dict[int, str] = {}
        """Tickets handed out and not yet consumed (in flight on a worker, or queued)."""
        self.returned: list[int] = []
        """Outstanding tickets to hand out again before new ones (a lost worker's, a resume's)."""
        self.consumed = 0

    def task_at(self, index: int) -> str:
        """The task of ticket ``index`` under the uniform sampler: position ``index % n`` of
        epoch ``index // n``'s seeded shuffle, so any ticket is reproducible alone (an adaptive
        sampler's draws depend on the run's verdicts: refused)."""
        if self.sampler.adaptive:
            raise ValueError("dispenser: an adaptive sampler's tasks depend on the verdicts")
        return self.sampler.uniform_at(index)

    def next(self, version: int | None = None) -> Ticket:
        """The next ticket: a returned one first, else a new one."""
        if self.returned:
            gid = self.returned.pop(0)
            return Ticket(gid, self.outstanding[gid], version)
        gid = self.cursor
        self.cursor += 1
        self.outstanding[gid] = self.sampler.next_task()
        return Ticket(gid, self.outstanding[gid], version)

    def consume(self, group_id: int, rewards: Sequence[float | bool] | None = None) -> None:
        """Mark a ticket's group used (trained on, or dropped as stale): a second time is an
        error, so no group is ever used twice. ``rewards`` (the group's valid rollouts'; None:
        unscored) update the sampler's estimate of its task."""
        if group_id not in self.outstanding or group_id in self.returned:
            raise KeyError(f"dispenser: group {group_id} is not outstanding (used twice?)")
        task_id = self.outstanding.pop(group_id)
        self.consumed += 1
        if rewards:
            self.sampler.update(task_id, rewards)

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
            "sampler": self.sampler.state_dict(),
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
        if "sampler" in state:
            self.sampler.load_state_dict(state["sampler"])
        else:  # saved before the dispenser drew through its sampler (uniform, a draw a
            # ticket): the resumed order follows the sampler's epochs from the cursor on
            self.sampler.draws = self.sampler.drawn = self.cursor
