"""`ingest` on directories that hold nothing or hostile entries (issue 18)."""

from __future__ import annotations

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
