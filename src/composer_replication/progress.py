"""Progress that shows anywhere: a rich bar on a terminal, plain flushed lines elsewhere (a pipe,
a file, ``nohup``, CI, a job scheduler), where a live bar renders nothing until it stops.

`progress_bar` puts either behind an ``advance(n, description)`` callback, for loops that
report progress through a plain callable (evaluation, the ``eval`` command, teacher replay).
No console, no bar."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

PLAIN_LINE_EVERY_S = 1.0
"""Off a terminal, at most one progress line per this many seconds (and always the last): an
evaluation chunk on a CPU takes longer, so each gets its line; a replay of thousands of fast
calls does not flood the log."""


def duration(seconds: float) -> str:
    """``42 s``, ``7m 05s``, ``2h 03m``: a duration as a person reads it in a log."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"


def eta(elapsed_s: float, done: int, total: int | None) -> str:
    """``ETA 3m 10s`` at the mean pace so far; empty before the first unit or without a total."""
    if not total or done <= 0:
        return ""
    return f"ETA {duration(elapsed_s / done * max(total - done, 0))}"


def plain_line(console: Console, text: str) -> None:
    """Print ``text`` verbatim on one line (no markup, no highlighting, never wrapped at the
    console's width: a log line stays one line)."""
    console.print(text, highlight=False, markup=False, soft_wrap=True)


def is_terminal(console: Console | None) -> bool:
    """Whether ``console`` writes to a terminal (a live bar renders there)."""
    return console is not None and console.is_terminal


@contextmanager
def progress_bar(
    console: Console | None, label: str, total: int
) -> Iterator[Callable[..., None] | None]:
    """Yield ``advance(n=1, description=None, total=None)`` driving a bar of ``total`` steps on
    ``console`` (None without one); a description replaces the bar's label text, a total
    the bar's length (for work whose size is known only once it started). Off a terminal the
    bar is `plain_progress` lines."""
    if console is None:
        yield None
        return
    if not console.is_terminal:
        yield plain_progress(lambda text: plain_line(console, text), label, total)
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=console) as bar:
        task = bar.add_task(label, total=total)

        def advance(n: int = 1, description: str | None = None, total: int | None = None) -> None:
            extra = {"description": description} if description else {}
            if total is not None:
                extra["total"] = total
            bar.update(task, advance=n, **extra)

        yield advance


def plain_progress(
    echo: Callable[[str], None], label: str, total: int, every_s: float = PLAIN_LINE_EVERY_S
) -> Callable[..., None]:
    """``advance(n=1, description=None, total=None)`` that echoes ``label  done/total  elapsed
    ETA`` (at most one line per ``every_s`` seconds, and always the line that completes the
    total) with ``echo``."""
    state = {"label": label, "total": total, "done": 0, "last": float("-inf")}
    t0 = time.monotonic()

    def advance(n: int = 1, description: str | None = None, total: int | None = None) -> None:
        state["done"] += n
        state["label"] = description or state["label"]
        state["total"] = total if total is not None else state["total"]
        now, done, size = time.monotonic(), state["done"], state["total"]
        if now - state["last"] < every_s and not (size and done >= size):
            return
        state["last"] = now
        count = f"{done}/{size}" if size else f"{done}"
        parts = (state["label"], count, duration(now - t0), eta(now - t0, done, size))
        echo("  ".join(p for p in parts if p))

    return advance
