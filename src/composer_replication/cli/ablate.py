"""``composer-replication ablate``: every arm of the ablation for every seed, then the table."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from composer_replication.cli.common import console, exit_on, quiet_libraries


def ablate_command(
    overrides: Annotated[
        list[str] | None, typer.Argument(help="key=value overrides of the ablation config")
    ] = None,
    config: Annotated[Path, typer.Option("--config", "-c", help="ablation YAML")] = Path(
        "configs/ablation.yaml"
    ),
    report: Annotated[
        bool,
        typer.Option(
            "--report",
            help="Train nothing: tabulate the runs already finished (marked as partial).",
        ),
    ] = False,
    arm: Annotated[
        list[str] | None,
        typer.Option(
            "--arm",
            help="Train only this arm (repeatable), e.g. to split one experiment over two "
            "processes; the table then holds every finished run.",
        ),
    ] = None,
) -> None:
    """Train every arm (GRPO, +SDPO, +replay, all, TRL SDPO peer) for every seed; write the
    results table and a held-out-vs-step plot into the run directory (and into the docs with
    results_md=docs/results.md). Several processes may run one config at once (one per GPU
    with CUDA_VISIBLE_DEVICES, say): each trains the runs no other process holds."""
    from composer_replication.config import (
        check_output_dir,
        load_ablation_config,
        resolve_config_path,
    )
    from composer_replication.run.ablation import arm_config, check_arm_inputs, run_ablation
    from composer_replication.run.paired import with_interval

    with exit_on():
        acfg = load_ablation_config(resolve_config_path(str(config)), overrides or [])
        check_output_dir(acfg.output_dir, "output_dir")
        for each in acfg.arms:  # validate every arm's run config before training anything
            arm_config(acfg, each, acfg.seeds[0])
        if not report:  # and what each arm reads: a bad one fails now, not at its turn
            check_arm_inputs(acfg)
    quiet_libraries()
    command = (
        "composer-replication ablate --config "
        + str(config)
        + "".join(f" {o}" for o in overrides or [])
        + "".join(f" --arm {a!r}" for a in arm or [])
    )
    with exit_on():
        rows = run_ablation(acfg, command, console, train=not report, only=arm)
    table = Table(title="ablation: final held-out pass@1 (mean over seeds, 95% t-CI)")
    for col in ("arm", "mean [95% CI]", "per seed"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r["arm"],
            with_interval(r["mean"], (r["ci95_low"], r["ci95_high"]), len(r["per_seed"])),
            ", ".join(f"{v:.1%}" for v in r["per_seed"]),
        )
    console.print(table)
