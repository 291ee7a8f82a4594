"""An output path that cannot be a directory (an existing file, or a path under one) is bad
input: every command that writes a directory says so in one ``error:`` line, exit 2, before it
loads a model or does any work; before, each raised a traceback when it first wrote there,
after the work (``hints uplift`` after its whole measurement, ``train`` after loading the model
and evaluating the base)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from composer_replication.cli import app
from composer_replication.cli.common import BAD_INPUT
from composer_replication.config import ConfigError, check_output_dir

COMMANDS = {
    "train": ["train", "max_steps=1", "output_dir={out}"],
    "ablate": ["ablate", "output_dir={out}"],
    "diloco": ["diloco", "max_steps=1", "output_dir={out}"],
    "hints uplift": ["hints", "uplift", "--prompts", "1", "--out", "{out}"],
    "pairs": ["pairs", "j.db", "--no-embeddings", "--out", "{out}"],
    "tasks generate": ["tasks", "generate", ".", "--out", "{out}"],
}


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize(
    "out, message",
    [
        ("taken", "taken: it exists and is not a directory"),
        ("taken/run", "taken/run: {tmp}/taken exists and is not a directory"),
    ],
)
def test_an_output_path_that_is_a_file_is_refused_before_any_work(
    command, out, message, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "taken").write_text("an earlier result\n")
    args = [a.format(out=out) for a in COMMANDS[command]]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == BAD_INPUT, result.output
    text = _flat(result.output)
    assert text.startswith("error:") and message.format(tmp=tmp_path) in text
    assert "Traceback" not in result.output and "Loading" not in result.output
    assert (tmp_path / "taken").read_text() == "an earlier result\n"


def test_check_output_dir_accepts_new_and_existing_directories(tmp_path):
    check_output_dir(tmp_path, "output_dir")
    check_output_dir(tmp_path / "a" / "b", "output_dir")
    assert not (tmp_path / "a").exists()  # a check writes nothing


def test_check_output_dir_refuses_a_dangling_symlink(tmp_path):
    (tmp_path / "link").symlink_to(tmp_path / "gone")
    with pytest.raises(ConfigError, match="output_dir .*link: it exists and is not a directory"):
        check_output_dir(tmp_path / "link", "output_dir")
