"""The real embedded SmolLM2-135M-Instruct through ComposerReplicationTrainer: the CLI's two-step
run with its artefacts, and a resume that continues exactly like an uninterrupted run."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from composer_replication.config import load_config
from composer_replication.run.train import run_training
from composer_replication.trainer.callbacks import read_metrics

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]

SMALL = [
    "generation.num_generations=4",
    "generation.prompts_per_step=2",
    "generation.max_completion_length=6",
    "env.levels=[1]",
    "env.num_train=64",
    "num_threads=2",
]


def test_cli_quickstart_two_steps(tmp_path):
    """`composer-replication train --config configs/quickstart.yaml max_steps=2` end to end."""
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "composer_replication.cli",
        "train",
        "--config",
        str(REPO / "configs" / "quickstart.yaml"),
        "max_steps=2",
        f"output_dir={out}",
        "eval.n=24",
        *SMALL,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "base" in proc.stdout and "trained" in proc.stdout and "pass@1" in proc.stdout
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(math.isfinite(r["loss"]) and "reward" in r for r in rows)
    assert (out / "training_curves.png").stat().st_size > 5000
    assert (out / "final" / "model.safetensors").is_file()
    assert (out / "checkpoint-2" / "optimizer.pt").is_file()
    assert (out / "eval.json").is_file()
    episodes = [json.loads(x) for x in (out / "eval_episodes.jsonl").read_text().splitlines()]
    base = [e for e in episodes if e["tag"] == "base"]
    trained = [e for e in episodes if e["tag"] == "trained"]
    n = json.loads((out / "eval.json").read_text())["base"]["n"]  # the held-out split's size
    assert len(base) == len(trained) == n > 0 and len(episodes) == 2 * n
    assert [e["task_id"] for e in base] == [e["task_id"] for e in trained]
    assert all(isinstance(e["completion"], str) and e["reward"] >= 0.0 for e in episodes)


def test_resume_continues_like_an_uninterrupted_run(tmp_path):
    # keep checkpoint-2 after checkpoint-3 is written (the default keeps only the newest)
    common = [
        *SMALL,
        "eval.before_and_after=false",
        "save_steps=2",
        "seed=3",
        "save_total_limit=null",
    ]
    full = load_config(None, [*common, "max_steps=3", f"output_dir={tmp_path / 'full'}"])
    run_training(full)
    resumed = load_config(
        None,
        [
            *common,
            "max_steps=3",
            f"output_dir={tmp_path / 'resumed'}",
            f"resume_from={tmp_path / 'full' / 'checkpoint-2'}",
        ],
    )
    run_training(resumed)
    a = read_metrics(tmp_path / "full" / "metrics.jsonl")
    b = read_metrics(tmp_path / "resumed" / "metrics.jsonl")
    assert [r["step"] for r in a] == [1, 2, 3]
    assert [r["step"] for r in b] == [3]
    for key in ("reward", "loss", "grad_norm", "entropy", "completions/mean_length"):
        assert b[0][key] == pytest.approx(a[2][key], rel=1e-5, abs=1e-7), key
