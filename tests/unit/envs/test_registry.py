"""The environment registry in ``composer_replication.envs``."""

from __future__ import annotations

import pytest

from composer_replication import envs
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
