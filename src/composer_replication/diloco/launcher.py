"""``composer-replication diloco``: N local replicas of the trainer under DiLoCo.

Each replica is a separate OS process running the normal training entry point
(:func:`composer_replication.run.train.run_training`) with ``diloco.enabled=true``, its own
``replica_id``, data shard ``r`` of ``n``, sampling seed ``seed + r`` and output directory
``{output_dir}/replica-{r}``. With the torchft backend a lighthouse is started here (unless one
is given); with the object_store backend the replicas meet only in ``diloco.store_uri``. The
launcher streams their output with a ``[rN]`` prefix, waits for them, draws the combined curves
and prints the checksum of every replica's final weights. :func:`launch_with_executor` runs the
same replicas through a serverless executor instead (``LocalProcessExecutor`` by default).

Several hosts: start one lighthouse (``torchft_lighthouse --min_replicas N --bind [::]:29510``)
and on each host run ``composer-replication diloco --replicas N --replica-ids 0,1
--lighthouse http://LIGHTHOUSE_HOST:29510 ...`` with that host's ids.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from composer_replication.config import RunConfig, check_output_dir, load_config
from composer_replication.diloco.callback import FINAL_FILE, SYNC_LOG
from composer_replication.diloco.replica import replica_overrides

PLOT_FILE = "diloco_curves.png"
SUMMARY_FILE = "diloco_summary.json"


@dataclass
class ReplicaResult:
    replica: int
    exit_code: int
    output_dir: Path
    final: dict[str, Any] | None
    syncs: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None


@dataclass
class LaunchResult:
    replicas: list[ReplicaResult]
    lighthouse: str | None
    plot: Path | None
    summary: Path

    @property
    def ok(self) -> bool:
        return all(r.exit_code == 0 and r.final for r in self.replicas)

    @property
    def checksums(self) -> dict[int, str | None]:
        return {r.replica: (r.final or {}).get("checksum") for r in self.replicas}

    @property
    def weights_equal(self) -> bool:
        values = list(self.checksums.values())
        return self.ok and len(set(values)) == 1


def thread_overrides(overrides: list[str], n_local: int) -> list[str]:
    """``num_threads=cores / n_local`` unless the user set num_threads."""
    if any(o.split("=", 1)[0].strip() == "num_threads" for o in overrides):
        return []
    return [f"num_threads={max(1, (os.cpu_count() or 1) // n_local)}"]


def check_fresh_store(cfg: RunConfig) -> None:
    """Refuse an object store that already holds rounds (from an earlier run), and a local one
    that cannot be a directory."""
    from composer_replication.diloco.callback import store_options
    from composer_replication.diloco.serverless.allreduce import rounds_at

    d = cfg.diloco
    if d.store_uri and ("://" not in d.store_uri or d.store_uri.startswith("file://")):
        check_output_dir(d.store_uri.removeprefix("file://"), "diloco.store_uri")
    left = rounds_at(d.store_uri or "", store_options(d))
    if left:
        raise ValueError(
            f"diloco.store_uri={d.store_uri} already holds rounds {left[:3]} of another run; "
            "give each run a fresh prefix"
        )


STOP_GRACE_S = 5.0
"""How long a stopped replica gets to exit on SIGTERM before it is killed."""


def stop_process_groups(procs: list[subprocess.Popen], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM each process's group (each started with ``start_new_session``: the replica and
    whatever it started), SIGKILL the groups still alive after ``grace_s``, and reap them."""
    for p in procs:
        _signal_group(p, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        _signal_group(p, signal.SIGKILL)  # also the group's other members, if any are left
        p.wait()


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """In the block, SIGTERM (``timeout``, ``kill``, a job scheduler) raises KeyboardInterrupt
    as Ctrl-C does, so the launcher's cleanup runs and stops its replicas; SIGTERM's default
    action ends the process at once and leaves them running, orphaned. Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(p.pid, sig)
    except (ProcessLookupError, PermissionError):  # the group is gone
        pass


def _stream(proc: subprocess.Popen, prefix: str, echo) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        echo(f"{prefix} {line.rstrip()}")


def start_lighthouse(min_replicas: int, join_timeout_s: float, heartbeat_timeout_s: float = 5.0):
    """torchft's lighthouse on a free port of this host; returns the server (``.address()``)."""
    os.environ.setdefault("RUST_LOG", "warn")  # the lighthouse logs every quorum at INFO
    from torchft.coordination import LighthouseServer

    return LighthouseServer(
        bind="[::]:0",
        min_replicas=min_replicas,
        join_timeout_ms=int(join_timeout_s * 1000),
        heartbeat_timeout_ms=int(heartbeat_timeout_s * 1000),
    )


def launch_diloco(
    config: str | Path | None,
    overrides: list[str],
    replicas: int,
    lighthouse: str | None = None,
    replica_ids: list[int] | None = None,
    min_replicas: int | None = None,
    echo=print,
) -> LaunchResult:
    """Start the replicas as subprocesses (and, for the torchft backend, a lighthouse unless
    ``lighthouse`` is given); wait; summarize."""
    cfg = load_config(config, [*overrides, f"diloco.replicas={replicas}"])
    ids = replica_ids if replica_ids is not None else list(range(replicas))
    bad = [i for i in ids if not 0 <= i < replicas]
    if bad:
        raise ValueError(f"--replica-ids {bad} out of range for --replicas {replicas}")
    object_store = cfg.diloco.backend == "object_store"
    if object_store:
        check_fresh_store(cfg)
    server = None
    if lighthouse is None and not object_store:
        server = start_lighthouse(min_replicas or replicas, join_timeout_s=cfg.diloco.timeout_s)
        lighthouse = server.address()
    threads = thread_overrides(overrides, len(ids))
    env = dict(os.environ, RUST_LOG=os.environ.get("RUST_LOG", "warn"), PYTHONUNBUFFERED="1")
    where = f"object store {cfg.diloco.store_uri}" if object_store else f"lighthouse {lighthouse}"
    echo(f"[diloco] {where}; starting replicas {ids} of {replicas}")
    procs: list[tuple[int, subprocess.Popen, threading.Thread]] = []
    with sigterm_as_interrupt():  # a kill stops the replicas too
        try:
            for r in ids:
                args = [sys.executable, "-m", "composer_replication.run.replica"]
                if config is not None:
                    args += ["--config", str(config)]
                rep = replica_overrides(
                    cfg, r, replicas, None if object_store else lighthouse, None
                )
                args += [*overrides, *threads, *rep]
                p = subprocess.Popen(
                    args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                    start_new_session=True,  # stopped by this launcher, with their own children
                )  # fmt: skip
                t = threading.Thread(target=_stream, args=(p, f"[r{r}]", echo), daemon=True)
                t.start()
                procs.append((r, p, t))
            for _, p, t in procs:
                p.wait()
                t.join(5)
        except KeyboardInterrupt:
            echo(f"[diloco] interrupted: stopping replicas {ids}")
            raise
        finally:  # also on Ctrl-C or an error here: no replica outlives the launcher
            stop_process_groups([p for _, p, _ in procs])
            if server is not None:
                server.shutdown()
    results = [collect_replica(cfg, r, p.returncode) for r, p, _ in procs]
    return summarize(cfg, results, None if object_store else lighthouse)


def launch_with_executor(
    config: str | Path | None,
    overrides: list[str],
    replicas: int,
    executor: Any = None,
    timeout_s: float | None = None,
    echo=print,
) -> LaunchResult:
    """Run the replicas through a serverless executor (default: ``LocalProcessExecutor``) with
    the trainer entrypoint (:func:`~composer_replication.diloco.serverless.train_entry.
    train_replica`); object_store backend only (the replicas meet in ``diloco.store_uri``)."""
    from composer_replication.config import dump_config
    from composer_replication.diloco.serverless import LocalProcessExecutor, ReplicaFailedError
    from composer_replication.diloco.serverless.train_entry import TRAIN_ENTRYPOINT

    cfg = load_config(config, [*overrides, f"diloco.replicas={replicas}"])
    if cfg.diloco.backend != "object_store":
        raise ValueError(
            "an executor launch needs diloco.backend=object_store and diloco.store_uri "
            "(serverless replicas cannot reach a torchft lighthouse)"
        )
    check_fresh_store(cfg)
    executor = executor or LocalProcessExecutor(Path(cfg.output_dir) / "executor")
    args = {"config_yaml": dump_config(cfg), "overrides": thread_overrides(overrides, replicas)}
    echo(
        f"[diloco] object store {cfg.diloco.store_uri}; {type(executor).__name__}: "
        f"{replicas} replicas of {TRAIN_ENTRYPOINT}"
    )
    handles = executor.launch_replicas(replicas, TRAIN_ENTRYPOINT, args)
    try:
        with sigterm_as_interrupt():  # collect stops the replicas on an interrupt
            records = executor.collect(handles, timeout=timeout_s)
    except ReplicaFailedError as err:  # the others were stopped: no result from any
        echo(f"[diloco] {err}")
        records = [None] * replicas
    results = [
        ReplicaResult(
            r,
            0 if rec and rec.get("final") else 1,
            Path(cfg.output_dir) / f"replica-{r}",
            (rec or {}).get("final"),
            (rec or {}).get("syncs", []),
        )
        for r, rec in enumerate(records)
    ]
    return summarize(cfg, results, None)


def summarize(cfg: RunConfig, results: list[ReplicaResult], lighthouse: str | None) -> LaunchResult:
    """Plot the replicas' curves and write ``diloco_summary.json``."""
    plot = plot_replicas(results, Path(cfg.output_dir) / PLOT_FILE)
    summary = Path(cfg.output_dir) / SUMMARY_FILE
    summary.parent.mkdir(parents=True, exist_ok=True)
    result = LaunchResult(results, lighthouse, plot, summary)
    rows = [
        {"replica": r.replica, "exit_code": r.exit_code, "final": r.final}
        | ({"error": r.error} if r.error else {})
        for r in results
    ]
    summary.write_text(
        json.dumps(
            {"lighthouse": lighthouse, "replicas": rows, "weights_equal": result.weights_equal},
            indent=2,
        )
    )
    return result


def collect_replica(cfg: RunConfig, replica: int, code: int) -> ReplicaResult:
    """A finished replica's final summary and sync log, read from its output directory."""
    out = Path(cfg.output_dir) / f"replica-{replica}"
    return ReplicaResult(replica, code, out, *read_replica_output(out))


def read_replica_output(out: Path) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """``(final, syncs)`` from a replica's output directory: ``diloco_final.json`` (None
    until the replica finished) and the rows of ``diloco.jsonl``."""
    final_path, sync_path = out / FINAL_FILE, out / SYNC_LOG
    final = json.loads(final_path.read_text()) if final_path.is_file() else None
    syncs = (
        [json.loads(x) for x in sync_path.read_text().splitlines() if x.strip()]
        if sync_path.is_file()
        else []
    )
    return final, syncs


def plot_replicas(results: list[ReplicaResult], out: Path) -> Path | None:
    """Reward and loss per step for every replica, sync points marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from composer_replication.trainer.callbacks import METRICS_FILE, read_metrics

    series = {r.replica: read_metrics(r.output_dir / METRICS_FILE) for r in results}
    if not any(series.values()):
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key in zip(axes, ("reward", "loss"), strict=True):
        for r in results:
            pts = [(row["step"], row[key]) for row in series[r.replica] if key in row]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker=".", label=f"replica {r.replica}")
        sync_steps = sorted({s["inner_step"] for r in results for s in r.syncs})
        for s in sync_steps:
            ax.axvline(s, color="grey", alpha=0.3, linestyle="--")
        ax.set_title(f"{key} (dashed: outer syncs)")
        ax.set_xlabel("inner step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
