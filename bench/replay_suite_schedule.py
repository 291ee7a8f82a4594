"""Replay a suite run's candidates under two slot policies (an estimate, not a measurement):
first come, first served (what a suite did before schedule.py) and the yield-weighted
scheduler (schedule.YieldScheduler's rank, the same object and formula), as a discrete-event
simulation over the candidates each package's ``runs.jsonl`` holds, in the order they were
recorded (about the order they ran).

A candidate is one step costing its recorded slot time (``seconds + forward_seconds +
screen_seconds``; its waits left out), a package runs at most ``--workers`` at once, the slots
are ``--workers``; a task with hidden targets is schedule.may_hide's test. Assumptions (say
them with the numbers): baselines and the visibility scan are left out, a candidate's steps
are merged into one, and only the candidates the run tried can be replayed, so both policies
draw from the same pool: the ratio at a time t is of tasks with hidden targets found by t.

    python bench/replay_suite_schedule.py /tmp/i60c/tasks --workers 4
"""

from __future__ import annotations

import argparse
import heapq
import json
from pathlib import Path

from composer_replication.envs.feature_deletion.schedule import YieldScheduler, may_hide
from composer_replication.sandbox.sandbox import Slots


def load(suite_dir: Path, visible_tests: int) -> dict[str, list[tuple[float, bool]]]:
    """Per package: (slot-seconds, a task with hidden targets) of each candidate that ran."""
    out = {}
    for runs in sorted(Path(suite_dir).glob("*/runs.jsonl")):
        rows = []  # read only (generate.read_runs cuts a torn last line: a live run's)
        for line in runs.read_bytes().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
        cost = [sum(float(r.get(k) or 0) for k in ("seconds", "forward_seconds",
                                                   "screen_seconds")) for r in rows]  # fmt: skip
        out[runs.parent.name] = [
            (c, r["status"] == "task" and may_hide(r["failing"], visible_tests))
            for c, r in zip(cost, rows, strict=True)
            if c > 0
        ]
    return out


def replay(packages: dict[str, list[tuple[float, bool]]], workers: int, weighted: bool,
           marks: list[float], **prior: float) -> list[int]:  # fmt: skip
    """Tasks with hidden targets found by each time of ``marks`` (slot policy: ``weighted``
    or first come, first served); ``prior``: YieldScheduler's keywords (its defaults)."""
    sched = YieldScheduler(Slots(workers), **prior)
    shares = {name: sched.share(name) for name in packages}
    queues = {name: list(c) for name, c in packages.items()}
    asked = {name: [0.0] * workers for name in packages}  # when each idle thread asked
    events: list[tuple[float, int, str, float, bool]] = []
    found: list[float] = []
    now, free, seq = 0.0, workers, 0
    while True:
        while free:
            ready = [n for n in packages if queues[n] and asked[n]]
            if not ready:
                break
            if weighted:
                name = max(ready, key=lambda n: (*sched.rank(shares[n]), -min(asked[n])))
            else:
                name = min(ready, key=lambda n: min(asked[n]))
            asked[name].remove(min(asked[name]))
            cost, hidden = queues[name].pop(0)
            shares[name].begun += 1
            free -= 1
            seq += 1
            heapq.heappush(events, (now + cost, seq, name, cost, hidden))
        if not events:
            break
        now, _, name, cost, hidden = heapq.heappop(events)
        shares[name].finished(hidden, cost)
        if hidden:
            found.append(now)
        asked[name].append(now)
        free += 1
    return [sum(t <= m for t in found) for m in marks]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("suite_dir", type=Path)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--visible-tests", type=int, default=3)
    args = ap.parse_args()
    packages = load(args.suite_dir, args.visible_tests)
    total = sum(c for cands in packages.values() for c, _ in cands) / args.workers
    marks = [total * f for f in (0.25, 0.5, 0.75, 1.0)]
    fifo = replay(packages, args.workers, False, marks)
    weighted = replay(packages, args.workers, True, marks)
    n = sum(len(c) for c in packages.values())
    print(f"{len(packages)} packages, {n} candidates, {total:.0f} s of {args.workers} slots "
          "if always busy")  # fmt: skip
    for m, a, b in zip(marks, fifo, weighted, strict=True):
        print(f"by {m:7.0f} s: first come first served {a:4d}, yield-weighted {b:4d} tasks "
              f"with hidden targets ({b / max(a, 1):.2f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
