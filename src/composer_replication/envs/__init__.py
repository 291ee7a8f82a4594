"""Verifiable environments and their registry. The interface (`Environment`, `Task`,
`StepResult`) lives in ``envs/base.py``; each environment module imports only that, and this
package maps names to environments: ``get_env("arithmetic", levels=[1])``.

A new environment registers itself with ``register_env("name", MyEnv, config=MyEnvConfig)``
(any callable that takes the environment's keyword options and returns an `Environment`, and
the options class of its ``env:`` section, a subclass of ``config.EnvConfig``). From then on a
run config names it like a built-in one (``env: {name: name, ...}``) and :func:`build_env`
makes it: the one place that decides which environment a run gets.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import create_model

from composer_replication.config.env import (
    ENV_CONFIGS,
    EnvConfig,
    SandboxConfig,
    register_env_config,
)
from composer_replication.envs.arithmetic import ArithmeticEnv
from composer_replication.envs.base import Environment, StepResult, Task
from composer_replication.envs.calculator import CalculatorEnv
from composer_replication.envs.feature_deletion.env import FeatureDeletionEnv
from composer_replication.envs.humaneval import HumanEvalEnv
from composer_replication.envs.memory import MemoryEnv

EnvFactory = Callable[..., Environment]

_REGISTRY: dict[str, EnvFactory] = {
    "arithmetic": ArithmeticEnv,
    "humaneval": HumanEvalEnv,
    "calculator": CalculatorEnv,
    "feature_deletion": FeatureDeletionEnv,
    "memory": MemoryEnv,
}


def register_env(name: str, factory: EnvFactory, config: type[EnvConfig] | None = None) -> None:
    """Make ``get_env(name, **options)`` build ``factory(**options)`` and ``env: {name: NAME}``
    a valid run-config section validated by ``config`` (its fields beyond ``name``,
    ``num_train`` and ``seed`` are the factory's options; default: a class with only the
    options every environment has). Names are unique."""
    if name in _REGISTRY and _REGISTRY[name] is not factory:
        raise ValueError(f"environment {name!r} is already registered ({_REGISTRY[name]!r})")
    if config is None and name not in ENV_CONFIGS:
        config = create_model(f"EnvConfig_{name}", __base__=EnvConfig, name=(Literal[name], name))
    if config is not None:
        register_env_config(name, config)
    _REGISTRY[name] = factory


def build_env(env: EnvConfig, sandbox: SandboxConfig | None = None) -> Environment:
    """The environment a run config's ``env`` section names, built from its options (and the
    ``sandbox`` section, for an environment that grades code in it)."""
    return get_env(env.name, **env.env_options(sandbox or SandboxConfig()))


def env_names() -> list[str]:
    """Registered environment names, sorted."""
    return sorted(_REGISTRY)


def get_env(name: str, **kwargs: Any) -> Environment:
    """Build a registered environment by name (built in: ``arithmetic``, ``humaneval``, ``calculator``,
    ``feature_deletion``)."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown environment {name!r}; known: {', '.join(env_names())}")
    return _REGISTRY[name](**kwargs)


__all__ = [
    "ArithmeticEnv",
    "CalculatorEnv",
    "Environment",
    "FeatureDeletionEnv",
    "HumanEvalEnv",
    "StepResult",
    "Task",
    "build_env",
    "env_names",
    "get_env",
    "register_env",
]
