"""The real embedded SmolLM2-135M-Instruct through ComposerReplicationTrainer: the CLI's two-step
run with its artefacts. (A resume that continues exactly like an uninterrupted run is
tests/unit/run/test_train_resume.py, on a tiny model: the same code path, a quarter the time.)"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

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
        "eval.n=8",
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
