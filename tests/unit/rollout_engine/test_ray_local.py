"""The acceptance command on a machine with no Ray running: ``composer-replication train
-c configs/agent_quickstart.yaml rollout.engine=ray ray.num_workers=2 max_steps=3`` (here 2
steps; the agent quickstart: a tool environment, multi-turn rollouts on the workers; a tiny
random model) starts a local Ray, runs end to end with the version and staleness of every
step in metrics.jsonl (and hints built from the workers' verdicts), and leaves none of the
Ray processes it started (the quickstart runs on the engine in test_ray_engine.py); Ctrl-C
stops a run's workers and its local Ray."""

from __future__ import annotations

import json
import time

import pytest
from support.cli_process import interrupt, read_until, start_cli
from support.ray_processes import actor_processes, ray_processes, started_by, wait_gone
from support.tiny_run import save_tiny_model

pytestmark = pytest.mark.timeout(600)


def test_the_agent_quickstart_runs_on_a_local_ray_and_stops_it(tmp_path):
    model = save_tiny_model(tmp_path / "tiny")
    out = tmp_path / "run"
    before = {p.pid for p in ray_processes()}
    proc = start_cli([
        "train", "-c", "configs/agent_quickstart.yaml", "rollout.engine=ray",
        "ray.num_workers=2", "max_steps=2", f"model.name={model}", f"output_dir={out}",
        "num_threads=1", "generation.num_generations=2", "generation.prompts_per_step=2",
        "generation.max_completion_length=8", "env.num_train=8", "env.few_shot=false",
        "eval.before_and_after=false", "ray.timeout_s=300", "alpha_sdpo=0.5",
    ])  # fmt: skip
    head = read_until(proc, lambda lines: lines[-1].startswith("step 1/2"))
    assert head and head[-1].startswith("step 1/2"), "\n".join(head)
    started = [p for p in ray_processes() if p.pid not in before]
    assert started  # the run's own Ray: its services and workers
    rest, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, "\n".join(head) + rest
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "rollout/version" in s]
    assert [s["rollout/version"] for s in steps] == [0, 1]
    assert all(0 <= s["rollout/staleness_max"] <= 4 for s in steps)
    assert all("tools/call_frequency" in s and "rollout/turns" in s for s in steps)
    # hints from the workers' verdicts, pinned to the turn the verifier blamed
    assert all(s["sdpo/hinted_frac"] > 0 and "sdpo/turn_hinted_frac" in s for s in steps)
    assert wait_gone(lambda: [p for p in started if p.is_running()]) == []


def test_ctrl_c_stops_the_workers_and_the_local_ray(tmp_path):
    """SIGINT (Ctrl-C) to a quickstart run once its local Ray runs its rollout workers: the
    CLI says what it kept and exits 130; its Ray (services, hub, workers) is gone afterwards."""
    model = save_tiny_model(tmp_path / "tiny")
    out = tmp_path / "run"
    before = {p.pid for p in ray_processes()}
    proc = start_cli([
        "train", "rollout.engine=ray", "ray.num_workers=2", "max_steps=50", f"model.name={model}",
        f"output_dir={out}", "num_threads=1", "generation.num_generations=2",
        "generation.prompts_per_step=2", "generation.max_completion_length=4",
        "env.num_train=8", "eval.before_and_after=false", "ray.timeout_s=300",
    ])  # fmt: skip
    deadline = time.monotonic() + 300
    while len(started_by(proc.pid, actor_processes(("ray::RolloutWorker",)))) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, "no workers started"
        time.sleep(0.2)
    # its own Ray only: another run's on the shared machine starts and stops on its own
    started = started_by(proc.pid, [p for p in ray_processes() if p.pid not in before])
    assert any("raylet" in " ".join(p.cmdline()) for p in started)
    rest, _ = interrupt(proc, timeout_s=120)
    assert proc.returncode == 130, rest
    assert "interrupted: stopped after step" in rest
    assert wait_gone(lambda: [p for p in started if p.is_running()]) == []
