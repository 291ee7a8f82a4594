"""End to end over loopback: two real `serve` processes running the embedded SmolLM2-135M
(greedy on both, plus a sampled teacher on the second), states ingested from the public fixture
logs, `replay` (VOI gating + tiers) and `pairs` through the CLI, and one TRL DPOTrainer step on the
exported dataset (tiny random model + the embedded tokenizer)."""

from __future__ import annotations

import copy
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import orjson
import pytest
import yaml
from support.fixtures import trace_fixtures_dir

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
FIXTURES = trace_fixtures_dir()
ENV = {**os.environ, "PYTHONPATH": str(REPO / "src"), "HF_HUB_OFFLINE": "1"}
CLI = [sys.executable, "-m", "composer_replication.cli"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pick_states(n: int, max_prefix_bytes: int = 1500):
    from composer_replication.traces import ingest

    states = [
        s for s in ingest([FIXTURES])
        if s.prefix and (s.action.text or s.action.tool_calls)
        and len(orjson.dumps(s.prefix)) <= max_prefix_bytes
    ]  # fmt: skip
    states.sort(key=lambda s: (len(orjson.dumps(s.prefix)), s.state_id))
    step = max(1, len(states) // n)
    return states[::step][:n]


@pytest.fixture(scope="module")
def servers(tmp_path_factory, embedded_path):
    logs = tmp_path_factory.mktemp("servers")
    procs, urls = [], []
    for i in range(2):
        port = _free_port()
        log = open(logs / f"server{i}.log", "wb")  # noqa: SIM115
        procs.append((subprocess.Popen(
            [*CLI, "serve", "--model", embedded_path, "--port", str(port),
             "--served-model-name", "smol", "--max-prompt-tokens", "512"],
            env=ENV, stdout=log, stderr=subprocess.STDOUT,
        ), logs / f"server{i}.log"))  # fmt: skip
        urls.append(f"http://127.0.0.1:{port}/v1")
    try:
        for (proc, log), url in zip(procs, urls, strict=True):
            _wait_ready(proc, url, log)
        yield urls, [log for _, log in procs]
    finally:
        for proc, _ in procs:
            proc.terminate()
        for proc, _ in procs:
            proc.wait(timeout=30)


def _wait_ready(proc, url: str, log: Path) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        try:
            with urllib.request.urlopen(f"{url}/models", timeout=2) as r:
                assert b'"smol"' in r.read()
                return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"server {url} did not start: {log.read_text()[-2000:]}")


def test_replay_pairs_dpo_over_loopback(servers, tmp_path, tokenizer, tiny_model):
    urls, logs = servers
    states = _pick_states(4)
    assert len(states) == 4
    sfile = tmp_path / "states.jsonl"
    sfile.write_bytes(b"".join(s.to_json() + b"\n" for s in states))
    common = {"model": "smol", "max_tokens": 8, "max_concurrency": 1, "timeout_s": 120,
              "keep_cut_answers": True}  # fmt: skip
    pool = tmp_path / "pool.yaml"
    pool.write_text(yaml.safe_dump({"teachers": [
        {"name": "greedy-a", "base_url": urls[0], "temperature": 0.0, "tier": 0,
         "price_in_per_mtok": 0.05, "price_out_per_mtok": 0.10, **common},
        {"name": "greedy-b", "base_url": urls[1], "temperature": 0.0, "tier": 0,
         "price_in_per_mtok": 0.05, "price_out_per_mtok": 0.10, **common},
        {"name": "warm", "base_url": urls[1], "temperature": 0.8, "tier": 1,
         "price_in_per_mtok": 0.20, "price_out_per_mtok": 0.40, **common},
    ]}))  # fmt: skip
    db = tmp_path / "replay.db"
    out = _run([*CLI, "replay", str(sfile), "--teachers", str(pool), "--budget-usd", "0.01",
                "--out", str(db), "--tiered", "--gate-top-percentile", "50", "--no-progress",
                "--student", str(_student())])  # fmt: skip
    assert "gating: 2/4 states selected" in out
    assert re.search(
        r"states: 4 total, 2 completed, 0 failed, 0 remaining \(budget\), 2 gated out", out
    )
    sent = int(re.search(r"calls: (\d+) sent", out).group(1))
    saved_tiers = int(re.search(r"tiers (\d+)", out).group(1))
    assert re.search(r"gating 6, tiers \d+", out) and sent + saved_tiers == 6
    cost = float(re.search(r"cost: \$([0-9.]+) this run", out).group(1))
    assert 0 < cost <= 0.01
    posts = sum(log.read_text().count('"POST /v1/chat/completions HTTP/1.1" 200') for log in logs)
    assert posts == sent  # one access-log line per request

    rerun = _run([*CLI, "replay", str(sfile), "--teachers", str(pool), "--budget-usd", "0.01",
                  "--out", str(db), "--tiered", "--gate-top-percentile", "50", "--no-progress"])  # fmt: skip
    assert "calls: 0 sent" in rerun
    assert posts == sum(log.read_text().count("POST /v1/chat/completions") for log in logs)

    pairs_dir = tmp_path / "pairs"
    out = _run([*CLI, "pairs", str(db), "--out", str(pairs_dir)])
    n_pairs = int(re.search(r"(\d+) pairs ->", out).group(1))
    assert n_pairs >= 1
    lines = (pairs_dir / "pairs.jsonl").read_bytes().splitlines()
    assert len(lines) == n_pairs
    rec = orjson.loads(lines[0])
    assert rec["chosen"][0]["role"] == rec["rejected"][0]["role"] == "assistant"
    assert rec["n_teachers_agreeing"] >= 2 and rec["prompt"]
    _dpo_one_step(pairs_dir / "dataset", tokenizer, tiny_model, tmp_path)


def _student() -> str:
    from composer_replication.lm.models import DEFAULT_MODEL, resolve_model_path

    return resolve_model_path(DEFAULT_MODEL)


def _run(cmd: list[str]) -> str:
    p = subprocess.run(cmd, env=ENV, capture_output=True, timeout=600)
    out = p.stdout.decode() + p.stderr.decode()
    assert p.returncode == 0, out
    return " ".join(out.split())  # rich wraps long lines


def _dpo_one_step(dataset_dir: Path, tokenizer, model, tmp_path: Path) -> None:
    import torch
    from datasets import load_from_disk
    from trl import DPOConfig, DPOTrainer

    ds = load_from_disk(str(dataset_dir))
    before = [p.detach().clone() for p in model.parameters()]
    args = DPOConfig(
        output_dir=str(tmp_path / "dpo"), max_steps=1, per_device_train_batch_size=1,
        max_length=256, report_to=[], logging_steps=1, save_strategy="no", use_cpu=True,
        learning_rate=1e-3,
    )  # fmt: skip
    trainer = DPOTrainer(
        model=model, ref_model=copy.deepcopy(model), args=args, train_dataset=ds,
        processing_class=tokenizer,
    )  # fmt: skip
    out = trainer.train()
    assert out.global_step == 1 and torch.isfinite(torch.tensor(out.training_loss))
    assert any(
        not torch.equal(a, b.detach()) for a, b in zip(before, model.parameters(), strict=True)
    )
