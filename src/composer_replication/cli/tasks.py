"""`composer-replication tasks generate SOURCE --out DIR`: build a Feature Deletion task set (or
a suite: SOURCE a file listing sources); `tasks export --format harbor OUT`: write task sets as
Harbor task directories."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from composer_replication.cli.common import console, exit_on, exit_on_interrupt, fail, warn

tasks_app = typer.Typer(help="Feature Deletion task sets.", no_args_is_help=True)


@tasks_app.command("generate")
def generate_command(
    source: Annotated[
        str,
        typer.Argument(
            help="A directory with a pytest suite, a pinned package (toolz==1.2.0), or a file "
            "listing such sources one a line (# comments): a suite sharing the cache and workers."
        ),
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory of task sets.")] = Path(
        "tasks"
    ),
    workers: Annotated[int, typer.Option(help="Parallel sandboxed runs (0: CPU cores).")] = 0,
    max_candidates: Annotated[
        int | None, typer.Option(help="Try only the first N functions (file order).")
    ] = None,
    max_break_share: Annotated[
        float, typer.Option(help="Refuse deletions failing more than this share of the suite.")
    ] = 0.5,
    visible_tests: Annotated[int, typer.Option(help="Failing tests the agent may see.")] = 3,
    suite_timeout_s: Annotated[float, typer.Option(help="Limit of one suite run.")] = 120.0,
    screen_test_timeout_s: Annotated[
        float, typer.Option(help="Limit of one test under one trivial body (the screen).")
    ] = 10.0,
    time_limit_s: Annotated[
        float | None,
        typer.Option(help="Start no candidate run after this many seconds (a re-run goes on)."),
    ] = None,
    test_requirement: Annotated[
        list[str] | None,
        typer.Option(help="A test dependency of the suite (pip requirement; repeatable)."),
    ] = None,
    rename_package: Annotated[
        bool, typer.Option(help="Rename the package against memorized upstream code.")
    ] = False,
) -> None:
    """Delete each function in turn, run the suite in the sandbox, keep the deletions that
    break some tests (resumable: a re-run continues where a killed one stopped)."""
    from pydantic import ValidationError

    from composer_replication.config import TaskGenConfig, check_output_dir
    from composer_replication.envs.feature_deletion.generate import generate_tasks
    from composer_replication.envs.feature_deletion.source import prepare_source
    from composer_replication.progress import progress_bar
    from composer_replication.sandbox.pytest_suite import require_pytest

    try:
        cfg = TaskGenConfig(workers=workers, max_candidates=max_candidates,
                            max_break_share=max_break_share, visible_tests=visible_tests,
                            suite_timeout_s=suite_timeout_s, time_limit_s=time_limit_s,
                            screen_test_timeout_s=screen_test_timeout_s,
                            test_requirements=test_requirement or [],
                            rename_package=rename_package)  # fmt: skip
    except ValidationError as e:
        fail("; ".join(f"{_option(err['loc'])}: {err['msg']}" for err in e.errors()))
    with exit_on():
        check_output_dir(out, "--out")
        require_pytest()  # the grader: before a source is downloaded or unpacked
        if Path(source).is_file():
            return _generate_suite(Path(source), out, cfg)
        tree = prepare_source(source, cfg)
        console.print(f"source {tree.label} ({tree.root}), sha256 {tree.digest[:12]}")
        runs = out / tree.label / "runs.jsonl"
        kept = f"the candidates tried so far are in {runs}; a re-run continues from there"
        with (
            progress_bar(console, f"deleting functions of {tree.label}", total=0) as advance,
            exit_on_interrupt(kept),
        ):
            bar = _Bar(advance)
            summary = generate_tasks(tree, out, cfg, spec=source, progress=bar.step,
                                     on_total=bar.total)  # fmt: skip
    table = Table(title=f"{summary.out_dir}")
    for col in ("candidates", "reused", "ran", "tasks", "seconds"):
        table.add_column(col, justify="right")
    table.add_row(str(summary.candidates), str(summary.reused), str(summary.ran),
                  str(summary.tasks), f"{summary.seconds:.0f}")  # fmt: skip
    console.print(table)
    console.print(
        "by status: " + ", ".join(f"{k} {v}" for k, v in sorted(summary.by_status.items()))
    )
    if summary.left:
        console.print(f"{summary.left} candidates not tried: the time limit passed; {kept}")


def _generate_suite(specs_file: Path, out: Path, cfg) -> None:
    """Every source ``specs_file`` lists, at once (envs/feature_deletion/suite.py), then the
    per-package table (also in ``OUT/suite.json``)."""
    from composer_replication.envs.feature_deletion.suite import generate_suite, read_specs
    from composer_replication.progress import plain_line, progress_bar

    specs = read_specs(specs_file)
    kept = f"each package's candidates tried so far are in {out}/<package>/runs.jsonl"
    with (
        progress_bar(console, f"deleting functions of {len(specs)} sources", total=0) as advance,
        exit_on_interrupt(kept),
    ):
        bar = _Bar(advance)
        rows = generate_suite(specs, out, cfg, progress=bar.step, on_total=bar.total,
                              note=lambda text: plain_line(console, text))  # fmt: skip
    table = Table(title=f"{out} ({len(specs)} sources)")
    for col in ("package", "candidates", "tasks", "hidden targets", "tests/task", "refused"):
        table.add_column(col, justify="left" if col in ("package", "refused") else "right")
    for r in rows:
        why = r.error or ", ".join(f"{k} {v}" for k, v in r.refused.items())
        table.add_row(r.label or r.spec, str(r.candidates), str(r.tasks), str(r.hidden_targets),
                      f"{r.tests_per_task:g}", why)  # fmt: skip
    table.add_row("total", str(sum(r.candidates for r in rows)), str(sum(r.tasks for r in rows)),
                  str(sum(r.hidden_targets for r in rows)), "", "")  # fmt: skip
    console.print(table)
    console.print(f"per-package summary: {out / 'suite.json'}", soft_wrap=True)  # whole path
    if left := sum(r.left for r in rows):
        console.print(f"{left} candidates not tried: the time limit passed; {kept}", soft_wrap=True)


@tasks_app.command("export")
def export_command(
    out: Annotated[Path, typer.Argument(help="Directory to write OUT/tasks/<task>/ into.")],
    fmt: Annotated[str, typer.Option("--format", help="Export format (harbor).")] = "harbor",
    tasks: Annotated[
        Path, typer.Option("--tasks", help="A task set, or a directory of task sets.")
    ] = Path("tasks"),
    estimates: Annotated[
        Path | None,
        typer.Option(help="JSON lines {task_id, pass_rate, attempts}: sets difficulty_level."),
    ] = None,
    org: Annotated[str, typer.Option(help="Harbor package organization (org/name).")] = (
        "composer-replication"
    ),
    base_image: Annotated[
        str, typer.Option(help="The images' FROM (default python:<this Python>-slim).")
    ] = "",
    agent_timeout_s: Annotated[float, typer.Option(help="[agent] timeout_sec.")] = 600.0,
    wheels: Annotated[
        Path | None,
        typer.Option(help="A directory holding the pinned pytest wheels (else pip download)."),
    ] = None,
) -> None:
    """Write each Feature Deletion task as a Harbor task directory (instruction, agent image,
    verifier image with the pristine repository and the pinned pytest, oracle solution,
    licenses): TRL's HarborSpec, SkyRL, rLLM and prime-rl read them."""
    from composer_replication.envs.feature_deletion.harbor import (
        ExportOptions,
        export_harbor,
        read_estimates,
    )

    if fmt != "harbor":
        fail(f"--format: unknown export format {fmt!r} (known: harbor)")
    if agent_timeout_s <= 0:
        fail("--agent-timeout-s: must be positive")
    if not org or "/" in org:
        fail(f"--org: {org!r} must be a non-empty name without '/'")
    with exit_on(OSError):
        est = read_estimates(estimates) if estimates is not None else None
        opts = ExportOptions(org=org, base_image=base_image, agent_timeout_s=agent_timeout_s,
                             wheel_dir=wheels)  # fmt: skip
        summary = export_harbor(tasks, out, opts, est)
    console.print(f"exported {len(summary.tasks)} tasks to {out / 'tasks'} "
                  f"({summary.with_difficulty} with difficulty_level)")  # fmt: skip
    for label in summary.missing_licenses:
        warn(f"{label}: no license file found in the source; check its terms before sharing")


def _option(loc: tuple) -> str:
    """The command-line option of a `TaskGenConfig` field (``max_break_share`` ->
    ``--max-break-share``; the list ``test_requirements`` is the repeatable
    ``--test-requirement``)."""
    if not loc:
        return "options"
    field = str(loc[0]).removesuffix("s") if loc[0] == "test_requirements" else str(loc[0])
    return "--" + field.replace("_", "-") + "".join(f"[{i}]" for i in loc[1:])


class _Bar:
    """Adapts the generator's callbacks to the progress bar (total known after the scan)."""

    def __init__(self, advance):
        self.advance = advance

    def total(self, n: int) -> None:
        if self.advance is not None:
            self.advance(0, total=n)

    def step(self, n: int = 1) -> None:
        if self.advance is not None:
            self.advance(n)
