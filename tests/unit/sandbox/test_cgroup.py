"""The per-sandbox memory cgroup (sandbox/cgroup.py): removal kills what is left in it and never
leaks the directory. Needs a writable cgroup-v1 memory controller (root on CI machines)."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from composer_replication.sandbox import cgroup
from composer_replication.sandbox.cgroup import MemoryCgroup, memory_root

needs_cgroup = pytest.mark.skipif(
    memory_root() is None, reason="no writable memory cgroup on this machine"
)


def _start_in(group: MemoryCgroup) -> subprocess.Popen:
    """A process that joined ``group`` and left this process's session."""
    return subprocess.Popen(["sleep", "60"], preexec_fn=group.join, start_new_session=True)


def _wait_empty(group: MemoryCgroup, timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while (group.path / "cgroup.procs").read_text().strip() and time.monotonic() < end:
        time.sleep(0.05)


@needs_cgroup
def test_remove_kills_what_is_left_and_deletes_the_cgroup():
    group = MemoryCgroup.create(64)
    proc = _start_in(group)
    assert (group.path / "cgroup.procs").read_text().split() == [str(proc.pid)]
    group.remove()
    assert proc.wait(timeout=5) == -9
    assert not group.path.exists()


@needs_cgroup
def test_a_removal_that_times_out_is_retried_not_leaked():
    group = MemoryCgroup.create(64)
    proc = _start_in(group)
    try:
        group.remove(timeout_s=0.0)  # the process is still alive: it cannot go yet
        assert group.path.exists() and group.path in cgroup._PENDING
    finally:
        proc.kill()
        proc.wait()
    _wait_empty(group)
    fresh = MemoryCgroup.create(64)  # every creation retries the pending ones first
    assert not group.path.exists() and group.path not in cgroup._PENDING
    fresh.remove()
    assert not fresh.path.exists()


@needs_cgroup
def test_cgroups_of_a_dead_grader_are_removed_by_the_next_sandbox():
    dead = _dead_pid()
    orphan = memory_root() / f"cr-sandbox-{dead}-0"
    orphan.mkdir()
    try:
        MemoryCgroup.create(64).remove()
        assert not orphan.exists()
    finally:
        if orphan.exists():
            orphan.rmdir()


def _dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_bind_directories_of_dead_processes_are_removed(tmp_path):
    """Not a cgroup, the same class: what a killed grader leaves in /var/tmp (its pytest
    copy, staged trees) is removed by the next process that makes a bind directory."""
    from composer_replication.sandbox import sandbox

    dead, base = _dead_pid(), tmp_path
    orphan = base / f"cr-pytest-tools-{dead}.abc_12"
    mine = base / f"cr-pytest-tools-{os.getpid()}.def_34"
    other = base / "cr-unrelated"
    for d in (orphan, mine, other):
        d.mkdir()
    sandbox._remove_orphan_binds(str(base))
    assert not orphan.exists() and mine.exists() and other.exists()


MEMFD_HOARD = """
import os, time
fds = []
for i in range(24):  # 24 x 12 MB in memfds: no process maps them, no rlimit counts them
    fd = os.memfd_create(f"hoard{i}")
    for _ in range(12):
        os.write(fd, b"x" * (1 << 20))
    fds.append(fd)
print("hoarded", flush=True)
time.sleep(8)
print("survived", flush=True)
"""


def test_without_a_cgroup_the_watchdog_bounds_a_sandboxs_total_memory(monkeypatch):
    """Issue 55 (class 8): with no cgroup-v1 memory controller (cgroup-v2-only hosts, no
    root) a sandbox was bounded per process only: pages in ``memfd`` files (and children
    started past the audit hook) are in no process's address space. Here the v1 probe is
    forced off and a sandbox with 128 MB per process hoards 288 MB in memfds: the
    user-space watchdog kills it (its total limit: 128 + 16 + 64 MB)."""
    from composer_replication.config import SandboxConfig
    from composer_replication.sandbox.cgroup import WATCHDOG
    from composer_replication.sandbox.sandbox import Sandbox

    monkeypatch.setattr(cgroup, "memory_root", lambda: None)
    cfg = SandboxConfig(memory_mb=128, work_dir_mb=16, file_size_mb=16, wall_timeout_s=60,
                        cpu_time_s=60, audit_hook=False)  # fmt: skip
    res = Sandbox(cfg).run_python(MEMFD_HOARD)
    assert "survived" not in res.stdout, res.stderr
    assert res.returncode is not None and res.returncode < 0 or res.returncode == 137
    assert WATCHDOG.watching == 0  # unwatched when the sandbox closed
    small = Sandbox(cfg).run_python("import os; fd = os.memfd_create('a'); "
                                    "os.write(fd, b'x' * (8 << 20)); print('fine')")  # fmt: skip
    assert small.ok and small.stdout.strip() == "fine"
