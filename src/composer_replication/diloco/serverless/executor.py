"""Executors start N replicas of an entrypoint and collect their results.

All share one shape: ``launch_replicas(n_replicas, entrypoint, entrypoint_args) -> handles``,
``poll(handles) -> states`` and ``collect(handles, timeout) -> results`` (raising
:class:`ReplicaFailedError` if any replica failed). Replica ``r`` sees ``REPLICA_RANK=r`` in its
environment. ``entrypoint`` is ``"package.module:function"`` (called with
``**entrypoint_args``); its return value must be picklable.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import pickle
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

RANK_ENV = "REPLICA_RANK"
WORLD_ENV = "REPLICA_WORLD_SIZE"


class ReplicaFailedError(RuntimeError):
    """One or more replicas failed; ``failures`` maps rank -> (exit code, error) (exit code
    None: the replica raised in a live process, e.g. a Monarch actor). Pickles as its
    ``failures`` alone, so it crosses process boundaries whatever the original error was."""

    def __init__(self, failures: dict[int, tuple[int | None, str]]):
        self.failures = failures
        if len(failures) == 1 and next(iter(failures.values()))[0] is None:
            ((rank, (_, err)),) = failures.items()  # one live replica raised: its error, one line
            super().__init__(f"replica {rank} failed: {err}")
            return
        lines = [f"{len(failures)} replica(s) failed:"]
        for rank, (code, err) in sorted(failures.items()):
            lines.append(
                f"  rank {rank}: exit code {code}: {err.strip().splitlines()[-1] if err.strip() else '(no output)'}"
            )
        super().__init__("\n".join(lines))

    def __reduce__(self):
        return (type(self), (self.failures,))


class ReplicaTimeoutError(TimeoutError):
    """``collect`` ran out of time; the still-running replicas were terminated."""


def resolve_entrypoint(entrypoint: str) -> Any:
    """``"pkg.mod:func"`` -> the function (a clear error if either part is missing)."""
    if ":" not in entrypoint:
        raise ValueError(f"entrypoint {entrypoint!r} must look like 'package.module:function'")
    mod_name, func_name = entrypoint.split(":", 1)
    try:
        module = importlib.import_module(mod_name)
    except ImportError as err:
        raise ValueError(f"entrypoint {entrypoint!r}: cannot import {mod_name!r}: {err}") from err
    func = getattr(module, func_name, None)
    if not callable(func):
        raise ValueError(f"entrypoint {entrypoint!r}: {mod_name} has no function {func_name!r}")
    return func


class ServerlessExecutor(Protocol):
    def launch_replicas(
        self, n_replicas: int, entrypoint: str, entrypoint_args: dict[str, Any] | None = None
    ) -> list[Any]: ...

    def poll(self, handles: list[Any]) -> list[str]: ...

    def collect(self, handles: list[Any], timeout: float | None = None) -> list[Any]: ...


@dataclass
class LocalHandle:
    rank: int
    process: Any
    result_path: Path


def _child_main(
    rank: int, world: int, entrypoint: str, args: dict[str, Any], result_path: str
) -> None:
    os.environ[RANK_ENV] = str(rank)
    os.environ[WORLD_ENV] = str(world)
    try:
        result = resolve_entrypoint(entrypoint)(**args)
        Path(result_path).write_bytes(pickle.dumps(("ok", result)))
    except BaseException as err:  # report any failure, then exit non-zero
        code = err.code if isinstance(err, SystemExit) and isinstance(err.code, int) else 1
        Path(result_path).write_bytes(
            pickle.dumps(("error", f"{type(err).__name__}: {err}\n{traceback.format_exc()}"))
        )
        raise SystemExit(code or 1) from None


class LocalProcessExecutor:
    """Replicas as local processes (``multiprocessing`` spawn context): the development stand-in
    for the cloud executors, with the same calls."""

    def __init__(self, workdir: str | Path | None = None):
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="cr-replicas-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._ctx = mp.get_context("spawn")

    def launch_replicas(
        self, n_replicas: int, entrypoint: str, entrypoint_args: dict[str, Any] | None = None
    ) -> list[LocalHandle]:
        if n_replicas < 1:
            raise ValueError(f"n_replicas must be >= 1, got {n_replicas}")
        resolve_entrypoint(entrypoint)  # fail here, not in N children
        handles = []
        for rank in range(n_replicas):
            result_path = self.workdir / f"replica-{rank}.result"
            result_path.unlink(missing_ok=True)
            proc = self._ctx.Process(
                target=_child_main,
                args=(rank, n_replicas, entrypoint, dict(entrypoint_args or {}), str(result_path)),
                name=f"replica-{rank}",
            )
            proc.start()
            handles.append(LocalHandle(rank, proc, result_path))
        return handles

    def poll(self, handles: list[LocalHandle]) -> list[str]:
        """``running``, ``succeeded`` or ``failed`` per handle."""
        out = []
        for h in handles:
            code = h.process.exitcode
            out.append("running" if code is None else "succeeded" if code == 0 else "failed")
        return out

    def terminate(self, handles: list[LocalHandle]) -> None:
        """SIGTERM the running replicas; SIGKILL those still running 5 s later."""
        for h in handles:
            if h.process.exitcode is None:
                h.process.terminate()
        for h in handles:
            h.process.join(5)
            if h.process.exitcode is None:
                h.process.kill()
                h.process.join(5)

    def collect(
        self, handles: list[LocalHandle], timeout: float | None = None, fail_fast: bool = True
    ) -> list[Any]:
        """Wait for all replicas; return their results in rank order.

        A replica that exits non-zero (or is killed) raises :class:`ReplicaFailedError` with
        its exit code and error; with ``fail_fast`` the others are terminated at once instead of
        being left to block on the missing peer.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while any(h.process.exitcode is None for h in handles):
                if fail_fast and any(h.process.exitcode not in (None, 0) for h in handles):
                    break
                if deadline is not None and time.monotonic() > deadline:
                    running = [h.rank for h in handles if h.process.exitcode is None]
                    raise ReplicaTimeoutError(
                        f"replicas {running} still running after {timeout:g} s"
                    )
                time.sleep(0.05)
        except BaseException:  # the timeout, Ctrl-C: no replica outlives the wait (and
            self.terminate(handles)  # multiprocessing would join them at exit)
            raise
        failures: dict[int, tuple[int | None, str]] = {}
        results: list[Any] = []
        for h in handles:
            h.process.join(0.1 if h.process.exitcode is not None else 0)
            code = h.process.exitcode
            status, value = self._read_result(h)
            if code == 0 and status == "ok":
                results.append(value)
            elif code is not None:
                failures[h.rank] = (
                    code,
                    value if status == "error" else f"exited with code {code}",
                )
        if failures:
            self.terminate(handles)
            raise ReplicaFailedError(failures)
        return results

    @staticmethod
    def _read_result(h: LocalHandle) -> tuple[str, Any]:
        if not h.result_path.is_file():
            return "missing", None
        return pickle.loads(h.result_path.read_bytes())
