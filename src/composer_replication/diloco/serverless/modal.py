"""Replicas as Modal functions (``modal.App`` + ``Function.spawn``).

``launch_replicas`` opens an ephemeral app run, spawns one call per replica (rank passed in and
set as ``REPLICA_RANK``) and ``collect`` waits on the calls and closes the run. Replicas meet
through an object store (``ObjectStoreAllReduce`` on ``s3://``; pass its credentials as a
``modal.Secret`` name).
"""

from __future__ import annotations

import importlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from composer_replication.config.base import UserError
from composer_replication.diloco.serverless.executor import (
    RANK_ENV,
    WORLD_ENV,
    ReplicaFailedError,
    ReplicaTimeoutError,
)
from composer_replication.diloco.serverless.install import project_source

IGNORE = [".git", ".venv", "runs", "**/__pycache__", "**/*.pyc"]


class ModalCredentialsError(UserError, RuntimeError):
    """No Modal token (``modal token new`` or MODAL_TOKEN_ID / MODAL_TOKEN_SECRET)."""


def _modal_replica(rank: int, world: int, entrypoint: str, entrypoint_args: dict[str, Any]) -> Any:
    """Runs inside the Modal container."""
    os.environ[RANK_ENV] = str(rank)
    os.environ[WORLD_ENV] = str(world)
    from composer_replication.diloco.serverless.executor import resolve_entrypoint

    return resolve_entrypoint(entrypoint)(**entrypoint_args)


@dataclass
class ModalHandle:
    rank: int
    call: Any


def project_image(modal: Any, project: str | Path, python_version: str) -> Any:
    """A debian-slim image with this project installed from ``project`` (a wheel or project
    directory copied into the image, or a pip URL), see :mod:`.install`."""
    src = project_source(project)
    image = modal.Image.debian_slim(python_version=python_version)
    if src.kind == "wheel":
        image = image.add_local_file(src.local, src.remote_path(), copy=True)
    elif src.kind == "dir":
        image = image.add_local_dir(src.local, src.remote_path(), copy=True, ignore=IGNORE)
    return image.pip_install(src.requirement())


class ModalExecutor:
    """Start replicas as Modal function calls; same calls as :class:`LocalProcessExecutor`.

    ``project`` is where the image installs composer-replication from (a wheel, a project
    directory or a pip URL); ``image`` replaces the built image entirely. ``sdk`` is the
    ``modal`` module (tests pass a recording stand-in). Credentials are checked here (Modal's
    config: env vars or ``~/.modal.toml``).
    """

    def __init__(
        self,
        project: str | Path | None = None,
        gpu: str | None = None,
        image: Any = None,
        python_version: str = "3.11",
        timeout_s: int = 7200,
        secrets: tuple[str, ...] = (),
        app_name: str = "composer-replication-diloco",
        sdk: Any = None,
    ):
        modal = sdk if sdk is not None else importlib.import_module("modal")
        cfg = modal.config.config
        if not (cfg.get("token_id") and cfg.get("token_secret")):
            raise ModalCredentialsError(
                "ModalExecutor: no Modal token; run `modal token new` or set "
                "MODAL_TOKEN_ID and MODAL_TOKEN_SECRET"
            )
        if image is None and project is None:
            raise ValueError(
                "ModalExecutor: give project= (a wheel, the project directory or a pip URL of "
                "composer-replication) or a ready image="
            )
        self.image = image if image is not None else project_image(modal, project, python_version)
        self.gpu, self.timeout_s = gpu, timeout_s
        self.secret_names = tuple(secrets)
        self.app = modal.App(app_name)
        self.function_options = {
            "image": self.image,
            "gpu": gpu,
            "timeout": timeout_s,
            "secrets": [modal.Secret.from_name(s) for s in self.secret_names],
            "serialized": True,
        }
        self.function = self.app.function(**self.function_options)(_modal_replica)
        self._run = None

    def call_args(
        self, rank: int, n_replicas: int, entrypoint: str, entrypoint_args: dict[str, Any]
    ) -> tuple:
        """Positional arguments of ``function.spawn`` for replica ``rank``."""
        return (rank, n_replicas, entrypoint, dict(entrypoint_args))

    def launch_replicas(
        self, n_replicas: int, entrypoint: str, entrypoint_args: dict[str, Any] | None = None
    ) -> list[ModalHandle]:
        if n_replicas < 1:
            raise ValueError(f"n_replicas must be >= 1, got {n_replicas}")
        self._run = self.app.run()
        self._run.__enter__()
        return [
            ModalHandle(
                r,
                self.function.spawn(
                    *self.call_args(r, n_replicas, entrypoint, entrypoint_args or {})
                ),
            )
            for r in range(n_replicas)
        ]

    def poll(self, handles: list[ModalHandle]) -> list[str]:
        out = []
        for h in handles:
            try:
                h.call.get(timeout=0)
                out.append("succeeded")
            except TimeoutError:
                out.append("running")
            except Exception:  # the remote call raised
                out.append("failed")
        return out

    def collect(self, handles: list[ModalHandle], timeout: float | None = None) -> list[Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        results, failures = [], {}
        try:
            for h in handles:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    results.append(h.call.get(timeout=left))
                except TimeoutError:
                    for other in handles:
                        other.call.cancel()
                    raise ReplicaTimeoutError(
                        f"Modal replicas still running after {timeout:g} s"
                    ) from None
                except Exception as err:  # the remote call raised
                    failures[h.rank] = (None, f"{type(err).__name__}: {err}")
        finally:
            if self._run is not None:
                self._run.__exit__(None, None, None)
                self._run = None
        if failures:
            raise ReplicaFailedError(failures)
        return results
