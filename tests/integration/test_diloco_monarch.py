"""DiLoCo replicas as Monarch actors (``--launcher monarch``): a 2-process mesh on this host,
each actor running the real trainer on a tiny random Llama (object_store backend); both end
with bit-equal weights that differ from the start (DiLoCo's checksums, and the saved
safetensors independently), their output prefixed ``[r0]``/``[r1]``. A replica that fails while
its peer trains is named, the peer is stopped instead of waiting for the sync, and no process
is left. The torchft backend under Monarch was run by hand (see ``diloco/monarch.py``)."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file
from support.tiny_run import save_tiny_model, tiny_run_overrides
from typer.testing import CliRunner

pytest.importorskip("monarch.actor", reason="torchmonarch is part of the dev extra")

from composer_replication.cli import app  # noqa: E402
from composer_replication.diloco import monarch  # noqa: E402
from composer_replication.diloco.monarch import launch_monarch, prefixed_output  # noqa: E402

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def test_two_actors_train_to_equal_weights(tiny_model_dir, tmp_path, capfd):
    overrides = tiny_run_overrides(tiny_model_dir, tmp_path / "run", f"file://{tmp_path}/store")
    lines: list[str] = []
    before = _children()
    result = launch_monarch(None, overrides, 2, echo=lines.append)
    assert result.ok, (lines, [(r.replica, r.exit_code, r.error) for r in result.replicas])
    f0, f1 = (r.final for r in result.replicas)
    assert f0["checksum"] == f1["checksum"] != f0["initial_checksum"]
    assert (f0["inner_steps"], f0["syncs"]) == (f1["inner_steps"], f1["syncs"]) == (4, 2)
    assert [len(r.syncs) for r in result.replicas] == [2, 2]
    w0, w1 = (load_file(str(r.output_dir / "final" / "model.safetensors")) for r in result.replicas)
    start = load_file(str(tiny_model_dir / "model.safetensors"))
    assert all(torch.equal(w0[k], w1[k]) for k in w0)
    assert any(not torch.equal(w0[k], start[k]) for k in w0)
    assert result.lighthouse is None and "Monarch mesh of 2 processes" in lines[0]
    out = capfd.readouterr().out
    assert "[r0] [diloco] replica 0: final checksum" in out, out[-2000:]
    assert "[r1] [diloco] replica 1: final checksum" in out, out[-2000:]
    assert _children() <= before  # the mesh's processes are gone


@pytest.mark.timeout(150)
def test_a_failing_replica_is_named_and_its_peer_is_stopped(tiny_model_dir, tmp_path):
    """Replica 1 cannot create its output directory (a file is in the way); replica 0 trains
    and would wait for it at the first sync for ``diloco.timeout_s`` (300 s) if the mesh were
    not stopped at once."""
    overrides = tiny_run_overrides(tiny_model_dir, tmp_path / "run", f"file://{tmp_path}/store")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "replica-1").write_text("in the way")
    lines: list[str] = []
    before = _children()
    result = launch_monarch(None, overrides, 2, echo=lines.append)
    assert not result.ok and not result.weights_equal
    r0, r1 = result.replicas
    assert r1.exit_code == 1 and r1.error.startswith("replica 1 failed: "), r1.error
    assert "replica-1" in r1.error
    assert (r0.exit_code, r0.error) == (1, "stopped because replica 1 failed")
    assert any(line.startswith("[diloco] replica 1 failed") for line in lines), lines
    rows = json.loads(result.summary.read_text())["replicas"]
    assert [row["exit_code"] for row in rows] == [1, 1] and "error" in rows[1]
    assert _children() <= before


def test_prefixed_output_starts_every_line_with_the_replica(monkeypatch):
    buf = io.StringIO()
    monkeypatch.setattr(sys, "stdout", buf)
    with prefixed_output("[r1] "):
        print("a\nb", end="")
        print("c\rd")
        print("\rprogress\n")
    print("after")
    assert buf.getvalue() == "[r1] a\n[r1] bc\r[r1] d\n\r[r1] progress\n\nafter\n"


def test_missing_torchmonarch_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setattr(monarch, "ReplicaActor", None)
    with pytest.raises(monarch.MonarchMissingError, match="pip install torchmonarch"):
        launch_monarch(None, [f"output_dir={tmp_path}"], 2)
    r = CliRunner().invoke(app, ["diloco", "--launcher", "monarch", f"output_dir={tmp_path}/x"])
    assert r.exit_code == 2, r.output
    assert "pip install torchmonarch" in " ".join(r.output.split())


def test_the_controllers_log_records_keep_their_text(tiny_model_dir, tmp_path, caplog):
    """Monarch's filter would rewrite every later log message of this process to
    ``[actor=<root>] ...`` (once per launch); the launcher turns that prefix off."""
    import logging

    overrides = tiny_run_overrides(tiny_model_dir, tmp_path / "run", f"file://{tmp_path}/store")
    bad = [
        o if not o.startswith("model.name=") else f"model.name={tmp_path}/nope" for o in overrides
    ]
    launch_monarch(None, bad, 2, echo=lambda _: None)
    log = logging.getLogger("composer_replication.test_after_monarch")
    with caplog.at_level(logging.WARNING, logger=log.name):
        log.warning("quorum timed out")
    assert [r.getMessage() for r in caplog.records] == ["quorum timed out"]
