"""The trainer as a serverless replica: ``TRAIN_ENTRYPOINT`` for any executor (the function
itself, which assembles the run, is in ``run/replica.py``).

``launch_replicas(n, TRAIN_ENTRYPOINT, {"config_yaml": ..., "overrides": [...]})`` runs
:func:`~composer_replication.run.train.run_training` in every replica with the replica's id
from ``$REPLICA_RANK`` (data shard, seed, output directory as the local launcher sets them) and
the object-store backend; each returns its ``diloco_final.json`` record and sync log.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from composer_replication.diloco.serverless.executor import RANK_ENV, WORLD_ENV

TRAIN_ENTRYPOINT = "composer_replication.run.replica:train_serverless_replica"


def rank_and_world() -> tuple[int, int]:
    try:
        return int(os.environ[RANK_ENV]), int(os.environ[WORLD_ENV])
    except (KeyError, ValueError):
        raise RuntimeError(
            f"train_replica runs under an executor: ${RANK_ENV} and ${WORLD_ENV} must be integers"
        ) from None


def replica_config(config_yaml: str, overrides: list[str], rank: int, world: int):
    """The RunConfig of replica ``rank``: the YAML text, the overrides, then the per-replica
    settings of :func:`~composer_replication.diloco.replica.replica_overrides`."""
    from composer_replication.config import load_config
    from composer_replication.diloco.replica import replica_overrides

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.yaml"
        path.write_text(config_yaml)
        base = load_config(path, overrides)
        cfg = load_config(path, [*overrides, *replica_overrides(base, rank, world, None, None)])
    if cfg.diloco.backend != "object_store":
        raise ValueError(
            "train_replica: diloco.backend must be object_store (serverless replicas meet "
            "in diloco.store_uri)"
        )
    return cfg
