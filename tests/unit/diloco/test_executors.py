"""Executors: LocalProcessExecutor with real spawned processes; the Modal and HF Jobs executors
up to the wire (HF: real HTTP requests from huggingface_hub to a local recording server;
Modal: the function spec and call arguments, since its wire is gRPC to Modal's servers)."""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from composer_replication.diloco.serverless import (
    LocalProcessExecutor,
    ReplicaFailedError,
    ReplicaTimeoutError,
)


def test_local_executor_sets_rank_env_and_returns_results_in_order(tmp_path):
    ex = LocalProcessExecutor(tmp_path)
    handles = ex.launch_replicas(3, "os:getenv", {"key": "REPLICA_RANK"})
    assert ex.collect(handles, timeout=120) == ["0", "1", "2"]
    assert ex.poll(handles) == ["succeeded"] * 3


def test_local_executor_propagates_child_failure_and_exit_code(tmp_path):
    ex = LocalProcessExecutor(tmp_path)
    cmd = [sys.executable, "-c", "import sys; sys.exit(3)"]
    handles = ex.launch_replicas(2, "subprocess:run", {"args": cmd, "check": True})
    with pytest.raises(ReplicaFailedError, match="rank 0: exit code 1") as info:
        ex.collect(handles, timeout=120, fail_fast=False)
    assert sorted(info.value.failures) == [0, 1]
    code, err = info.value.failures[1]
    assert code == 1 and "CalledProcessError" in err and "exit status 3" in err


def test_local_executor_timeout_terminates(tmp_path):
    ex = LocalProcessExecutor(tmp_path)
    handles = ex.launch_replicas(1, "subprocess:run", {"args": ["sleep", "60"]})
    with pytest.raises(ReplicaTimeoutError, match=r"replicas \[0\]"):
        ex.collect(handles, timeout=3)
    assert ex.poll(handles) == ["failed"]


@pytest.mark.parametrize("entry", ["no_colon", "no_such_module_xyz:f", "os:no_such_function"])
def test_bad_entrypoint_fails_before_spawning(tmp_path, entry):
    with pytest.raises(ValueError, match="entrypoint"):
        LocalProcessExecutor(tmp_path).launch_replicas(2, entry)


class _Recorder(BaseHTTPRequestHandler):
    requests: list = []

    def _reply(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):  # noqa: N802 - http.server API
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(
            ("POST", self.path, {k.lower(): v for k, v in self.headers.items()}, body)
        )
        rank = body["environment"]["REPLICA_RANK"]
        self._reply(
            {
                "id": f"job-{rank}",
                "owner": {"id": "1", "name": "my-org", "type": "org"},
                "status": {"stage": "RUNNING"},
            }
        )

    def do_GET(self):  # noqa: N802
        type(self).requests.append(("GET", self.path, dict(self.headers), None))
        job = self.path.rsplit("/", 1)[-1]
        self._reply(
            {
                "id": job,
                "owner": {"id": "1", "name": "my-org", "type": "org"},
                "status": {"stage": "COMPLETED" if job == "job-0" else "ERROR"},
            }
        )

    def log_message(self, *args):
        pass


@pytest.fixture
def hub_server():
    _Recorder.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_hf_jobs_needs_a_token(monkeypatch, tmp_path):
    from composer_replication.diloco.serverless.hf_jobs import (
        HFJobsCredentialsError,
        HFJobsExecutor,
    )

    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setenv("HF_TOKEN_PATH", str(tmp_path / "token"))
    with pytest.raises(HFJobsCredentialsError, match="HF_TOKEN"):
        HFJobsExecutor()


def test_hf_jobs_up_to_the_wire(hub_server, monkeypatch):
    """The POSTs huggingface_hub really sends for two replicas, and the status polls."""
    from huggingface_hub import constants

    from composer_replication.diloco.serverless.hf_jobs import HFJobsExecutor

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # the suite runs offline

    ex = HFJobsExecutor(
        flavor="a10g-small",
        namespace="my-org",
        token="hf_fake_token",
        endpoint=hub_server,
        secrets={"AWS_SECRET_ACCESS_KEY": "s3cr3t"},
    )
    args = {"store_uri": "s3://bucket/run", "steps": 100, "out": "/tmp/r{rank}.json"}
    handles = ex.launch_replicas(2, "support.diloco_toy:replica_entrypoint", args)
    assert [h.job_id for h in handles] == ["job-0", "job-1"]
    posts = [r for r in _Recorder.requests if r[0] == "POST"]
    assert [p[1] for p in posts] == ["/api/jobs/my-org"] * 2
    for rank, (_, _, headers, body) in enumerate(posts):
        assert headers["authorization"] == "Bearer hf_fake_token"
        assert body["flavor"] == "a10g-small"
        assert body["environment"]["REPLICA_RANK"] == str(rank)
        assert body["environment"]["REPLICA_WORLD_SIZE"] == "2"
        assert "AWS_SECRET_ACCESS_KEY" in body["secrets"]
        script = " ".join(body.get("command") or []) + " " + " ".join(body.get("arguments") or [])
        assert "composer_replication.diloco.serverless.entry" in script
        assert "support.diloco_toy:replica_entrypoint" in script
        assert "s3://bucket/run" in script
    assert ex.poll(handles) == ["succeeded", "failed"]
    gets = [r[1] for r in _Recorder.requests if r[0] == "GET"]
    assert gets == ["/api/jobs/my-org/job-0", "/api/jobs/my-org/job-1"]


def test_modal_needs_credentials(monkeypatch):
    pytest.importorskip("modal")
    import modal

    from composer_replication.diloco.serverless.modal import ModalCredentialsError, ModalExecutor

    monkeypatch.delenv("MODAL_TOKEN_ID", raising=False)
    monkeypatch.delenv("MODAL_TOKEN_SECRET", raising=False)
    if modal.config.config.get("token_id"):
        pytest.skip("this machine has a Modal profile configured")
    with pytest.raises(ModalCredentialsError, match="MODAL_TOKEN_ID"):
        ModalExecutor()


def test_modal_up_to_the_wire(monkeypatch):
    pytest.importorskip("modal")
    import modal

    from composer_replication.diloco.serverless.modal import ModalExecutor, _modal_replica

    monkeypatch.setenv("MODAL_TOKEN_ID", "ak-fake")
    monkeypatch.setenv("MODAL_TOKEN_SECRET", "as-fake")
    ex = ModalExecutor(gpu="A100", timeout_s=1800)
    assert isinstance(ex.function, modal.Function)
    assert ex.function_options["gpu"] == "A100" and ex.function_options["timeout"] == 1800
    assert isinstance(ex.function_options["image"], modal.Image)
    args = ex.call_args(1, 4, "support.diloco_toy:replica_entrypoint", {"steps": 3})
    assert args == (1, 4, "support.diloco_toy:replica_entrypoint", {"steps": 3})
    # the function body the container runs: rank/world env set, entrypoint called
    monkeypatch.delenv("REPLICA_RANK", raising=False)
    assert _modal_replica(2, 4, "os:getenv", {"key": "REPLICA_RANK"}) == "2"
