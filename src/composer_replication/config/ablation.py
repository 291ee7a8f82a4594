"""``composer-replication ablate``'s config: arms x seeds on one base run config.
Imports no torch."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from composer_replication.config.base import (
    ConfigError,
    StrictModel,
    apply_overrides,
    format_validation_error,
    home_expanded,
    load_yaml_mapping,
    resolve_config_path,
)


class AblationArm(StrictModel):
    name: str = Field(min_length=1)
    """Label of the arm in tables and plots."""
    overrides: list[str] = Field(default_factory=list)
    """``key=value`` overrides applied on top of the base config for this arm."""
    trainer: Literal["composer", "trl_sdpo"] = "composer"
    """``composer``: ComposerReplicationTrainer; ``trl_sdpo``: TRL's experimental SDPOTrainer
    (the peer), configured from the same run config."""


class StepReport(StrictModel):
    """The per-step analysis of ``ablate``'s report (issue 38's pre-registration in
    docs/results.md), read from each finished run's periodic held-out scores (``heldout.jsonl``)
    and per-step training times (``step_time`` in ``metrics.jsonl``). Every figure is a per-seed
    paired difference against ``reference_arm`` with a 95% Student-t interval and the decision
    rule's verdict ("helps" / "hurts" / "no difference detected")."""

    primary_step: int = Field(ge=0)
    """The fixed early step of the primary metric: each run's periodic held-out pass@1 there
    (step 10 in regime (a), 4 in (c)). Must be an evaluated step (a multiple of eval_every)."""
    threshold: float = Field(0.8, gt=0.0, le=1.0)
    """Steps to this held-out pass@1: the first evaluated step whose periodic score is >= it;
    a run that never gets there counts as one evaluation interval past its last evaluated
    step (and the number of such runs per arm is reported)."""
    wall_fractions: list[float] = Field(default_factory=lambda: [1.0, 0.5], min_length=1)
    """Fractions of the wall-time budget ``T`` (the median over the reference arm's seeds of
    the summed per-step ``step_time``; periodic evaluations do not count) at which each run's
    periodic held-out score is compared: its score at the last evaluated step whose cumulative
    step time is <= the fraction of ``T``."""

    pairs: list[tuple[str, str]] = Field(default_factory=list)
    """Further paired comparisons ``(arm, against)`` on the primary and the final metric,
    beside each arm against ``reference_arm`` (two treatments against each other, e.g.
    ``[summarize, summarize-masked]``); each is its own pre-registered comparison."""

    @model_validator(mode="after")
    def _fractions_in_range(self) -> StepReport:
        bad = [f for f in self.wall_fractions if not 0.0 < f <= 1.0]
        if bad:
            raise ValueError(f"wall_fractions must lie in (0, 1]: {bad}")
        return self


class AblationConfig(StrictModel):
    """``composer-replication ablate``: arms x seeds on one base config, held-out eval curves."""

    base_config: str = "quickstart.yaml"
    """Run config every arm starts from (a path, or a file name under configs/)."""
    base_overrides: list[str] = Field(default_factory=list)
    """Overrides applied to every arm (e.g. a shorter max_steps)."""
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=1)
    """Seeds; every arm runs once per seed."""
    arms: list[AblationArm] = Field(min_length=1)
    """The arms to compare."""
    eval_every: int = Field(5, ge=1)
    """Held-out evaluation every N optimizer steps (for the score-vs-step curves)."""
    eval_n_during: int = Field(64, ge=1)
    """Held-out problems in the periodic evaluations (the final one uses eval.n)."""
    output_dir: str = "runs/ablation"
    """Where each arm/seed run directory, the summary JSON, ``results.md`` and the plot go."""
    results_md: str | None = None
    """Also (re)write the ablation section of this Markdown file and put the plot beside it
    (``results_md=docs/results.md`` updates the project's docs); None = only the run dir."""
    records_dir: str | None = None
    """Also keep the small files of every finished arm/seed run (its config, final and periodic
    held-out results, per-step metrics: ``run.ablation.record_files``) under
    ``records_dir/<arm>/seed<N>/``, copied as soon as the run finishes, and copy them back into
    ``output_dir`` where it lacks them: committed (docs/evidence_runs), the finished runs of an
    experiment split over sessions or machines survive a fresh clone, which resumes from them
    and reports them. None = only under ``output_dir``."""
    checkpoint_every: int = Field(0, ge=0)
    """Save a resumable checkpoint (weights, optimizer, scheduler, RNG and channel state; only
    the newest kept) every N optimizer steps, so a killed ``ablate`` continues an unfinished
    arm/seed from it, as the same run, instead of training it again; 0 = only a weights-only
    one at the end (a killed run starts over). Resumable checkpoints cost disk and a few
    seconds each: ~1.6 GB for 135M with AdamW (~16 bytes a parameter). Arms of the TRL
    SDPOTrainer peer save none and start over."""
    keep_checkpoints: bool = False
    """Keep each arm/seed's ``checkpoint-*`` (weights only, ~0.5 GB for 135M, unless
    ``checkpoint_every``); by default they are deleted once the arm's final evaluation is
    recorded."""
    section: str = Field("ablation", pattern=r"^[a-z0-9][a-z0-9-]*$")
    """Name of this experiment's section in ``results_md`` (between ``<!-- {section}:begin -->``
    and ``<!-- {section}:end -->``) and of its plot (``{section}_heldout_vs_step.png``), so
    several experiments share one results file."""
    title: str = "Ablation: what each channel does"
    """Heading of the section."""
    reference_arm: str | None = None
    """Arm the others are paired against per seed (default: the first arm)."""
    report: StepReport | None = None
    """Also report the per-step analysis (a fixed early step, the difference at every
    evaluated step, steps to a threshold, fixed wall time); None = the final scores only."""

    @field_validator("output_dir", "records_dir")
    @classmethod
    def _home(cls, value: str | None) -> str | None:
        return None if value is None else home_expanded(value)

    @model_validator(mode="after")
    def _reference_is_an_arm(self) -> AblationConfig:
        names = [a.name for a in self.arms]
        if len(set(names)) != len(names):
            raise ValueError(f"arm names must be unique: {names}")
        if self.reference_arm is not None and self.reference_arm not in names:
            raise ValueError(f"reference_arm {self.reference_arm!r} is not an arm: {names}")
        stray = [a for pair in (self.report.pairs if self.report else []) for a in pair
                 if a not in names]  # fmt: skip
        if stray:
            raise ValueError(f"report.pairs names {stray[0]!r}, not an arm: {names}")
        if self.records_dir is not None and (
            Path(self.records_dir).resolve() == Path(self.output_dir).resolve()
        ):
            raise ValueError(f"records_dir is output_dir ({self.output_dir}): name another folder")
        if self.report is not None and self.report.primary_step % self.eval_every:
            raise ValueError(
                f"report.primary_step={self.report.primary_step} is not a multiple of "
                f"eval_every={self.eval_every}: no periodic held-out evaluation there"
            )
        return self


def load_ablation_config(path: str | Path, overrides: list[str] | None = None) -> AblationConfig:
    """Load an AblationConfig from YAML plus ``key=value`` overrides."""
    path = resolve_config_path(path)
    data = apply_overrides(load_yaml_mapping(path, "ablation config"), overrides or [])
    try:
        return AblationConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(
            format_validation_error(err, str(path), AblationConfig, overrides=overrides or [])
        ) from None
