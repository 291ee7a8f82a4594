"""Everything about a run's input that can be checked before any model loads, in one function
(:func:`preflight`): the config against this launch (processes), the checkpoint to resume
from, the replay channel's preference data, and the environment (its task sets and sources
are built here). A problem raises a `UserError` whose one line names the field or file; the
CLI prints it and exits 2. :func:`~composer_replication.run.train.run_training` runs it
unless given its result."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from composer_replication import envs
from composer_replication.config import (
    ConfigError,
    RunConfig,
    check_processes,
    check_resume_channels,
)
from composer_replication.envs.base import Environment
from composer_replication.prefs.dataset import load_pairs


@dataclass
class Checked:
    """What :func:`preflight` found: the checkpoint to resume from (None: a fresh run) and the
    environment, already built."""

    resume: str | None
    env: Environment


def preflight(cfg: RunConfig) -> Checked:
    """Check ``cfg``'s inputs (module docstring) and build its environment."""
    resume = check_resume(cfg)
    if cfg.replay.weight > 0 and cfg.replay.dataset:
        load_pairs(cfg.replay.dataset, cfg.replay.max_pairs)
    if cfg.agent_proxy.enabled:
        from composer_replication.agents.episodes import harness_venv

        harness_venv(cfg.agent_proxy)
    return Checked(resume=resume, env=build_env(cfg))


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
        check_resume_channels(resume, cfg.channel_settings(), cfg.resume_override_channels)
    return resume


def process_rank() -> tuple[int, int]:
    """(rank, world size) of this process under torchrun / accelerate launch; (0, 1) alone."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def resolve_resume(cfg: RunConfig) -> str | None:
    """``resume_from: latest`` -> newest ``checkpoint-N`` in output_dir; a path is checked to
    exist and to hold optimizer state. Raises `ConfigError` (nothing loaded or written yet)."""
    if cfg.resume_from is None:
        return None
    if cfg.resume_from == "latest":
        steps = {
            int(p.name.split("-")[1]): p
            for p in Path(cfg.output_dir).glob("checkpoint-*")
            if p.is_dir() and p.name.split("-")[1].isdigit()
        }
        if not steps:
            raise ConfigError(
                f"resume_from=latest: no checkpoint-N directory in {cfg.output_dir} "
                "(start without resume_from, or point output_dir at the earlier run)"
            )
        return _resumable(str(steps[max(steps)]))
    if not Path(cfg.resume_from).is_dir():
        raise ConfigError(f"resume_from: {cfg.resume_from} is not a directory")
    return _resumable(cfg.resume_from)


def _resumable(checkpoint: str) -> str:
    if not (Path(checkpoint) / "optimizer.pt").is_file():
        raise ConfigError(
            f"resume: {checkpoint} has no optimizer state (saved with save_only_model=true, or "
            "not a training checkpoint); it can be loaded as model.name but not resumed"
        )
    return checkpoint
