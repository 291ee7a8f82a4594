"""Verifiable environments and their registry. The interface (`Environment`, `Task`,
`StepResult`) lives in ``envs/base.py``; each environment module imports only that, and this
package maps names to environments: ``get_env("arithmetic", levels=[1])``.

A new environment registers itself with ``register_env("name", MyEnv)`` (any callable that
takes the environment's keyword options and returns an `Environment`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from composer_replication.envs.arithmetic import ArithmeticEnv
from composer_replication.envs.base import Environment, StepResult, Task
from composer_replication.envs.calculator import CalculatorEnv
from composer_replication.envs.feature_deletion.env import FeatureDeletionEnv
from composer_replication.envs.humaneval import HumanEvalEnv

EnvFactory = Callable[..., Environment]

_REGISTRY: dict[str, EnvFactory] = {
    "arithmetic": ArithmeticEnv,
    "humaneval": HumanEvalEnv,
    "calculator": CalculatorEnv,
    "feature_deletion": FeatureDeletionEnv,
}


def register_env(name: str, factory: EnvFactory) -> None:
    """Make ``get_env(name, **options)`` build ``factory(**options)``; names are unique."""
    if name in _REGISTRY and _REGISTRY[name] is not factory:
        raise ValueError(f"environment {name!r} is already registered ({_REGISTRY[name]!r})")
    _REGISTRY[name] = factory


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
    "env_names",
    "get_env",
    "register_env",
]
