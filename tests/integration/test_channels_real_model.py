"""Channel 2 on the real embedded model: with every rollout failing (2-digit + 2-digit, which
the base model does not solve), GRPO has no signal, and the hinted self-teacher still gives a
non-zero loss and gradient."""

from __future__ import annotations

import pytest

from composer_replication.config import load_config
from composer_replication.run.train import build_trainer, prepare
from composer_replication.trainer.callbacks import read_metrics

pytestmark = pytest.mark.integration


def test_sdpo_fires_on_the_real_model(tmp_path):
    cfg = load_config(
        None,
        [
            f"output_dir={tmp_path}",
            "max_steps=1",
            "alpha_sdpo=1.0",
            "env.levels=[3]",
            "generation.num_generations=4",
            "generation.prompts_per_step=2",
            "generation.max_completion_length=8",
            "eval.before_and_after=false",
            "num_threads=2",
            "sdpo.hint_sources=[feedback]",
            "seed=0",
        ],
    )
    model, tokenizer, env = prepare(cfg)
    trainer = build_trainer(cfg, model, tokenizer, env)
    trainer.train()
    row = read_metrics(tmp_path / "metrics.jsonl")[-1]
    assert row["sdpo/active"] == 1.0
    assert row["sdpo/hinted_frac"] > 0
    assert row["sdpo/loss"] > 1e-4  # the hint really changes the teacher's distribution
    assert row["grad_norm"] > 0
    # the hinted teacher disowns what the failing student wrote: mean log q_teacher(y) -
    # log p_student(y) < 0 (measured on seeds 0/1/2: -0.099, -0.163, -0.195)
    assert row["sdpo/teacher_student_logprob_gap"] < 0.0
    # seed 0: every reply fails (all 2 groups tied; seed 2 has one success), so GRPO has no
    # signal and the whole gradient is channel 2's
    assert row["frac_reward_zero_std"] == 1.0
    assert row["policy/loss"] == 0.0
