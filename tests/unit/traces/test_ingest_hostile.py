"""`ingest` on directories that hold nothing or hostile entries (issue 18)."""

from __future__ import annotations

import os

import orjson
import typer
from typer.testing import CliRunner

from composer_replication.cli.ingest import ingest_command

app = typer.Typer()
app.command("ingest")(ingest_command)
app.command("other")(lambda: None)  # two commands: typer keeps the "ingest" subcommand name
runner = CliRunner()


def test_empty_directory_says_nothing_found_and_where(tmp_path):
    empty = tmp_path / "projects"
    empty.mkdir()
    out = tmp_path / "states.jsonl"
    r = runner.invoke(app, ["ingest", str(empty), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "nothing found" in r.output and str(empty.resolve()) in r.output
    assert out.exists() and out.read_bytes() == b""


def test_fifo_symlink_loop_dangling_and_unreadable_are_skipped_and_reported(tmp_path):
    """A FIFO (would block forever if opened), a symlink loop, a dangling symlink, a file that
    fails while read and a mode-000 file (unreadable unless root) sit next to a real log: ingest
    finishes, reports each path, ingests the log."""
    src = tmp_path / "logs"
    src.mkdir()
    good = src / "good.jsonl"
    msgs = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    good.write_bytes(orjson.dumps({"messages": msgs}) + b"\n")
    os.mkfifo(src / "fifo.jsonl")
    (src / "loop.jsonl").symlink_to(src / "loop.jsonl")
    (src / "dangling.jsonl").symlink_to(src / "missing.jsonl")
    locked = src / "locked.jsonl"
    locked.write_bytes(good.read_bytes())
    locked.chmod(0)
    # unreadable even for root: a regular file whose read fails (EIO at offset 0 of our own
    # address space), so the read-error path runs on every machine, as root or not
    (src / "mem.jsonl").symlink_to("/proc/self/mem")
    out = tmp_path / "states.jsonl"
    try:
        r = runner.invoke(
            app, ["ingest", str(src), "--out", str(out), "--format", "openai_messages"]
        )
    finally:
        locked.chmod(0o600)
    assert r.exit_code == 0, r.output
    for name in ["fifo.jsonl", "loop.jsonl", "dangling.jsonl", "mem.jsonl"] + (
        ["locked.jsonl"] if os.geteuid() != 0 else []
    ):
        assert f"skipped {src / name}:" in r.output, (name, r.output)
    assert b'"2+2?"' in out.read_bytes()  # the real log was ingested
