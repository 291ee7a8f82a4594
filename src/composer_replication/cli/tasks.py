"""`composer-replication tasks generate SOURCE --out DIR`: build a Feature Deletion task set."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from composer_replication.cli.common import console, exit_on, exit_on_interrupt, fail

tasks_app = typer.Typer(help="Feature Deletion task sets.", no_args_is_help=True)


@tasks_app.command("generate")
def generate_command(
    source: Annotated[
        str,
        typer.Argument(help="A directory with a pytest suite, or a pinned package (toolz==1.2.0)."),
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
                            suite_timeout_s=suite_timeout_s,
                            test_requirements=test_requirement or [],
                            rename_package=rename_package)  # fmt: skip
    except ValidationError as e:
        fail("; ".join(f"{_option(err['loc'])}: {err['msg']}" for err in e.errors()))
    with exit_on():
        check_output_dir(out, "--out")
        require_pytest()  # the grader: before a source is downloaded or unpacked
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
