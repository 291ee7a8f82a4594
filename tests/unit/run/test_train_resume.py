"""``run_training`` with ``resume_from=<checkpoint>``: a run resumed from checkpoint-2 continues
exactly like the uninterrupted run (the same step-3 loss, grad norm, reward, entropy and
completion lengths), on a tiny random model with self-distillation on so the step has a
gradient. (The real model's run is tests/integration/test_train_real_model.py; ``ablate``'s
resume, with the distill channel's state, is test_ablation_resume.py.)"""

from __future__ import annotations

import pytest
from support.tiny_run import save_tiny_model

from composer_replication.config import load_config
from composer_replication.run.train import run_training
from composer_replication.trainer.callbacks import read_metrics


def test_resume_continues_like_an_uninterrupted_run(tmp_path):
    model = save_tiny_model(tmp_path / "model")
    # keep checkpoint-2 after checkpoint-3 is written (the default keeps only the newest)
    common = [
        f"model.name={model}", "alpha_sdpo=0.5", "optim.learning_rate=1e-3",
        "optim.warmup_steps=0", "generation.num_generations=4", "generation.prompts_per_step=2",
        "generation.max_completion_length=6", "env.levels=[1]", "env.num_train=64",
        "num_threads=2", "eval.before_and_after=false", "save_steps=2", "seed=3",
        "save_total_limit=null", "max_steps=3",
    ]  # fmt: skip
    run_training(load_config(None, [*common, f"output_dir={tmp_path / 'full'}"]))
    resume = f"resume_from={tmp_path / 'full' / 'checkpoint-2'}"
    run_training(load_config(None, [*common, f"output_dir={tmp_path / 'resumed'}", resume]))
    a = read_metrics(tmp_path / "full" / "metrics.jsonl")
    b = read_metrics(tmp_path / "resumed" / "metrics.jsonl")
    assert [r["step"] for r in a] == [1, 2, 3]
    assert [r["step"] for r in b] == [3]
    assert b[0]["grad_norm"] > 0 and b[0]["sdpo/active"] == 1.0  # a step that trains
    for key in ("reward", "loss", "grad_norm", "entropy", "completions/mean_length"):
        assert b[0][key] == pytest.approx(a[2][key], rel=1e-5, abs=1e-7), key
