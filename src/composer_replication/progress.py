"""A rich progress bar behind an ``advance(n, description)`` callback, for loops that report
progress through a plain callable (evaluation, the ``eval`` command, teacher replay). No console,
no bar."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console


@contextmanager
def progress_bar(
    console: Console | None, label: str, total: int
) -> Iterator[Callable[..., None] | None]:
    """Yield ``advance(n=1, description=None, total=None)`` driving a bar of ``total`` steps on
    ``console`` (None without one); a description replaces the bar's label text, a total
    the bar's length (for work whose size is known only once it started)."""
    if console is None:
        yield None
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
