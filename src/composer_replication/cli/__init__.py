"""``composer-replication``: one Typer app; each command group lives in its own module and the
commands stay thin (parse, build the parts, run them, print a summary).

- ``train``, ``eval``: `composer_replication.cli.train`
- ``ablate``: `composer_replication.cli.ablate`
- ``ingest``: `composer_replication.cli.ingest`
- ``serve``, ``replay``, ``pairs``: `composer_replication.cli.replay`
- ``diloco``: `composer_replication.cli.diloco`

Shared consoles, error reporting and exit codes: `composer_replication.cli.common`.
"""

from __future__ import annotations

import typer

from composer_replication.cli.ablate import ablate_command
from composer_replication.cli.diloco import diloco_command
from composer_replication.cli.ingest import ingest_command
from composer_replication.cli.replay import pairs_command, replay_command, serve_command
from composer_replication.cli.train import eval_command, train_command

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

__all__ = ["app"]
