"""Executors: LocalProcessExecutor with real spawned processes; the Modal and HF Jobs executors'
real launch/poll/collect code against recording SDK stand-ins (tests/support/fake_cloud.py:
the remote side runs as a local process), and HF Jobs up to the wire (real HTTP requests from
huggingface_hub to a local recording server). The real wire needs a Modal / HF account."""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from support.fake_cloud import FakeHfApi, FakeModal

from composer_replication.diloco.serverless import (
    LocalProcessExecutor,
    ReplicaFailedError,
    ReplicaTimeoutError,
)
from composer_replication.diloco.serverless.hf_jobs import HFJobsCredentialsError, HFJobsExecutor
from composer_replication.diloco.serverless.install import project_source
from composer_replication.diloco.serverless.modal import ModalCredentialsError, ModalExecutor
from composer_replication.diloco.serverless.train_entry import TRAIN_ENTRYPOINT

WHEEL_URL = "https://example.org/dist/composer_replication-0.1.0-py3-none-any.whl"
REQ = "composer-replication[diloco,serverless] @ "


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
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setenv("HF_TOKEN_PATH", str(tmp_path / "token"))
    with pytest.raises(HFJobsCredentialsError, match="HF_TOKEN"):
        HFJobsExecutor(WHEEL_URL)


def test_hf_jobs_up_to_the_wire_real_wire_needs_hf_account(hub_server, monkeypatch):
    """The POSTs huggingface_hub really sends for two replicas, and the status polls."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # the suite runs offline

    ex = HFJobsExecutor(
        WHEEL_URL,
        flavor="a10g-small",
        namespace="my-org",
        token="hf_fake_token",
        endpoint=hub_server,
        secrets={"AWS_SECRET_ACCESS_KEY": "s3cr3t"},
    )
    args = {"config_yaml": "diloco:\n  store_uri: s3://bucket/run\n", "overrides": []}
    handles = ex.launch_replicas(2, TRAIN_ENTRYPOINT, args)
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
        assert f"pip install --quiet '{REQ}{WHEEL_URL}'" in script
        assert "composer_replication.diloco.serverless.entry" in script
        assert TRAIN_ENTRYPOINT in script and "s3://bucket/run" in script
    assert ex.poll(handles) == ["succeeded", "failed"]
    gets = [r[1] for r in _Recorder.requests if r[0] == "GET"]
    assert gets == ["/api/jobs/my-org/job-0", "/api/jobs/my-org/job-1"]


def _wheel(tmp_path):
    wheel = tmp_path / "composer_replication-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"PK")  # only its path is used: the fake job's pip records, not installs
    return wheel


def test_hf_jobs_fake_sdk_stages_wheel_and_collects_results(tmp_path):
    """A local wheel is uploaded once to the staging repo; each job downloads it (token as a
    secret), installs it by path, runs the entry module and reports through its log."""
    api = FakeHfApi(tmp_path)
    wheel = _wheel(tmp_path)
    ex = HFJobsExecutor(wheel, staging_repo="me/cr-wheels", token="hf_t", api=api, poll_s=0.05)
    handles = ex.launch_replicas(2, "os:getenv", {"key": "REPLICA_RANK"})
    assert ex.collect(handles, timeout=120) == ["0", "1"]
    methods = [c[0] for c in api.calls]
    assert methods[:4] == ["create_repo", "upload_file", "run_job", "run_job"]
    assert api.calls[0][1] == {
        "repo_id": "me/cr-wheels",
        "repo_type": "dataset",
        "private": True,
        "exist_ok": True,
    }
    assert api.calls[1][1]["path_or_fileobj"] == str(wheel)
    assert api.calls[1][1]["path_in_repo"] == wheel.name
    for rank, (_, spec) in enumerate(api.calls[2:4]):
        assert spec["secrets"] == {"HF_TOKEN": "hf_t"}
        assert spec["env"] == {"REPLICA_RANK": str(rank), "REPLICA_WORLD_SIZE": "2"}
    assert (
        api.installs.count(
            f"pip install --quiet {REQ}file:///tmp/composer-replication/{wheel.name}"
        )
        == 2
    )
    assert (
        api.installs.count(
            f"hf download me/cr-wheels {wheel.name} --repo-type dataset "
            "--local-dir /tmp/composer-replication"
        )
        == 2
    )
    assert "inspect_job" in methods and methods.count("fetch_job_logs") == 2


def test_hf_jobs_fake_sdk_failed_job_reports_its_log(tmp_path):
    api = FakeHfApi(tmp_path)
    ex = HFJobsExecutor(WHEEL_URL, api=api, poll_s=0.05)
    cmd = [sys.executable, "-c", "import sys; sys.exit(3)"]
    handles = ex.launch_replicas(2, "subprocess:run", {"args": cmd, "check": True})
    with pytest.raises(ReplicaFailedError) as info:
        ex.collect(handles, timeout=120)
    assert sorted(info.value.failures) == [0, 1]
    assert "CalledProcessError" in info.value.failures[0][1]
    assert "fake/job-0" in info.value.failures[0][1]


def test_hf_jobs_fake_sdk_timeout_cancels_running_jobs(tmp_path):
    api = FakeHfApi(tmp_path)
    ex = HFJobsExecutor(WHEEL_URL, api=api, poll_s=0.05)
    handles = ex.launch_replicas(1, "subprocess:run", {"args": ["sleep", "60"]})
    with pytest.raises(ReplicaTimeoutError, match="HF jobs still running"):
        ex.collect(handles, timeout=2)
    assert ("cancel_job", {"job_id": "job-0", "namespace": None}) in api.calls


def test_hf_jobs_refuses_a_directory_and_an_unstaged_wheel(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[project]\nname='x'\n")
    with pytest.raises(ValueError, match="build\n?.*wheel"):
        HFJobsExecutor(tmp_path, api=FakeHfApi(tmp_path))
    with pytest.raises(ValueError, match="staging_repo"):
        HFJobsExecutor(_wheel(tmp_path), api=FakeHfApi(tmp_path))


@pytest.mark.parametrize("bad", ["composer-replication", "no/such/file.whl"])
def test_project_must_be_a_wheel_dir_or_url(bad):
    with pytest.raises(ValueError, match="expected a wheel file"):
        project_source(bad)


def test_modal_needs_credentials():
    with pytest.raises(ModalCredentialsError, match="MODAL_TOKEN_ID"):
        ModalExecutor(WHEEL_URL, sdk=FakeModal(token=False))


def test_modal_needs_a_project_or_image():
    with pytest.raises(ValueError, match="project="):
        ModalExecutor(sdk=FakeModal())


def test_modal_image_installs_the_given_wheel_or_directory(tmp_path):
    sdk = FakeModal()
    wheel = _wheel(tmp_path)
    ModalExecutor(wheel, python_version="3.12", sdk=sdk)
    remote = f"/opt/composer-replication/{wheel.name}"
    assert [c for c in sdk.calls if c[0] == "image"] == [
        ("image", "debian_slim", "3.12"),
        ("image", "add_local_file", str(wheel), remote, True),
        ("image", "pip_install", f"{REQ}file://{remote}"),
    ]
    (tmp_path / "pyproject.toml").write_text("[project]\nname='x'\n")
    sdk = FakeModal()
    ModalExecutor(tmp_path, sdk=sdk)
    steps = [c[1:] for c in sdk.calls if c[0] == "image"]
    assert steps[1][:4] == (
        "add_local_dir",
        str(tmp_path),
        "/opt/composer-replication/project",
        True,
    )
    assert ".git" in steps[1][4]
    assert steps[2] == ("pip_install", f"{REQ}file:///opt/composer-replication/project")


def test_modal_fake_sdk_launch_poll_collect(tmp_path):
    """Function options, one spawn per replica inside the app run, the container body sets the
    rank, results in rank order, the run closed after collect."""
    sdk = FakeModal()
    ex = ModalExecutor(WHEEL_URL, gpu="A100", timeout_s=1800, secrets=("aws",), sdk=sdk)
    opts = next(c[1] for c in sdk.calls if c[0] == "function")
    assert opts["gpu"] == "A100" and opts["timeout"] == 1800 and opts["serialized"] is True
    assert opts["secrets"] == [("secret", "aws")] and opts["image"] is ex.image
    handles = ex.launch_replicas(2, "os:getenv", {"key": "REPLICA_WORLD_SIZE"})
    assert [c[1] for c in sdk.calls if c[0] == "spawn"] == [
        (0, 2, "os:getenv", {"key": "REPLICA_WORLD_SIZE"}),
        (1, 2, "os:getenv", {"key": "REPLICA_WORLD_SIZE"}),
    ]
    assert ex.collect(handles, timeout=120) == ["2", "2"]
    assert ex.poll(handles) == ["succeeded", "succeeded"]
    names = [c[0] for c in sdk.calls]
    assert names.index("run_enter") < names.index("spawn") and names[-1] == "run_exit"


def test_modal_fake_sdk_failure_and_timeout(tmp_path):
    sdk = FakeModal()
    ex = ModalExecutor(WHEEL_URL, sdk=sdk)
    cmd = [sys.executable, "-c", "import sys; sys.exit(3)"]
    handles = ex.launch_replicas(1, "subprocess:run", {"args": cmd, "check": True})
    with pytest.raises(ReplicaFailedError, match="CalledProcessError"):
        ex.collect(handles, timeout=120)
    handles = ex.launch_replicas(2, "subprocess:run", {"args": ["sleep", "60"]})
    with pytest.raises(ReplicaTimeoutError, match="Modal replicas still running"):
        ex.collect(handles, timeout=2)
    assert sdk.calls.count(("cancel",)) == 2 and sdk.calls[-1] == ("run_exit",)
