"""`composer-replication ingest PATH... --out states.jsonl [--format auto]`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from composer_replication.cli.common import CHECK_FAILED, fail
from composer_replication.traces import (
    FORMATS,
    IngestReport,
    TraceState,
    UnknownFormatError,
    ingest,
)


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
    check_out(out, paths)
    tmp = out.with_name(out.name + ".partial")
    written: dict[tuple[str, str], list[int]] = {}  # (file, session) -> [bytes, states]
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        fail(f"--out {out}: cannot create its directory: {exc.strerror or exc}")
    try:
        run = ingest(paths, format, exclude=[out])
        with open(tmp, "wb") as fh:
            for state in run:
                line = state.to_json()
                fh.write(line)
                fh.write(b"\n")
                w = written.setdefault((state.meta.file, state.session_id), [0, 0])
                w[0] += len(line) + 1
                w[1] += 1
    except (UnknownFormatError, FileNotFoundError, ValueError) as exc:
        tmp.unlink(missing_ok=True)
        fail(str(exc))
    except OSError as exc:  # the output cannot be written (permissions, disk full)
        tmp.unlink(missing_ok=True)
        fail(f"--out {out}: cannot write {exc.filename or tmp}: {exc.strerror or exc}")
    except BaseException:  # Ctrl-C or a bug: no half-written .partial is left behind
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(out)
    print_summary(run.report, out, console)
    print_size(written, console)
    if not run.report.files:
        looked = ", ".join(str(p.resolve()) for p in paths)
        console.print(
            f"nothing found: no agent log files in {looked} (searched recursively for "
            f"{', '.join(FORMATS)} logs); {out} is empty",
            markup=False,
            soft_wrap=True,
        )
    failures = run.report.check_failures()
    for why in failures:
        console.print(f"check failed: {why}", markup=False, soft_wrap=True)
    if failures and run.report.states:
        console.print(f"the states of the other files are in {out}", markup=False, soft_wrap=True)
    if not run.report.balanced or failures:
        raise typer.Exit(CHECK_FAILED)


def check_out(out: Path, paths: list[Path]) -> None:
    """Refuse an ``--out`` that would destroy an input: the input file itself (also through a
    symlink or hard link), or a log inside an input directory. A states file written there by
    an earlier run is fine: `ingest` leaves it out of the input (``exclude``)."""
    if out.is_dir():
        fail(f"--out {out} is a directory; give the path of the JSONL file to write")
    target = out.resolve()
    for p in paths:
        given = p.expanduser()
        if given.is_file() and (given.resolve() == target or _same_file(given, out)):
            fail(f"--out {out} is the input {p}: ingest would overwrite the log it reads")
        if given.is_dir() and target.is_relative_to(given.resolve()) and out.is_file():
            if not _is_states_file(out):
                fail(
                    f"--out {out} is a file inside the input directory {p} that is not a states "
                    "file from an earlier ingest: it would be overwritten; choose another --out"
                )


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _is_states_file(path: Path) -> bool:
    """True for an empty file or one whose first line is a TraceState (an earlier output)."""
    try:
        with open(path, "rb") as fh:
            first = fh.readline()
        return not first.strip() or TraceState.from_json(first) is not None
    except (OSError, ValueError):
        return False


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
    _counter(console, "context changes (rewind, rollback, compaction)", report.context_changes())
    _counter(console, "warnings", report.warnings())
    if report.duplicate_decisions:
        console.print(f"decisions read twice (kept once): {report.duplicate_decisions}")
    for f in report.files:
        console.print(f.summary(), markup=False, soft_wrap=True)
    for path, why in report.unreadable.items():
        what = "read in part" if why.startswith("partially read") else "skipped"
        console.print(f"{what} {path}: {why}", markup=False, soft_wrap=True)
    if report.duplicates:
        shown = ", ".join(report.duplicates[:10])
        console.print(f"read once (given more than once): {shown}", markup=False, soft_wrap=True)
    if report.not_traces:
        console.print(f"not agent logs (ignored): {', '.join(report.not_traces)}")


def print_size(written: dict[tuple[str, str], list[int]], console: Console) -> None:
    """Bytes written, and the session that wrote the most: each state holds its conversation
    so far, so a session's share of the file grows as the square of its length."""
    if not written:
        return
    total = sum(b for b, _ in written.values())
    (file, session), (size, states) = max(written.items(), key=lambda kv: kv[1][0])
    console.print(
        f"wrote {_mb(total)}; the largest session, {session} ({file}), {_mb(size)} in {states} "
        "states (each state repeats its session's conversation so far: a session's share "
        "grows as the square of its length; docs/ingestion.md)",
        markup=False,
        soft_wrap=True,
    )


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MB"


def _counter(console: Console, title: str, counts) -> None:
    if not counts:
        console.print(f"{title}: none")
        return
    body = ", ".join(f"{k}={v}" for k, v in sorted(counts.items()))
    console.print(f"{title}: {body}")
