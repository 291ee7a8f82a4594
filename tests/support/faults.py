"""Fault injection for file-system changes: every call that changes a tree (``os.open`` for
writing, ``os.write``, ``os.unlink``, ``os.rmdir``, ``os.mkdir``, ``os.rename``,
``os.replace``, ``os.chmod``, ``os.fchmod`` and ``open``/``io.open`` in a writing mode) is
counted, and the chosen ones (the k-th, and then one of the rollback's) fail with ``EIO``;
and a snapshot of a tree to compare before/after."""

from __future__ import annotations

import builtins
import contextlib
import errno
import io
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

_OS_CALLS = ("write", "unlink", "remove", "rmdir", "mkdir", "rename", "replace", "chmod", "fchmod")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class Faults:
    """Counts tree-changing calls; those whose 1-based number is in ``fail_at`` raise ``EIO``."""

    def __init__(self, fail_at: tuple[int, ...] = ()):
        self.fail_at, self.calls, self.failed = set(fail_at), 0, 0

    def tick(self, what: str) -> None:
        self.calls += 1
        if self.calls in self.fail_at:
            self.failed += 1
            raise OSError(errno.EIO, f"injected failure at call {self.calls} ({what})")


@contextlib.contextmanager
def injected(monkeypatch, *fail_at: int) -> Iterator[Faults]:
    """Patch the calls (module docstring) for the block; yields the counter."""
    faults = Faults(fail_at)

    def wrap(name, real):
        def call(*args, **kwargs):
            faults.tick(name)
            return real(*args, **kwargs)

        return call

    with monkeypatch.context() as m:
        for name in _OS_CALLS:
            m.setattr(os, name, wrap(name, getattr(os, name)))
        real_os_open = os.open

        def os_open(path, flags, *args, **kwargs):
            if flags & _WRITE_FLAGS:
                faults.tick("open")
            return real_os_open(path, flags, *args, **kwargs)

        m.setattr(os, "open", os_open)
        real_open = builtins.open

        def py_open(file, mode="r", *args, **kwargs):
            if any(c in mode for c in "wax+"):
                faults.tick("open")
            return real_open(file, mode, *args, **kwargs)

        m.setattr(builtins, "open", py_open)
        m.setattr(io, "open", py_open)
        yield faults


def every_fault(setup, change, monkeypatch) -> Iterator[tuple[tuple[int, ...], Faults, object]]:
    """``change()`` on a tree ``setup()`` made afresh, with a failure at each call k of it, and,
    for each k, again with a second failure at each later call of that run (the rollback's
    own steps): yields (the failing calls, the counter, ``change``'s result)."""

    def once(*failing: int) -> tuple[Faults, object]:
        setup()
        with injected(monkeypatch, *failing) as faults:
            result = change()
        return faults, result

    clean, _ = once()
    for k in range(1, clean.calls + 1):
        first, result = once(k)
        yield (k,), first, result
        for j in range(k + 1, first.calls + 1):
            second, result = once(k, j)
            yield (k, j), second, result


def snapshot(root: Path, skip: tuple[str, ...] = ()) -> dict[str, tuple]:
    """Every entry under ``root``: relative path -> (kind, bytes or link target, mode bits);
    top-level names in ``skip`` left out (a workspace's ``.git``, made with timestamps)."""
    out: dict[str, tuple] = {}
    for dirpath, dirs, files in os.walk(root):
        if dirpath == str(root):
            dirs[:] = [d for d in dirs if d not in skip]
        for name in dirs + files:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            rel = os.path.relpath(path, root)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(path), 0)
            elif stat.S_ISREG(st.st_mode):
                out[rel] = ("file", Path(path).read_bytes(), stat.S_IMODE(st.st_mode))
            else:
                out[rel] = ("dir", b"", stat.S_IMODE(st.st_mode))
    return out


def restore(root: Path, snap: dict[str, tuple], skip: tuple[str, ...] = ()) -> None:
    """Make ``root`` hold ``snap`` again (:func:`snapshot`; top-level names in ``skip`` are
    left alone)."""
    for entry in root.iterdir():
        if entry.name in skip:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    for rel, (kind, data, mode) in sorted(snap.items()):
        path = root / rel
        if kind == "dir":
            path.mkdir()
            path.chmod(mode)
        elif kind == "link":
            path.symlink_to(data)
        else:
            path.write_bytes(data)
            path.chmod(mode)
