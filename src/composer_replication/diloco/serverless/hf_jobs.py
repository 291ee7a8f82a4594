"""Replicas as Hugging Face Jobs (``huggingface_hub.HfApi.run_job``).

Each replica is one job running ``python -m composer_replication.diloco.serverless.entry`` in a
container image, with ``REPLICA_RANK`` / ``REPLICA_WORLD_SIZE`` in its environment; the result
comes back through the job's logs. Replicas meet through an object store
(``ObjectStoreAllReduce`` on an ``s3://`` URI whose credentials are passed as job secrets).
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass
from typing import Any

from composer_replication.diloco.serverless.entry import parse_result
from composer_replication.diloco.serverless.executor import (
    RANK_ENV,
    WORLD_ENV,
    ReplicaFailedError,
    ReplicaTimeoutError,
)

DEFAULT_IMAGE = "pytorch/pytorch:2.6.0-cuda12.4-cudnn9-runtime"
DEFAULT_PACKAGES = "composer-replication[diloco,serverless]"
DONE_STAGES = {"COMPLETED", "ERROR", "CANCELED", "DELETED"}


class HFJobsCredentialsError(RuntimeError):
    """No Hugging Face token (``hf auth login`` or ``HF_TOKEN``)."""


@dataclass
class HFJobHandle:
    rank: int
    job_id: str
    url: str


class HFJobsExecutor:
    """Start replicas on Hugging Face Jobs; same calls as :class:`LocalProcessExecutor`.

    The token is checked here (``token`` argument, else ``HF_TOKEN`` / the cached login), not
    at the first launch. ``namespace`` defaults to the token's user (one ``whoami`` call).
    """

    def __init__(
        self,
        flavor: str = "cpu-basic",
        image: str = DEFAULT_IMAGE,
        packages: str = DEFAULT_PACKAGES,
        namespace: str | None = None,
        token: str | None = None,
        timeout: str | int = "2h",
        env: dict[str, str] | None = None,
        secrets: dict[str, str] | None = None,
        endpoint: str | None = None,
        poll_s: float = 10.0,
    ):
        from huggingface_hub import HfApi, get_token

        token = token or get_token()
        if not token:
            raise HFJobsCredentialsError(
                "HFJobsExecutor: no Hugging Face token; run `hf auth login` or set HF_TOKEN"
            )
        self.api = HfApi(token=token, endpoint=endpoint)
        self.flavor, self.image, self.packages = flavor, image, packages
        self.namespace, self.timeout, self.poll_s = namespace, timeout, poll_s
        self.env, self.secrets = dict(env or {}), dict(secrets or {})

    def job_spec(
        self, rank: int, n_replicas: int, entrypoint: str, entrypoint_args: dict[str, Any]
    ) -> dict[str, Any]:
        """Keyword arguments for ``HfApi.run_job`` for replica ``rank``."""
        run = (
            f"pip install --quiet {shlex.quote(self.packages)} && python -m "
            f"composer_replication.diloco.serverless.entry {shlex.quote(entrypoint)} "
            f"{shlex.quote(json.dumps(entrypoint_args, default=str))}"
        )
        return {
            "image": self.image,
            "command": ["bash", "-c", run],
            "env": {**self.env, RANK_ENV: str(rank), WORLD_ENV: str(n_replicas)},
            "secrets": self.secrets or None,
            "flavor": self.flavor,
            "timeout": self.timeout,
            "namespace": self.namespace,
            "labels": {"composer-replication": "diloco", "replica": str(rank)},
        }

    def launch_replicas(
        self, n_replicas: int, entrypoint: str, entrypoint_args: dict[str, Any] | None = None
    ) -> list[HFJobHandle]:
        if n_replicas < 1:
            raise ValueError(f"n_replicas must be >= 1, got {n_replicas}")
        handles = []
        for rank in range(n_replicas):
            info = self.api.run_job(
                **self.job_spec(rank, n_replicas, entrypoint, entrypoint_args or {})
            )
            handles.append(HFJobHandle(rank, info.id, info.url))
        return handles

    def _stage(self, h: HFJobHandle) -> str:
        return self.api.inspect_job(job_id=h.job_id, namespace=self.namespace).status.stage

    def poll(self, handles: list[HFJobHandle]) -> list[str]:
        """``running``, ``succeeded`` or ``failed`` per handle."""
        out = []
        for h in handles:
            stage = self._stage(h)
            out.append(
                "succeeded"
                if stage == "COMPLETED"
                else "failed"
                if stage in DONE_STAGES
                else "running"
            )
        return out

    def collect(self, handles: list[HFJobHandle], timeout: float | None = None) -> list[Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            states = self.poll(handles)
            if "running" not in states:
                break
            if deadline is not None and time.monotonic() > deadline:
                for h, s in zip(handles, states, strict=True):
                    if s == "running":
                        self.api.cancel_job(job_id=h.job_id, namespace=self.namespace)
                raise ReplicaTimeoutError(f"HF jobs still running after {timeout:g} s")
            time.sleep(self.poll_s)
        results, failures = [], {}
        for h, state in zip(handles, states, strict=True):
            logs = list(self.api.fetch_job_logs(job_id=h.job_id, namespace=self.namespace))
            if state == "succeeded":
                results.append(parse_result(logs))
            else:
                failures[h.rank] = (None, f"job {h.url} failed: " + "\n".join(logs[-20:]))
        if failures:
            raise ReplicaFailedError(failures)
        return results
