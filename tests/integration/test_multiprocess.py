"""Our trainer in two processes (torchrun, gloo on CPU) with every channel on: the ranks end
with equal weights, one process writes the run's files, replay pairs are shared out per
optimizer step, channel metrics are averaged over the processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.tiny_run import save_tiny_model

from composer_replication.config import ConfigError, load_config
from composer_replication.run.preflight import check_resume

pytestmark = pytest.mark.timeout(600)
REPO = Path(__file__).resolve().parents[2]
PAIRS = [
    {"prompt": [{"role": "user", "content": f"What is {a} + 7?"}],
     "chosen": [{"role": "assistant", "content": str(a + 7)}],
     "rejected": [{"role": "assistant", "content": str(a + 8)}]}
    for a in range(6)
]  # fmt: skip


def _torchrun(module: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'tests'}:{REPO / 'src'}", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--standalone", "-m", module, *args]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=540)


def test_two_processes_all_channels_equal_weights(tmp_path):
    model_dir = save_tiny_model(tmp_path / "model")
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(p) + "\n" for p in PAIRS))
    out = tmp_path / "run"
    overrides = [
        f"model.name={model_dir}", f"output_dir={out}", "max_steps=2", "num_threads=1",
        "sdpo.weight=0.5", "replay.weight=0.1", f"replay.dataset={pairs}",
        "replay.pairs_per_step=2", "generation.num_generations=2",
        "generation.prompts_per_step=2", "generation.max_completion_length=4",
        "env.num_train=16", "eval.before_and_after=false", "optim.warmup_steps=0",
        "optim.learning_rate=1e-3",
    ]  # fmt: skip
    proc = _torchrun("support.ddp_train", overrides, tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    sha0, sha1 = ((out / f"rank-{r}.sha").read_text() for r in (0, 1))
    assert sha0 == sha1
    from composer_replication.diloco.outer import params_checksum
    from composer_replication.lm.models import load_model

    start = params_checksum(p.detach() for p in load_model(str(model_dir)).parameters())
    assert sha0 != start  # the weights moved
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]  # one writer
    for r in rows:
        assert r["replay/num_pairs"] == 2.0  # the step's 2 pairs, one per process, summed
        assert r["replay/loss"] > 0 and r["sdpo/loss"] != 0
    assert json.loads((out / "checkpoint-2" / "channels.json").read_text()).keys() == {
        "sdpo", "replay"
    }  # fmt: skip


def test_dynamic_sampling_refuses_several_processes_before_loading(monkeypatch):
    cfg = load_config(None, ["grpo.dynamic_sampling.enabled=true"])
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="dynamic_sampling: not supported with several"):
        check_resume(cfg)
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert check_resume(cfg) is None
