"""Everything about a run's input that can be checked before any model loads, in one function
(:func:`preflight`): the output directory, the config against this launch (processes), the
checkpoint to resume from, the replay channel's preference data, the environment (its task
sets and sources are built here), the distill channel's routing column against its rows and its
teachers' tokenizers (and served model names) against the student's. A problem raises a
`UserError` whose one line names the field or file; the CLI prints it and exits 2, before its
run header. :func:`~composer_replication.run.train.run_training` runs it
unless given its result."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from composer_replication import envs
from composer_replication.config import (
    RERUN_MAY_DIFFER,
    RESUME_MAY_CHANGE,
    ColumnRoute,
    ConfigError,
    LocalTeacherConfig,
    RunConfig,
    check_output_dir,
    check_processes,
    check_resume_channels,
    saved_config_diffs,
)
from composer_replication.envs.base import Environment
from composer_replication.prefs.dataset import load_pairs

log = logging.getLogger(__name__)


@dataclass
class Checked:
    """What :func:`preflight` found: the checkpoint to resume from (None: a fresh run) and the
    environment, already built."""

    resume: str | None
    env: Environment


def preflight(cfg: RunConfig) -> Checked:
    """Check ``cfg``'s inputs (module docstring) and build its environment."""
    check_output_dir(cfg.output_dir, "output_dir")
    check_ray_installed(cfg)
    if cfg.resume_from is None:
        check_fresh_run_dir(cfg)
    resume = check_resume(cfg)
    check_engine_state(cfg, resume)
    check_data(cfg)
    env = build_env(cfg)
    check_distill_route(cfg, env)
    check_teachers(cfg)
    return Checked(resume=resume, env=env)


RAY_MISSING = (
    "rollout.engine=ray: the ray package is not installed (pip install "
    "'composer-replication[ray]'), or set rollout.engine=local"
)
"""The one line a ray run gets where Ray is not installed."""


def check_ray_installed(cfg: RunConfig) -> None:
    """``rollout.engine: ray`` needs the ``ray`` extra: refused in one line when missing."""
    if cfg.rollout.engine == "ray" and importlib.util.find_spec("ray") is None:
        raise ConfigError(RAY_MISSING)


def check_engine_state(cfg: RunConfig, resume: str | None) -> None:
    """A ``rollout.engine: ray`` resume needs the checkpoint's engine state (the task
    dispenser's cursor and in-flight tickets), which a ``local`` run does not write."""
    from composer_replication.rollout_engine.learner import STATE_FILE

    if cfg.rollout.engine == "ray" and resume and not (Path(resume) / STATE_FILE).is_file():
        raise ConfigError(
            f"resume_from {resume}: no {STATE_FILE} (a checkpoint of a rollout.engine=local "
            "run?); resume it with rollout.engine=local"
        )


def check_teachers(cfg: RunConfig) -> None:
    """The distill channel's teachers share the student's tokenizer (a served teacher: its
    fingerprint, and the model it names is served). Tokenizers and fingerprints only, no model
    loads; refused here so the run has printed and written nothing."""
    if not cfg.distill.enabled:
        return
    from composer_replication.teachers.scoring import check_same_tokenizer

    check_same_tokenizer(cfg.model.name, cfg.distill.teachers, cfg.distill.full_vocabulary)


def check_distill_route(cfg: RunConfig, env: Environment) -> None:
    """``distill.route.column`` names a column of the environment's rows: else every row would
    go unrouted (reported, but only once steps have run), so it is refused here, naming the
    columns there are."""
    from composer_replication.trainer.data import row_columns

    route = cfg.distill.route
    if not cfg.distill.enabled or not isinstance(route, ColumnRoute):
        return
    columns = row_columns(env)
    if route.column not in columns:
        raise ConfigError(
            f"distill.route.column: {route.column!r} is not a column of {env.name}'s rows; "
            f"its rows have {columns}"
        )


def check_data(cfg: RunConfig) -> None:
    """What the run reads besides its model and tasks, checked without building anything: the
    replay channel's preference data and the agent proxy's harness environment."""
    if cfg.replay.enabled and cfg.replay.dataset:
        load_pairs(cfg.replay.dataset, cfg.replay.max_pairs)
    if cfg.agent_proxy.enabled:
        from composer_replication.agents.episodes import harness_venv

        harness_venv(cfg.agent_proxy)


CONFIG_FILE = "config.yaml"
"""The full config of a run, written into its output_dir before training (``run/train.py``)."""


def check_fresh_run_dir(cfg: RunConfig) -> None:
    """A fresh run (no ``resume_from``) in an ``output_dir`` that holds a run trained with
    another config raises `ConfigError` naming what differs: it would overwrite that run's
    config, drop its metrics and mix its evaluations with this run's. The same config again
    (only `RERUN_MAY_DIFFER` may differ: where it saves, threads) is a re-run and goes on."""
    saved = Path(cfg.output_dir) / CONFIG_FILE
    if not saved.is_file():
        return
    try:
        diffs = saved_config_diffs(saved, cfg, RERUN_MAY_DIFFER)
    except ConfigError as err:
        raise ConfigError(
            f"output_dir {cfg.output_dir} holds a run whose config.yaml cannot be read "
            f"({' '.join(str(err).split())}); choose another output_dir or move it away"
        ) from None
    if diffs:
        raise ConfigError(
            f"output_dir {cfg.output_dir} holds a run trained with another config "
            f"({_summary(diffs)}); choose another output_dir, move that run away, or continue "
            "it with its own config and resume_from=latest"
        )


def _summary(diffs: list[str]) -> str:
    """``saved -> this: a; b; c; and N more``: the first three differences of a saved config."""
    more = f"; and {len(diffs) - 3} more" if len(diffs) > 3 else ""
    return f"saved -> this: {'; '.join(diffs[:3])}{more}"


def check_replica_dirs(
    config: str | Path | None, overrides: list[str], cfg: RunConfig, ids: Iterable[int]
) -> None:
    """`check_fresh_run_dir` for each DiLoCo replica's run directory (``replica-r`` under
    ``cfg.output_dir``, with the overrides the launcher gives it), before any replica starts:
    else every replica fails alone with the same error."""
    from composer_replication.config import load_config
    from composer_replication.diloco.replica import replica_overrides

    if cfg.resume_from is not None:
        return
    n = cfg.diloco.replicas
    for r in ids:
        check_fresh_run_dir(
            load_config(config, [*overrides, *replica_overrides(cfg, r, n, None, None)])
        )


def check_model_sources(cfg: RunConfig) -> None:
    """The student's model reference and each local distill teacher's resolve on this machine
    (`resolve_model_source`: nothing loads); else one line naming the field (and teacher)."""
    from composer_replication.lm.models import ModelLoadError, resolve_model_source

    resolve_model_source(cfg.model.name)
    if not cfg.distill.enabled:
        return
    for t in cfg.distill.teachers:
        if isinstance(t, LocalTeacherConfig):
            try:
                resolve_model_source(t.model)
            except ModelLoadError as err:
                raise ConfigError(f"distill.teachers: {t.name!r}: {err}") from None


def build_env(cfg: RunConfig) -> Environment:
    """The run's environment (``envs.build_env`` on the ``env`` and ``sandbox`` sections); first
    this process's sandbox slots (``sandbox.workers``) and OpenEnv connection limit
    (``rollout.max_remote_calls``), shared by tools and grading."""
    from composer_replication.envs.openenv.adapter import CONNECTIONS
    from composer_replication.sandbox.sandbox import set_sandbox_slots

    set_sandbox_slots(cfg.sandbox.workers)
    CONNECTIONS.set_limit(cfg.rollout.max_remote_calls)
    return envs.build_env(cfg.env, cfg.sandbox)


def check_resume(cfg: RunConfig) -> str | None:
    """The checkpoint to resume from, after checking that the config can run in this many
    processes and that the checkpoint was trained with this config's channel settings
    (``resume_override_channels`` to differ)."""
    check_processes(cfg.grpo.dynamic_sampling.enabled, process_rank()[1])
    resume = resolve_resume(cfg)
    if resume is not None:
        check_resume_config(resume, cfg)
        check_run_records(Path(cfg.output_dir))
        check_resume_channels(resume, cfg.channel_settings(), cfg.resume_override_channels)
        check_channel_state(resume, cfg.channel_settings())
        step = json.loads((Path(resume) / TRAINER_STATE).read_text()).get("global_step", 0)
        if step % cfg.grpo.num_iterations:
            log.warning(
                "resuming at step %d, inside a generation's grpo.num_iterations=%d updates: "
                "TRL does not checkpoint its buffered rollouts, so the resumed run generates "
                "anew here and will not continue exactly as the interrupted one would have",
                step, cfg.grpo.num_iterations,
            )  # fmt: skip
    return resume


def check_resume_config(checkpoint: str, cfg: RunConfig) -> None:
    """A resume whose run saved a ``config.yaml`` (beside the checkpoint) that differs from
    ``cfg`` in what it trains (outside `RESUME_MAY_CHANGE`) raises `ConfigError` naming the
    differences, unless ``resume_override_config``: the checkpoint would go on silently under
    another model, task, optimizer or seed. No saved config (a checkpoint copied alone): no
    check."""
    saved = Path(checkpoint).parent / CONFIG_FILE
    if cfg.resume_override_config or not saved.is_file():
        return
    try:
        diffs = saved_config_diffs(saved, cfg, RESUME_MAY_CHANGE)
    except ConfigError as err:
        raise ConfigError(
            f"resume: {saved} cannot be read as a run config ({' '.join(str(err).split())}); "
            "set resume_override_config=true to resume with this config anyway"
        ) from None
    if diffs:
        raise ConfigError(
            f"resume: {checkpoint} was trained with another config ({_summary(diffs)}); resume "
            "with the saved config, or set resume_override_config=true to go on with this one"
        )


def check_run_records(run_dir: Path) -> None:
    """The per-step files a resumed run reads back and rewrites up to its checkpoint parse
    (a `MetricsFileError` naming file and line), before any model loads rather than at the
    first training callback; a last row cut short by a kill is dropped there, as on resume."""
    from composer_replication.trainer.callbacks import (
        EPISODES_FILE,
        HELDOUT_FILE,
        METRICS_FILE,
        read_metrics,
    )

    for name in (METRICS_FILE, EPISODES_FILE, HELDOUT_FILE):
        read_metrics(run_dir / name)


def check_channel_state(checkpoint: str, enabled: Iterable[str]) -> None:
    """Each channel the checkpoint recorded that keeps per-process state (the distill channel's
    teacher counters, its budget) finds the files of the processes that saved it; else one
    line naming the first missing (found at load time, the models would be loaded)."""
    from composer_replication.channels import missing_state_files

    missing = missing_state_files(checkpoint, enabled)
    if missing:
        raise ConfigError(
            f"resume: {missing[0]} is missing: the channel state saved with this checkpoint "
            "cannot be restored whole (was it copied without it?); resume from a checkpoint "
            "that has it, or start over"
        )


def process_rank() -> tuple[int, int]:
    """(rank, world size) of this process under torchrun / accelerate launch; (0, 1) alone."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def resolve_resume(cfg: RunConfig) -> str | None:
    """``resume_from: latest`` -> newest ``checkpoint-N`` in output_dir; a path is checked to
    exist and to hold optimizer state. Raises `ConfigError` (nothing loaded or written yet)."""
    if cfg.resume_from is None:
        return None
    if cfg.resume_from == "latest":
        newest = newest_checkpoint(Path(cfg.output_dir))
        if newest is None:
            raise ConfigError(
                f"resume_from=latest: no checkpoint-N directory in {cfg.output_dir} saved "
                "whole (start without resume_from, or point output_dir at the earlier run)"
            )
        return _resumable(str(newest))
    if not Path(cfg.resume_from).is_dir():
        raise ConfigError(f"resume_from: {cfg.resume_from} is not a directory")
    return _resumable(cfg.resume_from)


TRAINER_STATE = "trainer_state.json"
"""Written last into a checkpoint (after the weights, optimizer, RNG and channel state), so a
checkpoint whose copy parses was saved whole."""


def newest_checkpoint(run_dir: Path) -> Path | None:
    """The newest whole ``checkpoint-N`` in ``run_dir`` (None: none). Newer ones whose save was
    cut short (no readable ``trainer_state.json``) are renamed ``incomplete-checkpoint-N``, with
    a warning: kept for a look, out of the way of the resumed run's checkpoint rotation (which
    could otherwise keep the broken one and delete the run's new checkpoint)."""
    steps = {
        int(p.name.split("-")[1]): p
        for p in run_dir.glob("checkpoint-*")
        if p.is_dir() and p.name.split("-")[1].isdigit()
    }
    for step in sorted(steps, reverse=True):
        if _complete(steps[step]):
            return steps[step]
        aside = steps[step].with_name(f"incomplete-{steps[step].name}")
        log.warning("%s: incomplete (no readable %s: its save was cut short); moved to %s",
                    steps[step], TRAINER_STATE, aside)  # fmt: skip
        shutil.rmtree(aside, ignore_errors=True)
        steps[step].rename(aside)
    return None


def _complete(checkpoint: Path) -> bool:
    try:
        json.loads((checkpoint / TRAINER_STATE).read_text())
    except (OSError, ValueError):
        return False
    return True


def _resumable(checkpoint: str) -> str:
    if not (Path(checkpoint) / "optimizer.pt").is_file():
        raise ConfigError(
            f"resume: {checkpoint} has no optimizer state (saved with save_only_model=true, or "
            "not a training checkpoint); it can be loaded as model.name but not resumed"
        )
    if not _complete(Path(checkpoint)):
        raise ConfigError(
            f"resume: {checkpoint} is incomplete (no readable {TRAINER_STATE}: its save was "
            "cut short); resume from an earlier checkpoint or start over"
        )
    return checkpoint
