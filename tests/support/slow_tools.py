"""Slow tools for the concurrency tests and the rollout benchmark: each call records, from
inside the slow part itself, when it started and ended, so a test asserts how calls
overlapped (a structure) instead of how long a batch took (a wall-clock threshold a loaded
machine breaks).

* :class:`SandboxNapTools`: ``nap(tag)`` sleeps inside a real sandbox and reports the
  sandbox's own clock.
* :func:`delayed_calculator`: the calculator environment whose ``calculate`` waits
  ``delay_s`` on the server before answering (a remote environment's latency), served over
  OpenEnv by ``support.openenv_server.served``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from composer_replication.config import SandboxConfig
from composer_replication.envs.calculator import CalculatorEnv
from composer_replication.sandbox.sandbox import Sandbox

NAP_CODE = "import time; t0 = time.time(); time.sleep({s}); print(t0, time.time())"


@dataclass
class Spans:
    """(label, start, end) of every call, appended from any thread."""

    items: list[tuple[str, float, float]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, label: str, start: float, end: float) -> None:
        with self.lock:
            self.items.append((label, start, end))

    def peak(self) -> int:
        """Most calls running at the same moment."""
        edges = sorted([(s, 1) for _, s, _ in self.items] + [(e, -1) for _, _, e in self.items],
                       key=lambda x: (x[0], x[1]))  # fmt: skip
        now = best = 0
        for _, step in edges:
            now += step
            best = max(best, now)
        return best


class SandboxNapTools:
    """An ``environment_factory`` class: ``nap(tag)`` sleeps ``nap_s`` in the sandbox."""

    nap_s: float = 1.0
    spans = Spans()
    box = Sandbox(SandboxConfig(wall_timeout_s=30.0, cpu_time_s=5))

    def reset(self, **row: Any) -> None:
        self.task_id, self.calls = row["task_id"], 0

    def nap(self, tag: str) -> str:
        """Sleep a while in the sandbox.

        Args:
            tag: A label for the nap.
        """
        self.calls += 1
        r = self.box.run_python(NAP_CODE.format(s=self.nap_s))
        if not r.ok:
            raise RuntimeError(f"the nap failed: {r.stderr[-200:]}")
        start, end = (float(x) for x in r.stdout.split())
        self.spans.add(f"{self.task_id}:{tag}", start, end)
        return f"{self.task_id} napped ({tag}, call {self.calls})"


def delayed_calculator(delay_s: float, spans: Spans, per_kind: int = 50) -> CalculatorEnv:
    """The calculator whose served ``calculate`` takes ``env.delay_s`` (initially
    ``delay_s``) more, each call recorded in ``spans`` from the server's side."""
    env = CalculatorEnv(per_kind=per_kind)
    env.delay_s = delay_s
    plain = env.tools_class

    def tools_class() -> type:
        base = plain()

        class Delayed(base):
            def calculate(self, expression: str) -> str:
                start = time.time()
                time.sleep(env.delay_s)
                out = base.calculate(self, expression)
                spans.add(expression, start, time.time())
                return out

        Delayed.calculate.__doc__ = base.calculate.__doc__
        Delayed.__name__ = base.__name__
        return Delayed

    env.tools_class = tools_class
    return env
