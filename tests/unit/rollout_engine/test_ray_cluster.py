"""Two Ray nodes on 127.0.0.1 (``ray.cluster_utils.Cluster``), each with 2 sandbox slots; each
worker takes 2, so the 2 workers land on different nodes (sandboxes are budgeted per node).
A worker is killed inside step 2: the run finishes, every step has its loss, the killed
worker's in-flight groups are handed out again (counted), no group is used twice, and nothing
of the run's actors is left."""

from __future__ import annotations

import json
import time

import pytest
from support.ray_processes import actor_processes, wait_gone
from support.tiny_run import save_tiny_model
from transformers import TrainerCallback

from composer_replication.config import load_config
from composer_replication.rollout_engine.learner import GROUPS_FILE, import_ray
from composer_replication.run import train as train_module
from composer_replication.run.train import run_training

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def cluster():
    ray = import_ray()
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "object_store_memory": 2**28, "resources": {"sandbox_slots": 2}})  # fmt: skip
    c.add_node(num_cpus=2, object_store_memory=2**28, resources={"sandbox_slots": 2})
    ray.init(address=c.address, log_to_driver=False)
    yield ray
    ray.shutdown()
    c.shutdown()


class _Killer(TrainerCallback):
    """Records each worker's node at step 1; kills worker 0 as step 2 begins."""

    def __init__(self, engines: list):
        self.engines = engines
        self.nodes: set[str] = set()

    def on_step_begin(self, args, state, control, **kw):
        engine = self.engines[0]
        if state.global_step == 0:
            self.nodes = {engine.ray.get(w.node.remote()) for w in engine.workers.values()}
        if state.global_step == 1:  # once worker 0 holds a ticket: its group is in flight
            deadline = time.monotonic() + 120
            while not engine.ray.get(engine.hub.stats.remote())["inflight_by_worker"].get(0):
                assert time.monotonic() < deadline, "worker 0 never held a ticket"
                time.sleep(0.01)
            engine.ray.kill(engine.workers[0], no_restart=True)


def test_workers_on_both_nodes_survive_a_killed_worker(cluster, tmp_path, monkeypatch):
    engines: list = []
    build = train_module.build_engine
    monkeypatch.setattr(train_module, "build_engine",
                        lambda *a, **kw: engines.append(build(*a, **kw)) or engines[-1])  # fmt: skip
    killer = _Killer(engines)
    model = save_tiny_model(tmp_path / "tiny")
    out = tmp_path / "run"
    cfg = load_config(None, [
        f"model.name={model}", f"output_dir={out}", "num_threads=1", "rollout.engine=ray",
        "ray.num_workers=2", "ray.worker.sandbox_slots=2", "ray.address=auto",
        "generation.num_generations=2", "generation.prompts_per_step=2",
        "generation.max_completion_length=4", "env.num_train=16", "eval.before_and_after=false",
        "optim.warmup_steps=0", "alpha_sdpo=0.5", "max_steps=4", "ray.timeout_s=300",
    ])  # fmt: skip
    run_training(cfg, extra_callbacks=[killer])
    assert len(killer.nodes) == 2  # one worker per node: 2 slots each, 2 per worker
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "rollout/version" in s]
    assert [s["rollout/version"] for s in steps] == [0, 1, 2, 3]
    assert all("loss" in s for s in steps)
    assert steps[-1]["rollout/lost_groups"] >= 1  # the killed worker's group, handed out again
    lines = [json.loads(x) for x in (out / GROUPS_FILE).read_text().splitlines()]
    ids = [g["id"] for line in lines for g in line["groups"]]
    assert len(ids) == 8 and len(set(ids)) == 8
    engine = engines[0]
    assert engine.lost_groups == steps[-1]["rollout/lost_groups"]
    assert engine.workers == {} and engine.ray is None  # closed
    assert wait_gone(actor_processes) == []  # no worker or hub process left on either node
