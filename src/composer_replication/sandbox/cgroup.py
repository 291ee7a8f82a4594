"""A memory cgroup per sandbox that runs candidate code, where the machine allows one.

Per-process rlimits cannot bound what a sandbox holds in total: pages of a ``memfd`` or of
the tmpfs work directory, kernel memory of its inodes, or children started through a call
the audit hook does not see (a red-team pass held 320 MB with a 128 MB limit through
``os.memfd_create``, and ~330 MB of kernel memory with 124 000 empty directories). A memory
cgroup counts all of these, and the kernel reclaims or kills inside it.

Used when the grader runs as root and the cgroup-v1 memory controller of its own cgroup is
writable (this is the case on the project's CI machines). Everywhere else (cgroup-v2-only
hosts, no root) `MemoryCgroup.create` returns None and :data:`WATCHDOG` bounds the sandbox's
total instead, from user space (:class:`MemoryWatchdog`): less exact than the kernel (it
samples, so a burst between two looks passes until the next one), but it sees the same
kinds of memory that escaped the rlimits.
Kernel docs: Documentation/admin-guide/cgroup-v1/memory.rst (``memory.limit_in_bytes``,
``cgroup.procs``; tmpfs pages and kernel memory are charged to the writer's cgroup).
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import re
import signal
import threading
import time
from collections.abc import Iterable, Iterator
from functools import lru_cache
from pathlib import Path

log = logging.getLogger(__name__)
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


# ---- without a cgroup: a watchdog in user space ----------------------------------------------


def descendants(pid: int) -> list[int]:
    """Host pids of every live descendant of ``pid`` (via /proc/*/task/*/children)."""
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:  # the process may exit while it is listed: /proc/<pid>/task vanishes
            tasks = list(Path(f"/proc/{parent}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                kids = [int(x) for x in (task / "children").read_text().split()]
            except (OSError, ValueError):
                continue
            out += kids
            todo += kids
    return out


def tree_memory(pid: int) -> int:
    """Bytes of memory the process tree under ``pid`` (itself included) holds: the
    proportional set size of each process (``Pss`` of /proc/<pid>/smaps_rollup: private
    pages, its share of shared ones, mapped ``memfd``/shm pages included), plus the pages of
    every ``memfd`` or deleted file one of them holds open (not mapped, they are in no
    process's memory: the red-team's ``memfd_create`` attack), each file counted once."""
    total, files = 0, set()
    for p in [pid, *descendants(pid)]:
        try:
            rollup = Path(f"/proc/{p}/smaps_rollup").read_text()
            total += next(int(ln.split()[1]) for ln in rollup.splitlines()
                          if ln.startswith("Pss:")) * 1024  # fmt: skip
        except (OSError, StopIteration, ValueError, IndexError):
            pass
        try:
            fds = os.listdir(f"/proc/{p}/fd")
        except OSError:
            continue
        for fd in fds:
            path = f"/proc/{p}/fd/{fd}"
            try:
                target = os.readlink(path)
                if target.startswith("/memfd:") or target.endswith(" (deleted)"):
                    st = os.stat(path)
                    if (st.st_dev, st.st_ino) not in files:
                        files.add((st.st_dev, st.st_ino))
                        total += st.st_blocks * 512
            except OSError:
                continue
    return total


class MemoryWatchdog:
    """Bounds the total memory of process trees from user space (module docstring): every
    ``interval_s`` one thread measures each watched tree (:func:`tree_memory`) and SIGKILLs
    a tree over its limit (its root first, then every descendant), recording the pid in
    ``killed``. Trees are watched from :meth:`watch` to :meth:`unwatch`."""

    def __init__(self, interval_s: float = 0.1):
        self.interval_s = interval_s
        self._trees: dict[int, int] = {}  # root pid -> limit in bytes
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self.killed: dict[int, int] = {}
        """Root pid -> bytes measured when it was killed (until :meth:`unwatch`)."""

    def watch(self, pid: int, limit_bytes: int) -> None:
        with self._cond:
            self._trees[pid] = limit_bytes
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="cr-memory-watchdog",
                                                daemon=True)  # fmt: skip
                self._thread.start()
            self._cond.notify()

    @property
    def watching(self) -> int:
        """Trees watched now."""
        with self._cond:
            return len(self._trees)

    def unwatch(self, pid: int) -> int | None:
        """Stop watching ``pid``; the bytes it held when it was killed, or None."""
        with self._cond:
            self._trees.pop(pid, None)
            return self.killed.pop(pid, None)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._trees)
                trees = dict(self._trees)
            for pid, limit in trees.items():
                used = tree_memory(pid)
                if used > limit:
                    self._kill(pid, used, limit)
            time.sleep(self.interval_s)

    def _kill(self, pid: int, used: int, limit: int) -> None:
        with self._cond:
            if pid not in self._trees:  # unwatched meanwhile: the pid may be reused
                return
            self.killed[pid] = used
            inside = descendants(pid)
            for p in [pid, *inside]:
                try:
                    os.kill(p, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        log.warning("a sandbox held %d MB, over its %d MB: killed", used >> 20, limit >> 20)


WATCHDOG = MemoryWatchdog()
"""This process's watchdog for sandboxes that have no memory cgroup."""
