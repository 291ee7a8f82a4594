"""Serverless DiLoCo: replicas as separate processes (LocalProcessExecutor) that meet only
through ObjectStoreAllReduce, on file:// and on s3:// served by moto's standalone server on
127.0.0.1. torchft's DiLoCo runs the outer step in both; nothing mocks the all-reduce."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest
import torch
from support.diloco_toy import train_single

from composer_replication.diloco.serverless import LocalProcessExecutor, ReplicaFailedError

pytestmark = pytest.mark.timeout(400)
ENTRY = "support.diloco_toy:replica_entrypoint"


def _run(tmp_path, n: int, **options) -> list[dict]:
    """n toy replicas via LocalProcessExecutor; records in rank order (tensors in r{rank}.pt)."""
    ex = LocalProcessExecutor(tmp_path / "exec")
    args = {"world": n, "backend": "object_store", "out": f"{tmp_path}/r{{rank}}.json", **options}
    handles = ex.launch_replicas(n, ENTRY, args)
    return ex.collect(handles, timeout=300)


def _check_equal_after_every_sync(tmp_path, n: int, syncs: int) -> None:
    tensors = [torch.load(tmp_path / f"r{r}.pt", weights_only=True) for r in range(n)]
    for k in range(syncs):
        for r in range(n):
            assert all(
                torch.equal(a, b)
                for a, b in zip(tensors[0]["post"][k], tensors[r]["post"][k], strict=True)
            ), f"sync {k}: rank {r} differs from rank 0"
            assert any(
                not torch.equal(a, b)
                for a, b in zip(tensors[r]["pre"][k], tensors[r]["post"][k], strict=True)
            ), f"sync {k}: rank {r} unchanged by the sync"


def _gap(rec: dict, steps: int) -> tuple[float, float]:
    base = train_single(steps, batch=32, shards=2, lr=0.03)["eval_loss"]
    return (rec["eval_loss"] - base) / base, base


CONVERGENCE = {"sync_every": 10, "lr": 0.03, "outer_lr": 0.7, "outer_momentum": 0.5}


def test_file_store_three_replicas_equal_after_every_sync(tmp_path):
    n = 3
    recs = _run(
        tmp_path, n, store_uri=f"file://{tmp_path}/store", steps=12, sync_every=4, keep_tensors=True
    )
    assert [r["rank"] for r in recs] == list(range(n))
    assert [len(r["syncs"]) for r in recs] == [3] * n
    assert len({r["final_checksum"] for r in recs}) == 1
    _check_equal_after_every_sync(tmp_path, n, 3)


def test_file_store_two_replicas_equal_after_every_sync_and_converge(tmp_path):
    steps = 600
    recs = _run(
        tmp_path,
        2,
        store_uri=f"file://{tmp_path}/store",
        steps=steps,
        keep_tensors=True,
        **CONVERGENCE,
    )
    assert recs[0]["final_checksum"] == recs[1]["final_checksum"]
    assert [len(r["syncs"]) for r in recs] == [steps // 10] * 2
    _check_equal_after_every_sync(tmp_path, 2, steps // 10)
    gap, base = _gap(recs[0], steps)
    print(
        f"\nfile:// convergence: DiLoCo {recs[0]['eval_loss']:.5f} vs sync {base:.5f}: {gap:+.2%}"
    )
    assert abs(gap) <= 0.02


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def moto_s3(monkeypatch):
    pytest.importorskip("s3fs", reason="install the serverless extra")
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("moto server did not start") from None
            time.sleep(0.2)
    import s3fs

    fs = s3fs.S3FileSystem(endpoint_url=endpoint)
    fs.mkdir("diloco-test")
    yield endpoint
    proc.terminate()
    proc.wait(10)


def test_s3_equal_after_every_sync_converge_and_clean_rounds(tmp_path, moto_s3):
    import s3fs

    steps = 600
    recs = _run(
        tmp_path,
        2,
        store_uri="s3://diloco-test/conv",
        endpoint_url=moto_s3,
        steps=steps,
        keep_tensors=True,
        **CONVERGENCE,
    )
    _check_equal_after_every_sync(tmp_path, 2, steps // 10)
    assert [len(r["syncs"]) for r in recs] == [steps // 10] * 2
    assert all(
        a["checksum"] == b["checksum"] for a, b in zip(*(r["syncs"] for r in recs), strict=True)
    )
    assert recs[0]["wire"]["rounds"] == steps // 10 and recs[0]["wire"]["bytes_sent"] > 0
    gap, base = _gap(recs[0], steps)
    print(f"\ns3:// convergence: DiLoCo {recs[0]['eval_loss']:.5f} vs sync {base:.5f}: {gap:+.2%}")
    assert abs(gap) <= 0.02
    fs = s3fs.S3FileSystem(endpoint_url=moto_s3)
    left = fs.ls("diloco-test/conv")
    assert len(left) == 1, f"old rounds not cleaned: {left}"


def test_missing_replica_makes_others_fail_with_timeout_not_hang(tmp_path):
    ex = LocalProcessExecutor(tmp_path / "exec")
    handles = ex.launch_replicas(
        3,
        ENTRY,
        {
            "world": 3,
            "backend": "object_store",
            "store_uri": f"file://{tmp_path}/store",
            "steps": 8,
            "sync_every": 4,
            "timeout": 3,
            "absent_rank": 2,
            "out": f"{tmp_path}/x{{rank}}.json",
        },
    )
    t0 = time.monotonic()
    with pytest.raises(ReplicaFailedError) as info:
        ex.collect(handles, timeout=200, fail_fast=False)
    assert time.monotonic() - t0 < 200
    failures = info.value.failures
    assert sorted(failures) == [0, 1]
    for code, err in failures.values():
        assert code == 1
        assert "ObjectStoreTimeoutError" in err
        assert "round 0: rank(s) [2] of world_size 3" in err
