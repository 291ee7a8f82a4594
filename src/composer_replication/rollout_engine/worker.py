"""A rollout worker: a Ray actor holding a policy copy, a generator and its environment. It
pulls a ticket from the hub, loads the weights the ticket needs (the newest, or the version a
forced-staleness ticket names) from Ray's object store, generates the group, grades it, and
pushes the group record to the hub; until the hub says stop.

The policy copy is built from the learner's model class and config and filled with the
weights the learner publishes, so a worker needs the package and the tokenizer, never the
model's files. Sampling is seeded per group (run seed and ticket number), so a group's tokens do
not depend on which worker drew it.

A tool environment's group runs TRL's multi-turn loop (rollout.py ``ToolLoop``: the loop local
training runs) on one instance of the run's tool class per rollout, and is graded here with
``grade_episodes``; before each later turn the worker loads the newest weights (or the forced
version), so each turn records its own version. With ``rollout.context``
(``WorkerSettings.context``) the loop is the local engine's ``ContextLoop`` (through
``ToolLoop``), and each context window of an episode travels as its own ``Sequence`` with its
turns' versions; the learner packs them into one row (learner.py ``group_tokens``;
docs/summarization.md). The worker runs at most
``WorkerSettings.sandbox_slots`` sandboxes at once (its share of its node, which Ray
accounts), and its temporary files (workspaces) live under its own scratch directory, which
the learner or its replacement removes: a killed actor runs no ``atexit``, and its bwrap
processes die with it (``--die-with-parent``)."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from composer_replication.envs.telemetry import do_nothing_reward
from composer_replication.envs.tools import bounded_tools
from composer_replication.lm.chat import as_messages, render_prompt
from composer_replication.lm.generator import Generator, Sampling
from composer_replication.rollout import ContextEpisode, ToolLoop, Window
from composer_replication.rollout_engine.dispenser import Ticket
from composer_replication.rollout_engine.group import GroupRecord, Rollout, Sequence
from composer_replication.rollout_engine.weight_sync import (
    apply_push,
    distinct_tensors,
    state_checksum,
)
from composer_replication.sandbox.sandbox import set_sandbox_slots

POLL_S = 0.02
"""Seconds between asks when the hub has no ticket or no weights yet."""


@dataclass(frozen=True)
class WorkerSettings:
    group_size: int
    sampling: Sampling
    seed: int
    num_threads: int = 1
    timeout_s: float = 600.0
    max_turns: int = 1
    """Assistant turns of a tool environment's episode (``rollout.max_turns``)."""
    max_tool_calls: int = 0
    """Tool calls per episode (``rollout.max_tool_calls``, envs/tools.py ``bounded_tools``)."""
    concurrent_tools: bool = True
    """The tool calls of a turn run at once across the group (``rollout.concurrent_tools``)."""
    sandbox_slots: int = 1
    """Sandboxes the worker runs at once: its share of its node (module docstring)."""
    peft_config: Any = None
    """The learner's PEFT adapter config (``ray.weight_sync: lora``): the worker wraps its
    policy copy with the same adapter, unmerged (rollout_engine/weight_sync.py)."""
    work_dir: str | None = None
    """Per-worker scratch directory base (``TMPDIR`` of the actor): ``<work_dir>/worker-<id>``
    holds its workspaces and is removed by the learner or by the worker's replacement."""
    context: Any = None
    """``rollout.context`` when it sets a strategy (config/env.py ``ContextConfig``): tool
    episodes run ``rollout.ContextLoop`` and carry one sequence per window."""


class RolloutWorker:
    """One worker (module docstring); ``ray.remote`` makes it an actor (learner.py)."""

    def __init__(
        self,
        worker_id: int,
        hub: Any,
        model_class: type,
        model_config: Any,
        tokenizer: Any,
        env_factory: Callable[[], Any],
        settings: WorkerSettings,
    ):
        import torch

        torch.set_num_threads(max(1, settings.num_threads))
        if settings.work_dir is not None:
            _own_scratch(worker_dir(settings.work_dir, worker_id))
        self.worker_id = worker_id
        self.hub = hub
        self.settings = settings
        self.tokenizer = tokenizer
        self.model = _policy_copy(model_class, model_config, settings.peft_config)
        self.version = -1
        self.lock = threading.Lock()
        """Held while the model generates or changes."""
        self.load_lock = threading.Lock()
        """Held while a push is fetched and applied: one load at a time (a delta applies to
        the version it was made after, once)."""
        self.env = env_factory()
        set_sandbox_slots(settings.sandbox_slots)  # after the env's own (per-process) setting
        self.tasks = {t.task_id: t for t in self.env.tasks("train")}
        self.tool_loop: ToolLoop | None = None
        self.instances: list[Any] = []
        if self.env.tools:
            tools_class = bounded_tools(self.env.tools_class(), settings.max_tool_calls)
            self.instances = [tools_class() for _ in range(settings.group_size)]
            self.tool_loop = ToolLoop(tokenizer, model_config, self._turn, settings.max_turns,
                                      settings.sampling.max_new_tokens,
                                      settings.concurrent_tools, settings.context)  # fmt: skip
        self._ticket: Ticket | None = None
        self.checked: set[str] = set()
        """Tasks whose do-nothing submission this worker graded (the hack telemetry's check,
        envs/telemetry.py: once per task and worker; the record carries the reward)."""
        eos = tokenizer.eos_token_id
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
        # lm/generator.py, the generator every path shares, with prefix reuse (a group's
        # prompt runs once): the staleness-0 ratio is 1 within 2e-6 in the two-node test.
        self.generator = Generator(self.model, pad, [eos], shared_prefix=True)
        self.chat = bool(getattr(tokenizer, "chat_template", None))

    # ---- the loop ----------------------------------------------------------------------------
    def run(self) -> int:
        """Make groups until the hub says stop; returns how many were made."""
        import ray

        made = 0
        while True:
            ticket = ray.get(self.hub.next_ticket.remote(self.worker_id))
            if ticket == "stop":
                return made
            if ticket is None:
                time.sleep(POLL_S)
                continue
            group = self.make_group(ticket)
            self.hub.put_group.remote(self.worker_id, group)
            made += 1

    def make_group(self, ticket: Ticket) -> GroupRecord:
        import torch

        start = time.monotonic()
        self._load_weights(ticket.version)
        task = self.tasks[ticket.task_id]
        if self.tool_loop is not None:
            torch.manual_seed(_group_seed(self.settings.seed, ticket.group_id))
            return self._tool_group(ticket, task, start)
        prompt = self.env.user_message(task)
        row = {"prompt": as_messages(prompt) if self.chat else prompt, "task_id": task.task_id}
        prompt_ids = self._prompt_ids(row["prompt"])
        torch.manual_seed(_group_seed(self.settings.seed, ticket.group_id))
        with self.lock:
            outs = self.generator.generate(
                [prompt_ids] * self.settings.group_size, self.settings.sampling
            )
            version = self.version
        texts = [self.tokenizer.decode(c.ids, skip_special_tokens=True) for c in outs]
        results = self.env.grade_batch([task] * len(texts), texts)
        rollouts = [
            Rollout(
                [Sequence(prompt_ids, c.ids, c.logprobs, [1] * len(c.ids), [version])], r.reward, r
            )  # fmt: skip
            for c, r in zip(outs, results, strict=True)
        ]
        return GroupRecord(ticket.group_id, task.task_id, row, rollouts, self.worker_id,
                           time.monotonic() - start)  # fmt: skip

    def _tool_group(self, ticket: Ticket, task: Any, start: float) -> GroupRecord:
        """A tool environment's group: TRL's multi-turn loop (rollout.py ``ToolLoop``) on
        the worker's instances, graded here with the instances' state (``grade_episodes``)."""
        assert self.tool_loop is not None
        row = self.env.row(task)
        self._ticket = ticket
        episodes = self.tool_loop.run([row] * len(self.instances), self.instances)
        results = self.env.grade_episodes(
            [task] * len(episodes), [e.messages for e in episodes], [e.instance for e in episodes]
        )
        rollouts = [episode_rollout(e, r) for e, r in zip(episodes, results, strict=True)]
        info = {"tool_calls": self.tool_loop.tool_calls,
                "tool_failures": self.tool_loop.tool_failures}  # fmt: skip
        if getattr(self.env, "checks_do_nothing", False) and task.task_id not in self.checked:
            info["do_nothing_reward"] = reward = do_nothing_reward(self.env, task)
            if reward is not None:  # a failed check is tried again when the task comes back
                self.checked.add(task.task_id)
        return GroupRecord(ticket.group_id, task.task_id, row, rollouts, self.worker_id,
                           time.monotonic() - start, info)  # fmt: skip

    def _turn(
        self, prompts: list[list[int]], limit: int | None = None
    ) -> tuple[list[list[int]], list[list[float]], int]:
        """One turn of the tool loop (``limit``: at most that many new tokens, a context
        loop's summary turn): a later turn first loads the newest weights (or the ticket's
        forced version), so each turn's version is recorded on its own."""
        assert self.tool_loop is not None and self._ticket is not None
        if self.tool_loop.tags:
            self._load_weights(self._ticket.version)
        sampling = self.settings.sampling
        if limit is not None:
            sampling = replace(sampling, max_new_tokens=limit)
        with self.lock:
            outs = self.generator.generate(prompts, sampling)
            version = self.version
        return [o.ids for o in outs], [o.logprobs for o in outs], version

    def _prompt_ids(self, prompt: Any) -> list[int]:
        """The tokens of the text the model sees (lm/chat.py ``render_prompt``)."""
        text = render_prompt(self.tokenizer, prompt)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    # ---- weights -----------------------------------------------------------------------------
    def _load_weights(self, version: int | None) -> None:
        """Load ``version`` (None: the newest published) unless held; waits (to the deadline)
        for a version not yet published."""
        import ray

        if version is not None and version == self.version:  # held (maybe gone from the hub)
            return
        deadline = time.monotonic() + self.settings.timeout_s
        while (found := ray.get(self.hub.latest_weights.remote(version))) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker {self.worker_id}: weights version {version} never "
                                   f"published within {self.settings.timeout_s:.0f} s")  # fmt: skip
            time.sleep(POLL_S)
        v, [push] = found
        with self.load_lock:  # the loop and a ``sync`` call may load at once: a delta twice
            # held, or (asked for the newest) older than what a concurrent load just took: the
            # newest looked up before the lock must not roll the weights back
            if v == self.version or (version is None and v < self.version):
                return
            parts = {name: ray.get(getattr(push, name)) for name in push.needs(self.version)}
            with self.lock:
                apply_push(self.model, push, parts, self.version)
                self.version = v

    def sync(self, version: int | None = None) -> tuple[int, str]:
        """Load ``version`` (None: the newest) now, and return :meth:`checksum`."""
        self._load_weights(version)
        return self.checksum()

    def checksum(self) -> tuple[int, str]:
        """``(version, state_checksum)`` of the weights the worker holds."""
        with self.lock:
            return self.version, state_checksum(distinct_tensors(self.model.state_dict()))

    def node(self) -> str:
        """The Ray node the worker runs on."""
        import ray

        return ray.get_runtime_context().get_node_id()


def window_sequences(episode: ContextEpisode) -> list[Sequence]:
    """A context episode's windows as the record's sequences, one per window: its prompt, its
    completion, tool mask, behaviour log-probs, its turns' versions and its summary."""
    return [
        Sequence(w.prompt_ids, w.completion_ids, w.logprobs, w.tool_mask, list(w.turn_tags),
                 w.summary, w.summary_tokens, w.summary_cut)
        for w in episode.windows
    ]  # fmt: skip


def episode_rollout(episode: Any, result: Any) -> Rollout:
    """A tool loop's episode graded ``result`` (a ``StepResult``) as the record's rollout: one
    sequence, or (a ``rollout.context`` episode) one per window with how it ended, the tokens
    it saved and the environment's calls after summaries (:func:`rollout_episode`'s inverse)."""
    if episode.context is None:
        seq = Sequence(episode.prompt_ids, episode.completion_ids, episode.logprobs,
                       episode.tool_mask, list(episode.turn_tags))  # fmt: skip
        return Rollout([seq], result.reward, result, messages=episode.messages)
    ctx = episode.context
    return Rollout(window_sequences(ctx), result.reward, result, messages=episode.messages,
                   ended=ctx.ended, tokens_saved=ctx.tokens_saved,
                   environment_calls=ctx.environment_calls)  # fmt: skip


def rollout_episode(rollout: Rollout) -> ContextEpisode:
    """A record's rollout as the context episode it was (:func:`window_sequences`' inverse),
    for the learner: its packed row (``ContextEpisode.packed``, the local engine's) and its
    metrics. A rollout of one sequence is an episode of one window."""
    windows = [
        Window(s.prompt_ids, s.completion_ids, s.tool_mask, s.behaviour_logps, s.summary,
               s.summary_tokens, s.summary_cut, list(s.turn_versions))
        for s in rollout.sequences
    ]  # fmt: skip
    return ContextEpisode(windows, rollout.ended, rollout.tokens_saved,
                          environment_calls=rollout.environment_calls)  # fmt: skip


def _policy_copy(model_class: type, model_config: Any, peft_config: Any) -> Any:
    """The worker's policy: ``model_class`` built from the learner's config (weights come with
    the first push), wrapped with the learner's adapter when it trains one."""
    model = model_class(_generation_config(model_config))
    if peft_config is None:
        return model
    from peft import get_peft_model

    return get_peft_model(model, peft_config).eval()


def _generation_config(model_config: Any) -> Any:
    """The learner's model config for a copy that only generates: with the KV cache on
    (transformers' ``Trainer`` turns ``use_cache`` off in the learner's config; a copy built
    from it would generate without a cache, recomputing every prompt token at every step)."""
    import copy

    config = copy.deepcopy(model_config)
    config.use_cache = True
    return config


def worker_dir(base: str, worker_id: int) -> str:
    """Worker ``worker_id``'s scratch directory under the run's ``base``."""
    return os.path.join(base, f"worker-{worker_id}")


def _own_scratch(path: str) -> None:
    """Make ``path`` this process's temporary directory (``tempfile`` and the ``TMPDIR`` of
    what it starts), emptied first: a killed predecessor on this node runs no ``atexit``, so
    its workspaces are removed here (or by the learner)."""
    import shutil
    import tempfile

    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    os.chmod(path, 0o711)  # the sandbox's ``nobody`` passes through to what is staged here
    tempfile.tempdir = path
    os.environ["TMPDIR"] = path


def _group_seed(seed: int, group_id: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{group_id}".encode()).digest()[:4], "little")
