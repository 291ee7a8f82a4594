"""``generation.vllm.async_rollouts`` maps a run config onto TRL's experimental
``AsyncGRPOTrainer`` (run/train.py). Up to the wire: vLLM and a GPU are absent here,
so the mapping, the refusals and the picklable tool factory are checked, never a run."""

from __future__ import annotations

import importlib.util
import pickle

import pytest

from composer_replication.config import ConfigError, configs_dir, load_config
from composer_replication.run import train as run_mod
from composer_replication.run.train import (
    ToolsFactory,
    async_enabled,
    async_grpo_args,
    async_trainer_kwargs,
    check_async,
)

ASYNC = configs_dir() / "gpu" / "qwen2.5-0.5b-async-agent.yaml"
ON = ["generation.backend=vllm", "generation.vllm.mode=server",
      "generation.vllm.async_rollouts.enabled=true"]  # fmt: skip


@pytest.fixture
def vllm_present(monkeypatch):
    monkeypatch.setattr(run_mod, "vllm_installed", lambda: True)


def test_the_shipped_async_config_maps_onto_async_grpo_config(vllm_present):
    cfg = load_config(ASYNC)
    assert async_enabled(cfg)
    check_async(cfg)  # nothing refused
    args = async_grpo_args(cfg)
    a, g = cfg.generation.vllm.async_rollouts, cfg.generation
    assert (
        (args.max_staleness, args.max_inflight_tasks)
        == (cfg.rollout.max_staleness, a.max_inflight)
        == (2, 256)
    )
    assert args.weight_sync_steps == a.weight_sync_steps
    assert args.vllm_server_base_url == g.vllm.server_base_url
    assert args.num_generations == g.num_generations
    assert args.per_device_train_batch_size == g.prompts_per_step * g.num_generations
    assert args.max_tool_calling_iterations == cfg.rollout.max_turns - 1
    assert (args.epsilon, args.epsilon_high) == (cfg.grpo.epsilon, cfg.grpo.epsilon_high)
    assert args.temperature == g.temperature and args.learning_rate == cfg.optim.learning_rate
    assert args.dtype == "bfloat16" and args.gradient_checkpointing


def test_without_vllm_the_run_is_refused_in_one_line_before_anything_loads(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    monkeypatch.setattr(run_mod, "prepare", lambda cfg: pytest.fail("loaded a model"))
    with pytest.raises(ConfigError, match="async_rollouts: the vllm package is not installed") as e:
        run_mod.run_training(load_config(ASYNC, ["output_dir=/nonexistent/x"]))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("override,what", [
    ("sdpo.weight=0.1", "channels"),
    ("grpo.dynamic_sampling.enabled=true", "dynamic_sampling"),
    ("grpo.beta=0.04", "grpo.beta"),
    ("grpo.loss_type=grpo", "loss_type"),
    ("peft.enabled=true", "peft"),
])  # fmt: skip
def test_what_async_grpo_does_not_run_is_refused_naming_the_key(vllm_present, override, what):
    with pytest.raises(ConfigError, match=what):
        check_async(load_config(ASYNC, [override]))


def test_async_needs_a_vllm_server():
    with pytest.raises(ConfigError, match="async_rollouts needs generation.vllm.mode=server"):
        load_config(
            None, ["generation.backend=vllm", "generation.vllm.async_rollouts.enabled=true"]
        )
    with pytest.raises(ConfigError, match="async_rollouts needs generation.backend=vllm"):
        load_config(
            None, ["generation.vllm.mode=server", "generation.vllm.async_rollouts.enabled=true"]
        )
    assert not async_enabled(load_config(None, []))


def test_tools_and_rewards_travel_to_the_rollout_worker(vllm_present, tokenizer, monkeypatch):
    """AsyncGRPOTrainer pickles its rewards and environment factory into a spawned worker:
    the factory rebuilds the bounded tool class there. (The config's hub id is passed through
    as it is: no hub is reachable here, and the model is not what this test is about.)"""
    monkeypatch.setattr("composer_replication.lm.models.resolve_model_path", lambda ref: ref)
    cfg = load_config(ASYNC, ["env.num_train=4"])
    env = run_mod.build_env(cfg)
    kwargs = async_trainer_kwargs(cfg, tokenizer, env)
    assert isinstance(kwargs["environment_factory"], ToolsFactory)
    factory = pickle.loads(pickle.dumps(kwargs["environment_factory"]))
    tools = factory()
    tools.reset(**kwargs["train_dataset"][0])
    assert tools.calculate(expression="6 * 7") == "42"
    assert [type(f).__name__ for f in pickle.loads(pickle.dumps(kwargs["reward_funcs"]))] == [
        type(f).__name__ for f in kwargs["reward_funcs"]
    ]
    assert kwargs["model"] == cfg.model.name  # a hub id: vLLM serves the same
