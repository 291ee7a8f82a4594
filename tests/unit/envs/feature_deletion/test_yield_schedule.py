"""Yield-weighted slots for a suite (schedule.py): fake packages whose fake steps hold real
slots of a private ``Slots`` pool (no sandbox), in real threads; a step waits until every
other live thread of the run waits or holds a slot, and reports its candidate before it
gives its slot back, so each free slot is decided among all the waiters on the ranks of
every step so far, and the order is deterministic."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from composer_replication.config import TaskGenConfig
from composer_replication.envs.feature_deletion import generate
from composer_replication.envs.feature_deletion.candidates import find_candidates
from composer_replication.envs.feature_deletion.hidden import split_visible
from composer_replication.envs.feature_deletion.schedule import YieldScheduler, may_hide
from composer_replication.envs.feature_deletion.source import SourceTree
from composer_replication.sandbox.sandbox import Slots


class FakeClock:
    """A clock a step moves on by hand: a slot-second is what the test says it is."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _until(test, timeout_s: float = 5.0) -> None:
    end = time.monotonic() + timeout_s
    while not test():
        assert time.monotonic() < end, "timed out: a thread is stuck"
        time.sleep(0.0005)


def _run(packages: dict[str, list[bool]], threads: int, slots: Slots, budget: int,
         scheduler: YieldScheduler | None = None, clock: FakeClock | None = None,
         raise_in: str = "") -> tuple[list[str], list[BaseException]]:  # fmt: skip
    """Run each package's candidates (True: a task with hidden targets) on ``threads``
    threads, one 1-slot-second step each, through ``scheduler`` (else ``slots`` first come,
    first served) until ``budget`` steps ran; ``raise_in``: that package's first step
    raises. Returns the packages in the order their steps ran, and the errors raised."""
    order: list[str] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    live = [len(packages) * threads]
    queues = {name: list(cands) for name, cands in packages.items()}
    shares = {name: scheduler.share(name) for name in packages} if scheduler else {}
    waiting = (lambda: scheduler.waiting) if scheduler else (lambda: slots.waiting)
    holding = (lambda: scheduler.admitted) if scheduler else (lambda: slots.in_use)

    def worker(name: str) -> None:
        try:
            while True:
                with lock:
                    if not queues[name]:
                        return
                    hit = queues[name].pop(0)
                hold = shares[name].held() if scheduler else slots.held()
                with hold:
                    _until(lambda: waiting() + holding() >= live[0])  # the others wait
                    with lock:
                        if len(order) >= budget:
                            return
                        order.append(name)
                    if clock is not None:
                        clock.now += 1.0
                    if name == raise_in and order.count(name) == 1:
                        raise RuntimeError("a step failed")
                    if scheduler:
                        shares[name].finished(hit)
        except RuntimeError as e:
            errors.append(e)
        finally:
            with lock:
                live[0] -= 1

    pool = [threading.Thread(target=worker, args=(name,), daemon=True)
            for name in packages for _ in range(threads)]  # fmt: skip
    for t in pool:
        t.start()
    for t in pool:
        t.join(10)
        assert not t.is_alive(), "deadlock: a package thread never ended"
    return order, errors


def test_under_contention_the_high_yield_package_gets_the_slots():
    """One slot, two packages of 10 candidates on two threads each, 12 steps of budget (the
    time limit): first come, first served alternates (6 and 6); the scheduler gives each
    package its 2 first tries, then every slot to ``high`` (all its candidates are tasks
    with hidden targets: rate (1 + k) / (5 + T) >= 2/7 after its first tries, above ``low``'s
    1 / (5 + 2) = 0.14), so ``high`` runs all 10 and ``low`` its first 2."""
    packages = {"low": [False] * 10, "high": [True] * 10}
    fifo, _ = _run(packages, 2, Slots(1), budget=12)
    assert (fifo.count("high"), fifo.count("low")) == (6, 6)
    clock, slots = FakeClock(), Slots(1)
    scheduler = YieldScheduler(slots, clock=clock)
    order, errors = _run(packages, 2, slots, budget=12, scheduler=scheduler, clock=clock)
    assert not errors
    assert (order.count("high"), order.count("low")) == (10, 2)
    assert sorted(order[:4]) == ["high", "high", "low", "low"]  # the first tries come first
    assert order[4:] == ["high"] * 8
    high, low = scheduler.shares[1], scheduler.shares[0]
    assert (high.slot_seconds, high.hidden_tasks, low.slot_seconds, low.hidden_tasks) == (
        10.0, 10, 2.0, 0)  # fmt: skip
    assert high.rate() == pytest.approx(11 / 15) and low.rate() == pytest.approx(1 / 7)
    assert (scheduler.admitted, scheduler.waiting, slots.in_use) == (0, 0, 0)


def test_a_package_that_ends_or_raises_leaves_the_slots_to_the_others():
    """No budget: ``high`` runs out of candidates and its threads end, ``low`` then gets
    the slots and finishes too (no thread waits on a package that has no waiter left); a
    third package's first step raises: its slot comes back and the others finish. Two
    slots, so admissions also happen while a slot is free."""
    clock, slots = FakeClock(), Slots(2)
    scheduler = YieldScheduler(slots, clock=clock)
    packages = {"low": [False] * 6, "high": [True] * 6, "bad": [True] * 3}
    order, errors = _run(packages, 2, slots, budget=100, scheduler=scheduler, clock=clock,
                         raise_in="bad")  # fmt: skip
    assert [str(e) for e in errors] == ["a step failed"]
    assert (order.count("low"), order.count("high")) == (6, 6)
    assert 1 <= order.count("bad") <= 3  # its other thread went on after the failure
    assert (scheduler.admitted, scheduler.waiting, slots.in_use) == (0, 0, 0)


def test_an_interrupt_inside_a_step_frees_the_slot_and_nesting_takes_one():
    """Ctrl-C (KeyboardInterrupt) in a step gives the slot back; a step that nests another
    (as Slots does for a split grading's two sandboxes) takes one slot and never waits on
    itself; the slot time counts once."""
    clock, slots = FakeClock(), Slots(1)
    scheduler = YieldScheduler(slots, clock=clock)
    share = scheduler.share("pkg")
    with pytest.raises(KeyboardInterrupt), share.held():
        assert (scheduler.admitted, slots.in_use) == (1, 1)
        raise KeyboardInterrupt
    assert (scheduler.admitted, scheduler.waiting, slots.in_use) == (0, 0, 0)
    with share.held(), share.held(continuing=True):
        clock.now += 2.5
        assert (scheduler.admitted, slots.in_use) == (1, 1)
    assert (share.slot_seconds, share.steps, share.begun) == (2.5, 2, 2)
    share.finished(True, seconds=4.0)  # a run reused from runs.jsonl
    assert (share.slot_seconds, share.run_seconds, share.hidden_tasks) == (6.5, 2.5, 1)
    assert share.rate() == pytest.approx(2 / 11.5)


@pytest.mark.parametrize(
    ("failing", "expected"),
    [
        ([], False),
        (["t.py::test_a"], False),
        (["t.py::test_a[1]", "t.py::test_a[2]"], False),  # one test function: all shown
        (["t.py::test_a", "t.py::test_b"], True),
        ([f"t.py::test_{i}" for i in range(5)], True),
    ],
)
def test_may_hide_is_split_visible_hiding_something(failing, expected):
    """may_hide is the first step of hidden_split: split_visible leaves some test hidden."""
    assert may_hide(failing, 3) is expected
    if failing:
        assert bool(split_visible(failing, 3)[1]) is expected


def test_through_the_scheduler_a_slot_after_the_time_limit_runs_nothing(tmp_path):
    """A candidate asked for its slot before the suite's time limit and got it after (another
    package's step held the only slot): generate's candidate run gives up without running
    anything (its sandbox is None here: a run would fail) and is not recorded (None)."""
    root = tmp_path / "pk"
    (root / "pk").mkdir(parents=True)
    (root / "pk" / "__init__.py").write_text("def f(x):\n    y = x + 1\n    return y * 2\n")
    (cand,) = find_candidates(root)
    source = SourceTree("pk", "local", root, "0" * 64)
    slots = Slots(1)
    scheduler = YieldScheduler(slots)
    deadline = time.monotonic() + 0.2
    with ThreadPoolExecutor(1) as pool:
        with slots.held():  # the other package's step, past the limit
            run = pool.submit(generate._try, None, source, cand, ["t.py::test_f"],
                              TaskGenConfig(), None, None, share=scheduler.share("pk"),
                              deadline=deadline)  # fmt: skip
            _until(lambda: slots.waiting == 1)
            _until(lambda: time.monotonic() > deadline)
        assert run.result(5) is None
    assert (scheduler.admitted, slots.in_use) == (0, 0)
