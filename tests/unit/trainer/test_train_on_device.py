"""The trainer on a non-CPU device (the ``devcheck`` device of tests/support/device_check.py):
a tiny random model trains with every channel on, dynamic sampling, shared-prefix generation
and forwards, a checkpoint, and a held-out evaluation; any CPU tensor our code hands to the
device data fails the run. Variants cover each self-distillation loss and teacher, the
placebo contrast and both preference losses; the agent variant runs tool rollouts."""

from __future__ import annotations

import copy

import pytest
from support.device_check import accelerate_on_device, on_check_device
from support.tiny_run import every_channel_overrides

from composer_replication.config import load_config
from composer_replication.run.train import build_env, build_trainer
from composer_replication.trainer.callbacks import read_metrics


def _cfg(tmp_path, steps: int, *extra: str, name: str | None = None):
    return load_config(name, [*every_channel_overrides(tmp_path / "run", steps), *extra])


def _train_on_device(cfg, model, tokenizer):
    with accelerate_on_device() as dev:
        trainer = build_trainer(cfg, model, tokenizer, build_env(cfg))
        trainer.train()
    assert {p.device for p in model.parameters()} == {dev}
    return read_metrics(f"{cfg.output_dir}/metrics.jsonl")


@on_check_device
def test_two_steps_with_every_channel_then_evaluation(tmp_path, tokenizer, tiny_model):
    from composer_replication.evaluation import evaluate

    cfg = _cfg(tmp_path, 2, "grpo.dynamic_sampling.enabled=true",
               "grpo.dynamic_sampling.max_refills=1", "generation.shared_prefix=true")  # fmt: skip
    rows = _train_on_device(cfg, tiny_model, tokenizer)
    assert len(rows) == 2
    assert all(r["sdpo/active"] == 1.0 and r["replay/active"] == 1.0 for r in rows)
    assert "dynamic_sampling/refills" in rows[0]
    assert (tmp_path / "run" / "checkpoint-2" / "model.safetensors").is_file()
    result = evaluate(tiny_model, tokenizer, build_env(cfg), "heldout", n=3, max_new_tokens=3)
    assert len(result.passed) == 3


VARIANTS = {
    "taid_ema_placebo_simpo": [
        "sdpo.loss.type=taid",
        "sdpo.teacher=ema",
        "sdpo.contrast=placebo",
        "replay.loss.type=simpo",
    ],
    "entropy_opd_initial_plain_forwards": [
        "sdpo.loss.type=entropy_opd",
        "sdpo.teacher=initial",
        "generation.shared_prefix=false",
    ],
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@on_check_device
def test_channel_variant_step(variant, tmp_path, tokenizer, tiny_model):
    rows = _train_on_device(_cfg(tmp_path, 1, *VARIANTS[variant]), tiny_model, tokenizer)
    assert rows[-1]["replay/active"] == 1.0 and "sdpo/loss" in rows[-1]


@on_check_device
def test_agent_tool_rollouts_with_every_channel(tmp_path, tokenizer):
    from support.scripted_agent import scripted_calculator_model

    from composer_replication.evaluation import evaluate
    from composer_replication.lm.chat_templates import ensure_tool_template

    tok = copy.deepcopy(tokenizer)
    ensure_tool_template(tok)
    cfg = _cfg(tmp_path, 1, "sdpo.hint_sources=[feedback]", "generation.max_completion_length=64",
               name="agent_quickstart.yaml")  # fmt: skip
    model = scripted_calculator_model(tok)
    rows = _train_on_device(cfg, model, tok)
    assert rows[-1]["rollout/turns"] == 2.0 and rows[-1]["sdpo/active"] == 1.0
    result = evaluate(model, tok, build_env(cfg), "heldout", n=2, max_new_tokens=32)
    assert result.tool_stats["tool_calls_per_rollout"] > 0
