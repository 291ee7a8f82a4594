"""What every command shares: the consoles, bad-input errors turned into one line and an exit
code, and quieting library chatter before a long run.

Exit codes: 0 success; 1 the work ran but its check failed (unbalanced ingest, a failed or
diverged replica, a replay in which calls failed: the journal keeps what succeeded and a re-run
retries transient failures); 2 bad input (config, arguments, missing or malformed files),
reported before any work starts; 3 a replay stopped because its budget ran out and nothing
failed (resumable: re-run with a larger ``--budget-usd``).
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NoReturn

import typer
from rich.console import Console
from rich.text import Text

from composer_replication.config import UserError

BAD_INPUT = 2
"""Exit code of a command refused because of its input."""
CHECK_FAILED = 1
"""Exit code of a command that ran but whose result failed its own check."""

BUDGET_EXHAUSTED = 3
"""Exit code of a replay stopped by its budget with no failed call (resumable)."""

INTERRUPTED = 130
"""Exit code after Ctrl-C (128 + SIGINT), as a shell reports it."""

console = Console()
err_console = Console(stderr=True, soft_wrap=True)


def fail(message: str, code: int = BAD_INPUT) -> NoReturn:
    """Print ``error: message`` on stderr (verbatim, no rich markup) and exit with ``code``."""
    err_console.print(Text.assemble(("error:", "bold red"), " ", message))
    raise typer.Exit(code)


def warn(message: str) -> None:
    """Print ``warning: message`` on stderr (verbatim): something was skipped, the run goes on."""
    err_console.print(Text.assemble(("warning:", "bold yellow"), " ", message))


def require_extra(extra: str, *modules: str) -> None:
    """Stop with one line (exit 2) naming the pip extra that provides ``modules`` when one of
    them is not installed: before any work, instead of an ImportError half-way through."""
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        fail(
            f"{', '.join(missing)} not installed; this command needs the {extra!r} extra: "
            f"pip install 'composer-replication[{extra}]'"
        )


@contextmanager
def exit_on(*errors: type[Exception], code: int = BAD_INPUT) -> Iterator[None]:
    """Turn a `UserError` (bad input, whatever layer found it) and the listed exceptions raised
    in the block into `fail` (message, then exit ``code``)."""
    try:
        yield
    except (UserError, *errors) as err:
        fail(str(err), code)


@contextmanager
def exit_on_interrupt(kept: str | Callable[[], str]) -> Iterator[None]:
    """Ctrl-C in the block: print ``interrupted: kept`` (what was done and where it is; a
    callable is asked then) and exit 130, without a traceback."""
    try:
        yield
    except KeyboardInterrupt:
        text = kept() if callable(kept) else kept
        err_console.print(Text.assemble(("interrupted:", "bold yellow"), " ", text))
        raise typer.Exit(INTERRUPTED) from None


def quiet_libraries() -> None:
    """Silence deprecation chatter from transformers/TRL; our own output is the summary."""
    logging.basicConfig(level=logging.WARNING)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module="trl")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "transformers" in sys.modules:  # imported before the line above: its bars read it then
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # e.g. "Writing model shards" (\r-updated in a log)
