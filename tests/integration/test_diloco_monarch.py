"""DiLoCo replicas as Monarch actors (``--launcher monarch``): a 2-process mesh on this host,
each actor running the real trainer on a tiny random Llama; both end with bit-equal weights
that differ from the start (DiLoCo's checksums, and the saved safetensors independently). A
replica that fails surfaces as an error naming it, and nothing is left running."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from support.tiny_run import save_tiny_model, tiny_run_overrides

pytest.importorskip("monarch.actor", reason="torchmonarch is part of the dev extra")

from composer_replication.diloco.monarch import launch_monarch  # noqa: E402

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def test_two_actors_train_to_equal_weights(tiny_model_dir, tmp_path):
    overrides = tiny_run_overrides(tiny_model_dir, tmp_path / "run", f"file://{tmp_path}/store")
    lines: list[str] = []
    result = launch_monarch(None, overrides, 2, echo=lines.append)
    assert result.ok, (lines, [(r.replica, r.exit_code) for r in result.replicas])
    f0, f1 = (r.final for r in result.replicas)
    assert f0["checksum"] == f1["checksum"] != f0["initial_checksum"]
    assert (f0["inner_steps"], f0["syncs"]) == (f1["inner_steps"], f1["syncs"]) == (4, 2)
    w0, w1 = (load_file(str(r.output_dir / "final" / "model.safetensors")) for r in result.replicas)
    start = load_file(str(tiny_model_dir / "model.safetensors"))
    assert all(torch.equal(w0[k], w1[k]) for k in w0)
    assert any(not torch.equal(w0[k], start[k]) for k in w0)
    assert result.lighthouse is None and "Monarch mesh of 2 processes" in lines[0]


def test_a_failing_replica_is_named_and_nothing_hangs(tiny_model_dir, tmp_path):
    overrides = tiny_run_overrides(tiny_model_dir, tmp_path / "run", f"file://{tmp_path}/store")
    lines: list[str] = []
    # a model path that does not exist: every replica fails while loading it
    bad = [
        o if not o.startswith("model.name=") else f"model.name={tmp_path}/nope" for o in overrides
    ]
    result = launch_monarch(None, bad, 2, echo=lines.append)
    assert not result.ok and not result.weights_equal
    assert any("replica" in ln and "nope" in ln for ln in lines), lines
