"""The real ``composer-replication`` CLI in a process of its own, for tests that interrupt it:
started in a new session (its process group is its own, so what it leaves running can be
found) with SIGINT's default action (a test run in the background by a non-interactive shell
ignores SIGINT, and a child would inherit that: Python then never raises KeyboardInterrupt)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_cli(args: list[str], **env: str) -> subprocess.Popen:
    """``python -m composer_replication.cli ARGS`` with stdout and stderr on one text pipe."""
    return subprocess.Popen(
        [sys.executable, "-m", "composer_replication.cli", *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONPATH": str(SRC), **env},
        start_new_session=True, preexec_fn=_sigint_default,
    )  # fmt: skip


def read_until(proc: subprocess.Popen, done: Callable[[list[str]], bool]) -> list[str]:
    """Lines of ``proc``'s output up to the first at which ``done(lines)`` holds (all of them
    if the process ends first)."""
    assert proc.stdout is not None
    lines: list[str] = []
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        if done(lines):
            break
    return lines


def children(pid: int) -> list[int]:
    """Process ids whose parent is ``pid``."""
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True)
    return [int(x) for x in out.stdout.split()]


def group_alive(pgid: int) -> bool:
    """Whether any process is left in process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def interrupt(
    proc: subprocess.Popen, timeout_s: float, sig: int = signal.SIGINT
) -> tuple[str, float]:
    """SIGINT (or ``sig``) to ``proc`` alone (as ``kill -INT``), then its remaining output and
    the seconds it took to exit (``subprocess.TimeoutExpired`` past ``timeout_s``; the group is
    killed)."""
    t0 = time.monotonic()
    proc.send_signal(sig)
    try:
        rest, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return rest, time.monotonic() - t0
