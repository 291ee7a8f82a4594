"""``data:``, how a run chooses its training tasks: ``data.sampler`` is ``uniform`` (the
dataset's shuffled order, TRL's own sampler) or ``adaptive`` (difficulty chosen during the
run from the run's own groups, envs/sampler.py). Imports no torch."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from composer_replication.config.base import StrictModel


class UniformSamplerConfig(StrictModel):
    """Every training task as often as the shuffled dataset holds it (TRL's sampler). The
    run still keeps per-task pass-rate estimates and logs ``sampler/*``, so a uniform run is
    the baseline an adaptive one is compared with."""

    type: Literal["uniform"] = "uniform"
    success_threshold: float = Field(0.5, ge=-1e6, le=1e6)
    """A rollout counts as a success when its reward is above this (for environments whose
    reward function keeps no verdicts; ``EnvReward``'s ``passed`` is used where it exists)."""


class AdaptiveSamplerConfig(UniformSamplerConfig):
    """Tasks drawn in proportion to the probability that a group of ``num_generations``
    rollouts is mixed (neither all pass nor all fail: the only groups with a GRPO advantage),
    under a Beta posterior of each task's pass rate; solved tasks retire, hopeless ones keep a
    floor weight."""

    type: Literal["adaptive"] = "adaptive"  # type: ignore[assignment]
    prior: int = Field(1, ge=1, le=100)
    """Pseudo-counts of the Beta prior on each side: Beta(prior, prior) before any rollout
    (1: uniform on [0, 1])."""
    sharpness: float = Field(3.0, ge=1.0, le=16.0)
    """A task's weight is its mixed-group probability to this power: 1 draws in proportion
    to it; higher concentrates the batch on the tasks most likely to carry a signal (with
    posteriors from a few groups, 1 leaves much of the batch on all-fail tasks)."""
    floor: float = Field(0.02, ge=0.0, le=1.0)
    """Least weight of a task that is not retired (a sure mixed group weighs 1): hopeless tasks, whose groups all fail, are revisited at this rate."""
    retire_pass_rate: float = Field(0.8, gt=0.0, lt=1.0)
    """A task retires when its pass rate is above this ..."""
    retire_confidence: float = Field(0.9, gt=0.5, lt=1.0)
    """... with this posterior probability ..."""
    retire_min_rollouts: int = Field(8, ge=1)
    """... after at least this many of its rollouts were scored (by default three groups of 4
    that all pass retire a task: P(p > 0.8) = 1 - 0.8^13 under Beta(13, 1)). Retired tasks are no longer
    drawn (unless every task is retired; then all are drawn uniformly)."""


SamplerConfig = Annotated[UniformSamplerConfig | AdaptiveSamplerConfig, Field(discriminator="type")]


class DataConfig(StrictModel):
    """Which training tasks each step's groups are for."""

    sampler: SamplerConfig = Field(default_factory=UniformSamplerConfig)
    """``uniform`` (default) or ``adaptive``; a bare name is short for ``{type: name}``."""

    @model_validator(mode="before")
    @classmethod
    def _bare_name(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("sampler"), str):
            data = {**data, "sampler": {"type": data["sampler"]}}
        return data
