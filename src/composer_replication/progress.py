"""A rich progress bar behind an ``advance(n)`` callback, for loops that report progress through
a plain callable (evaluation, the ``eval`` command). No console, no bar."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console


@contextmanager
def progress_bar(
    console: Console | None, label: str, total: int
) -> Iterator[Callable[[int], None] | None]:
    """Yield ``advance(n)`` driving a bar of ``total`` steps on ``console`` (None without one)."""
    if console is None:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    with Progress(
        TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), console=console
    ) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)
