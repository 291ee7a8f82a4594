"""``composer-replication diloco --launcher monarch``: the DiLoCo replicas as Monarch actors.

Monarch (PyTorch's single-controller actor runtime; PyPI ``torchmonarch``) spawns a process mesh
of ``replicas`` processes on this host and one :class:`ReplicaActor` in each. The controller (this
process) starts the torchft lighthouse unless the object_store backend is used or a lighthouse
is given, sends every actor the same list of per-replica override lists, and each actor picks its
own by its rank in the mesh (``current_rank()``), then runs the normal training entry point
(:func:`composer_replication.trainer.run.run_training`) in its process: the same run the
subprocess launcher starts with ``python -m composer_replication.diloco.replica``. Monarch
forwards the actors' stdout to the controller. A replica that raises fails the call with an
error naming it; the mesh is stopped either way (no replica is left waiting for a sync).

Tested here (tests/integration/test_diloco_monarch.py): 2 actors on one host with the
object_store backend, a tiny model through the real trainer, equal final weights; and an actor
failure surfacing with the replica's id. torchmonarch 0.7.0's wheel is built against torch
2.14.1; with our torch 2.13.0 its actor API (process meshes, endpoints, ``current_rank``,
``ActorError``, stdout forwarding, ``stop``) works; its tensor engine and RDMA were not used.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from composer_replication.config import load_config
from composer_replication.diloco.launcher import (
    LaunchResult,
    check_fresh_store,
    collect_replica,
    start_lighthouse,
    summarize,
    thread_overrides,
)
from composer_replication.diloco.replica import replica_overrides

MISSING = "--launcher monarch needs Monarch: pip install torchmonarch (PyPI name; not `monarch`)"


class ReplicaFailedError(RuntimeError):
    """A replica actor raised; the message names the replica."""


try:
    from monarch.actor import Actor, current_rank, endpoint

    class ReplicaActor(Actor):
        """One DiLoCo replica: trains with the overrides at its mesh rank."""

        @endpoint
        def train(self, config: str | None, per_rank: list[list[str]]) -> dict[str, Any]:
            rank = current_rank().rank
            try:
                return _train(config, per_rank[rank], rank)
            except BaseException as err:  # the controller sees which replica, and why
                raise ReplicaFailedError(f"replica {rank}: {type(err).__name__}: {err}") from err

except ImportError:  # torchmonarch absent: launch_monarch says how to install it
    ReplicaActor = None  # type: ignore[assignment,misc]


def _train(config: str | None, overrides: list[str], rank: int) -> dict[str, Any]:
    from composer_replication.diloco.replica import quiet_logs
    from composer_replication.trainer.run import run_training

    cfg = load_config(config, overrides)
    quiet_logs()
    summary = run_training(cfg)
    print(f"[r{rank}] done: train {summary.train_seconds:.0f} s", flush=True)
    return {"replica": cfg.diloco.replica_id, "rank": rank, "pid": os.getpid()}


def launch_monarch(
    config: str | Path | None,
    overrides: list[str],
    replicas: int,
    lighthouse: str | None = None,
    echo=print,
) -> LaunchResult:
    """Run ``replicas`` DiLoCo replicas as actors on a Monarch process mesh of this host."""
    if ReplicaActor is None:
        raise RuntimeError(MISSING)
    from monarch.actor import ActorError, this_host

    cfg = load_config(config, [*overrides, f"diloco.replicas={replicas}"])
    object_store = cfg.diloco.backend == "object_store"
    if object_store:
        check_fresh_store(cfg)
    server = None
    if lighthouse is None and not object_store:
        server = start_lighthouse(replicas, join_timeout_s=cfg.diloco.timeout_s)
        lighthouse = server.address()
    threads = thread_overrides(overrides, replicas)
    link = None if object_store else lighthouse
    per_rank = [
        [*overrides, *threads, *replica_overrides(cfg, r, replicas, link, None)]
        for r in range(replicas)
    ]
    where = f"object store {cfg.diloco.store_uri}" if object_store else f"lighthouse {lighthouse}"
    echo(f"[diloco] {where}; Monarch mesh of {replicas} processes, one replica actor each")
    ok = False
    mesh = this_host().spawn_procs(per_host={"procs": replicas})
    try:
        actors = mesh.spawn("composer_replica", ReplicaActor)
        actors.train.call(None if config is None else str(config), per_rank).get()
        ok = True
    except ActorError as err:
        cause = getattr(err, "exception", None) or err
        echo(f"[diloco] {cause}")
    finally:
        mesh.stop().get()
        if server is not None:
            server.shutdown()
    results = [collect_replica(cfg, r, 0 if ok else 1) for r in range(replicas)]
    return summarize(cfg, results, link)
