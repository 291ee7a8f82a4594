"""The one ``composer-replication`` app: every command registered once, bad input reported as
one ``error:`` line with exit code 2 before any work, and messages printed verbatim."""

from __future__ import annotations

import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from composer_replication.cli import app
from composer_replication.cli.common import BAD_INPUT, exit_on, fail

COMMANDS = ["train", "eval", "ablate", "ingest", "serve", "replay", "pairs", "diloco"]


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_every_command_is_registered_once():
    names = [c.name for c in app.registered_commands]
    assert sorted(names) == sorted(COMMANDS)
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    assert all(f" {name} " in result.output for name in COMMANDS)


def test_module_entry_point_runs_the_same_app():
    out = subprocess.run(
        [sys.executable, "-m", "composer_replication.cli", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "Usage: composer-replication" in out and all(name in out for name in COMMANDS)


@pytest.mark.parametrize(
    "args, message",
    [
        (["train", "max_steps=0"], "max_steps"),
        (["train", "--config", "nope.yaml"], "config file not found: nope.yaml"),
        (["ablate", "--config", "nope.yaml"], "config file not found: nope.yaml"),
        (["eval", "--model", "m", "--env", "chess"], "unknown environment 'chess'"),
        (["diloco", "--replica-ids", "0,x"], "--replica-ids '0,x': expected e.g. 0,1"),
        (["pairs", "j.db", "--out", "o", "--strategy", "best"], "plurality or weighted"),
        (["replay", "s.jsonl", "--teachers", "nope.yaml", "--budget-usd", "1", "--out", "r.db"],
         "config file not found: nope.yaml"),
    ],
)  # fmt: skip
def test_bad_input_is_one_error_line_and_exit_2(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == BAD_INPUT, result.output
    assert message in _flat(result.output)
    assert _flat(result.output).startswith("error:")
    assert "Traceback" not in result.output
    assert not (tmp_path / "r.db").exists() and not (tmp_path / "o").exists()


def test_fail_prints_the_message_verbatim():
    """A message with rich-markup-like brackets (an extra's name) is printed as is."""
    probe = typer.Typer()

    @probe.command()
    def run(code: int = 2) -> None:
        with exit_on(ImportError, code=code):
            raise ImportError("install the extra: pip install 'composer-replication[datajuicer]'")

    @probe.command()
    def other() -> None:
        fail("[bold]not bold[/bold]", code=3)

    result = CliRunner().invoke(probe, ["run"])
    assert result.exit_code == 2
    assert "error: install the extra: pip install 'composer-replication[datajuicer]'" in (
        _flat(result.output)
    )
    result = CliRunner().invoke(probe, ["other"])
    assert result.exit_code == 3 and "error: [bold]not bold[/bold]" in result.output
