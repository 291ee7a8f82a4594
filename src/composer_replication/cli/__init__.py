"""``composer-replication``: one Typer app; each command group lives in its own module and the
commands stay thin (parse, build the parts, run them, print a summary).

- ``train``, ``eval``: `composer_replication.cli.train`
- ``ablate``: `composer_replication.cli.ablate`
- ``ingest``: `composer_replication.cli.ingest`
- ``serve``, ``replay``, ``pairs``: `composer_replication.cli.replay`
- ``diloco``: `composer_replication.cli.diloco`
- ``tasks generate``: `composer_replication.cli.tasks`
- ``hints uplift``: `composer_replication.cli.hints`

Shared consoles, error reporting and exit codes: `composer_replication.cli.common`.
"""

from __future__ import annotations

import os
import sys

import typer
import typer.rich_utils

from composer_replication.cli.ablate import ablate_command
from composer_replication.cli.diloco import diloco_command
from composer_replication.cli.hints import hints_app
from composer_replication.cli.ingest import ingest_command
from composer_replication.cli.replay import pairs_command, replay_command, serve_command
from composer_replication.cli.tasks import tasks_app
from composer_replication.cli.train import eval_command, train_command

HELP_WIDTH_OFF_TERMINAL = 120
"""Width of ``--help`` when stdout is not a terminal (piped, captured): rich would use 80 and
cut long option names (``--agreement-thr…``). TERMINAL_WIDTH or COLUMNS still win."""
if not sys.stdout.isatty() and not (os.environ.get("TERMINAL_WIDTH") or os.environ.get("COLUMNS")):
    typer.rich_utils.MAX_WIDTH = HELP_WIDTH_OFF_TERMINAL

app = typer.Typer(
    help="RL post-training for Hugging Face causal LMs: GRPO/DAPO, hint self-distillation, "
    "multi-teacher trace replay, DiLoCo.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
_OVERRIDES = {"allow_extra_args": True, "ignore_unknown_options": False}

app.command("train", context_settings=_OVERRIDES)(train_command)
app.command("eval")(eval_command)
app.command("ablate")(ablate_command)
app.command("ingest")(ingest_command)
app.command("serve")(serve_command)
app.command("replay")(replay_command)
app.command("pairs")(pairs_command)
app.command("diloco", context_settings={"allow_extra_args": True})(diloco_command)
app.add_typer(tasks_app, name="tasks")
app.add_typer(hints_app, name="hints")

__all__ = ["app"]
