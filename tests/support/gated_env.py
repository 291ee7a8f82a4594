"""An arithmetic environment whose grading, past the first ``free`` calls, waits for a gate
file: rollout workers (other processes, which import this module through PYTHONPATH) then
finish a group only once the test opens the gate, so a test can show when groups are made."""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

from composer_replication.envs.arithmetic import ArithmeticEnv

GATE_DIR = "CR_TEST_GATE_DIR"
"""Environment variable: the directory holding the call tokens and the ``open`` file."""


class GatedArithmetic(ArithmeticEnv):
    def __init__(self, gate_dir: str, free: int, **kw):
        super().__init__(**kw)
        self.gate_dir, self.free = Path(gate_dir), free

    def grade_batch(self, tasks, completions):
        if self._call_number() >= self.free:
            deadline = time.monotonic() + 300
            while not (self.gate_dir / "open").exists() and time.monotonic() < deadline:
                time.sleep(0.02)
        return super().grade_batch(tasks, completions)

    def _call_number(self) -> int:
        """This call's number across processes (an exclusively created token file)."""
        for n in itertools.count():
            try:
                os.close(os.open(self.gate_dir / f"call-{n}", os.O_CREAT | os.O_EXCL))
                return n
            except FileExistsError:
                continue
        raise AssertionError("unreachable")


def gated_env(cfg, free: int = 2):
    """``run.train.build_env``'s stand-in: the gate directory from ``CR_TEST_GATE_DIR``."""
    return GatedArithmetic(os.environ[GATE_DIR], free, levels=cfg.env.levels)


def open_gate(gate_dir: Path) -> None:
    (gate_dir / "open").touch()
