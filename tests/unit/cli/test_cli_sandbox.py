"""Code environments and the missing sandbox, through the real CLI: without ``bwrap`` on PATH
a humaneval run stops before any model loads, with the install hint; with the unsafe switch
it runs and says so once."""

from __future__ import annotations

import os
import subprocess
import sys

from support.tiny_run import save_tiny_model


def _cli(args, tmp_path, timeout=600):
    bare = tmp_path / "bin-without-bwrap"
    bare.mkdir(exist_ok=True)
    env = {**os.environ, "PATH": str(bare), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "composer_replication.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd=tmp_path,
    )


def test_humaneval_without_bwrap_stops_before_the_model_loads(tmp_path):
    out = tmp_path / "run"
    missing_model = tmp_path / "no-such-model"
    r = _cli(["train", "env.name=humaneval", f"model.name={missing_model}", f"output_dir={out}"],
             tmp_path)  # fmt: skip
    text = r.stdout + r.stderr
    assert r.returncode != 0
    assert "`bwrap` was not found on PATH" in text and "apt-get install bubblewrap" in text
    assert "unsafe_run_without_isolation" in text  # the way out is named
    assert "does not exist" not in text  # stopped before the (missing) model was looked up
    assert not out.exists()  # nothing written


def test_unsafe_switch_runs_without_bwrap_and_warns_once(tmp_path):
    model = save_tiny_model(tmp_path / "tiny")
    out = tmp_path / "run"
    r = _cli(
        [
            "train",
            "env.name=humaneval",
            "sandbox.unsafe_run_without_isolation=true",
            f"model.name={model}",
            f"output_dir={out}",
            "max_steps=1",
            "num_threads=1",
            "generation.num_generations=2",
            "generation.prompts_per_step=2",
            "generation.max_completion_length=4",
            "env.num_train=4",
            "eval.before_and_after=false",
        ],
        tmp_path,
    )
    text = r.stdout + r.stderr
    assert r.returncode == 0, text[-2000:]
    assert text.count("runs WITHOUT OS isolation") == 1
    assert (out / "final").is_dir()
