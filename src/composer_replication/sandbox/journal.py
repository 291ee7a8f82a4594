"""All-or-nothing changes to a directory tree: the shell tool's read-back (sandbox/shell.py) and
Codex's ``apply_patch`` (envs/profiles.py) change a workspace through a :class:`TreeJournal`.

Every change is one ``rename`` or ``mkdir`` that the journal can undo: new bytes are first
written in full to a scratch directory beside the tree (same file system), then renamed into
place; an entry that is removed or replaced is renamed into the scratch directory, not deleted.
If any step fails (a name the host refuses, ``ENAMETOOLONG``, a full disk, a directory where a
file goes), the steps already taken are undone in reverse order and the error is raised: the
tree is as it was. On success the scratch directory (the parked old entries) is removed.

Undo steps are renames and ``rmdir`` of directories the journal made: they need no space and
write no bytes, and each is tried again if it fails (``UNDO_ATTEMPTS``). If one keeps failing (the file system that failed the change fails this too),
the scratch directory is kept and named in the log, so that nothing is lost.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile
from pathlib import Path
from types import TracebackType

log = logging.getLogger(__name__)

UNDO_ATTEMPTS = 3
"""Tries per undo step (a step that failed once, as the change it undoes did, may pass)."""


class TreeJournal:
    """Changes under ``root``, undone together if one fails (module docstring). Use as a
    context manager: an exception inside the block rolls back and propagates; leaving it
    normally commits."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._scratch: str | None = None
        self._undo: list[tuple[str, str, str]] = []  # (op, path, parked/staged path)
        self._count = 0

    def __enter__(self) -> TreeJournal:
        return self

    def __exit__(self, et: type | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        if et is None:
            self.commit()
        else:
            self.rollback()

    # ---- changes ---------------------------------------------------------------------------
    def remove(self, path: Path) -> None:
        """Take the entry at ``path`` (a file, a link, or a whole directory) out of the tree."""
        parked = self._new_scratch_name()
        os.rename(path, parked)
        self._undo.append(("unpark", str(path), parked))

    def mkdir(self, path: Path) -> None:
        """Make the directory ``path`` (its parent must exist)."""
        os.mkdir(path)
        self._undo.append(("rmdir", str(path), ""))

    def makedirs(self, path: Path) -> None:
        """Make ``path`` and its missing parents inside the tree, each undoable."""
        missing = []
        p = Path(path)
        while not p.is_dir() and p != self.root and self.root in p.parents:
            missing.append(p)
            p = p.parent
        for d in reversed(missing):
            self.mkdir(d)

    def write(self, path: Path, data: bytes) -> None:
        """Make ``path`` a regular file holding ``data``: a file there is replaced (keeping
        its permission bits), a directory there is an error (``IsADirectoryError``)."""
        try:
            old = os.lstat(path)
        except FileNotFoundError:
            old = None
        if old is not None and stat.S_ISDIR(old.st_mode):
            raise IsADirectoryError(21, "Is a directory", str(path))
        staged = self._new_scratch_name()
        mode = stat.S_IMODE(old.st_mode) if old is not None and stat.S_ISREG(old.st_mode) else None
        _write_file(staged, data, mode)
        if old is not None:
            self.remove(path)
        os.rename(staged, path)
        self._undo.append(("unplace", str(path), staged))

    # ---- ending ----------------------------------------------------------------------------
    def commit(self) -> None:
        """Keep the changes; drop what was parked."""
        self._undo.clear()
        if self._scratch is not None:
            _discard(self._scratch)
            self._scratch = None

    def rollback(self) -> None:
        """Undo every change, last first (best effort: see the module docstring)."""
        failed = 0
        for op, path, other in reversed(self._undo):
            for attempt in range(UNDO_ATTEMPTS):
                try:
                    _undo(op, path, other)
                    break
                except OSError as e:
                    if attempt == UNDO_ATTEMPTS - 1:
                        failed += 1
                        log.error("rolling back %s of %s failed: %s", op, path, e)
        self._undo.clear()
        if failed:
            log.error("%d undo steps failed; the old entries stay in %s", failed, self._scratch)
        elif self._scratch is not None:
            _discard(self._scratch)
        self._scratch = None

    def _new_scratch_name(self) -> str:
        if self._scratch is None:
            self._scratch = tempfile.mkdtemp(prefix=f".{self.root.name[:40]}.cr-journal-",
                                             dir=self.root.parent)  # fmt: skip
        self._count += 1
        return os.path.join(self._scratch, str(self._count))


def _undo(op: str, path: str, other: str) -> None:
    if op == "rmdir":
        os.rmdir(path)
    elif op == "unpark":  # the old entry back
        os.rename(other, path)
    else:  # unplace: the new file out again
        os.rename(path, other)


def _discard(scratch: str) -> None:
    """Remove the scratch directory (more passes for what a passing failure left)."""
    for _ in range(UNDO_ATTEMPTS):
        shutil.rmtree(scratch, ignore_errors=True)
        if not os.path.lexists(scratch):
            return
    log.warning("could not remove %s", scratch)


def _write_file(path: str, data: bytes, mode: int | None) -> None:
    """Write a new file in full (``mode``: its permission bits; None: the umask's default)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if mode is not None:
            os.fchmod(fd, mode)
    finally:
        os.close(fd)
