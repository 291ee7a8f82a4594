"""Runs inside the lowest-versions venv (tests/support/lowest_venv.py; started by
tests/integration/test_lowest_versions.py): the lower bounds pyproject.toml declares are the
versions installed here, ``train`` builds its TRL config on them, and a smoke train with
every channel (and a LoRA adapter, for peft) runs to the end."""

from __future__ import annotations

import dataclasses
from importlib.metadata import version

from packaging.version import Version
from support.lowest_venv import lowest_versions
from support.tiny_run import every_channel_overrides
from trl import GRPOConfig

from composer_replication.config import load_config
from composer_replication.run.train import build_env, build_grpo_args, build_trainer
from composer_replication.trainer.callbacks import read_metrics


def test_installed_versions_are_the_declared_lower_bounds():
    for name, low in lowest_versions().items():  # 2.13.0+cpu is 2.13
        assert Version(version(name).split("+")[0]) == Version(low), (name, version(name), low)


def test_train_builds_its_trl_config_on_the_lowest_transformers():
    """transformers < 5.23 has no ``activation_checkpointing``: the switch is detected, and
    goes to ``gradient_checkpointing`` (issue 35: ``train`` failed on the GPU image here)."""
    assert "activation_checkpointing" not in {f.name for f in dataclasses.fields(GRPOConfig)}
    on = build_grpo_args(load_config(None, ["optim.gradient_checkpointing=true"]))
    off = build_grpo_args(load_config(None, ["optim.gradient_checkpointing=false"]))
    assert (
        isinstance(on, GRPOConfig) and on.gradient_checkpointing and not off.gradient_checkpointing
    )
    assert on.num_generations == 8 and on.loss_type == "dapo"


def test_smoke_train_with_every_channel_and_lora(tmp_path, tokenizer, tiny_model):
    cfg = load_config(None, every_channel_overrides(tmp_path / "run", 2))
    from composer_replication.config import PeftConfig
    from composer_replication.lm.models import apply_lora

    model = apply_lora(tiny_model, PeftConfig(enabled=True, r=4, alpha=8))
    trainer = build_trainer(cfg, model, tokenizer, build_env(cfg))
    trainer.train()
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert len(rows) == 2
    assert all(r["sdpo/active"] == 1.0 and r["replay/active"] == 1.0 for r in rows)
    assert (tmp_path / "run" / "checkpoint-2").is_dir()
