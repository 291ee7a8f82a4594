"""``diloco --launcher``: unknown launchers and conflicting options fail with one line, before
any replica starts."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from composer_replication.cli import app


@pytest.mark.parametrize(
    "args, message",
    [
        (["--launcher", "ray"], "expected 'subprocess' or 'monarch'"),
        (["--launcher", "monarch", "--executor", "local"], "drop --executor"),
        (["--launcher", "monarch", "--replica-ids", "0"], "drop --executor"),
    ],
)
def test_bad_launcher_choices_fail_fast(args, message, tmp_path):
    r = CliRunner().invoke(app, ["diloco", *args, f"output_dir={tmp_path}/run"])
    assert r.exit_code == 2, r.output
    assert message in " ".join(r.output.split())
    assert not (tmp_path / "run").exists()
