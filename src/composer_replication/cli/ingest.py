"""`composer-replication ingest PATH... --out states.jsonl [--format auto]`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from composer_replication.cli.common import CHECK_FAILED, fail
from composer_replication.traces import FORMATS, IngestReport, UnknownFormatError, ingest


def ingest_command(
    paths: Annotated[
        list[Path], typer.Argument(help="Log files or directories (searched recursively).")
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output JSONL of TraceStates.")],
    format: Annotated[
        str, typer.Option("--format", "-f", help=f"auto or one of: {', '.join(FORMATS)}")
    ] = "auto",
) -> None:
    """Turn agent logs into redacted per-step TraceStates (JSON lines)."""
    console = Console()
    tmp = out.with_name(out.name + ".partial")
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        run = ingest(paths, format)
        with open(tmp, "wb") as fh:
            for state in run:
                fh.write(state.to_json())
                fh.write(b"\n")
    except (UnknownFormatError, FileNotFoundError, ValueError) as exc:
        tmp.unlink(missing_ok=True)
        fail(str(exc))
    except BaseException:  # Ctrl-C or a bug: no half-written .partial is left behind
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(out)
    print_summary(run.report, out, console)
    if not run.report.files:
        looked = ", ".join(str(p.resolve()) for p in paths)
        console.print(
            f"nothing found: no agent log files in {looked} (searched recursively for "
            f"{', '.join(FORMATS)} logs); {out} is empty",
            markup=False,
            soft_wrap=True,
        )
    if not run.report.balanced:
        raise typer.Exit(CHECK_FAILED)


def print_summary(report: IngestReport, out: Path, console: Console) -> None:
    """Files, sessions, states per format; line accounting; skips, redactions, unknown types."""
    t = Table(title=f"ingested -> {out}")
    for col in ("format", "files", "sessions", "states", "lines", "skipped lines"):
        t.add_column(col, justify="right" if col != "format" else "left")
    for fmt, row in sorted(report.by_format().items()):
        t.add_row(fmt, *(str(row[k]) for k in ("files", "sessions", "states", "lines", "skipped")))
    t.add_row(
        "total",
        str(len(report.files)),
        str(report.sessions),
        str(report.states),
        str(report.total_lines),
        str(report.skipped_lines),
        style="bold",
    )
    console.print(t)
    ok = "[green]ok[/green]" if report.balanced else "[red]MISMATCH[/red]"
    console.print(
        f"lines: total {report.total_lines} = parsed {report.parsed_lines} + "
        f"skipped {report.skipped_lines} ({ok})"
    )
    for f in report.files:
        if not f.balanced:
            console.print(
                f"[red]unbalanced[/red] {f.path}: {f.parsed}+{f.skipped}!={f.total_lines}"
            )
    _counter(console, "skipped lines by reason", report.skipped_by_reason())
    for f in report.files:
        for reason, where in f.skipped_examples.items():
            console.print(f"  {reason}: {', '.join(where[:5])}")
    _counter(console, "skipped items inside documents", report.skipped_items())
    _counter(console, "redactions by type", report.redactions)
    _counter(console, "unknown record types", report.unknown_record_types())
    _counter(console, "orphaned tool calls/results", report.orphans())
    for path, why in report.unreadable.items():
        console.print(f"skipped {path}: {why}", markup=False, soft_wrap=True)
    if report.not_traces:
        console.print(f"not agent logs (ignored): {', '.join(report.not_traces)}")


def _counter(console: Console, title: str, counts) -> None:
    if not counts:
        console.print(f"{title}: none")
        return
    body = ", ".join(f"{k}={v}" for k, v in sorted(counts.items()))
    console.print(f"{title}: {body}")
