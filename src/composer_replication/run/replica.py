"""One replica of ``composer-replication diloco``: the normal training run with the ``diloco:``
section on, entered three ways. ``python -m composer_replication.run.replica --config FILE
k=v ...`` (the subprocess launcher), :func:`train_replica` (a Monarch actor,
``diloco.monarch.TRAIN_ENTRYPOINT``) and :func:`train_serverless_replica` (any serverless
executor, ``diloco.serverless.train_entry.TRAIN_ENTRYPOINT``)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from composer_replication.config import ConfigError, load_config
from composer_replication.diloco.callback import FINAL_FILE, SYNC_LOG
from composer_replication.diloco.launcher import read_replica_output
from composer_replication.diloco.replica import quiet_logs
from composer_replication.diloco.serverless.train_entry import rank_and_world, replica_config
from composer_replication.run.train import run_training


def main(argv: list[str] | None = None) -> int:
    import argparse

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


def train_replica(config: str | None, overrides: list[str], rank: int) -> dict[str, Any]:
    """One replica's training run in this process (a Monarch actor); its final summary and
    sync log."""
    cfg = load_config(config, overrides)
    quiet_logs()
    summary = run_training(cfg)
    print(f"done: train {summary.train_seconds:.0f} s, pid {os.getpid()}", flush=True)
    final, syncs = read_replica_output(Path(cfg.output_dir))
    return {"replica": rank, "final": final, "syncs": syncs}


def train_serverless_replica(
    config_yaml: str, overrides: list[str] | None = None
) -> dict[str, Any]:
    """Train one serverless replica (its rank from the executor's environment); returns
    ``{"replica", "final", "syncs", "output_dir", "trained"}``."""
    rank, world = rank_and_world()
    cfg = replica_config(config_yaml, list(overrides or []), rank, world)
    quiet_logs()
    summary = run_training(cfg)
    out = Path(cfg.output_dir)
    syncs = (out / SYNC_LOG).read_text().splitlines()
    return {
        "replica": rank,
        "final": json.loads((out / FINAL_FILE).read_text()),
        "syncs": [json.loads(x) for x in syncs if x.strip()],
        "output_dir": str(out),
        "trained": summary.trained,
    }


if __name__ == "__main__":
    sys.exit(main())
