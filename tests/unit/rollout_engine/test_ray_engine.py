"""``rollout.engine: ray`` end to end on one local Ray (shared by the module: Ray's start-up is
the slow part): a quickstart run of a tiny random model with 2 workers, whose metrics carry the
version and staleness of every step; rollouts overlapping training (a worker makes groups
while the learner is inside a step); every Ray socket on 127.0.0.1; workers' weights equal to
the learner's (checksums); a resume that continues the task order and the policy version; and
nothing of the run's actors left afterwards."""

from __future__ import annotations

import ipaddress
import json
import time
from pathlib import Path

import pytest
from support.ray_processes import actor_processes, listening_ips, wait_gone
from support.tiny_run import save_tiny_model
from transformers import TrainerCallback

from composer_replication.config import load_config
from composer_replication.rollout_engine.dispenser import TaskDispenser
from composer_replication.rollout_engine.learner import GROUPS_FILE, STATE_FILE, import_ray
from composer_replication.run import train as train_module
from composer_replication.run.train import run_training

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def local_ray():
    ray = import_ray()
    ray.init(num_cpus=4, object_store_memory=2**29, include_dashboard=False,
             _node_ip_address="127.0.0.1", resources={"sandbox_slots": 4}, log_to_driver=False)  # fmt: skip
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny"))


def _overrides(model: Path, out: Path, *extra: str) -> list[str]:
    return [
        f"model.name={model}", f"output_dir={out}", "num_threads=1", "rollout.engine=ray",
        "ray.num_workers=2", "generation.num_generations=2", "generation.prompts_per_step=2",
        "generation.max_completion_length=4", "env.num_train=16", "eval.before_and_after=false",
        "optim.warmup_steps=0", "optim.learning_rate=1.0e-3", "alpha_sdpo=0.5",
        "ray.timeout_s=300", *extra,
    ]  # fmt: skip


class _Probe(TrainerCallback):
    """Inside each step (after its groups were taken, before the new weights go out): waits
    until the workers have finished ``groups_per_step`` more groups than at the step's start
    (a deadline fails the test), and lists Ray's listening sockets at step 2."""

    def __init__(self, engines: list, groups_per_step: int):
        self.engines, self.gps = engines, groups_per_step
        self.overlapped: list[int] = []
        self.listening: list[str] = []

    def _produced(self) -> int:
        engine = self.engines[0]
        return sum(engine.ray.get(engine.hub.stats.remote())["produced"].values())

    def on_step_begin(self, args, state, control, **kw):
        self.start = self._produced()

    def on_optimizer_step(self, args, state, control, **kw):
        deadline = time.monotonic() + 120
        while self._produced() < self.start + self.gps:
            assert time.monotonic() < deadline, "no group made while the learner was in the step"
            time.sleep(0.05)
        self.overlapped.append(state.global_step + 1)
        if state.global_step + 1 == 2:
            self.listening = listening_ips()


def _ipv4(ip: str) -> str:
    """``::ffff:127.0.0.1`` (an IPv4 address on a dual-stack socket) -> ``127.0.0.1``."""
    addr = ipaddress.ip_address(ip)
    mapped = getattr(addr, "ipv4_mapped", None)
    return str(mapped or addr)


def _capture_engine(monkeypatch) -> list:
    engines: list = []
    build = train_module.build_engine

    def capture(*a, **kw):
        engines.append(build(*a, **kw))
        return engines[-1]

    monkeypatch.setattr(train_module, "build_engine", capture)
    return engines


def test_a_quickstart_run_overlaps_rollouts_with_training(local_ray, tiny_dir, tmp_path,
                                                          monkeypatch):  # fmt: skip
    engines = _capture_engine(monkeypatch)
    probe = _Probe(engines, groups_per_step=2)
    out = tmp_path / "run"
    cfg = load_config(None, _overrides(tiny_dir, out, "max_steps=3"))
    run_training(cfg, extra_callbacks=[probe])
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "rollout/version" in s]
    assert [s["rollout/version"] for s in steps] == [0, 1, 2]
    assert all(0 <= s["rollout/staleness_max"] <= 4 for s in steps)
    assert steps[0]["rollout/ratio_lag0_max_dev"] < 1e-4  # step 1's groups are all fresh
    assert any(s["loss"] != 0 for s in steps)
    assert probe.overlapped == [1, 2, 3]  # each step saw groups made during it
    assert probe.listening and {_ipv4(ip) for ip in probe.listening} == {"127.0.0.1"}
    lines = [json.loads(x) for x in (out / GROUPS_FILE).read_text().splitlines()]
    ids = [g["id"] for line in lines for g in line["groups"]]
    assert len(ids) == 6 and len(set(ids)) == 6  # no group used twice
    order = TaskDispenser(engines[0].dispenser.train_ids, cfg.seed)  # the seeded order
    assert all(g["task"] == order.task_at(g["id"]) for line in lines for g in line["groups"])
    assert wait_gone(actor_processes) == []  # the run's workers and hub are gone


def test_workers_hold_the_learners_weights(local_ray, tiny_dir, tmp_path):
    """After a weight push each worker's state dict is bit-identical to the learner's (a
    SHA-256 over every tensor), and differs from what it held before the push."""
    import torch

    from composer_replication.lm.models import load_model, load_tokenizer
    from composer_replication.run.preflight import build_env

    cfg = load_config(None, _overrides(tiny_dir, tmp_path / "w", "max_steps=1"))
    model, tokenizer = load_model(str(tiny_dir)), load_tokenizer(str(tiny_dir))
    engine = train_module.build_engine(cfg, model, tokenizer, build_env(cfg))
    try:
        engine.start()
        before = engine.worker_checksums(0)
        assert {c for _, c in before.values()} == {engine.learner_checksum()}
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 1e-3)
        engine.publish(model, 1)
        after = engine.worker_checksums(1)
        assert after == {w: (1, engine.learner_checksum()) for w in after}
        assert engine.learner_checksum() not in {c for _, c in before.values()}
        assert engine.step_metrics()["rollout/weight_sync_bytes"] == sum(
            t.numel() * t.element_size() for t in model.state_dict().values()
        )
    finally:
        engine.close()


def test_resume_continues_the_task_order_and_the_version(local_ray, tiny_dir, tmp_path):
    """A run stopped after its step-2 checkpoint, resumed: its first step trains at version
    2, on groups never trained before, each ticket's task the seeded order's (the in-flight
    tickets of the checkpoint, then new ones from its cursor)."""
    out = tmp_path / "run"
    base = _overrides(tiny_dir, out, "rollout.max_staleness=1", "save_steps=2",
                      "save_total_limit=null")  # fmt: skip
    run_training(load_config(None, [*base, "max_steps=3"]))
    ckpt = out / "checkpoint-2"
    state = json.loads((ckpt / STATE_FILE).read_text())
    assert state["version"] == 2
    first = [json.loads(x) for x in (out / GROUPS_FILE).read_text().splitlines()][:2]
    used_before = {g["id"] for line in first for g in line["groups"]}
    (out / GROUPS_FILE).unlink()
    run_training(load_config(None, [*base, "max_steps=4", f"resume_from={ckpt}"]))
    lines = [json.loads(x) for x in (out / GROUPS_FILE).read_text().splitlines()]
    assert [line["version"] for line in lines] == [2, 3]
    resumed = [g for line in lines for g in line["groups"]]
    outstanding = {int(k) for k in state["dispenser"]["outstanding"]}
    cursor = state["dispenser"]["cursor"]
    assert not {g["id"] for g in resumed} & used_before
    assert all(g["id"] in outstanding or g["id"] >= cursor for g in resumed)
    tasks = {g["id"]: g["task"] for line in first for g in line["groups"]}
    assert tasks  # the same seeded order before and after the resume
    from composer_replication.run.preflight import build_env

    cfg = load_config(None, base)
    ids = [t.task_id for t in build_env(cfg).tasks("train")]
    order = TaskDispenser(ids, cfg.seed)
    assert all(g["task"] == order.task_at(g["id"]) for g in resumed)
    assert all(t == order.task_at(i) for i, t in tasks.items())
