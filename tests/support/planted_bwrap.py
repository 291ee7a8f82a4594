"""A sandbox's bwrap replaced by a shell script for one test (machine failures planted for real:
a bwrap that cannot create its namespace, one the host kills), in a directory the sandbox's user
can read (a root grader drops to ``nobody``)."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from composer_replication.sandbox.sandbox import Sandbox, bindable_dir

BWRAP_ERROR = 'echo "bwrap: Creating new namespace failed: Operation not permitted" >&2; exit 1'
"""A script body failing as bwrap does on a host without user namespaces."""


@contextlib.contextmanager
def script_dir() -> Iterator[Path]:
    """A fresh directory every user can read, removed afterwards."""
    path = Path(bindable_dir("cr-test-"))
    os.chmod(path, 0o777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def planted_bwrap(box: Sandbox, scripts: Path) -> Iterator[Callable[[str], Path]]:
    """``plant(body)`` makes ``box`` run ``scripts/bwrap`` (``#!/bin/sh`` then ``body``) as its
    bwrap and returns ``scripts``; the real bwrap comes back afterwards."""
    real = box.bwrap

    def plant(body: str) -> Path:
        script = scripts / "bwrap"
        script.write_text(f"#!/bin/sh\n{body}\n")
        script.chmod(0o755)
        box.bwrap = str(script)
        return scripts

    try:
        yield plant
    finally:
        box.bwrap = real
