"""The learner's side of ``rollout.engine: ray``: Ray's lifecycle, the hub and the workers,
weight pushes through the object store, and groups turned into the rows and token lists TRL's
``GRPOTrainer`` scores (its ``rollout_func`` protocol), with staleness bounded and counted.

The trainer (trainer/trainer.py) asks :meth:`RayRollouts.next_rows` for a step's groups instead
of generating; TRL then computes, as for any batch, the advantages per group, the learner's
pre-update log-probs (``old_per_token_logps``) and, with its importance-sampling code switched
on, the truncated ratio of that policy to the behaviour policy the worker sampled with: AReaL's
decoupled PPO objective (Fu et al. 2025, arXiv:2505.24298, eq. 5),

    min(r * A, clip(r, 1 - eps, 1 + eps_high) * A) * min(pi_old / pi_behav, C),
    r = pi_theta / pi_old,

PPO's clip against the learner's own pre-update policy (``pi_old``), times a truncated
importance weight from the behaviour policy (``rollout.correction_cap`` = C, TRL's
``vllm_importance_sampling_clip_max``; ``token_truncate`` mode). At staleness 0 the weight is 1
up to float rounding (``rollout/ratio_*`` at version lag 0 measures that mismatch: numerics,
not staleness)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from composer_replication.rollout_engine.dispenser import TaskDispenser
from composer_replication.rollout_engine.group import GroupRecord, StalenessByLength
from composer_replication.rollout_engine.hub import Hub
from composer_replication.rollout_engine.weight_sync import (
    Codec,
    Mode,
    Publisher,
    Push,
    distinct_tensors,
    payload_bytes,
    state_checksum,
)
from composer_replication.rollout_engine.worker import (
    POLL_S,
    RolloutWorker,
    WorkerSettings,
    rollout_episode,
    worker_dir,
)

log = logging.getLogger(__name__)

LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
"""Ray 2.60 reads it once, at import: ``0`` makes every service of a local Ray listen on
127.0.0.1 (without it they listen on all interfaces)."""

GROUPS_FILE = "rollout_groups.jsonl"
"""The run's record of which groups each step trained on (`EngineSettings.groups_log`)."""

STATE_FILE = "rollout_engine.json"
"""Written into every checkpoint: the dispenser's state and the policy version."""


def import_ray():
    """``ray``, imported with the loopback setting in place (refused if ray was imported
    before without it: its services would listen on every interface)."""
    import sys

    if "ray" not in sys.modules:
        os.environ.setdefault(LOOPBACK_ENV, "0")
    elif os.environ.get(LOOPBACK_ENV) != "0":
        raise RuntimeError(f"ray was imported before {LOOPBACK_ENV}=0 was set: a local Ray would "
                           "listen on every interface; set it in the environment")  # fmt: skip
    import ray

    return ray


@dataclass(frozen=True)
class EngineSettings:
    """What the learner's side needs from the run config (plain values, no pydantic)."""

    num_workers: int
    groups_per_step: int
    max_staleness: int
    force_staleness: int | None
    address: str | None = None
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    memory_gb: float | None = None
    sandbox_slots: int = 0
    sandbox_slots_per_node: int | None = None
    object_store_gb: float | None = None
    weight_sync_steps: int = 1
    weight_sync: Mode = "full"
    """``ray.weight_sync``: ``full``, ``lora`` or ``delta`` (rollout_engine/weight_sync.py)."""
    delta_codec: Codec = "int8"
    timeout_s: float = 600.0
    correction_cap: float = 2.0
    """``rollout.correction_cap``: the share of tokens whose behaviour weight exceeds it is
    reported (``rollout/ratio_*_above_cap``), whether the correction is on or off."""
    groups_log: str | None = None
    """JSON lines, one per step: the learner version and each group's ticket, task, worker
    and staleness (``GROUPS_FILE`` in the run directory)."""


def local_node_slots(settings: EngineSettings) -> int:
    """The ``sandbox_slots`` resource of a local Ray's node: ``ray.sandbox_slots_per_node``,
    else the machine's CPU count."""
    return settings.sandbox_slots_per_node or os.cpu_count() or 1


class RayRollouts:
    """Workers on Ray streaming groups to this learner (module docstring)."""

    def __init__(
        self,
        settings: EngineSettings,
        worker: WorkerSettings,
        model: Any,
        tokenizer: Any,
        env_factory: Callable[[], Any],
        dispenser: TaskDispenser,
        tools: list[Callable[..., Any]] | None = None,
    ):
        slots = local_node_slots(settings)
        if settings.address is None and settings.sandbox_slots * settings.num_workers > slots:
            raise ValueError(f"ray.worker.sandbox_slots={settings.sandbox_slots} x ray.num_workers="
                             f"{settings.num_workers} is more than the local Ray node's {slots} "
                             "sandbox slots (ray.sandbox_slots_per_node): some workers could "
                             "never start")  # fmt: skip
        self.settings = settings
        self.worker_settings = worker
        self.tools = tools
        """A tool environment's tools (bound methods of one instance): the schemas the
        workers render prompts with, for the channels that render them again (hints)."""
        self.work_dir: str | None = None
        """The workers' scratch directories' base (``WorkerSettings.work_dir``), made at
        start and removed at close."""
        self.model = model
        self.tokenizer = tokenizer
        self.env_factory = env_factory
        self.dispenser = dispenser
        self.ray: Any = None
        self.started_ray = False
        self.hub: Any = None
        self.workers: dict[int, Any] = {}
        self.runs: dict[int, Any] = {}
        self.version = 0
        self.pending: list[GroupRecord] = []
        self.metrics: dict[str, float] = {}
        self.lost_groups = 0
        self.dropped_groups = 0
        self.by_length = StalenessByLength()
        self.used: set[int] = set()
        self.produced_at_take = 0
        """Groups the workers had finished when the learner last took a step's groups."""
        self.publisher = Publisher(settings.weight_sync, settings.delta_codec)
        self.first_full: Any = None
        """The first push's whole state (its object-store reference): ``lora`` pushes keep
        pointing at it for workers that hold nothing yet."""

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self, resume_dir: str | None = None, publish: bool = False) -> None:
        """Start (or join) Ray, the hub and the workers (a resume: from the checkpoint's
        dispenser state). The first weights go out at the trainer's ``on_train_begin``, once
        a resumed checkpoint's weights are loaded (:class:`EngineCallback`), or here with
        ``publish`` (version 0)."""
        self.ray = ray = import_ray()
        if not ray.is_initialized():
            ray.init(**self._init_kwargs())
            self.started_ray = True
        if resume_dir is not None:
            self.dispenser.load_state_dict(read_state(resume_dir)["dispenser"])
        s = self.settings
        forced = s.force_staleness is not None
        keep = (s.force_staleness or 0) + 2
        self.hub = (
            ray.remote(Hub)
            .options(num_cpus=0)
            .remote(self.dispenser, s.groups_per_step, s.max_staleness, forced, keep)
        )
        if publish:
            self.publish(self.model, 0)
        self.work_dir = tempfile.mkdtemp(prefix="cr-ray-workers-")
        os.chmod(self.work_dir, 0o711)  # the sandbox's ``nobody`` passes through to its stage
        self.worker_settings = replace(self.worker_settings, work_dir=self.work_dir)
        for wid in range(s.num_workers):
            self._start_worker(wid)

    def _init_kwargs(self) -> dict[str, Any]:
        s = self.settings
        if s.address is not None:
            return {"address": s.address, "log_to_driver": False}
        slots = local_node_slots(s)
        return {
            # "local": a new Ray, always; None would join the newest cluster this machine
            # started (ray 2.60 reads /tmp/ray/ray_current_cluster and RAY_ADDRESS)
            "address": "local",
            "num_cpus": max(s.num_workers * s.num_cpus, 1),
            "object_store_memory": self._object_store_bytes(),
            "include_dashboard": False,
            "resources": {"sandbox_slots": slots},
            "log_to_driver": False,
            "_node_ip_address": "127.0.0.1",
        }

    def _object_store_bytes(self) -> int:
        if self.settings.object_store_gb is not None:
            return int(self.settings.object_store_gb * 2**30)
        state = distinct_tensors(self.model.state_dict())
        model_bytes = sum(t.numel() * t.element_size() for t in state.values())
        return max(4 * model_bytes, 2**29)

    def _start_worker(self, wid: int) -> None:
        s = self.settings
        resources = {"sandbox_slots": s.sandbox_slots} if s.sandbox_slots else {}
        memory = {"memory": int(s.memory_gb * 2**30)} if s.memory_gb else {}
        base, peft_config = _base_and_adapter(self.model)
        worker = replace(self.worker_settings, peft_config=peft_config)
        actor = self.ray.remote(RolloutWorker).options(
            num_cpus=s.num_cpus, num_gpus=s.num_gpus, resources=resources, max_concurrency=2,
            name=None, **memory,
        ).remote(wid, self.hub, type(base), base.config, self.tokenizer, self.env_factory,
                 worker)  # fmt: skip
        self.workers[wid] = actor
        self.runs[wid] = actor.run.remote()

    def close(self) -> None:
        """Stop the workers and the hub; stop Ray if this run started it. Safe to call twice."""
        if self.ray is None:
            return
        ray, self.ray = self.ray, None
        try:
            if self.hub is not None:
                ray.get(self.hub.stop.remote(), timeout=10)
                ray.wait(list(self.runs.values()), num_returns=len(self.runs), timeout=10)
        except Exception as err:  # a dead hub or worker: killed below all the same
            log.debug("rollout engine close: %s", err)
        for actor in [*self.workers.values(), self.hub]:
            if actor is not None:
                ray.kill(actor, no_restart=True)
        self.workers.clear()
        self.runs.clear()
        if self.work_dir is not None:  # a killed worker's workspaces (on this node) too
            shutil.rmtree(self.work_dir, ignore_errors=True)
        if self.started_ray:
            ray.shutdown()

    # ---- weights -----------------------------------------------------------------------------
    def publish(self, model: Any, version: int) -> None:
        """Put ``version``'s push into the object store (``ray.weight_sync``: the whole state
        dict, each tied tensor once; or after a first whole push, the adapter or the encoded
        delta, rollout_engine/weight_sync.py) and tell the hub; workers load it before their
        next group. ``rollout/weight_sync_bytes``: what a worker holding the previous version
        fetches."""
        start = time.monotonic()
        after = self.publisher.last
        full, update = self.publisher.parts(model, version)
        full_ref = self.ray.put(full) if full is not None else self.first_full
        if self.first_full is None:
            self.first_full = full_ref
        update_ref = self.ray.put(update) if update is not None else None
        push = Push(self.settings.weight_sync, full_ref, update_ref, after)
        self.ray.get(self.hub.publish.remote(version, [push]), timeout=self.settings.timeout_s)
        self.version = version
        self.metrics["rollout/weight_sync_s"] = time.monotonic() - start
        self.metrics["rollout/weight_sync_bytes"] = float(
            payload_bytes(update if update is not None else full)
        )

    def learner_checksum(self) -> str:
        """The checksum every worker's weights must have: the learner's (each tied tensor
        once), or in ``delta`` mode the mirror of what was pushed."""
        if self.publisher.mirror is not None:
            return state_checksum(self.publisher.mirror)
        return state_checksum(distinct_tensors(self.model.state_dict()))

    def worker_checksums(self, version: int | None = None) -> dict[int, tuple[int, str]]:
        """Each live worker's ``(version, checksum)`` after loading ``version`` (None: the
        newest published); a dead worker (replaced at the next take) is left out."""
        refs = {wid: a.sync.remote(version) for wid, a in self.workers.items()}
        out = {}
        for wid, ref in refs.items():
            try:
                out[wid] = self.ray.get(ref, timeout=self.settings.timeout_s)
            except self.ray.exceptions.RayActorError:
                continue
        return out

    # ---- groups ------------------------------------------------------------------------------
    def take_groups(self, n: int, version: int) -> list[GroupRecord]:
        """``n`` groups at most ``max_staleness`` steps old at learner ``version`` (older ones
        dropped and counted), waiting for them up to the deadline; the wait is measured."""
        s = self.settings
        if s.force_staleness is not None:
            self.ray.get(self.hub.request.remote(n, max(0, version - s.force_staleness)))
        start = time.monotonic()
        fresh: list[GroupRecord] = []
        staleness: list[int] = []
        while len(fresh) < n:
            self._check_workers()
            got = self.ray.get(self.hub.take.remote(n - len(fresh)))
            for g in got:
                if g.group_id in self.used:
                    raise RuntimeError(f"group {g.group_id} arrived twice")
                self.used.add(g.group_id)
                lag = g.staleness(version)
                staleness.append(lag)
                self.by_length.count(g, dropped=lag > s.max_staleness)
                if lag > s.max_staleness:
                    self.dropped_groups += 1
                else:
                    fresh.append(g)
            if got:
                used = {g.group_id: [r.reward for r in g.rollouts if r.valid] for g in got}
                self.ray.get(self.hub.consume.remote(used))
            elif time.monotonic() - start > s.timeout_s:
                raise TimeoutError(f"rollout engine: no group from {len(self.workers)} workers "
                                   f"within ray.timeout_s={s.timeout_s:.0f} s")  # fmt: skip
            else:
                time.sleep(POLL_S)
        self._step_metrics(fresh, staleness, time.monotonic() - start)
        self._log_groups(fresh, version)
        return fresh

    def _log_groups(self, groups: list[GroupRecord], version: int) -> None:
        if self.settings.groups_log is None:
            return
        line = {"version": version, "groups": [
            {"id": g.group_id, "task": g.task_id, "worker": g.worker,
             "staleness": g.staleness(version)} for g in groups]}  # fmt: skip
        with open(self.settings.groups_log, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line) + "\n")

    def _check_workers(self) -> None:
        """A worker whose loop ended (killed, or an error) is replaced; a killed one's
        in-flight tickets go back to the dispenser (counted in ``rollout/lost_groups``); an
        error in a worker's code stops the run with its message."""
        ready, _ = self.ray.wait(list(self.runs.values()), num_returns=len(self.runs), timeout=0)
        for ref in ready:
            wid = next(w for w, r in self.runs.items() if r == ref)
            try:
                self.ray.get(ref)
                raise RuntimeError(f"rollout worker {wid} stopped before the run ended")
            except self.ray.exceptions.RayActorError:
                lost = self.ray.get(self.hub.worker_lost.remote(wid))
                self.lost_groups += lost
                if self.work_dir is not None:  # its workspaces, when it ran on this node
                    shutil.rmtree(worker_dir(self.work_dir, wid), ignore_errors=True)
                log.warning("rollout worker %d died; %d in-flight groups handed out again, "
                            "a replacement starts", wid, lost)  # fmt: skip
                self._start_worker(wid)
            except self.ray.exceptions.RayTaskError as err:
                raise RuntimeError(f"rollout worker {wid}: {err.cause!r}") from None

    def _step_metrics(self, groups: list[GroupRecord], staleness: list[int], wait_s: float):
        stats = self.ray.get(self.hub.stats.remote())
        self.produced_at_take = sum(stats["produced"].values())
        m = self.metrics
        m["rollout/version"] = float(self.version)
        m["rollout/wait_s"] = wait_s
        m["rollout/queue_depth"] = float(stats["queue_depth"])
        m["rollout/dropped_groups"] = float(self.dropped_groups)
        m["rollout/lost_groups"] = float(self.lost_groups)
        m.update(self.by_length.metrics())
        tool_groups = [g for g in groups if "tool_calls" in g.info]
        if tool_groups:  # TRL's two tool metrics, from the workers' counts
            calls = sum(g.info["tool_calls"] for g in tool_groups)
            failures = sum(g.info["tool_failures"] for g in tool_groups)
            m["tools/call_frequency"] = calls / sum(len(g.rollouts) for g in tool_groups)
            m["tools/failure_frequency"] = failures / calls if calls else 0.0
        used = [g.staleness(self.version) for g in groups]
        m["rollout/staleness_mean"] = sum(used) / len(used)
        m["rollout/staleness_max"] = float(max(used))
        for lag, count in Counter(staleness).items():
            m[f"rollout/staleness_hist/{lag}"] = float(count)
        m.update(self.ray.get(self.hub.sampler_metrics.remote()))
        for wid in stats["produced"]:
            secs = [g.seconds for g in groups if g.worker == wid]
            if secs:
                rollouts = self.worker_settings.group_size
                m[f"rollout/samples_per_s/worker_{wid}"] = rollouts * len(secs) / sum(secs)

    def step_metrics(self) -> dict[str, float]:
        """The metrics of the last :meth:`take_groups` (and weight push), then cleared."""
        out, self.metrics = self.metrics, {}
        return out

    # ---- TRL's batch -------------------------------------------------------------------------
    def next_rows(self, n_groups: int, version: int) -> list[dict[str, Any]]:
        """Take ``n_groups`` groups and return their rows (:func:`group_rows`);
        :meth:`rollout_func` then hands TRL their tokens."""
        self.pending = self.take_groups(n_groups, version)
        return group_rows(self.pending)

    def packed_windows(self) -> list[list[int]] | None:
        """The window of each completion token of the pending groups' rows (:func:`group_tokens`'
        order), when the run has a ``rollout.context`` strategy or a rollout holds several
        sequences: the trainer then scores those rows packed (``completion_window``,
        lm/packing.py), as the local engine does; None otherwise."""
        ws = self.worker_settings
        several = any(len(r.sequences) > 1 for g in self.pending for r in g.rollouts)
        if not several and (ws is None or ws.context is None):
            return None
        return [e.packed()[3] for e in self.context_episodes()]

    def context_episodes(self) -> list[Any]:
        """The pending groups' rollouts as ``rollout.ContextEpisode`` (their windows and
        summaries), one per row: what the trainer's ``rollout/summaries`` metrics read."""
        return [rollout_episode(r) for g in self.pending for r in g.rollouts]

    def rollout_func(self, prompts: list[Any], trainer: Any = None) -> dict[str, Any]:
        """TRL's ``rollout_func`` for the pending groups (:func:`group_tokens`)."""
        return group_tokens(self.pending, len(prompts))

    def batch_metrics(self, batch: dict[str, Any]) -> dict[str, float]:
        """The step's engine metrics, and the behaviour-correction weight ``pi_old /
        pi_behav`` (before truncation: ``exp(old - sampling)`` on the policy's tokens) split
        by version lag: ``lag0`` is the numerical mismatch between the worker's generation
        and the learner's forward, ``stale`` what staleness adds; ``above_cap`` is the share of
        tokens the truncation at ``correction_cap`` cuts."""
        import torch

        out = self.step_metrics()
        old, behav = batch.get("old_per_token_logps"), batch.get("sampling_per_token_logps")
        if old is None or behav is None:
            return out
        mask_BT = batch["completion_mask"].bool()
        if batch.get("tool_mask") is not None:
            mask_BT &= batch["tool_mask"].bool()
        lags_B = torch.tensor([g.staleness(self.version) for g in self.pending
                               for _ in g.rollouts], device=mask_BT.device)  # fmt: skip
        ratio_BT = torch.exp(old - behav)
        for name, rows_B in (("lag0", lags_B == 0), ("stale", lags_B > 0)):
            sel_BT = mask_BT & rows_B.unsqueeze(1)
            if sel_BT.any():
                r = ratio_BT[sel_BT]
                out[f"rollout/ratio_{name}_mean"] = float(r.mean())
                out[f"rollout/ratio_{name}_max_dev"] = float((r - 1).abs().max())
                out[f"rollout/ratio_{name}_above_cap"] = float(
                    (r > self.settings.correction_cap).float().mean()
                )
        return out

    def callback(self, trainer: Any) -> Any:
        """The trainer callback that pushes weights after optimizer steps and saves the
        engine's state into checkpoints."""
        return EngineCallback(self)

    # ---- checkpoints -------------------------------------------------------------------------
    def save(self, checkpoint_dir: str | Path, version: int) -> None:
        """The dispenser's state and the policy version, into ``checkpoint_dir``."""
        state = {"dispenser": self.ray.get(self.hub.state_dict.remote()), "version": version}
        Path(checkpoint_dir, STATE_FILE).write_text(json.dumps(state, indent=1))


def _base_and_adapter(model: Any) -> tuple[Any, Any]:
    """``(base model, adapter config)`` of a PEFT model; ``(model, None)`` otherwise."""
    get_base = getattr(model, "get_base_model", None)
    configs = getattr(model, "peft_config", None)
    if get_base is None or not configs:
        return model, None
    return get_base(), configs[getattr(model, "active_adapter", "default")]


def group_rows(groups: list[GroupRecord]) -> list[dict[str, Any]]:
    """One TRL row per rollout, group after group: the task's row plus the worker's
    ``worker_reward`` (None for a rollout lost to an infrastructure failure: TRL leaves an
    unscorable rollout out of its group's baseline and gives it no advantage),
    ``worker_verdict``, ``worker_messages`` (a tool episode's messages, else None) and
    ``worker_group`` (the group's ``info``: tool counts, the task's pass-rate estimate, a
    do-nothing check's reward) for the learner's telemetry (:class:`WorkerReward`)."""
    rows = []
    for g in groups:
        for r in g.rollouts:
            rows.append({**g.row, "worker_reward": r.reward if r.valid else None,
                         "worker_verdict": r.verdict, "worker_messages": r.messages,
                         "worker_group": g.info})  # fmt: skip
    return rows


def group_tokens(groups: list[GroupRecord], n_prompts: int) -> dict[str, Any]:
    """TRL's ``rollout_func`` output for ``groups`` (in :func:`group_rows`' order): prompt
    and completion ids, behaviour log-probs and tool masks (``env_mask``). A rollout of
    several sequences (context windows) is ONE row, packed as the local engine packs an
    episode (``rollout.ContextEpisode.packed``): window 0's prompt, then each window's
    completion, each later window preceded by its prompt (mask 0, log-prob 0.0); the window
    of each token is :meth:`RayRollouts.packed_windows`."""
    rollouts = [r for g in groups for r in g.rollouts]
    if len(rollouts) != n_prompts:
        raise RuntimeError(f"rollout engine: {len(rollouts)} rollouts for {n_prompts} prompts")
    packed = [rollout_episode(r).packed() for r in rollouts]
    return {
        "prompt_ids": [r.sequences[0].prompt_ids for r in rollouts],
        "completion_ids": [p[0] for p in packed],
        "logprobs": [p[2] for p in packed],
        "env_mask": [p[1] for p in packed],
    }


def read_state(checkpoint_dir: str | Path) -> dict[str, Any]:
    path = Path(checkpoint_dir, STATE_FILE)
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: cannot read the rollout engine's state ({err})") from None


class WorkerReward:
    """TRL reward function of ``rollout.engine: ray``: the reward the worker graded (the
    learner does not grade again); the verdicts stay in ``last_results`` for the hint
    channels, as :class:`~composer_replication.trainer.rewards.EnvReward` keeps them. A
    grading the machine failed (the verdict's mark, envs/base.py ``machine_failed``) or a
    rollout the record marks invalid is None, and its kind is in ``last_infra_kinds``: the
    trainer masks it as it masks the local engine's (trainer/masking.py, docs/sandbox.md).

    It logs what ``EnvReward`` logs on the local engine, from the records: ``env/pass_rate``,
    the flag rates and machine failures; for a tool environment ``tools/calls/<name>``, the
    hack telemetry ``env/hack/*`` (invalid calls split by the task estimates the hub attached
    when the learner took the groups; the do-nothing check the workers ran) and the episode
    log (envs/telemetry.py ``ToolTelemetry``)."""

    def __init__(self, env_name: str, offered: tuple[str, ...] | None = None,
                 episode_log: str | Path | None = None):  # fmt: skip
        from composer_replication.envs.telemetry import ToolTelemetry

        self.__name__ = f"{env_name}_reward"
        self.last_results: list[Any] = []
        self.last_infra_kinds: list[str | None] = []
        self.telemetry = ToolTelemetry(offered, episode_log) if offered is not None else None
        """A tool environment's telemetry (``offered``: its tool names); None: single-turn."""

    def __call__(self, prompts, completions, worker_reward, worker_verdict, task_id=None,
                 worker_messages=None, worker_group=None, log_metric=None, trainer_state=None,
                 **_: Any) -> list[float | None]:  # fmt: skip
        from composer_replication.envs.base import infra_kind
        from composer_replication.envs.telemetry import log_verdict_metrics

        self.last_results = list(worker_verdict)
        kinds = [infra_kind(v) if v is not None else None for v in worker_verdict]
        self.last_infra_kinds = kinds
        if self.telemetry is not None and worker_messages is not None and task_id is not None:
            self._log_tools(list(task_id), list(worker_messages), list(worker_group or []),
                            kinds, log_metric, trainer_state)  # fmt: skip
        log_verdict_metrics(self.last_results, kinds, log_metric)
        return [None if k is not None else r for r, k in zip(worker_reward, kinds, strict=True)]

    def _log_tools(self, task_id, messages, groups, kinds, log_metric, trainer_state) -> None:
        assert self.telemetry is not None
        infos = groups or [{}] * len(task_id)
        estimates = {t: tuple(i["task_estimate"]) for t, i in zip(task_id, infos, strict=True)
                     if "task_estimate" in i}  # fmt: skip
        # a rollout the record marks invalid has no verdict: left out as a machine failure is
        graded = [v if v is not None else _NO_VERDICT for v in self.last_results]
        kinds = [k if v is not None else "invalid" for k, v in zip(kinds, self.last_results,
                                                                   strict=True)]  # fmt: skip
        step = trainer_state.global_step + 1 if trainer_state is not None else None
        estimate = estimates.__getitem__ if len(estimates) == len(set(task_id)) else None
        self.telemetry.log(task_id, [m or [] for m in messages], graded, kinds, log_metric,
                           step, estimate)  # fmt: skip
        checked = {t: i["do_nothing_reward"] for t, i in zip(task_id, infos, strict=True)
                   if "do_nothing_reward" in i}  # fmt: skip
        if checked or self.telemetry.do_nothing:
            self.telemetry.log_do_nothing(checked, log_metric)


class _NoVerdict:
    """The stand-in verdict of a rollout the record marks invalid (no grading)."""

    reward, passed, info = 0.0, False, {}


_NO_VERDICT = _NoVerdict()


def _callback_base() -> type:
    from transformers import TrainerCallback

    return TrainerCallback


class EngineCallback(_callback_base()):
    """After every ``weight_sync_steps`` optimizer steps: the new weights to the workers; at
    each checkpoint: the dispenser's state and the version (``STATE_FILE``)."""

    def __init__(self, engine: RayRollouts):
        self.engine = engine

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.engine.publish(model, state.global_step)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % self.engine.settings.weight_sync_steps == 0:
            self.engine.publish(model, state.global_step)

    def on_save(self, args, state, control, **kwargs):
        ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if ckpt.is_dir():
            self.engine.save(ckpt, state.global_step)
