"""The run config's GPU-facing keys map onto TRL's GRPOConfig (checked without a GPU)."""

from __future__ import annotations

import importlib.util

import pytest

from composer_replication.config import ConfigError, configs_dir, load_config
from composer_replication.run.train import build_grpo_args, vllm_args

GPU_CONFIGS = sorted((configs_dir() / "gpu").glob("*.yaml"))


def test_defaults_map_to_transformers_generation_and_no_tracker():
    args = build_grpo_args(load_config(None, []))
    assert args.use_vllm is False
    assert args.report_to == []  # transformers' spelling of "none"
    assert args.run_name == "quickstart"
    # the quickstart turns it off (docs/benchmarks.md); the switch reaches TRL either way
    assert args.gradient_checkpointing is False
    on = build_grpo_args(load_config(None, ["optim.gradient_checkpointing=true"]))
    assert on.gradient_checkpointing is True


def test_logging_and_checkpointing_keys():
    cfg = load_config(None, ["logging.report_to=[tensorboard]", "logging.run_name=r1",
                             "optim.gradient_checkpointing=false", "save_total_limit=3",
                             "save_only_model=true"])  # fmt: skip
    args = build_grpo_args(cfg)
    assert args.report_to == ["tensorboard"] and args.run_name == "r1"
    assert args.gradient_checkpointing is False
    assert args.save_total_limit == 3 and args.save_only_model is True
    assert load_config(None, ["logging.report_to=none"]).logging.report_to == []
    with pytest.raises(ConfigError, match="logging.report_to"):
        load_config(None, ["logging.report_to=mlflow"])


def test_vllm_without_the_package_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ConfigError, match="vllm package is not installed"):
        build_grpo_args(load_config(None, ["generation.backend=vllm"]))


@pytest.mark.parametrize("path", GPU_CONFIGS, ids=lambda p: p.name)
def test_gpu_configs_map_onto_trl_vllm_options(path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real(name)
    )
    cfg = load_config(path)
    v = cfg.generation.vllm
    out = vllm_args(cfg)
    assert out["use_vllm"] is True and out["vllm_mode"] == v.mode
    if v.mode == "colocate":
        assert out["vllm_gpu_memory_utilization"] == v.gpu_memory_utilization
    else:
        assert out["vllm_server_base_url"] == v.server_base_url
    assert cfg.model.dtype == "bfloat16" and cfg.optim.gradient_checkpointing
    assert "tensorboard" in cfg.logging.report_to


def test_gpu_configs_exist():
    assert {p.name for p in GPU_CONFIGS} >= {"qwen2.5-0.5b.yaml", "qwen2.5-7b-lora.yaml"}
