"""A memory cgroup per sandbox that runs candidate code, where the machine allows one.

Per-process rlimits cannot bound what a sandbox holds in total: pages of a ``memfd`` or of
the tmpfs work directory, kernel memory of its inodes, or children started through a call
the audit hook does not see (a red-team pass held 320 MB with a 128 MB limit through
``os.memfd_create``, and ~330 MB of kernel memory with 124 000 empty directories). A memory
cgroup counts all of these, and the kernel reclaims or kills inside it.

Used when the grader runs as root and the cgroup-v1 memory controller of its own cgroup is
writable (this is the case on the project's CI machines); otherwise `MemoryCgroup.create`
returns None and the sandbox keeps only its rlimits (docs/sandbox.md, "Known gaps").
Kernel docs: Documentation/admin-guide/cgroup-v1/memory.rst (``memory.limit_in_bytes``,
``cgroup.procs``; tmpfs pages and kernel memory are charged to the writer's cgroup).
"""

from __future__ import annotations

import atexit
import itertools
import os
import re
import signal
import time
from collections.abc import Iterable, Iterator
from functools import lru_cache
from pathlib import Path

_COUNTER = itertools.count()
_PENDING: set[Path] = set()
"""Cgroups whose removal timed out (their last processes were still being torn down); each
later `MemoryCgroup.create` and the interpreter's exit try them again."""


@lru_cache(maxsize=1)
def memory_root() -> Path | None:
    """This process's cgroup-v1 memory directory if children can be made in it, else None."""
    if os.geteuid() != 0:
        return None
    try:
        own = next(
            line.split(":", 2)[2].strip()
            for line in Path("/proc/self/cgroup").read_text().splitlines()
            if "memory" in line.split(":", 2)[1].split(",")
        )
        mount = next(
            line.split()[4]
            for line in Path("/proc/self/mountinfo").read_text().splitlines()
            if " - cgroup " in line and "memory" in line.rsplit(" ", 1)[-1].split(",")
        )
    except (OSError, StopIteration, IndexError):
        return None
    root = Path(mount) / own.lstrip("/")
    probe = root / f"cr-probe-{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError:
        return None
    return root


def left_by_dead_processes(paths: Iterable[Path], name_pattern: str) -> Iterator[Path]:
    """The ``paths`` whose name matches ``name_pattern`` (its first group the pid of the
    process that made it) and whose maker is gone (no ``/proc/<pid>``): what a process
    killed before its exit handlers ran has left behind."""
    for path in paths:
        m = re.fullmatch(name_pattern, path.name)
        if m and not Path(f"/proc/{m.group(1)}").exists():
            yield path


def _remove_orphans(root: Path) -> None:
    """Remove empty sandbox cgroups left by graders that died before removing them (a
    process killed mid-grading cannot clean up; the next sandbox made beside it does)."""
    for path in left_by_dead_processes(root.glob("cr-sandbox-*"), r"cr-sandbox-(\d+)-\d+"):
        _rmdir(path)


class MemoryCgroup:
    """One child cgroup with a memory limit; `join` (a ``preexec_fn`` step) moves the
    calling process into it, `remove` deletes it once its processes are gone."""

    def __init__(self, path: Path):
        self.path = path

    @classmethod
    def create(cls, limit_mb: int) -> MemoryCgroup | None:
        root = memory_root()
        if root is None:
            return None
        _retry_pending()
        _remove_orphans(root)
        path = root / f"cr-sandbox-{os.getpid()}-{next(_COUNTER)}"
        try:
            path.mkdir()
            (path / "memory.limit_in_bytes").write_text(str(limit_mb * 2**20))
        except OSError:
            _rmdir(path)
            return None
        return cls(path)

    def join(self) -> None:
        """Move the calling process (and so everything it starts) into the cgroup."""
        with open(self.path / "cgroup.procs", "w") as fh:
            fh.write("0")

    def kill_all(self) -> None:
        """SIGKILL every process in the cgroup: its membership is exact, whatever the
        processes did to their parentage or sessions."""
        try:
            pids = (self.path / "cgroup.procs").read_text().split()
        except OSError:
            return
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, PermissionError, ValueError):
                pass

    def remove(self, timeout_s: float = 5.0) -> None:
        """Delete the cgroup once its processes are gone (a killed process holding hundreds
        of MB takes a while to leave on a loaded machine); if that takes longer than
        ``timeout_s`` it is retried later, not leaked."""
        end = time.monotonic() + timeout_s
        while not _rmdir(self.path):
            if time.monotonic() > end:
                _PENDING.add(self.path)
                return
            self.kill_all()
            time.sleep(0.05)


def _rmdir(path: Path) -> bool:
    """Remove an empty cgroup; False while it still has processes (or is busy)."""
    try:
        path.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


@atexit.register
def _retry_pending() -> None:
    for path in list(_PENDING):
        if _rmdir(path):
            _PENDING.discard(path)
