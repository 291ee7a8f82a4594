"""``composer-replication diloco --launcher monarch``: the DiLoCo replicas as Monarch actors.

Monarch (PyTorch's single-controller actor runtime; PyPI ``torchmonarch``) spawns a process mesh
of ``replicas`` processes on this host and one :class:`ReplicaActor` in each. The controller (this
process) starts the torchft lighthouse unless the object_store backend is used or a lighthouse
is given, and sends every actor the list of per-replica overrides (``replica_overrides`` plus
``num_threads = cores / replicas``, as the subprocess launcher does). Each actor takes its own
by its rank in the mesh (``current_rank()``) and runs the normal training entry point
(:func:`composer_replication.run.train.run_training`) in its process: the same run the
subprocess launcher starts with ``python -m composer_replication.run.replica``. It returns
its final summary (``diloco_final.json``) and sync log, which become the launcher's table, plot
and ``diloco_summary.json``.

Output: the actor processes write to the controller's terminal (Monarch's processes inherit
its stdout/stderr; Monarch's own log forwarding is not used); each actor prefixes the Python
output of its replica with ``[rN]``.

Failures: a replica that raises comes back as :class:`ReplicaFailedError` naming it; the
controller then stops the mesh at once (its peers would otherwise wait for the failed replica
at the next sync until ``diloco.timeout_s``), marks the unfinished replicas failed and returns
a result whose ``ok`` is false. Monarch's supervision faults raised by that stop (an actor busy
training cannot stop cleanly) are expected and kept from ``monarch.actor.unhandled_fault_hook``
(which would exit this process) while the mesh runs.

Run here (torchmonarch 0.7.0, whose wheel is built against torch 2.14.1, on our torch 2.13.0
CPU; the actor API only: process meshes, endpoints, ``stream``, ``current_rank``,
``ActorError``, ``stop``; no tensor engine, no RDMA): 2 actors on one host with the tiny model
through the real trainer, on the object_store backend (tests/integration/test_diloco_monarch.py,
equal final weights) and on the torchft backend with the lighthouse started here (run by hand,
4 inner steps, 2 syncs, equal checksums; not in the test suite to keep it short); and a replica
failing while its peer trains (the test: the error names it, nothing hangs, no process is left).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from composer_replication.config import RunConfig, load_config
from composer_replication.diloco.launcher import (
    LaunchResult,
    ReplicaResult,
    check_fresh_store,
    collect_replica,
    start_lighthouse,
    summarize,
    thread_overrides,
)
from composer_replication.diloco.replica import replica_overrides
from composer_replication.diloco.serverless.executor import resolve_entrypoint

MISSING = "--launcher monarch needs Monarch: pip install torchmonarch (PyPI name; not `monarch`)"


class MonarchMissingError(RuntimeError):
    """``torchmonarch`` is not installed."""


class ReplicaFailedError(RuntimeError):
    """A replica actor raised. Its arguments are only an int and a str, so it pickles back to
    the controller whatever the original exception was."""

    def __init__(self, replica: int, message: str):
        super().__init__(replica, message)
        self.replica = replica
        self.message = message

    def __str__(self) -> str:
        return f"replica {self.replica} failed: {self.message}"


class _Prefixed:
    """A text stream that starts every non-empty line written through it with ``prefix``."""

    def __init__(self, stream: TextIO, prefix: str):
        self._stream, self._prefix, self._at_start = stream, prefix, True

    def write(self, text: str) -> int:
        out = []
        for piece in text.splitlines(keepends=True):
            if self._at_start and piece.strip("\r\n"):  # not before a bare "\r" (tqdm)
                out.append(self._prefix)
            out.append(piece)
            self._at_start = piece.endswith(("\n", "\r"))
        self._stream.write("".join(out))
        return len(text)

    def __getattr__(self, name: str) -> Any:  # flush, fileno, isatty, encoding, ...
        return getattr(self._stream, name)


@contextmanager
def prefixed_output(prefix: str) -> Iterator[None]:
    """Prefix this process's Python stdout and stderr lines with ``prefix`` inside the block."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Prefixed(saved[0], prefix), _Prefixed(saved[1], prefix)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def plain_python_logs() -> None:
    """Turn off Monarch's actor prefix on Python log records in this process.

    Monarch adds a filter to every logging handler of a process that uses it (and patches
    ``Logger.addHandler`` to keep adding it) which rewrites each record's message to
    ``"[actor=<root>] ..."``; in the controller that changes every later log line of the user's
    process, once per launch. Its switch is ``monarch.actor.config.prefix_python_logs_with_actor``;
    the actors' output is prefixed ``[rN]`` by us instead."""
    from monarch.actor import config as monarch_config

    monarch_config.prefix_python_logs_with_actor = False


TRAIN_ENTRYPOINT = "composer_replication.run.replica:train_replica"
"""What a replica actor runs (``module:function``, resolved in the actor's process): one
replica's training run, its final summary and sync log."""


try:
    from monarch.actor import Actor, current_rank, endpoint

    class ReplicaActor(Actor):
        """One DiLoCo replica: trains with the overrides at its mesh rank."""

        @endpoint
        def train(self, config: str | None, per_rank: list[list[str]]) -> dict[str, Any]:
            rank = current_rank().rank
            plain_python_logs()  # our own [rN] prefix instead of Monarch's
            try:
                with prefixed_output(f"[r{rank}] "):
                    return resolve_entrypoint(TRAIN_ENTRYPOINT)(config, per_rank[rank], rank)
            except BaseException as err:  # the controller learns which replica, and why
                raise ReplicaFailedError(rank, f"{type(err).__name__}: {err}") from err

except ImportError:  # torchmonarch absent: launch_monarch says how to install it
    ReplicaActor = None  # type: ignore[assignment,misc]


def launch_monarch(
    config: str | Path | None,
    overrides: list[str],
    replicas: int,
    lighthouse: str | None = None,
    echo: Callable[[str], Any] = print,
) -> LaunchResult:
    """Run ``replicas`` DiLoCo replicas as actors on a Monarch process mesh of this host (and,
    for the torchft backend, a lighthouse here unless ``lighthouse`` is given); summarize."""
    if ReplicaActor is None:
        raise MonarchMissingError(MISSING)
    plain_python_logs()
    cfg = load_config(config, [*overrides, f"diloco.replicas={replicas}"])
    object_store = cfg.diloco.backend == "object_store"
    if object_store:
        check_fresh_store(cfg)
    server = None
    if lighthouse is None and not object_store:
        server = start_lighthouse(replicas, join_timeout_s=cfg.diloco.timeout_s)
        lighthouse = server.address()
    link = None if object_store else lighthouse
    threads = thread_overrides(overrides, replicas)
    per_rank = [
        [*overrides, *threads, *replica_overrides(cfg, r, replicas, link, None)]
        for r in range(replicas)
    ]
    where = f"object store {cfg.diloco.store_uri}" if object_store else f"lighthouse {lighthouse}"
    echo(f"[diloco] {where}; Monarch mesh of {replicas} processes, one replica actor each")
    try:
        run = run_on_mesh(None if config is None else str(config), per_rank, echo)
    finally:
        if server is not None:
            server.shutdown()
    return summarize(cfg, [run.result(cfg, r) for r in range(replicas)], link)


@dataclass
class MeshRun:
    """What came back from the actors: each finished replica's reply, and the first failure."""

    replies: dict[int, dict[str, Any]] = field(default_factory=dict)
    error: str | None = None
    failed: int | None = None

    def result(self, cfg: RunConfig, replica: int) -> ReplicaResult:
        """The replica's row: its reply, or (it failed or was stopped) what is on its disk."""
        out = self.replies.get(replica)
        if out is not None:
            path = Path(cfg.output_dir) / f"replica-{replica}"
            return ReplicaResult(
                replica, 0 if out["final"] else 1, path, out["final"], out["syncs"]
            )
        res = collect_replica(cfg, replica, 1)
        if self.failed == replica or self.failed is None:
            res.error = self.error or "no reply from its actor"
        else:
            res.error = f"stopped because replica {self.failed} failed"
        return res


def run_on_mesh(
    config: str | None, per_rank: list[list[str]], echo: Callable[[str], Any]
) -> MeshRun:
    """Train every replica on a fresh mesh and take each reply as it arrives; at the first
    failure stop (the mesh is stopped on leaving :func:`replica_mesh`)."""
    run = MeshRun()
    with replica_mesh(len(per_rank)) as actors:
        for reply in actors.train.stream(config, per_rank):
            try:
                out = reply.get()
            except Exception as err:  # ActorError (the replica raised) or a lost process
                cause = getattr(err, "exception", None) or err
                run.error = str(cause)
                run.failed = getattr(cause, "replica", None)
                echo(f"[diloco] {run.error}; stopping the mesh")
                break
            run.replies[out["replica"]] = out
    return run


@contextmanager
def replica_mesh(n: int) -> Iterator[Any]:
    """A mesh of ``n`` processes on this host with a :class:`ReplicaActor` in each; stopped on
    exit. Meanwhile Monarch's unhandled-fault hook (default: exit this process) ignores faults:
    stopping an actor that is busy training raises one, and every other failure also reaches
    the caller through its call's reply."""
    import monarch.actor
    from monarch.actor import this_host

    saved_hook = monarch.actor.unhandled_fault_hook
    monarch.actor.unhandled_fault_hook = lambda failure: None
    mesh = None
    try:
        mesh = this_host().spawn_procs(per_host={"procs": n})
        yield mesh.spawn("composer_replica", ReplicaActor)
    finally:
        if mesh is not None:
            mesh.stop().get()
        monarch.actor.unhandled_fault_hook = saved_hook
