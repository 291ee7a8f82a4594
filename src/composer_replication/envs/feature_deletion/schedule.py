"""Yield-weighted sandbox slots for a suite (issue 60): when a suite's packages wait for more
sandbox slots than are free, a free slot goes to the waiting package with the best estimated
yield of tasks with hidden targets per slot-second, instead of first come, first served
(where each package got about an equal share: 24 packages x ``workers`` threads for
``workers`` slots, and idna tried 24 of its 111 candidates in 34 minutes, 16 of them tasks,
while pycparser tried 151 for one task).

The estimate is the posterior mean of a Poisson rate under a conjugate gamma prior (Gelman
et al., *Bayesian Data Analysis*, 3rd ed., section 2.6, "Poisson model" with a
``Gamma(alpha, beta)`` prior): a package that found ``k`` tasks with hidden targets in ``T``
slot-seconds has rate ``(prior_tasks + k) / (prior_seconds + T)``, i.e. ``alpha =
prior_tasks``, ``beta = prior_seconds``. A package that has begun fewer than ``first_tries``
(2) candidates goes before the others whatever the estimates, so every package gets its first
tries; after them the prior keeps it optimistic: one task per ``prior_seconds`` = 5 s (0.2
per slot-second) is above every package of the suite run of 2026-12-03 (generator version 7;
a candidate's recorded run took a median of about 4 slot-seconds; the best, webencodings,
pyhumps and webcolors, found 0.15-0.19 per slot-second), and it weighs one task, so a
package's own results outweigh it after a few candidates. A replay of that run and of the
night before (bench/replay_suite_schedule.py) found the same counts within a few percent for
``prior_seconds`` from 1 to 20 and ``first_tries`` from 0 to 5. Ranking by the posterior
mean is greedy: a package whose first tries came to nothing waits until the others'
estimates fall below its own (they fall as a package goes down its own ``yield_order``) or
they have nothing left to run.

Why it matters beyond counting tries: first come, first served gives each package about the
same number of *steps*, so a package with slow runs took the most slot time (in that run
mistune held 4996 of the 15,380 recorded slot-seconds, about 156 a candidate, for 8 tasks
with hidden targets; idna 177, about 5 a candidate, for 12).

It changes no outcome: every candidate's steps run as before, only the order in which
packages' steps get a slot. ``T`` is measured here (the time a step held its sandbox slot);
``k`` is reported by the package as its candidates end (:meth:`PackageShare.finished`), with
the cheap test :func:`may_hide`. The order of the waiting steps is ``(continuing, first
tries, rate, first asked)``: a step of a candidate already begun (its forwarding and
screening) goes before any package's first step, so work begun ends first.
Waits have no deadline (as ``generate._step``'s); an exception, or a package that ends with
no waiter left, frees what it held.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from composer_replication.envs.feature_deletion.hidden import split_visible
from composer_replication.sandbox.sandbox import SLOTS, Slots


def may_hide(failing: list[str], visible_defs: int) -> bool:
    """Whether a task whose target tests are ``failing`` has hidden targets, as the first step
    of generate.hidden_split decides (hidden.split_visible shows at most all but one of the
    test functions, so: the failing tests span more than one). It is an upper bound:
    hidden_split then moves back to visible a hidden test the workspace cannot lose, which
    needs the test files parsed (it runs at the package's end); ranking packages needs no
    more than this pure, instant test."""
    return bool(split_visible(failing, visible_defs)[1]) if failing else False


@dataclass(eq=False)
class PackageShare:
    """One package's part of a :class:`YieldScheduler`: its steps take slots through
    :meth:`held`, its finished candidates are reported to :meth:`finished`."""

    name: str
    scheduler: YieldScheduler
    slot_seconds: float = 0.0
    """Slot-seconds its steps held (this run, plus reused runs: :meth:`finished`)."""
    hidden_tasks: int = 0
    """Its candidates that became tasks with hidden targets (:func:`may_hide`)."""
    candidates: int = 0
    """Its candidates reported finished."""
    steps: int = 0
    """Its steps that held a slot in this run."""
    begun: int = 0
    """Its candidates whose first step was admitted in this run."""
    run_seconds: float = 0.0
    """Slot-seconds its steps held in this run (``slot_seconds`` less reused runs)."""

    def rate(self) -> float:
        """Estimated tasks with hidden targets per slot-second (module docstring)."""
        s = self.scheduler
        return (s.prior_tasks + self.hidden_tasks) / (s.prior_seconds + self.slot_seconds)

    def held(self, continuing: bool = False) -> contextlib.AbstractContextManager[None]:
        """Hold one sandbox slot for a block, when this package's turn comes
        (:meth:`YieldScheduler.held`)."""
        return self.scheduler.held(self, continuing)

    def finished(self, hidden: bool, seconds: float = 0.0) -> None:
        """A candidate ended (``hidden``: a task with hidden targets); ``seconds``: slot time
        spent outside this scheduler (a run reused from ``runs.jsonl``)."""
        self.scheduler.finished(self, hidden, seconds)


class YieldScheduler:
    """Hands a bounded set of slots (``slots``, by default the process's sandbox slots; at
    most ``slots.limit`` steps admitted at once) to packages' steps in the order
    ``(continuing, first tries, rate, first asked)`` (module docstring); an admitted step
    then takes a slot of ``slots`` as any sandbox does (a package's baseline, which asks
    ``slots`` directly, is served first come, first served among the admitted steps).
    Re-entrant per thread, like ``Slots``."""

    def __init__(self, slots: Slots = SLOTS, prior_tasks: float = 1.0,
                 prior_seconds: float = 5.0, first_tries: int = 2,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        if prior_tasks <= 0 or prior_seconds <= 0 or first_tries < 0:
            raise ValueError("prior_tasks and prior_seconds must be > 0 and first_tries >= 0, "
                             f"got {prior_tasks}, {prior_seconds}, {first_tries}")  # fmt: skip
        self.slots, self.prior_tasks, self.prior_seconds = slots, prior_tasks, prior_seconds
        self.first_tries = first_tries
        self.clock = clock
        self.shares: list[PackageShare] = []
        self._cond = threading.Condition()
        self._admitted = 0
        self._depth: dict[int, int] = {}  # thread id -> nested held() it is in
        self._waiting: list[tuple[bool, int, PackageShare]] = []  # (continuing, seq, share)
        self._seq = itertools.count()

    def share(self, name: str) -> PackageShare:
        """A new package's :class:`PackageShare`."""
        with self._cond:
            got = PackageShare(name, self)
            self.shares.append(got)
            return got

    @property
    def admitted(self) -> int:
        """Steps holding (or about to take) a slot now."""
        with self._cond:
            return self._admitted

    @property
    def waiting(self) -> int:
        """Steps waiting for their turn now."""
        with self._cond:
            return len(self._waiting)

    def rank(self, share: PackageShare, continuing: bool = False) -> tuple[bool, bool, float]:
        """How a step of ``share`` ranks now (the highest goes first; ties: who asked
        first): ``(continuing, share.begun < first_tries, share.rate())``."""
        return continuing, share.begun < self.first_tries, share.rate()

    def _best(self) -> tuple[bool, int, PackageShare]:
        return max(self._waiting, key=lambda w: (*self.rank(w[2], w[0]), -w[1]))

    @contextlib.contextmanager
    def held(self, share: PackageShare, continuing: bool = False) -> Iterator[None]:
        """Wait until ``share``'s step is the best waiting one and fewer than ``slots.limit``
        steps are admitted, then hold a slot of ``slots`` for the block; the time the slot
        is held counts to ``share.slot_seconds``."""
        me = threading.get_ident()
        with self._cond:
            nested = self._depth.get(me, 0) > 0
            if not nested:
                mine = (continuing, next(self._seq), share)
                self._waiting.append(mine)
                try:
                    self._cond.wait_for(
                        lambda: self._admitted < self.slots.limit and self._best() is mine
                    )
                finally:
                    self._waiting.remove(mine)
                    self._cond.notify_all()  # the next best may go too
                self._admitted += 1
                share.begun += not continuing
            self._depth[me] = self._depth.get(me, 0) + 1
        spent = 0.0
        try:
            if nested:
                yield
            else:
                with self.slots.held():
                    start = self.clock()
                    try:
                        yield
                    finally:
                        spent = self.clock() - start
        finally:
            with self._cond:
                self._depth[me] -= 1
                if self._depth[me] == 0:
                    del self._depth[me]
                    self._admitted -= 1
                    share.slot_seconds += spent
                    share.run_seconds += spent
                    share.steps += 1
                    self._cond.notify_all()

    def finished(self, share: PackageShare, hidden: bool, seconds: float = 0.0) -> None:
        """Count one ended candidate of ``share`` (:meth:`PackageShare.finished`)."""
        with self._cond:
            share.candidates += 1
            share.hidden_tasks += bool(hidden)
            share.slot_seconds += max(0.0, seconds)
            self._cond.notify_all()  # the ranks changed
