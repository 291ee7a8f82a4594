"""``composer-replication diloco``: run N replicas of a training config under DiLoCo.

Registered with ``allow_extra_args`` so ``key=value`` overrides pass through.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from composer_replication.cli.common import (
    CHECK_FAILED,
    console,
    exit_on,
    exit_on_interrupt,
    fail,
    require_extra,
)

if TYPE_CHECKING:
    from composer_replication.diloco.launcher import LaunchResult


def diloco_command(
    overrides: Annotated[
        list[str] | None,
        typer.Argument(help="key=value overrides, e.g. max_steps=6 diloco.sync_every=3"),
    ] = None,
    replicas: Annotated[
        int, typer.Option("--replicas", "-n", min=1, help="number of replicas")
    ] = 2,
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="YAML run config (default: configs/quickstart.yaml)"),
    ] = None,
    lighthouse: Annotated[
        str | None,
        typer.Option(
            "--lighthouse",
            help="address of a running torchft lighthouse (multi-host); default: start one here",
        ),
    ] = None,
    replica_ids: Annotated[
        str | None,
        typer.Option(
            "--replica-ids", help="only start these replica ids here, e.g. 0,1 (multi-host)"
        ),
    ] = None,
    min_replicas: Annotated[
        int | None,
        typer.Option(
            "--min-replicas",
            min=1,
            help="smallest quorum the local lighthouse accepts (default: all replicas)",
        ),
    ] = None,
    launcher: Annotated[
        str,
        typer.Option(
            "--launcher",
            help="'subprocess': one OS process per replica; 'monarch': replicas as actors on a "
            "Monarch process mesh of this host (pip install torchmonarch)",
        ),
    ] = "subprocess",
    executor: Annotated[
        str | None,
        typer.Option(
            "--executor",
            help="'local': start the replicas through LocalProcessExecutor with the trainer "
            "entrypoint (object_store backend); default: subprocesses of this launcher",
        ),
    ] = None,
) -> None:
    """Train N replicas with the DiLoCo outer loop (torchft, or an object store with
    diloco.backend=object_store); print each replica's final-weight checksum."""
    from composer_replication.config import check_output_dir, load_config
    from composer_replication.diloco.launcher import launch_diloco, launch_with_executor
    from composer_replication.run.preflight import check_model_sources, check_replica_dirs

    if executor not in (None, "local"):
        fail(f"--executor {executor!r}: only 'local' is supported")
    if launcher not in ("subprocess", "monarch"):
        fail(f"--launcher {launcher!r}: expected 'subprocess' or 'monarch'")
    if launcher == "monarch" and (executor or replica_ids or min_replicas):
        fail(
            "--launcher monarch runs every replica on this host: drop --executor, "
            "--replica-ids and --min-replicas"
        )
    try:
        ids = [int(x) for x in replica_ids.split(",")] if replica_ids else None
    except ValueError:
        fail(f"--replica-ids {replica_ids!r}: expected e.g. 0,1")
    echo = lambda s: console.print(s, markup=False, highlight=False, soft_wrap=True)  # noqa: E731
    require_extra("diloco", "torchft")
    with exit_on():  # a bad config or model name: before any replica
        # as each replica reads it (enabled): its rules for the outer loop are checked here
        run = load_config(
            config, [*(overrides or []), f"diloco.replicas={replicas}", "diloco.enabled=true"]
        )
        check_model_sources(run)
        check_output_dir(run.output_dir, "output_dir")
        check_replica_dirs(config, overrides or [], run, ids or range(replicas))
    if launcher == "monarch":
        from composer_replication.diloco.monarch import launch_monarch

        with exit_on(ValueError):
            result = launch_monarch(config, overrides or [], replicas, lighthouse, echo=echo)
        _print_result(result)
        return
    with (
        exit_on(ValueError),
        exit_on_interrupt(f"replicas stopped; what they wrote is in {run.output_dir}/replica-N"),
    ):
        if executor == "local":
            result = launch_with_executor(config, overrides or [], replicas, echo=echo)
        else:
            result = launch_diloco(
                config,
                overrides or [],
                replicas,
                lighthouse=lighthouse,
                replica_ids=ids,
                min_replicas=min_replicas,
                echo=echo,
            )
    _print_result(result)


def _print_result(result: LaunchResult) -> None:
    """The replicas' table and the verdict; exit 1 unless every replica finished."""
    table = Table(title="DiLoCo replicas")
    for col in ("replica", "exit", "inner steps", "syncs", "final weights checksum"):
        table.add_column(col)
    for r in result.replicas:
        f = r.final or {}
        table.add_row(
            str(r.replica),
            str(r.exit_code),
            str(f.get("inner_steps", "-")),
            str(f.get("syncs", "-")),
            str(f.get("checksum", "(none)")),
        )
    console.print(table)
    verdict = "EQUAL" if result.weights_equal else "DIFFERENT"
    console.print(
        f"final weights across replicas: {verdict}; plot: {result.plot}; summary: {result.summary}"
    )
    if not result.ok:
        raise typer.Exit(CHECK_FAILED)
