"""The environment registry in ``composer_replication.envs``."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import Field

from composer_replication import envs
from composer_replication.config import ENV_CONFIGS, ConfigError, EnvConfig, load_config
from composer_replication.envs import Environment, StepResult, Task, get_env, register_env


class EchoEnv(Environment):
    """Passes a completion equal to the task's prompt."""

    name = "echo"

    def __init__(self, words: tuple[str, ...] = ("a",)) -> None:
        super().__init__()
        self.words = words

    def tasks(self, split: str) -> list[Task]:
        return [Task(f"echo-{w}", w, split) for w in self.words]

    def grade(self, task: Task, completion: str) -> StepResult:
        ok = completion == task.prompt
        return StepResult(completion, float(ok), True, ok, "" if ok else f"expected {task.prompt}")


@pytest.fixture
def registry(monkeypatch):
    monkeypatch.setattr(envs, "_REGISTRY", dict(envs._REGISTRY))
    saved = dict(ENV_CONFIGS)  # register_env adds the options class of the env's section
    yield
    ENV_CONFIGS.clear()
    ENV_CONFIGS.update(saved)


def test_built_in_environments_are_registered():
    assert {"arithmetic", "humaneval"} <= set(envs.env_names())
    assert isinstance(get_env("arithmetic", levels=[1]), envs.ArithmeticEnv)


def test_registered_env_is_built_with_its_options(registry):
    register_env("echo", EchoEnv)
    env = get_env("echo", words=("x", "y"))
    assert [t.prompt for t in env.tasks("train")] == ["x", "y"]
    assert env.grade(env.tasks("train")[1], "y").passed
    assert "echo" in envs.env_names()
    register_env("echo", EchoEnv)  # the same factory again is a no-op


def test_a_name_cannot_be_taken_twice(registry):
    with pytest.raises(ValueError, match="'arithmetic' is already registered"):
        register_env("arithmetic", EchoEnv)
    with pytest.raises(ValueError, match="unknown environment 'chess'; known: arithmetic"):
        get_env("chess")


class ParityEnv(Environment):
    """A third-party environment: is a number even? Its one option is how many numbers."""

    name = "parity"

    def __init__(self, count: int = 10, heldout_fraction: float = 0.2) -> None:
        super().__init__()
        for n in range(count):
            split = "heldout" if n % round(1 / heldout_fraction) == 0 else "train"
            prompt = f"Is {n} even? Answer yes or no."
            self._splits[split].append(Task(f"parity-{n}", prompt, split, {"even": n % 2 == 0}))

    def grade(self, task: Task, completion: str) -> StepResult:
        ok = ("yes" if task.data["even"] else "no") in completion.lower()
        return StepResult(completion, float(ok), True, ok, "" if ok else "wrong")


class ParityConfig(EnvConfig):
    name: Literal["parity"] = "parity"
    count: int = Field(10, ge=2, le=1000)
    """How many numbers."""


def test_a_registered_environment_trains_one_step_from_a_yaml(registry, tmp_path):
    """``register_env`` with an options class: a YAML names the environment like a built-in
    one, its options are validated (unknown keys and ranges), and ``run_training`` builds and
    trains on it (one step of a tiny random model)."""
    from support.tiny_run import save_tiny_model

    from composer_replication.run.train import run_training
    from composer_replication.trainer.callbacks import read_metrics

    register_env("parity", ParityEnv, config=ParityConfig)
    model = save_tiny_model(tmp_path / "model")
    yaml_path = tmp_path / "parity.yaml"
    yaml_path.write_text(
        f"""model: {{name: {model}}}
output_dir: {tmp_path / "run"}
max_steps: 1
num_threads: 1
env: {{name: parity, count: 24, num_train: 8}}
generation: {{num_generations: 2, prompts_per_step: 2, max_completion_length: 4}}
eval: {{before_and_after: false}}
"""
    )
    with pytest.raises(ConfigError, match="env.colour: unknown key"):
        load_config(yaml_path, ["env.colour=red"])
    with pytest.raises(ConfigError, match="env.count"):
        load_config(yaml_path, ["env.count=1"])
    cfg = load_config(yaml_path)
    assert type(cfg.env) is ParityConfig and cfg.env.count == 24
    summary = run_training(cfg)
    [row] = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert row["step"] == 1 and summary.final_checkpoint.is_dir()
    assert "count: 24" in (tmp_path / "run" / "config.yaml").read_text()


def test_an_environment_registered_without_options_takes_the_common_ones(registry):
    register_env("echo", EchoEnv)
    cfg = load_config(None, ["env.name=echo", "env.num_train=3"])
    assert cfg.env.name == "echo" and cfg.env.num_train == 3
    with pytest.raises(ConfigError, match="env.words: unknown key"):
        load_config(None, ["env.name=echo", "env.words=[a]"])
