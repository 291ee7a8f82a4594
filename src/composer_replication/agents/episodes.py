"""Agent-harness episodes as TRL's ``rollout_func`` (trl 1.16: ``rollout_func(prompts,
trainer) -> {"prompt_ids", "completion_ids", "logprobs", ...}``; other keys reach the reward
functions, ``env_mask`` masks the loss like ``tool_mask``).

Per prompt TRL hands over (its batch already repeats each prompt ``num_generations`` times):

1. the task is the one the prompt's dataset row names (``task_id``: the trainer's
   ``rollout_rows``, in the order of the prompts; two tasks may share one text);
2. a fresh workspace (the environment's own ``reset``);
3. the harness runs on it inside the sandbox (agents/sandboxed.py) with a fresh proxy key,
   the proxy answering with the trainer's current policy (agents/policy.py's
   ``TrainerPolicy``: the trainer's one generator and sampling settings);
4. what it left in the workspace is graded by the environment (``grade_episodes``: Feature
   Deletion takes only the target file, in its own sandboxes); writes to tests or configs and
   refused links are flagged as with the file tools;
5. the recorded turns become one sequence (agents/align.py), cut at the first turn that does
   not extend it and at ``max_completion_length``; an episode with no usable turn is one
   end-of-turn token with an all-zero mask (it trains nothing, its reward still counts in its
   group's baseline).

An error of one episode (its workspace, its sandbox, the read-back) is that episode's failure:
reward 0, flag ``episode_failed:<type>``, never the batch's.

Episodes run ``workers`` at once; their requests are generated together, in arrival order
(lm/generator.py). Metrics per step (``agent/``): turns per episode, dropped turns and tokens,
the share of episodes whose sequence diverged, refused requests, timed-out agents, failed
episodes, harnesses that exited with a non-zero status (their output goes to the log), agent
wall seconds, the seconds of it spent waiting for the generator (``agent/queued_seconds``)
and in the policy (``agent/policy_seconds``: queue and generation), the agent's own seconds
(wall less the time a request of it was in the policy: what ``agent_proxy.timeout_s`` limits,
agents/sandboxed.py), and ``env/pass_rate``.
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from composer_replication.agents.align import Joined, join_turns
from composer_replication.agents.harnesses import MODEL_NAME, harness_command, venv_setup_command
from composer_replication.agents.policy import TrainerPolicy
from composer_replication.agents.proxy import (
    Policy,
    PolicyProxy,
    Turn,
    private_socket_dir,
    remove_socket_dir,
)
from composer_replication.agents.sandboxed import AgentRun, run_agent
from composer_replication.config import AgentProxyConfig, SandboxConfig, UserError
from composer_replication.envs.base import (
    StepResult,
    Task,
    infra_kind,
    log_infra_metrics,
    machine_failed,
)
from composer_replication.envs.workspace import workspace_episode
from composer_replication.lm.chat import render_prompt
from composer_replication.sandbox.infra import HARNESS_START, InfraFailure
from composer_replication.sandbox.sandbox import SLOTS, Sandbox
from composer_replication.sandbox.shell import ShellResult

__all__ = ["AgentEpisodes", "AgentReward", "Episode"]

SOCKET = "proxy.sock"
log = logging.getLogger(__name__)


@dataclass
class Episode:
    """One harness run: its tools instance (workspace, flags), turns and sandbox outcome."""

    task: Task
    tools: Any
    turns: list[Turn] = field(default_factory=list)
    refused: int = 0
    run: ShellResult | None = None
    seconds: float = 0.0
    error: str = ""
    """Why the episode failed before it could be graded ('' if it did not)."""
    infra: InfraFailure | None = None
    """The agent's sandbox never started, or its harness ended before its first request: the
    machine's failure, the episode is masked (sandbox/infra.py)."""
    queued_s: float = 0.0
    """Seconds its requests waited for the generator (other requests' batches)."""
    policy_s: float = 0.0
    """Seconds its requests spent in the policy (queue and generation)."""
    waited_s: float = 0.0
    """Seconds with a request of it in the policy: not counted against ``timeout_s``."""


def harness_venv(cfg: AgentProxyConfig) -> str:
    """The real path of ``agent_proxy.venv``; a `UserError` naming the field if it is not a
    virtual environment with the harness in its ``bin`` (or if the proxy's server packages,
    the ``replay`` extra, are missing)."""
    import importlib.util

    if any(importlib.util.find_spec(m) is None for m in ("fastapi", "uvicorn")):
        raise UserError("agent_proxy serves the policy with fastapi and uvicorn: "
                        "pip install 'composer-replication[replay]'")  # fmt: skip
    path = os.path.realpath(os.path.expanduser(cfg.venv))
    program = "mini" if cfg.harness == "mini_swe_agent" else ""
    if not os.path.isfile(os.path.join(path, "pyvenv.cfg")) or (
        program and not os.path.isfile(os.path.join(path, "bin", program))
    ):
        what = f"with bin/{program} " if program else ""
        build = f": {venv_setup_command(cfg.venv)}" if program else ""
        raise UserError(f"agent_proxy.venv: {cfg.venv} is no virtual environment {what}"
                        f"(build it from PyPI{build})")  # fmt: skip
    return path


def episode_workers(n_episodes: int, workers: int) -> int:
    """Episodes run at once: ``workers`` (0: the sandbox slots), never more than the sandbox
    slots. An episode holds a slot for its whole run; one queued behind the slots would wait
    for its siblings, and a wait past ``sandbox.slot_wait_s`` is masked as the machine's
    (``slot_timeout``): a policy whose episodes run to their deadline would mask the queued
    episodes of its own group. Queued in the pool instead, an episode waits without a limit."""
    return max(1, min(n_episodes, workers or SLOTS.limit, SLOTS.limit))


class AgentEpisodes:
    """TRL's ``rollout_func`` over an environment's tasks (module docstring). The proxy starts
    at the first call with the trainer's policy (``policy``: another one, for tests) and
    stops with :meth:`close`."""

    def __init__(self, env: Any, cfg: AgentProxyConfig, tokenizer: Any,
                 policy: Policy | None = None):  # fmt: skip
        self.env, self.cfg, self.tokenizer, self._policy = env, cfg, tokenizer, policy
        self.venv = harness_venv(cfg)
        self._tasks = {t.task_id: t for s in ("train", "heldout") for t in env.tasks(s)}
        self.box = Sandbox(SandboxConfig(memory_mb=cfg.memory_mb))
        self.proxy: PolicyProxy | None = None
        self._socket_dir = ""
        self.last_episodes: list[Episode] = []

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list]:
        self._start(trainer)
        tasks = self._tasks_of(prompts, getattr(trainer, "rollout_rows", None))
        workers = episode_workers(len(tasks), self.cfg.workers)
        with ThreadPoolExecutor(workers, thread_name_prefix="cr-agent") as pool:
            episodes = list(pool.map(self.run_episode, tasks))
        results = self.grade(episodes)
        limit = trainer.max_completion_length
        joined = [join_turns(e.turns, limit) for e in episodes]
        self._log(trainer, episodes, joined, results)
        self.last_episodes = episodes
        return self._batch(prompts, joined, results)

    # ---- one episode -----------------------------------------------------------------------
    def run_episode(self, task: Task) -> Episode:
        """A fresh workspace for ``task``, the harness run on it, its turns recorded (the
        workspace is left for :meth:`grade`). Any error of the episode (its workspace, its
        sandbox, the read-back) is that episode's failure (``error``), never the batch's."""
        ep = Episode(task, None)
        try:
            self._run(ep)
        except Exception as e:  # noqa: BLE001 - one episode's fault ends that episode only
            log.warning("agent episode of %s failed", task.task_id, exc_info=e)
            ep.error = f"{type(e).__name__}: {e}"[:300]
        return ep

    def _run(self, ep: Episode) -> None:
        task = ep.task
        ep.tools = self.env.tools_class()()
        ep.tools.reset(task_id=task.task_id)
        workspace = workspace_episode(ep.tools)
        key = self.proxy.open_episode()
        command, env = harness_command(self.cfg.harness, self.cfg.command)
        env = (*env, ("OPENAI_API_KEY", key), ("AGENT_TASK", self.env.user_message(task)),
               ("AGENT_STEP_LIMIT", str(self.cfg.step_limit)))  # fmt: skip
        run = AgentRun(command, self.venv, env, port=self.cfg.port, timeout_s=self.cfg.timeout_s,
                       max_wait_s=self.cfg.max_policy_wait_s,
                       max_processes=self.cfg.max_processes)  # fmt: skip
        start = time.monotonic()
        try:
            ep.run = run_agent(self.box, workspace.root, run, self._socket_dir, SOCKET,
                               python_path=workspace.python_path,
                               policy_wait=lambda: self.proxy.policy_wait(key))  # fmt: skip
        except InfraFailure as e:  # the sandbox start or slot wait, before any request
            ep.infra = e
            return
        finally:
            ep.seconds = time.monotonic() - start
            record = self.proxy.close_episode_record(key)
            ep.turns, ep.refused = record.turns, record.refused
            ep.queued_s, ep.policy_s = record.queued_s, record.policy_s
            ep.waited_s = record.waited_s
        if not_started(ep):  # the machine's, before the policy's first action
            ep.infra = harness_not_started(ep.run)
            log.warning("the harness of %s ended before its first request: %s (output: %s)",
                        task.task_id, ep.infra.detail, ep.run.output[-500:])  # fmt: skip
            return
        if harness_failed(ep):
            log.warning("the harness of %s exited with status %s after %d turn(s) (output: %s)",
                        task.task_id, ep.run.exit_code, len(ep.turns),
                        ep.run.output[-1500:])  # fmt: skip
        for rel in ep.run.changed:
            workspace.note_write(rel)
        workspace.flag(*ep.run.refused)

    def grade(self, episodes: list[Episode]) -> list[StepResult]:
        """The environment's grading of each episode's workspace (removes the workspaces);
        an episode whose sandbox never started is the machine's failure, not graded; any
        other failed episode (``error``) scores 0 with an ``episode_failed`` flag, ungraded."""
        ran = [e for e in episodes if e.infra is None and not e.error]
        messages = [e.turns[-1].messages if e.turns else [] for e in ran]
        graded = iter(self.env.grade_episodes([e.task for e in ran], messages,
                                              [e.tools for e in ran]) if ran else [])  # fmt: skip
        return [_failed(e) if e.error else _not_graded(e) if e.infra is not None
                else next(graded) for e in episodes]  # fmt: skip

    # ---- plumbing --------------------------------------------------------------------------
    def _start(self, trainer: Any) -> None:
        if self.proxy is not None:
            return
        self._socket_dir = private_socket_dir()
        policy = self._policy or TrainerPolicy(trainer)
        self.proxy = PolicyProxy(policy, self.tokenizer, os.path.join(self._socket_dir, SOCKET),
                                 model_name=MODEL_NAME, max_prompt_tokens=self.cfg.max_prompt_tokens,
                                 max_requests=self.cfg.max_requests).start()  # fmt: skip

    def close(self) -> None:
        """Stop the proxy and remove its socket directory."""
        if self.proxy is not None:
            self.proxy.stop()
            self.proxy = None
            remove_socket_dir(self._socket_dir)

    def _tasks_of(self, prompts: list[Any], rows: list[dict[str, Any]] | None) -> list[Task]:
        """The task of each prompt: the ``task_id`` of its dataset row (``rows``, in the order
        of the prompts: the trainer's ``rollout_rows``)."""
        if rows is None or len(rows) != len(prompts):
            raise ValueError(f"agent_proxy: {len(prompts)} prompts came without their dataset "
                             "rows (the trainer's rollout_rows)")  # fmt: skip
        ids = [row.get("task_id") for row in rows]
        unknown = [i for i in ids if i not in self._tasks]
        if unknown:
            raise KeyError(f"agent_proxy: task_id {unknown[0]!r} is no task of {self.env.name}")
        return [self._tasks[i] for i in ids]

    def _batch(self, prompts, joined: list[Joined | None], results) -> dict[str, list]:
        eos = self.tokenizer.eos_token_id
        out: dict[str, list] = {k: [] for k in ("prompt_ids", "completion_ids", "logprobs",
                                                "env_mask")}  # fmt: skip
        for prompt, j in zip(prompts, joined, strict=True):
            if j is None or not j.completion_ids:  # nothing usable: one masked token
                ids = j.prompt_ids if j is not None else self._prompt_ids(prompt)
                j = Joined(ids, [eos], [0.0], [0])
            out["prompt_ids"].append(j.prompt_ids)
            out["completion_ids"].append(j.completion_ids)
            out["logprobs"].append(j.logprobs)
            out["env_mask"].append(j.env_mask)
        out["agent_result"] = list(results)
        return out

    def _prompt_ids(self, prompt: Any) -> list[int]:
        text = render_prompt(self.tokenizer, prompt)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _log(self, trainer, episodes: list[Episode], joined, results) -> None:
        mode = "train" if trainer.model.training else "eval"
        # the episodes the machine failed are masked and counted apart (env/infra_failed*)
        ran = [(e, j) for e, j in zip(episodes, joined, strict=True) if e.infra is None]
        episodes = [e for e, _ in ran]
        n = max(len(episodes), 1)
        usable = [j for _, j in ran if j is not None]
        values = {
            "agent/turns": sum(len(e.turns) for e in episodes) / n,
            "agent/trained_turns": sum(j.turns for j in usable) / n,
            "agent/dropped_turns": sum(j.dropped_turns for j in usable) / n,
            "agent/dropped_tokens": sum(j.dropped_tokens for j in usable) / n,
            "agent/diverged_frac": sum(j.diverged for j in usable) / n,
            "agent/refused_requests": sum(e.refused for e in episodes) / n,
            "agent/timed_out_frac": sum(bool(e.run and e.run.timed_out) for e in episodes) / n,
            "agent/seconds": sum(e.seconds for e in episodes) / n,
            "agent/failed_frac": sum(bool(e.error) for e in episodes) / n,
            "agent/harness_failed_frac": sum(harness_failed(e) for e in episodes) / n,
            "agent/queued_seconds": sum(e.queued_s for e in episodes) / n,
            "agent/policy_seconds": sum(e.policy_s for e in episodes) / n,
            "agent/own_seconds": sum(max(e.seconds - e.waited_s, 0.0) for e in episodes) / n,
        }
        for key, value in values.items():
            trainer.log_metric(key, value, mode)


NOT_STARTED_STATUS = (126, 127)
"""The shell's exit status for a command it could not execute or did not find (POSIX)."""


def not_started(ep: Episode) -> bool:
    """Whether the episode's harness could not start: its shell found no program to run
    (exit 126/127) and no request reached the policy. Seen on a loaded machine as ``mini: not
    found`` from a harness venv that was there before and after (issue 54's CI, 1 episode in
    ~100), or ``the proxy relay did not start`` (agents/sandboxed.py, the same status); the
    policy had no part in it, so it is the machine's failure (sandbox/infra.py:
    before the policy's first action), masked, not a 0 the group learns from. An agent that
    runs without asking the policy (a ``command`` harness acting on its own) is still graded."""
    run = ep.run
    return (run is not None and not ep.turns and not ep.refused and not run.timed_out
            and run.exit_code in NOT_STARTED_STATUS)  # fmt: skip


def harness_failed(ep: Episode) -> bool:
    """Whether the episode's harness ended with a non-zero exit status of its own (not
    stopped by the time limit, not :func:`not_started`): graded as it stands, like any agent
    that gives up, and counted (``agent/harness_failed_frac``) with its output in the log, so
    a harness that crashes (an exception of its model client, a limit of the sandbox) is seen
    rather than read as the policy's choice."""
    run = ep.run
    return bool(run is not None and ep.infra is None and not run.timed_out and run.exit_code)


def harness_not_started(run: ShellResult) -> InfraFailure:
    """The machine failure of a harness that could not start (:func:`not_started`). The
    detail is the exit status only (trusted text); the output goes to the log."""
    return InfraFailure(HARNESS_START, f"the harness could not start (exit status {run.exit_code})")


def _close_workspace(ep: Episode) -> list[str]:
    """Remove the workspace of an episode that is not graded; its flags."""
    workspace = getattr(ep.tools, "episode", None)
    flags = list(getattr(workspace, "flags", None) or [])
    if workspace is not None:
        workspace.close()
    return flags


def _not_graded(ep: Episode) -> StepResult:
    """The result of an episode the machine failed (``ep.infra``): masked; its workspace
    removed."""
    _close_workspace(ep)
    return machine_failed("", ep.infra)


def _failed(ep: Episode) -> StepResult:
    """The verdict of an episode that failed (``ep.error``): 0, flagged; its workspace removed."""
    flags = _close_workspace(ep)
    why = f"the episode failed: {ep.error}"
    kind = ep.error.partition(":")[0]
    return StepResult(
        why, 0.0, True, False, why, {"flags": sorted({*flags, f"episode_failed:{kind}"})}
    )


class AgentReward:
    """The reward of agent episodes: the environment's verdicts, graded in the rollout
    function and handed over in the ``agent_result`` column (kept in ``last_results`` for
    the channels that need verdicts)."""

    __name__ = "agent_reward"

    def __init__(self) -> None:
        self.last_results: list[StepResult] = []

    def __call__(self, prompts, completions, agent_result, log_metric=None, **_: Any):
        self.last_results = list(agent_result)
        kinds = self.last_infra_kinds
        if log_metric is not None and self.last_results:
            n = len(self.last_results)
            graded = [r for r, k in zip(self.last_results, kinds, strict=True) if k is None]
            if graded:
                log_metric("env/pass_rate", sum(r.passed for r in graded) / len(graded))
            flagged = sum(bool(r.info.get("flags")) for r in self.last_results)
            log_metric("env/flagged_frac", flagged / n)
            log_infra_metrics(kinds, log_metric)
        return [None if k else r.reward for r, k in zip(self.last_results, kinds, strict=True)]

    @property
    def last_infra_kinds(self) -> list[str | None]:
        """Per episode of the last batch: the machine failure kind, or None if graded."""
        return [infra_kind(r) for r in self.last_results]
