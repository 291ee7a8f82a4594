"""Runs tests/lowest_env inside the venv of the lowest versions pyproject.toml accepts for
torch, transformers, trl, peft and accelerate (tests/support/lowest_venv.py builds it on
first use, a few minutes of pip install, and reuses it)."""

from __future__ import annotations

import os
import subprocess

from support.lowest_venv import REPO, ensure_lowest_venv
from support.verl_venv import assert_exactly_passed

EXPECTED_TESTS = 3


def test_lowest_declared_versions_run_the_smoke_train(tmp_path):
    python = ensure_lowest_venv()
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    r = subprocess.run(
        [
            str(python),
            "-m",
            "pytest",
            "tests/lowest_env",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--basetemp={tmp_path / 'base'}",
        ],  # fmt: skip
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert_exactly_passed(r, EXPECTED_TESTS)
