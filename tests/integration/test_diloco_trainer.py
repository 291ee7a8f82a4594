"""DiLoCo on the object-store backend with the real trainer: two replicas of ``run_training``
(real OS processes) on a tiny random Llama, meeting on ``file://`` and on ``s3://`` (moto's
server on 127.0.0.1), started by the launcher, by ``LocalProcessExecutor`` with the trainer
entrypoint, and by the Modal / HF Jobs executors against recording SDK stand-ins (the real
wire needs a cloud account). Every run ends with bit-equal weights on both replicas that differ
from the start, checked by the DiLoCo checksum and independently from the saved safetensors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from support.fake_cloud import FakeHfApi, FakeModal
from support.s3 import local_s3
from support.tiny_run import save_tiny_model, tiny_run_overrides

from composer_replication.diloco import launcher
from composer_replication.diloco.launcher import LaunchResult, launch_diloco, launch_with_executor

pytestmark = pytest.mark.timeout(600)
BUCKET = "diloco-trainer"


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(params=["file", "s3"])
def store(request, tmp_path):
    """(store_uri, extra overrides) on a fresh prefix."""
    if request.param == "file":
        yield f"file://{tmp_path}/store", []
        return
    pytest.importorskip("s3fs", reason="install the serverless extra")
    with local_s3(BUCKET) as endpoint:
        yield f"s3://{BUCKET}/run", [f"diloco.store_endpoint_url={endpoint}"]


def _overrides(tiny_model_dir, tmp_path, store) -> list[str]:
    uri, extra = store
    return [*tiny_run_overrides(tiny_model_dir, tmp_path / "run", uri), *extra]


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path / "model.safetensors"))


def _assert_equal_and_trained(result: LaunchResult, tiny_model_dir: Path, local: bool) -> None:
    assert result.ok, [(r.replica, r.exit_code) for r in result.replicas]
    finals = [r.final for r in result.replicas]
    assert finals[0]["checksum"] == finals[1]["checksum"]
    assert finals[0]["initial_checksum"] == finals[1]["initial_checksum"]
    assert finals[0]["checksum"] != finals[0]["initial_checksum"]
    assert [(f["inner_steps"], f["syncs"], f["synced_at_end"]) for f in finals] == [
        (4, 2, True)
    ] * 2
    assert [s["checksum"] for s in result.replicas[0].syncs] == [
        s["checksum"] for s in result.replicas[1].syncs
    ]
    assert result.weights_equal
    if local:  # an independent check: the saved final weights, tensor by tensor
        start = _weights(tiny_model_dir)
        w0, w1 = (_weights(r.output_dir / "final") for r in result.replicas)
        assert w0.keys() == w1.keys() == start.keys()
        assert all(torch.equal(w0[k], w1[k]) for k in w0)
        assert any(not torch.equal(w0[k], start[k]) for k in w0)


# one store backend per launch path (file:// and s3:// are each compared replica by replica in
# test_diloco_serverless.py; the HF Jobs test below runs on s3 too)
@pytest.mark.parametrize("store", ["file"], indirect=True)
def test_launcher_object_store_trains_two_replicas_without_a_lighthouse(
    tiny_model_dir, tmp_path, store, monkeypatch
):
    def no_lighthouse(*a, **k):
        raise AssertionError("the object_store backend must not start a torchft lighthouse")

    monkeypatch.setattr(launcher, "start_lighthouse", no_lighthouse)
    result = launch_diloco(None, _overrides(tiny_model_dir, tmp_path, store), 2)
    assert result.lighthouse is None
    _assert_equal_and_trained(result, tiny_model_dir, local=True)


@pytest.mark.parametrize("store", ["s3"], indirect=True)
def test_local_process_executor_with_the_trainer_entrypoint(tiny_model_dir, tmp_path, store):
    result = launch_with_executor(None, _overrides(tiny_model_dir, tmp_path, store), 2)
    _assert_equal_and_trained(result, tiny_model_dir, local=True)


def test_modal_executor_fake_sdk_trainer_replicas_real_wire_needs_modal_account(
    tiny_model_dir, tmp_path
):
    """ModalExecutor's launch/collect with the trainer entrypoint; the fake SDK runs each
    spawned call in a local process instead of a Modal container."""
    from composer_replication.diloco.serverless.modal import ModalExecutor

    sdk = FakeModal()
    ex = ModalExecutor("https://example.org/composer_replication.whl", sdk=sdk)
    store = (f"file://{tmp_path}/store", [])
    result = launch_with_executor(
        None, _overrides(tiny_model_dir, tmp_path, store), 2, executor=ex, timeout_s=500
    )
    _assert_equal_and_trained(result, tiny_model_dir, local=True)
    assert [c[0] for c in sdk.calls].count("spawn") == 2


def test_hf_jobs_executor_fake_sdk_trainer_replicas_on_s3_real_wire_needs_hf_account(
    tiny_model_dir, tmp_path
):
    """HFJobsExecutor's launch/poll/collect with the trainer entrypoint; each job's bash command
    runs locally (pip recorded, not run) and its result comes back through its log."""
    pytest.importorskip("s3fs", reason="install the serverless extra")
    from composer_replication.diloco.serverless.hf_jobs import HFJobsExecutor

    api = FakeHfApi(tmp_path)
    ex = HFJobsExecutor("https://example.org/composer_replication.whl", api=api, poll_s=0.2)
    with local_s3(BUCKET) as endpoint:
        store = (f"s3://{BUCKET}/hf", [f"diloco.store_endpoint_url={endpoint}"])
        result = launch_with_executor(
            None, _overrides(tiny_model_dir, tmp_path, store), 2, executor=ex, timeout_s=500
        )
    _assert_equal_and_trained(result, tiny_model_dir, local=True)
    assert len(api.installs) == 2


def test_agent_config_two_replicas_end_equal(tiny_model_dir, tmp_path):
    """The agent quickstart (tool environment, multi-turn rollouts, tool template) under
    DiLoCo: 4 inner steps, a sync every 2, equal final weights on both replicas."""
    overrides = tiny_run_overrides(tiny_model_dir, tmp_path / "run", f"file://{tmp_path}/store")
    result = launch_diloco("agent_quickstart.yaml", [*overrides, "rollout.max_turns=2"], 2)
    _assert_equal_and_trained(result, tiny_model_dir, local=True)
