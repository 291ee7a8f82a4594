"""``rollout.engine: ray`` end to end on two Ray nodes on 127.0.0.1 (``ray.cluster_utils.Cluster``,
shared by the module: Ray's start-up is the slow part), each with 2 sandbox slots; each worker
takes 2, so the 2 workers land on different nodes (sandboxes budgeted per node). A quickstart
run of a tiny random model whose metrics carry the version and staleness of every step;
rollouts overlapping training (a worker makes groups while the learner is inside a step); every
Ray socket on 127.0.0.1; workers' weights equal to the learner's after every push (checksums);
a worker killed after step 2's weight push (holding a ticket, when one does): the run
finishes, every step has its loss, the tickets it held are handed out again and counted, a
replacement holds the learner's weights, no group is used twice, nothing of the run's actors is
left; a resume that continues the task order and the policy version."""

from __future__ import annotations

import ipaddress
import json
import math
import os
import time
from pathlib import Path

import pytest
from support.gated_env import GATE_DIR, gated_env, open_gate
from support.ray_processes import listening_ips, own_actor_processes, wait_gone
from support.ray_tool_env import GATE_DIR as TOOL_GATE
from support.ray_tool_env import sandboxed_calculator, workspace_calculator
from support.scripted_lm import ConfigScriptedLlama
from support.textkit import TEXTKIT
from support.tiny_run import save_tiny_model
from transformers import TrainerCallback

from composer_replication.config import load_config
from composer_replication.envs.tools import tool_functions
from composer_replication.lm.chat_templates import ensure_tool_template
from composer_replication.lm.generator import Sampling
from composer_replication.lm.models import DEFAULT_MODEL, load_model, load_tokenizer
from composer_replication.rollout_engine.dispenser import TaskDispenser
from composer_replication.rollout_engine.learner import (
    GROUPS_FILE,
    STATE_FILE,
    EngineSettings,
    RayRollouts,
    group_tokens,
    import_ray,
)
from composer_replication.rollout_engine.worker import WorkerSettings
from composer_replication.run import train as train_module
from composer_replication.run.train import run_training

pytestmark = pytest.mark.timeout(600)

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Two nodes; their workers import ``tests/support`` (the gated environment) and read
    the gate directory from the environment they start with."""
    gate = tmp_path_factory.mktemp("gate")
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", GATE_DIR, TOOL_GATE)}
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), str(REPO / "tests")])
    os.environ[GATE_DIR] = str(gate)
    os.environ[TOOL_GATE] = str(tmp_path_factory.mktemp("tool_gate"))
    ray = import_ray()
    from ray.cluster_utils import Cluster

    node = {"num_cpus": 2, "object_store_memory": 2**28, "resources": {"sandbox_slots": 2}}
    c = Cluster(initialize_head=True, head_node_args=node)
    c.add_node(**node)
    ray.init(address=c.address, log_to_driver=False)
    yield ray, gate
    ray.shutdown()
    c.shutdown()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny"))


def _overrides(model: Path, out: Path, *extra: str) -> list[str]:
    return [
        f"model.name={model}", f"output_dir={out}", "num_threads=1", "rollout.engine=ray",
        "ray.num_workers=2", "generation.num_generations=2", "generation.prompts_per_step=2",
        "generation.max_completion_length=4", "env.num_train=16", "eval.before_and_after=false",
        "optim.warmup_steps=0", "optim.learning_rate=1.0e-3", "alpha_sdpo=0.5",
        "ray.timeout_s=300", "ray.address=auto", "ray.worker.sandbox_slots=2", *extra,
    ]  # fmt: skip


class _Probe(TrainerCallback):
    """Step 1: the workers' gradings past the first two wait at a gate; inside the step
    (its groups taken, its update done, the new weights not yet out) the learner opens the
    gate and waits until a worker finishes a third group, one for a later step (a deadline
    fails the test), and lists Ray's listening sockets. After each weight push: the learner's
    and the workers' checksums. After step 2's push: kills a worker (one holding a ticket, if
    one does within 5 s), and notes the tickets it held."""

    def __init__(self, engines: list, gate: Path):
        self.engines, self.gate = engines, gate
        self.overlapped = False
        self.listening: list[str] = []
        self.checksums: list[tuple[str, dict]] = []
        self.nodes: set[str] = set()
        self.killed, self.held = -1, -1

    def _stats(self) -> dict:
        engine = self.engines[0]
        return engine.ray.get(engine.hub.stats.remote())

    def on_step_begin(self, args, state, control, **kw):
        engine = self.engines[0]
        if state.global_step == 0:
            self.nodes = {engine.ray.get(w.node.remote()) for w in engine.workers.values()}

    def on_optimizer_step(self, args, state, control, **kw):
        if state.global_step != 0:
            return
        assert self._produced() == 2  # step 1's groups: every later grading waits at the gate
        open_gate(self.gate)
        deadline = time.monotonic() + 120
        while self._produced() < 3:
            assert time.monotonic() < deadline, "no group made while the learner was in step 1"
            time.sleep(0.05)
        self.overlapped = True
        self.listening = listening_ips()

    def _produced(self) -> int:
        return sum(self._stats()["produced"].values())

    def on_step_end(self, args, state, control, **kw):
        engine = self.engines[0]
        self.checksums.append(
            (engine.learner_checksum(), engine.worker_checksums(state.global_step))
        )
        if state.global_step == 2:
            self._kill_a_worker()

    def _kill_a_worker(self) -> None:
        engine = self.engines[0]
        deadline = time.monotonic() + 5
        busy: list[int] = []
        while not busy and time.monotonic() < deadline:
            busy = [w for w, n in self._stats()["inflight_by_worker"].items() if n]
            time.sleep(0.005)
        self.killed = busy[0] if busy else 0
        engine.ray.kill(engine.workers[self.killed], no_restart=True)
        # Until Ray reports the death, a group the worker sent just before it may still land
        # (then it was not lost), and the learner's next take may not see the death yet (then
        # the last step's count lags): wait for it, then read what the dead worker held.
        done, _ = engine.ray.wait([engine.runs[self.killed]], timeout=60)
        assert done, "Ray did not report the killed worker's death within 60 s"
        self.held = self._stats()["inflight_by_worker"].get(self.killed, 0)


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


def test_a_quickstart_run_overlaps_rollouts_and_survives_a_killed_worker(
    cluster, tiny_dir, tmp_path, monkeypatch
):
    ray, gate = cluster
    engines = _capture_engine(monkeypatch)
    monkeypatch.setattr(train_module, "build_env", gated_env)  # the workers' environment
    probe = _Probe(engines, gate)
    out = tmp_path / "run"
    cfg = load_config(None, _overrides(tiny_dir, out, "max_steps=3"))
    run_training(cfg, extra_callbacks=[probe])
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "rollout/version" in s]
    assert len(probe.nodes) == 2  # one worker per node: 2 slots each, 2 per worker
    assert [s["rollout/version"] for s in steps] == [0, 1, 2]
    assert all("loss" in s for s in steps)
    assert all(0.0 <= s["sampler/signal_frac"] <= 1.0 for s in steps)  # the dispenser's sampler
    assert probe.held >= 0 and steps[-1]["rollout/lost_groups"] == probe.held  # handed out again
    assert all(0 <= s["rollout/staleness_max"] <= 4 for s in steps)
    assert steps[0]["rollout/ratio_lag0_max_dev"] < 1e-4  # step 1's groups are all fresh
    assert any(s["loss"] != 0 for s in steps)
    assert probe.overlapped  # a later step's group was made while the learner was in step 1
    assert probe.listening and {_ipv4(ip) for ip in probe.listening} == {"127.0.0.1"}
    lines = [json.loads(x) for x in (out / GROUPS_FILE).read_text().splitlines()]
    ids = [g["id"] for line in lines for g in line["groups"]]
    assert len(ids) == 6 and len(set(ids)) == 6  # no group used twice
    order = TaskDispenser(engines[0].dispenser.train_ids, cfg.seed)  # the seeded order
    assert all(g["task"] == order.task_at(g["id"]) for line in lines for g in line["groups"])
    assert wait_gone(own_actor_processes) == []  # the run's workers and hub are gone
    # every worker's weights are bit-identical to the learner's after each push (SHA-256 over
    # every tensor), and the weights changed from step to step
    for step, (learner, workers) in enumerate(probe.checksums, start=1):
        assert workers == {0: (step, learner), 1: (step, learner)}  # step 3: the replacement
    assert len({learner for learner, _ in probe.checksums}) == 3
    assert steps[0]["rollout/weight_sync_bytes"] == sum(  # each parameter once: the tie too
        p.numel() * p.element_size() for p in load_model(str(tiny_dir)).parameters()
    )


def test_resume_continues_the_task_order_and_the_version(cluster, tiny_dir, tmp_path):
    """A run stopped after its step-1 checkpoint (it went on to step 2: what a kill after the
    save leaves), resumed: its step 2 trains at version 1, on groups never trained before, each ticket's task the seeded order's (the in-flight
    tickets of the checkpoint, then new ones from its cursor)."""
    out = tmp_path / "run"
    base = _overrides(tiny_dir, out, "rollout.max_staleness=1", "save_steps=1",
                      "save_total_limit=null", "ray.num_workers=1")  # fmt: skip
    run_training(load_config(None, [*base, "max_steps=2"]))
    ckpt = out / "checkpoint-1"
    state = json.loads((ckpt / STATE_FILE).read_text())
    assert state["version"] == 1
    first = [json.loads(x) for x in (out / GROUPS_FILE).read_text().splitlines()][:1]
    used_before = {g["id"] for line in first for g in line["groups"]}
    (out / GROUPS_FILE).unlink()
    run_training(load_config(None, [*base, "max_steps=2", f"resume_from={ckpt}"]))
    lines = [json.loads(x) for x in (out / GROUPS_FILE).read_text().splitlines()]
    assert [line["version"] for line in lines] == [1]
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


def _scripted_policy(tok, expression: str, answer: int):
    """A tiny model that calls ``calculate(expression)``, then answers ``answer``; its script
    travels in its config, so the workers' copies follow it."""
    from conftest import make_tiny_model

    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    call = json.dumps({"name": "calculate", "arguments": {"expression": expression}})
    turns = [f"<tool_call>{call}</tool_call><|im_end|>", f"The answer is {answer}.<|im_end|>"]
    model = make_tiny_model(len(tok), 0, cls=ConfigScriptedLlama, max_positions=1024)
    model.set_script(enc("<|im_start|>assistant\n"), [enc(t) for t in turns])
    return model, turns


def test_tool_episodes_on_a_worker(cluster):
    """A tool environment on the Ray engine: a worker runs TRL's tool loop (2 turns), grades
    in the sandbox, and the group record carries the tool mask (0 exactly on the tool
    result), behaviour log-probs (0 on the tool result), each turn's policy version (weights
    published while the first turn's tool call ran: the second turn is version 1), the
    sandbox's rewards (1 for the task whose answer the script gives, 0 for the next), and the
    worker's sandbox slots (its reservation: 1, not the machine's cores)."""
    gate = Path(os.environ[TOOL_GATE])
    tok = load_tokenizer(DEFAULT_MODEL)
    ensure_tool_template(tok)
    env = sandboxed_calculator()
    tasks = {t.task_id: t for t in env.tasks("train")}
    dispenser = TaskDispenser(list(tasks), seed=0)
    first = tasks[dispenser.task_at(0)]
    model, turns = _scripted_policy(tok, first.data["expression"], first.data["answer"])
    settings = EngineSettings(num_workers=1, groups_per_step=1, max_staleness=4,
                              force_staleness=None, address="auto", sandbox_slots=1,
                              timeout_s=300)  # fmt: skip
    worker = WorkerSettings(2, Sampling(temperature=0.7, max_new_tokens=64), 0, max_turns=2,
                            max_tool_calls=2, sandbox_slots=1)  # fmt: skip
    tools = tool_functions(env.tools_class()())
    engine = RayRollouts(settings, worker, model, tok, sandboxed_calculator, dispenser, tools)
    try:
        engine.start(publish=True)
        deadline = time.monotonic() + 300  # the worker's start: a loaded machine is slow
        while not (gate / "waiting").exists():  # the first episode's tool call runs
            assert time.monotonic() < deadline, "no tool call on the worker"
            done, _ = engine.ray.wait(list(engine.runs.values()), timeout=0)
            assert not done, engine.ray.get(done)  # a worker's error, raised
            time.sleep(0.05)
        engine.publish(model, 1)
        (gate / "go").touch()
        groups = engine.take_groups(2, version=1)
    finally:
        engine.close()
    assert [g.group_id for g in groups] == [0, 1] and groups[0].task_id == first.task_id
    result = str(first.data["answer"])
    for g, versions, reward in zip(groups, ([0, 1], [1, 1]), ("1.0", "0.0"), strict=True):
        for r in g.rollouts:
            [seq] = r.sequences
            assert seq.turn_versions == versions
            assert r.verdict.info["sandbox_said"] == reward and r.reward == float(reward)
            assert r.verdict.info["slots"] == 1
            assert [m["role"] for m in r.messages] == ["assistant", "tool", "assistant"]
            assert r.messages[1]["content"] == result
            own = [t for t, m in zip(seq.completion_ids, seq.tool_mask, strict=True) if m]
            inserted = [t for t, m in zip(seq.completion_ids, seq.tool_mask, strict=True) if not m]
            assert tok.decode(own) == "".join(turns)
            assert result in tok.decode(inserted) and "tool" in tok.decode(inserted)
            zeros = [i for i, m in enumerate(seq.tool_mask) if not m]
            assert zeros == list(range(zeros[0], zeros[-1] + 1))  # one run: the tool result
            assert all(seq.behaviour_logps[i] == 0.0 for i in zeros)
            assert len(seq.behaviour_logps) == len(seq.completion_ids)
            assert all(lp <= 0 for lp in seq.behaviour_logps)
    batch = group_tokens(groups, 4)
    assert batch["env_mask"] == [r.sequences[0].tool_mask for g in groups for r in g.rollouts]
    assert groups[0].staleness(1) == 1 and groups[1].staleness(1) == 0


def test_a_worker_killed_in_a_sandboxed_tool_call_leaves_nothing(cluster):
    """A worker killed while its episode's tool call sleeps in the sandbox: its bwrap
    processes die with it, the workspaces its resets made (under its scratch directory) are
    removed, its ticket is handed out again (lost_groups 1) and the replacement makes the
    group."""
    import psutil

    gate = Path(os.environ[TOOL_GATE])
    tok = load_tokenizer(DEFAULT_MODEL)
    ensure_tool_template(tok)
    env = workspace_calculator()
    dispenser = TaskDispenser([t.task_id for t in env.tasks("train")], seed=0)
    model, _ = _scripted_policy(tok, "2 + 3", 5)
    settings = EngineSettings(num_workers=1, groups_per_step=1, max_staleness=4,
                              force_staleness=None, address="auto", timeout_s=300)  # fmt: skip
    worker = WorkerSettings(2, Sampling(temperature=0.7, max_new_tokens=64), 0, max_turns=2,
                            max_tool_calls=2)  # fmt: skip
    engine = RayRollouts(settings, worker, model, tok, workspace_calculator, dispenser)
    try:
        engine.start(publish=True)
        deadline = time.monotonic() + 300
        bwrap: list = []
        while not bwrap:  # the tool call's sandbox runs
            assert time.monotonic() < deadline, "no sandboxed tool call on the worker"
            if (gate / "sandboxed").exists():
                pid = int((gate / "sandboxed").read_text())
                bwrap = [p for p in psutil.Process(pid).children(recursive=True)
                         if p.name() == "bwrap"]  # fmt: skip
            time.sleep(0.05)
        workspaces = (gate / "workspaces").read_text().split()
        assert workspaces and all(Path(w).is_dir() for w in workspaces)
        assert all(w.startswith(engine.work_dir) for w in workspaces)
        engine.ray.kill(engine.workers[0], no_restart=True)
        [group] = engine.take_groups(1, version=0)
        assert engine.lost_groups == 1 and group.group_id == 0
        assert wait_gone(lambda: [p for p in bwrap if p.is_running()]) == []
        assert not [w for w in workspaces if Path(w).exists()]  # before the run's end
    finally:
        engine.close()


def test_more_sandbox_slots_than_a_local_node_has_are_refused():
    """Workers that reserve more sandbox slots than the local node has could never all start
    (the run would wait until its deadline): refused at once, in one line."""
    settings = EngineSettings(num_workers=2, groups_per_step=1, max_staleness=1,
                              force_staleness=None, sandbox_slots=2,
                              sandbox_slots_per_node=3)  # fmt: skip
    worker = WorkerSettings(2, Sampling(temperature=1.0, max_new_tokens=4), 0)
    with pytest.raises(ValueError, match=r"sandbox_slots=2 x ray.num_workers=2 is more than"):
        RayRollouts(settings, worker, None, None, sandboxed_calculator, TaskDispenser(["a"], 0))


@pytest.mark.parametrize(
    ("overrides", "slots"),
    [
        ([], 1),  # the CPU it reserves
        (["ray.worker.num_cpus=3"], 3),
        (["ray.worker.sandbox_slots=2", "ray.worker.num_cpus=3"], 2),  # its node-slot share
        (["ray.worker.sandbox_slots=2", "sandbox.workers=1"], 1),  # capped by sandbox.workers
    ],
)
def test_a_worker_runs_its_share_of_its_node_sandboxes(overrides, slots):
    cfg = load_config(None, ["rollout.engine=ray", *overrides])
    assert train_module.worker_sandbox_slots(cfg) == slots


FD_CALL = '<tool_call>{"name": "run_tests", "arguments": {}}</tool_call><|im_end|>'
FD_ANSWER = "done<|im_end|>"


def _scripted_fd_policy(tok):
    """A tiny model that runs the tests through the tool, then answers (its script in its
    config, so the workers' copies follow it)."""
    from conftest import make_tiny_model

    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    model = make_tiny_model(len(tok), 0, cls=ConfigScriptedLlama, max_positions=2048)
    model.set_script(enc("<|im_start|>assistant\n"), [enc(FD_CALL), enc(FD_ANSWER)])
    return model


def test_feature_deletion_runs_on_a_worker(cluster, tokenizer, textkit_tasks, tmp_path):
    """Feature Deletion on the Ray engine (textkit tasks, one worker, one step): the worker
    builds the environment from the run config, resets each rollout's workspace, runs the
    repository's tests through the tool in its sandbox and grades the hidden tests there; the
    learner trains on the group with the worker's verdicts (the failing tests' hint at the
    turn that ran them), and no held-out task reaches a training draw."""
    import copy

    from composer_replication.run.train import (
        build_env,
        build_trainer,
        close_rollouts,
        start_engine,
    )
    from composer_replication.trainer.callbacks import read_metrics

    tok = copy.deepcopy(tokenizer)
    ensure_tool_template(tok)
    out = tmp_path / "run"
    cfg = load_config("feature_deletion.yaml", [
        f"output_dir={out}", "max_steps=1", "num_threads=1", f"env.task_sources=[{TEXTKIT}]",
        f"env.task_dir={textkit_tasks}", "env.task_generation.workers=2",
        "env.task_generation.suite_timeout_s=30", "generation.num_generations=2",
        "generation.max_completion_length=160", "env.max_tool_output_chars=200",
        "env.tests_budget_s=120", "env.few_shot=false", "rollout.max_turns=2",
        "eval.before_and_after=false", "alpha_sdpo=0.5", "sdpo.hint_sources=[feedback]",
        "rollout.engine=ray", "ray.num_workers=1", "ray.address=auto", "ray.timeout_s=300",
    ])  # fmt: skip
    env = build_env(cfg)
    trainer = build_trainer(cfg, _scripted_fd_policy(tok), tok, env)
    try:
        start_engine(trainer, None)
        trainer.train()
    finally:
        close_rollouts(trainer)
    [row] = read_metrics(out / "metrics.jsonl")
    assert row["rollout/version"] == 0 and row["rollout/staleness_max"] == 0
    assert row["tools/call_frequency"] == 1.0 and row["rollout/turns"] == 2.0
    assert row["env/pass_rate"] == 0.0  # running the tests rebuilds nothing
    assert row["sdpo/active"] == 1.0 and row["sdpo/hint_turn_mean"] == 0.0
    # the hack telemetry from the records: the worker graded the task's do-nothing submission
    assert row["tools/calls/run_tests"] == 1.0 and row["env/flagged_frac"] == 0.0
    assert row["env/hack/no_edit_frac"] == 1.0 and row["env/hack/do_nothing_nonzero_tasks"] == 0
    results = trainer.reward_funcs[0].last_results
    assert len(results) == 2 and all("0 of" in r.feedback for r in results)
    assert all(r.info["failed_turn"] == 0 for r in results)
    heldout = {t.task_id for t in env.tasks("heldout")}
    [line] = [json.loads(x) for x in (out / GROUPS_FILE).read_text().splitlines()]
    assert heldout and not {g["task"] for g in line["groups"]} & heldout
    assert all(g["task"] in {t.task_id for t in env.tasks("train")} for g in line["groups"])
    assert wait_gone(own_actor_processes) == []


def _train_one_step(cfg, model, tok) -> dict:
    """One step of ``cfg`` in this process (the Ray engine: on the shared cluster); its
    metrics row."""
    from composer_replication.run.train import (
        build_env,
        build_trainer,
        close_rollouts,
        start_engine,
    )
    from composer_replication.trainer.callbacks import read_metrics

    trainer = build_trainer(cfg, model, tok, build_env(cfg))
    try:
        start_engine(trainer, None)
        trainer.train()
    finally:
        close_rollouts(trainer)
    [row] = read_metrics(Path(cfg.output_dir) / "metrics.jsonl")
    return row


TELEMETRY = ("tools/", "env/", "rollout/turns")
"""The learner-side tool telemetry: the local engine's from its reward function and TRL's tool
loop; the Ray engine's from the group records."""


def test_the_ray_engine_logs_the_local_engines_tool_telemetry(cluster, tokenizer, tmp_path):
    """The calculator agent (a scripted tiny model: one ``calculate`` call, then the answer),
    one step on each engine: the same tool and environment metric keys (``tools/calls/*``,
    ``tools/call_frequency|failure_frequency``, ``env/hack/*``, ``env/pass_rate``...), the
    same values where they do not depend on sampling (one call per rollout, none failed), and
    the episode log written on both."""
    import copy

    tok = copy.deepcopy(tokenizer)
    ensure_tool_template(tok)
    rows = {}
    for engine in ("local", "ray"):
        out = tmp_path / engine
        cfg = load_config("agent_quickstart.yaml", [
            f"output_dir={out}", "max_steps=1", "num_threads=1", f"rollout.engine={engine}",
            "generation.num_generations=2", "generation.prompts_per_step=1",
            "generation.max_completion_length=64", "env.num_train=8", "env.few_shot=false",
            "eval.before_and_after=false", "ray.num_workers=1", "ray.address=auto",
            "ray.timeout_s=300",
        ])  # fmt: skip
        model, _ = _scripted_policy(tok, "2 + 3", 5)
        rows[engine] = _train_one_step(cfg, model, tok)
        assert (out / "episodes.jsonl").read_text().strip(), engine
    keys = {e: {k for k in row if k.startswith(TELEMETRY)} for e, row in rows.items()}
    assert keys["ray"] == keys["local"]
    assert {"tools/calls/calculate", "env/hack/invalid_call_rate"} <= keys["ray"]
    for engine, row in rows.items():
        assert row["tools/calls/calculate"] == 1.0 and row["tools/call_frequency"] == 1.0, engine
        assert row["tools/failure_frequency"] == 0.0 and row["env/hack/invalid_call_rate"] == 0.0
    assert wait_gone(own_actor_processes) == []


class _Checksums(TrainerCallback):
    """After each step's weight push: the checksum the workers must hold (the learner's, or
    in ``delta`` mode its mirror), each worker's, and the step's push bytes."""

    def __init__(self, engines: list):
        self.engines, self.seen = engines, []

    def on_step_end(self, args, state, control, **kw):
        engine = self.engines[0]
        bytes_ = engine.metrics.get("rollout/weight_sync_bytes")
        self.seen.append((engine.learner_checksum(), engine.worker_checksums(state.global_step),
                          bytes_))  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "fraction"),
    [
        (["ray.weight_sync=delta", "ray.delta_codec=int8"], 0.25),
        (["ray.weight_sync=lora", "peft.enabled=true", "peft.r=2", "peft.alpha=4"], 0.1),
    ],
    ids=["delta", "lora"],
)
def test_delta_and_lora_pushes_leave_the_workers_equal_to_the_learner(
    cluster, tiny_dir, tmp_path, monkeypatch, extra, fraction
):
    """Two steps on the Ray engine with ``ray.weight_sync=delta`` (int8, error feedback) and
    with a LoRA learner (``lora``): after each push the worker's weights hash to the learner's
    (``delta``: the learner's mirror of what was pushed), the checksum changes between
    steps, and a push carries at most ``fraction`` of the whole model's bytes."""
    engines = _capture_engine(monkeypatch)
    probe = _Checksums(engines)
    out = tmp_path / "run"
    cfg = load_config(None, _overrides(tiny_dir, out, "max_steps=2", "ray.num_workers=1", *extra))
    run_training(cfg, extra_callbacks=[probe])
    whole = sum(p.numel() * p.element_size() for p in load_model(str(tiny_dir)).parameters())
    for step, (learner, workers, pushed) in enumerate(probe.seen, start=1):
        assert workers == {0: (step, learner)}
        assert 0 < pushed <= fraction * whole
    assert len({learner for learner, _, _ in probe.seen}) == 2
    assert wait_gone(own_actor_processes) == []


def test_summaries_on_the_workers(cluster, tokenizer, tmp_path):
    """``rollout.context.strategy=summarize`` on the Ray engine, one step: the worker runs the
    local engine's ``ContextLoop`` (a scripted tiny model: 2 calls fill window 0, then its
    summary; window 1 calls again and would need a second summary, past
    ``max_summaries=1``: the episode ends at the cap), the record carries the 2 windows, the
    learner packs and trains them, and the step logs the summaries; the episode log shows
    each summary."""
    import copy

    from conftest import make_tiny_model

    tok = copy.deepcopy(tokenizer)
    ensure_tool_template(tok)
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    call = json.dumps({"name": "calculate", "arguments": {"expression": "208 * 67"}})
    call = f"<tool_call>{call}</tool_call><|im_end|>"
    model = make_tiny_model(len(tok), 0, cls=ConfigScriptedLlama, max_positions=1024)
    # window 0's assistant headers: the prompt's and the first result's (the 2 calls), then
    # the summary instruction's (the second result's generation prompt gives way to the
    # instruction's user turn): the summary is the 3rd assistant turn of window 0
    model.set_script(enc("<|im_start|>assistant\n"),
                     [enc(call), enc(call), enc("208*67=13936<|im_end|>")])  # fmt: skip
    out = tmp_path / "run"
    cfg = load_config("agent_quickstart.yaml", [
        f"output_dir={out}", "max_steps=1", "num_threads=1", "rollout.engine=ray",
        "generation.num_generations=2", "generation.prompts_per_step=1",
        "generation.max_completion_length=40", "env.num_train=8", "env.few_shot=false",
        "eval.before_and_after=false", "ray.num_workers=1", "ray.address=auto",
        "ray.timeout_s=300", "alpha_sdpo=0", "beta_replay=0", "rollout.max_turns=8",
        "rollout.max_tool_calls=8", "rollout.context.strategy=summarize",
        "rollout.context.max_tokens=360", "rollout.context.summary_max_tokens=16",
        "rollout.context.max_summaries=1", "rollout.context.summary_prompt=Summarize.",
    ])  # fmt: skip
    row = _train_one_step(cfg, model, tok)
    assert row["rollout/summaries"] == 1.0 and row["rollout/windows"] == 2.0
    assert row["rollout/ended_at_cap"] == 1.0 and row["rollout/summary_tokens"] == 13
    assert row["rollout/tokens_saved"] > 0 and math.isfinite(row["loss"])
    assert "208*67=13936" in (out / "episodes.jsonl").read_text()
    assert wait_gone(own_actor_processes) == []
