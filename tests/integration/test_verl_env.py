"""Runs tests/verl_env inside the verl virtual environment (verl 0.9.1 with transformers < 5.11,
which our own environment excludes). The venv is created on first use by
tests/support/verl_venv.py (about a minute of pip install) and reused after."""

from __future__ import annotations

import subprocess

from support.verl_venv import REPO, assert_exactly_passed, ensure_verl_venv

EXPECTED_TESTS = 11


def test_verl_recipe_tests_pass_in_their_own_environment():
    python = ensure_verl_venv()
    probe = subprocess.run(
        [
            str(python),
            "-c",
            "import transformers, verl; print(transformers.__version__, verl.__version__)",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    tf, vv = probe.stdout.split()[-2:]
    assert vv == "0.9.1" and tuple(map(int, tf.split(".")[:2])) < (5, 11), probe.stdout
    r = subprocess.run(
        [
            str(python),
            "-m",
            "pytest",
            "tests/verl_env",
            "-q",
            "-p",
            "no:cacheprovider",
            "-W",
            "ignore",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert_exactly_passed(r, EXPECTED_TESTS)
