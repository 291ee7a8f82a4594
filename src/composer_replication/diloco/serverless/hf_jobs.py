"""Replicas as Hugging Face Jobs (``huggingface_hub.HfApi.run_job``).

Each replica is one job that installs this project (from the wheel or URL the user gives) and
runs ``python -m composer_replication.diloco.serverless.entry`` in a container image, with
``REPLICA_RANK`` / ``REPLICA_WORLD_SIZE`` in its environment; the result comes back through the
job's logs. Replicas meet through an object store
(``ObjectStoreAllReduce`` on an ``s3://`` URI whose credentials are passed as job secrets).
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from composer_replication.config.base import UserError
from composer_replication.diloco.serverless.entry import parse_result
from composer_replication.diloco.serverless.executor import (
    RANK_ENV,
    WORLD_ENV,
    ReplicaFailedError,
    ReplicaTimeoutError,
)
from composer_replication.diloco.serverless.install import project_source

DEFAULT_IMAGE = "pytorch/pytorch:2.6.0-cuda12.4-cudnn9-runtime"
DONE_STAGES = {"COMPLETED", "ERROR", "CANCELED", "DELETED"}
JOB_WHEEL_DIR = "/tmp/composer-replication"


class HFJobsCredentialsError(UserError, RuntimeError):
    """No Hugging Face token (``hf auth login`` or ``HF_TOKEN``)."""


@dataclass
class HFJobHandle:
    rank: int
    job_id: str
    url: str


class HFJobsExecutor:
    """Start replicas on Hugging Face Jobs; same calls as :class:`LocalProcessExecutor`.

    ``project`` is where each job installs composer-replication from: a pip URL, or a local
    wheel that is uploaded once to the dataset repo ``staging_repo`` (private, created if
    missing) and downloaded by the job with the token passed as its ``HF_TOKEN`` secret. A
    project directory is refused (a job cannot see this machine: build a wheel). ``api`` is an
    ``HfApi`` (tests pass a recording stand-in); by default one is built and the token is
    checked here (``token`` argument, else ``HF_TOKEN`` / the cached login).
    """

    def __init__(
        self,
        project: str | Path,
        staging_repo: str | None = None,
        flavor: str = "cpu-basic",
        image: str = DEFAULT_IMAGE,
        namespace: str | None = None,
        token: str | None = None,
        timeout: str | int = "2h",
        env: dict[str, str] | None = None,
        secrets: dict[str, str] | None = None,
        endpoint: str | None = None,
        poll_s: float = 10.0,
        api: Any = None,
    ):
        self.source = project_source(project)
        if self.source.kind == "dir":
            raise ValueError(
                f"HFJobsExecutor: project={project}: a job cannot read a local directory; build "
                "a wheel (`python -m pip wheel --no-deps -w dist .`) and pass it, or a pip URL"
            )
        if self.source.kind == "wheel" and not staging_repo:
            raise ValueError(
                "HFJobsExecutor: a local wheel needs staging_repo= (a dataset repo the jobs "
                "download it from, e.g. 'my-user/cr-wheels')"
            )
        if api is None:
            from huggingface_hub import HfApi, get_token

            token = token or get_token()
            if not token:
                raise HFJobsCredentialsError(
                    "HFJobsExecutor: no Hugging Face token; run `hf auth login` or set HF_TOKEN"
                )
            api = HfApi(token=token, endpoint=endpoint)
        self.api, self.token, self.staging_repo = api, token, staging_repo
        self.flavor, self.image = flavor, image
        self.namespace, self.timeout, self.poll_s = namespace, timeout, poll_s
        self.env, self.secrets = dict(env or {}), dict(secrets or {})
        if self.source.kind == "wheel" and token:
            self.secrets.setdefault("HF_TOKEN", token)

    def stage_project(self) -> None:
        """Upload a local wheel to ``staging_repo`` (no-op for a URL)."""
        if self.source.kind != "wheel":
            return
        assert self.source.local is not None
        self.api.create_repo(
            repo_id=self.staging_repo, repo_type="dataset", private=True, exist_ok=True
        )
        self.api.upload_file(
            path_or_fileobj=str(self.source.local),
            path_in_repo=self.source.local.name,
            repo_id=self.staging_repo,
            repo_type="dataset",
        )

    def install_command(self) -> str:
        """The shell command a job runs first: install this project (see :mod:`.install`)."""
        if self.source.kind == "url":
            return f"pip install --quiet {shlex.quote(self.source.requirement())}"
        assert self.source.local is not None
        name = self.source.local.name
        return (
            f"pip install --quiet huggingface_hub && hf download {shlex.quote(self.staging_repo)}"
            f" {shlex.quote(name)} --repo-type dataset --local-dir {JOB_WHEEL_DIR} && "
            "pip install --quiet " + shlex.quote(self.source.requirement(f"{JOB_WHEEL_DIR}/{name}"))
        )

    def job_spec(
        self, rank: int, n_replicas: int, entrypoint: str, entrypoint_args: dict[str, Any]
    ) -> dict[str, Any]:
        """Keyword arguments for ``HfApi.run_job`` for replica ``rank``."""
        run = (
            f"{self.install_command()} && python -m "
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
        self.stage_project()
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
            try:
                if state != "succeeded":
                    raise LookupError("failed")
                results.append(parse_result(logs))
            except LookupError as err:
                failures[h.rank] = (None, f"job {h.url}: {err}:\n" + "\n".join(logs[-20:]))
        if failures:
            raise ReplicaFailedError(failures)
        return results
