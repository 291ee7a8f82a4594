"""What makes a training run one replica of ``composer-replication diloco``: its overrides and
quiet logs. The replica's entry points (a process, a Monarch actor, a serverless job) are in
``run/replica.py``: they assemble the run."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from composer_replication.config import RunConfig


def replica_overrides(
    cfg: RunConfig, replica: int, n: int, lighthouse: str | None, threads: int | None
) -> list[str]:
    """The per-replica overrides appended after the user's: replica id (which picks the data
    shard, see ``run.train.data_shard``), sampling seed, output directory, threads and, for
    torchft, the lighthouse."""
    out = [
        "diloco.enabled=true",
        f"diloco.replicas={n}",
        f"diloco.replica_id={replica}",
        f"output_dir={Path(cfg.output_dir) / f'replica-{replica}'}",
        f"seed={cfg.seed + replica}",
    ]
    if lighthouse is not None:
        out.append(f"diloco.lighthouse={lighthouse}")
    if threads is not None:
        out.append(f"num_threads={threads}")
    return out


def quiet_logs() -> None:
    """Warnings and library INFO off: N replicas share one terminal."""
    import logging
    import os
    import warnings

    logging.basicConfig(level=logging.WARNING)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
