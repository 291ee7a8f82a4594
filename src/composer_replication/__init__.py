"""composer-replication: RL post-training for Hugging Face causal LMs (GRPO/DAPO, hint
self-distillation, multi-teacher trace replay, DiLoCo).

The front door: the public names below load on first use (PEP 562), so ``import
composer_replication`` imports no torch. ``docs/api.md`` lists each with an example and the
names and signatures that changed since the seeds' user guide.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_PUBLIC: dict[str, tuple[str, ...]] = {
    "composer_replication.config": (
        "RunConfig", "load_config", "dump_config", "ConfigError", "UserError", "EnvConfig",
        "LocalTeacherConfig", "RemoteTeacherConfig", "TeacherPool", "load_pool",
    ),
    "composer_replication.teachers": (
        "TeacherError", "build_teacher", "LocalScorer", "RemoteScorer", "check_same_tokenizer",
    ),
    "composer_replication.lm.models": ("load_model", "load_tokenizer"),
    "composer_replication.losses": (
        "compose_loss", "ChannelTerm", "TAIDScheduler", "taid_loss", "generalized_jsd_loss",
        "chunked_generalized_jsd_loss", "entropy_aware_opd_loss", "dpo_loss", "simpo_loss",
        "sequence_logps", "prime_rl_policy_loss",
    ),
    "composer_replication.envs": (
        "Environment", "Task", "StepResult", "get_env", "register_env", "env_names",
    ),
    "composer_replication.traces": ("TraceState", "Action", "ingest"),
    "composer_replication.replay": (
        "replay_trace", "ReplayResult", "BudgetLedger", "Journal",
    ),
    "composer_replication.prefs": (
        "extract_dpo_pairs", "DPOPair", "DJNormalizer", "NormalizeConfig", "normalize_pairs",
        "export_pairs", "replay_and_normalize_trace",
    ),
    "composer_replication.evaluation": ("evaluate", "EvalResult"),
    "composer_replication.channels": ("Channel", "build_channels"),
    "composer_replication.trainer.trainer": ("ComposerReplicationTrainer",),
    "composer_replication.diloco": ("DilocoConfig", "launch_diloco"),
    "composer_replication.diloco.serverless": (
        "ObjectStoreAllReduce", "LocalProcessExecutor", "ModalExecutor", "HFJobsExecutor",
    ),
    "composer_replication.run.train": ("run_training",),
}  # fmt: skip
_WHERE = {name: module for module, names in _PUBLIC.items() for name in names}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'composer_replication' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
