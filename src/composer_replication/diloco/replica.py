"""One replica process of ``composer-replication diloco``: the normal training run with the
``diloco:`` section on. ``python -m composer_replication.diloco.replica --config FILE k=v ...``"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from composer_replication.config import RunConfig


def replica_overrides(
    cfg: RunConfig, replica: int, n: int, lighthouse: str | None, threads: int | None
) -> list[str]:
    """The per-replica overrides appended after the user's: replica id (which picks the data
    shard, see ``trainer.run.data_shard``), sampling seed, output directory, threads and, for
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


def main(argv: list[str] | None = None) -> int:
    import argparse

    from composer_replication.config import ConfigError, load_config

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--config", default=None)
    ap.add_argument("overrides", nargs="*")
    ns = ap.parse_args(argv)
    try:
        cfg = load_config(ns.config, ns.overrides)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if not cfg.diloco.enabled:
        print("error: diloco.enabled is false; use `composer-replication train`", file=sys.stderr)
        return 2
    quiet_logs()
    from composer_replication.trainer.run import run_training

    summary = run_training(cfg)
    print(
        f"[replica {cfg.diloco.replica_id}] done: train {summary.train_seconds:.0f} s, "
        f"checkpoint {summary.final_checkpoint}",
        flush=True,
    )
    if summary.trained:
        print(
            f"[replica {cfg.diloco.replica_id}] trained pass@1 {summary.trained['pass_rate']:.1%}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
