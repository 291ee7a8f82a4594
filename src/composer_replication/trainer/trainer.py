"""``ComposerReplicationTrainer``: TRL's ``GRPOTrainer`` whose loss is the policy loss plus a
list of channel objects (``composer_replication.channels``).

Channel 1 is TRL's GRPO loss, unchanged (its loss types, clip-higher ``epsilon_high``, token-level
aggregation, truncated-completion masking). This subclass adds:

* ``_compute_loss`` as the single place channels compose: each enabled channel returns a
  ``ChannelTerm`` (its unweighted loss over its own mask and divisor, its metrics) and
  ``losses.compose_loss`` sums ``policy_weight * policy + sum(weight * loss)``
  (``policy_weight``, ``grpo.weight``, is 1 unless a run trains the channels alone). With no
  enabled channel (and ``policy_weight`` 1) it returns exactly what
  ``GRPOTrainer._compute_loss`` returns (same tensor, same graph), so loss and gradients are
  bit-identical to plain GRPO, and nothing else is computed.
* the channel life cycle: ``setup`` once, ``attach`` after each scored generation round,
  ``term`` per micro-batch, ``after_step`` per optimizer step, ``save``/``load`` with
  checkpoints (refusing a checkpoint whose channel settings differ, unless told to override),
  and a report of channels that never did anything.
* DAPO dynamic sampling (Yu et al., "DAPO: An Open-Source LLM Reinforcement Learning System at
  Scale", 2025, sec. 3.2), which TRL lacks: groups whose rewards all tie carry no advantage, so
  they are replaced by groups generated from fresh prompts, up to ``max_refills`` extra rounds.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback
from trl import GRPOTrainer
from trl.extras.profiling import profiling_context
from trl.models import unwrap_model_for_generation

from composer_replication.channels.base import (
    Channel,
    LossContext,
    Rollouts,
    informative_groups,
)
from composer_replication.config import (
    CHANNELS_FILE,
    check_processes,
    check_resume_channels,
    recorded_channels,
)
from composer_replication.envs.sampler import SAMPLER_FILE, TaskSampler
from composer_replication.lm.generator import Generator, Sampling
from composer_replication.lm.models import HiddenCapture, backbone, pad_token_id
from composer_replication.lm.packing import (
    packed_forward,
    packed_logps_with_prefix,
    packed_position_ids,
    pad_windows,
)
from composer_replication.lm.prefix import (
    checkpointing_active,
    completion_logps_with_prefix,
    use_prefix,
)
from composer_replication.losses import compose_loss
from composer_replication.rollout import (
    MAX_TOOL_THREADS,
    ContextEpisode,
    ContextLoop,
    calls_at_once,
    context_stats,
    reset_at_once,
    turn_index,
    undo_resets,
)
from composer_replication.trainer.data import ROW_ID
from composer_replication.trainer.masking import InfraBudget, mask_machine_failures

log = logging.getLogger(__name__)

DRAWS_FILE = "task_draws.jsonl"
"""The tasks of each training round (``data.sampler``), one JSON line per round."""

# tensors of a generation batch padded on the left (prompts) or the right (completions)
_LEFT_PADDED = ("prompt_ids", "prompt_mask")
_RIGHT_PADDED = (
    "completion_ids",
    "completion_mask",
    "old_per_token_logps",
    "ref_per_token_logps",
    "sampling_per_token_logps",
    "tool_mask",
    "importance_sampling_ratio",
    "completion_window",
)


class ComposerReplicationTrainer(GRPOTrainer):
    """GRPO trainer whose loss is the policy loss plus the enabled channels' terms.

    Extra keyword arguments (all optional):
        channels: channel objects (``composer_replication.channels``); those with weight 0 are
            dropped and cost nothing.
        dynamic_sampling: enable DAPO dynamic sampling.
        max_refills: extra generation rounds per step for dynamic sampling.
        resume_override_channels: resume a checkpoint whose channel settings differ.
        shared_prefix: run each shared prompt prefix once (KV cache expanded to the rows) in
            generation and in the policy's log-prob forwards (lm/prefix.py); the same
            numbers up to float rounding, at a fraction of the cost when prompts are long.
            The same switch reaches the channels' forwards (``Channel.shared_prefix``). On by
            default, as ``generation.shared_prefix``; off: TRL's plain padded forwards, bit
            for bit.
        concurrent_tools: run the tool calls of all rollouts of a turn at once
            (``rollout.TurnCalls``; bounded by the sandbox slots and the OpenEnv connection
            limit), with the messages, masks and metrics of TRL's one-rollout-after-another
            loop (default on). Off: TRL's loop as it is.
        task_sampler: ``data.sampler`` (envs/sampler.py): an adaptive one chooses each training
            round's tasks, DAPO's refills included; any one is updated with each scored group's
            verdicts, logs ``sampler/*`` and travels in checkpoints (``task_sampler.json``).
        max_infra_failed_frac: the run stops when more than this share of a step's rollouts
            were gradings the machine failed (masked, trainer/masking.py) for 3 steps in a row.
        context: ``rollout.context`` (config/env.py ``ContextConfig``): with a strategy, tool
            rollouts run :class:`~composer_replication.rollout.ContextLoop` instead of TRL's
            loop, each episode one packed row whose windows are scored with block-diagonal
            attention (lm/packing.py; docs/summarization.md).

    A channel that needs verdicts (``needs_verdicts``) needs a reward function that keeps them
    (``last_results``, as :class:`~composer_replication.trainer.rewards.EnvReward` does).
    """

    def __init__(
        self,
        *args: Any,
        channels: Sequence[Channel] = (),
        dynamic_sampling: bool = False,
        max_refills: int = 2,
        resume_override_channels: bool = False,
        shared_prefix: bool = True,
        concurrent_tools: bool = True,
        policy_weight: float = 1.0,
        task_sampler: TaskSampler | None = None,
        max_infra_failed_frac: float = 0.5,
        rollout_source: Any = None,
        context: Any = None,
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        self.context = context if context is not None and context.strategy != "none" else None
        self._round_windows: list[list[int]] | None = None  # the round being generated
        self._loss_windows: torch.Tensor | None = None  # the micro-batch of the loss
        self.context_episodes: list[ContextEpisode] = []
        """The episodes of the last round (``rollout.context``): their windows and summaries."""
        self.rollout_source = None
        if rollout_source is not None:
            self._take_rollouts_from(rollout_source)
        self.channels = [c for c in channels if c.enabled]
        self.policy_weight = policy_weight
        self._graded_reward = None
        if any(c.needs_verdicts for c in self.channels):
            self._graded_reward = _find_graded_reward(self.reward_funcs, self.channels)
        for channel in self.channels:
            channel.shared_prefix = shared_prefix
            channel.setup(self.model, self.processing_class, self.args)
        if self.channels:
            self.add_callback(_ChannelCallback(self))
        check_processes(dynamic_sampling, self.accelerator.num_processes)
        self.dynamic_sampling = dynamic_sampling
        self.max_refills = max_refills
        self.resume_override_channels = resume_override_channels
        self.shared_prefix = shared_prefix
        self.concurrent_tools = concurrent_tools
        self.channel_reports: list[str] = []
        self._generator: Generator | None = None
        self._loss_batch: dict[str, Any] | None = None  # the batch of the loss being computed
        self._refill_rows: Iterator[dict[str, Any]] | None = None
        self.task_sampler = self._check_sampler(task_sampler)
        self._sampler_rows = self._rows_of_tasks()
        self.infra_budget = InfraBudget(max_infra_failed_frac)
        self._step_kinds: list[str | None] = []
        self._infra_dropped = 0
        self.rollout_rows: list[dict[str, Any]] = []
        """The dataset rows of the round being generated, in the order of the prompts TRL
        hands a ``rollout_func`` (which gets only the prompts): their ``task_id`` and other
        columns (agents/episodes.py)."""

    def channel(self, name: str) -> Channel | None:
        """The enabled channel called ``name``, if any."""
        return next((c for c in self.channels if c.name == name), None)

    def log_metric(self, key: str, value: float, mode: str | None = None) -> None:
        """Add one value of ``key`` to this step's logged metrics (TRL averages a key's values
        over the steps between two logs); ``mode`` ``train`` or ``eval``, by default the
        model's. What other modules use instead of TRL's private ``_metrics``."""
        mode = mode or ("train" if self.model.training else "eval")
        self._metrics[mode][key].append(float(value))

    def load_checkpoint(self, checkpoint: str | Path) -> None:
        """Load a checkpoint's weights into the model without training (transformers'
        ``_load_from_checkpoint``, listed in trainer/trl_private.py)."""
        self._load_from_checkpoint(str(checkpoint))

    # ---- checkpoints carry the channels' settings and state --------------------------------
    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        if resume_from_checkpoint:
            current = {c.name: c.settings() for c in self.channels}
            diffs = check_resume_channels(
                resume_from_checkpoint, current, self.resume_override_channels
            )
            if diffs:
                log.warning("resuming with changed channel settings: %s", "; ".join(diffs))
            recorded = recorded_channels(resume_from_checkpoint)
            for channel in self.channels:  # one the checkpoint did not have starts fresh
                if channel.name in recorded:
                    channel.load(str(resume_from_checkpoint))
            self._load_sampler(resume_from_checkpoint)
        try:
            out = super().train(resume_from_checkpoint, *args, **kwargs)
        except BaseException:  # Ctrl-C, a failed step: do not wait for a batch being generated
            self.close_generator(wait=False)
            raise
        self.close_generator()
        return out

    def _save_checkpoint(self, model, trial):
        """The channels' settings and state go into the checkpoint first; the trainer's own
        save then ends with ``trainer_state.json`` and only then drops older checkpoints, so a
        process killed mid-save leaves the previous checkpoint whole (run/preflight.py resumes
        from the newest checkpoint whose ``trainer_state.json`` reads)."""
        ckpt = Path(self._get_output_dir(trial)) / f"checkpoint-{self.state.global_step}"
        ckpt.mkdir(parents=True, exist_ok=True)
        for channel in self.channels:  # per-process state: every rank writes its own file
            if channel.state_per_rank:
                channel.save(str(ckpt))
        if self.args.should_save:  # shared state: rank 0 writes it
            settings = {c.name: c.settings() for c in self.channels}
            (ckpt / CHANNELS_FILE).write_text(json.dumps(settings, indent=1, sort_keys=True))
            for channel in self.channels:
                if not channel.state_per_rank:
                    channel.save(str(ckpt))
            self._save_sampler(ckpt)
        super()._save_checkpoint(model, trial)

    def log(self, logs: dict[str, float], *args, **kwargs) -> None:
        """Channel and dynamic-sampling metrics are kept per process; reduce them over the
        processes (:func:`reduce_over_processes`) before TRL averages over the steps since the
        last log (every rank calls ``log`` at the same step, so the gather is collective)."""
        self._reduce_own_metrics("train" if self.model.training else "eval")
        super().log(logs, *args, **kwargs)

    def _is_running(self, key: str) -> bool:
        return self._declared(key, "running_counters")

    def _is_count(self, key: str) -> bool:
        return self._declared(key, "step_counts")

    def _declared(self, key: str, kind: str) -> bool:
        """Whether a channel lists ``key`` (its prefix + a pattern) in its ``kind`` patterns."""
        return any(
            fnmatch.fnmatchcase(key, c.prefix + pattern)
            for c in self.channels
            for pattern in getattr(c, kind)
        )

    def _reduce_own_metrics(self, mode: str) -> None:
        from accelerate.utils import gather_object

        own = {k: v for k, v in self._metrics[mode].items() if k.split("/")[0] in self._prefixes()}
        per_rank = gather_object([own]) if self.accelerator.num_processes > 1 else [own]
        # a step's counts add up over the processes in training; in evaluation each process
        # may score the same fixed items (replay's eval pairs), so their means are kept
        counted = self._is_count if mode == "train" else (lambda key: False)
        merged = reduce_over_processes(per_rank, self._is_running, counted)
        for key, value in merged.items():
            self._metrics[mode][key] = [value]

    def _prefixes(self) -> set[str]:
        return {
            "policy",
            "total",
            "dynamic_sampling",
            "rollout",
            "sampler",
            *(c.prefix.rstrip("/") for c in self.channels),
        }

    # ---- shared prompt prefixes run once (lm/prefix.py) ------------------------------
    def _prefix_ok(self, model) -> bool:
        return use_prefix(backbone(model), self.shared_prefix)

    def _get_per_token_logps_and_entropies(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size=None,
        compute_entropy=False,
        compute_aux_loss=False,
        **multimodal,
    ):
        """TRL's log-prob forward (through shared prefixes when the switch is on). The policy
        forward of a loss (:meth:`_compute_loss`) is shown to the channels
        (``Channel.see_policy_logps``) before TRL's loss reads the batch."""
        out = self._token_logps(
            model, input_ids, attention_mask, logits_to_keep, batch_size,
            compute_entropy, compute_aux_loss, **multimodal,
        )  # fmt: skip
        batch, self._loss_batch = self._loss_batch, None
        if batch is not None:
            for channel in self.channels:
                channel.see_policy_logps(batch, out[0].detach())
        return out

    def _token_logps(
        self, model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy,
        compute_aux_loss, **multimodal,
    ):  # fmt: skip
        windows = self._windows_for(input_ids, logits_to_keep)
        if windows is not None:
            return self._packed_logps(model, input_ids, attention_mask, logits_to_keep,
                                      batch_size, compute_entropy, windows)  # fmt: skip
        if compute_aux_loss or any(v is not None for v in multimodal.values()):
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size,
                compute_entropy, compute_aux_loss, **multimodal,
            )  # fmt: skip
        if not self._prefix_ok(model):
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy
            )
        batch_size = batch_size or input_ids.size(0)
        logps, entropies = [], []
        for start in range(0, input_ids.size(0), batch_size):
            rows = slice(start, start + batch_size)
            with self.accelerator.autocast():
                lp, ent = completion_logps_with_prefix(
                    model, input_ids[rows], attention_mask[rows], logits_to_keep,
                    pad_token_id(self.processing_class), compute_entropy,
                )  # fmt: skip
            logps.append(lp)
            entropies.append(ent)
        return torch.cat(logps), torch.cat(entropies) if compute_entropy else None, None

    # ---- packed episodes (rollout.context; lm/packing.py) -------------------------------------
    def _windows_for(self, input_ids, logits_to_keep: int) -> torch.Tensor | None:
        """The window of each completion token of the rows being scored: the loss's
        micro-batch (``completion_window``), else the round being generated; None when the
        batch has no packed episodes."""
        if self._loss_windows is not None:
            windows = self._loss_windows
        elif self._round_windows is not None and len(self._round_windows) == input_ids.shape[0]:
            windows = pad_windows(self._round_windows, logits_to_keep, input_ids.device)
        else:
            return None
        if windows.shape != (input_ids.shape[0], logits_to_keep):
            raise RuntimeError(f"packed windows {tuple(windows.shape)} for rows "
                               f"{input_ids.shape[0]} x {logits_to_keep} completion tokens")  # fmt: skip
        return windows

    def _packed_logps(self, model, input_ids, attention_mask, logits_to_keep, batch_size,
                      compute_entropy, windows):  # fmt: skip
        """TRL's log-prob forward (its fused LM head, its labels) on packed rows: positions
        restart at each window, no 2D mask and no cache, so attention is block-diagonal and a
        window sees only itself (docs/summarization.md). With shared prefixes on (and the model
        able to cache them) the prefix every window repeats runs once instead
        (:func:`~composer_replication.lm.packing.packed_logps_with_prefix`: the same values),
        under gradient checkpointing with its chunks checkpointed."""
        k = logits_to_keep
        hidden = self._loss_batch is not None and any(
            c.needs_student_hidden for c in self.channels
        )  # a channel reads the packed rows' hidden states: they come from the packed forward
        net = backbone(model)
        if use_prefix(net, self.shared_prefix, checkpointing_ok=True) and not hidden:
            checkpoint = torch.is_grad_enabled() and checkpointing_active(net)
            with self.accelerator.autocast():
                shared = packed_logps_with_prefix(model, input_ids, attention_mask, k, windows,
                                                  compute_entropy, checkpoint=checkpoint)  # fmt: skip
            if shared is not None:
                return shared[0], shared[1], None
        batch_size = batch_size or input_ids.size(0)
        logps, entropies = [], []
        for start in range(0, input_ids.size(0), batch_size):
            rows = slice(start, start + batch_size)
            ids, mask = input_ids[rows], attention_mask[rows]
            pos = packed_position_ids(mask[:, :-k], mask[:, -k:], windows[rows])
            labels = ids.masked_fill(mask == 0, -100)
            labels[:, :-k] = -100
            with self.accelerator.autocast():
                out = packed_forward(model, ids, pos, labels=labels, fused_lm_head=True)
            logps.append(out.log_probs[:, -k:])
            entropies.append(out.entropy[:, -k:] if compute_entropy else None)
        return torch.cat(logps), torch.cat(entropies) if compute_entropy else None, None

    def _context_turns(self, prompt_ids: list[list[int]], limit: int):
        """One turn for each prompt with at most ``limit`` new tokens, through
        :meth:`_generate_single_turn` (the trainer's generator), for :class:`ContextLoop`."""
        config = self.generation_config
        saved, config.max_new_tokens = config.max_new_tokens, limit
        try:
            ids, logps = self._generate_single_turn(prompt_ids, None, {}, 1)
        finally:
            config.max_new_tokens = saved
        return [list(i)[:limit] for i in ids], logps, self.state.global_step

    def _context_loop(self, prompts, prompt_ids, completion_ids, completions, logprobs):
        """``rollout.context``'s loop in place of TRL's (returns TRL's tuple); the round's
        windows are kept for the log-prob forwards of this round and for the batch."""
        loop = ContextLoop(
            self.processing_class, self.context, self.max_completion_length,
            self.max_tool_calling_iterations + 1, self._context_turns,
            self._get_tool_suffix_ids, self.tools,
        )  # fmt: skip
        out = loop.run(prompts, prompt_ids, completion_ids, completions, logprobs,
                       self._sync_tool_dicts, first_tag=self.state.global_step,
                       environments=self.environments)  # fmt: skip
        self.context_episodes = loop.episodes
        self._round_windows = [e.packed()[3] for e in loop.episodes]
        return out

    def _generate_single_turn(
        self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False
    ):
        """TRL's generation (its tool loop's turns too) through :meth:`rollout_generator`:
        the completions and their sampling log-probs from the generation itself (TRL then
        keeps them as ``sampling_per_token_logps``). vLLM, transformers' continuous batching,
        multimodal prompts and ``shared_prefix`` off stay on TRL's own path."""
        plain = (
            self.use_vllm
            or self.use_transformers_continuous_batching
            or multimodal_fields
            or (images is not None and any(i is not None for i in images))
            or not self.shared_prefix
        )
        if plain:
            return super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images
            )
        sampling = Sampling.from_generation_config(self.generation_config)
        with profiling_context(self, "transformers.generate"):
            outs = self.rollout_generator().generate([list(p) for p in prompt_ids], sampling)
        return [o.ids for o in outs], [o.logprobs for o in outs]

    def rollout_generator(self) -> Generator:
        """The trainer's one generator (lm/generator.py), made at first use: the policy
        being trained, unwrapped for generation as TRL does, the run's ``shared_prefix``.
        The native tool loop and the agent proxy (agents/policy.py) both generate with it."""
        if self._generator is None:
            self._generator = Generator(
                self.model, pad_token_id(self.processing_class), self.eos_token_ids,
                shared_prefix=self.shared_prefix, model_context=self._generation_model,
            )  # fmt: skip
        return self._generator

    def close_generator(self, wait: bool = True) -> None:
        """Stop the generator's worker thread (done when :meth:`train` ends, however it
        ends; ``wait``: until it has stopped); the next :meth:`rollout_generator` makes a new
        one. A worker left waiting keeps the generator, the model and this trainer (optimizer
        state included) alive for the rest of the process: four runs of one ``ablate``
        process held four models."""
        if self._generator is not None:
            self._generator.close(wait)
            self._generator = None

    @contextlib.contextmanager
    def _generation_model(self) -> Iterator[Any]:
        with (
            unwrap_model_for_generation(
                self.model_wrapped,
                self.accelerator,
                gather_deepspeed3_params=self.args.ds3_gather_for_generation,
                generation_kwargs=self.generation_kwargs,
                gradient_checkpointing_kwargs=self.args.gradient_checkpointing_kwargs,
            ) as unwrapped,
            torch.no_grad(),
            self._dist.summon_full_params(self.model_wrapped, recurse=False),
        ):
            yield unwrapped

    # ---- tool calls of a turn run at once across the batch (rollout.TurnCalls) -------------
    def _tool_call_loop(self, prompts, prompt_ids, completion_ids, completions, *rest):
        """TRL's loop, whose tool functions take the results of calls started together for
        every rollout of the turn instead of running one rollout after another; with a
        ``rollout.context`` strategy, :class:`ContextLoop` instead (its own concurrent calls)."""
        if self.context is not None:
            return self._context_loop(prompts, prompt_ids, completion_ids, completions, rest[0])
        if not self.concurrent_tools or len(completions) < 2:
            return super()._tool_call_loop(prompts, prompt_ids, completion_ids, completions, *rest)
        tools = self._sync_tool_dicts
        with calls_at_once(completions, tools, MAX_TOOL_THREADS) as deferred:
            self._sync_tool_dicts = deferred
            try:
                return super()._tool_call_loop(
                    prompts, prompt_ids, completion_ids, completions, *rest
                )
            finally:
                self._sync_tool_dicts = tools

    @contextlib.contextmanager
    def _resets_at_once(self, inputs):
        """Reset the environments TRL is about to draw for ``inputs`` at once (its pool:
        instance k of an environment serves that environment's k-th row, more made as needed)
        so that its one-after-another ``reset`` calls only take the results."""
        if not (self.concurrent_tools and self.environment_factories and len(inputs) > 1):
            yield
            return
        instances, rows, drawn = [], [], {}
        for x in inputs:
            name = x.get("environment") if self._multi_environment else None
            pool = self._environment_pool[name]
            index = drawn[name] = drawn.get(name, -1) + 1
            if index == len(pool):
                pool.append(self.environment_factories[name]())
            instances.append(pool[index])
            multi = self._multi_environment  # TRL keeps its routing column out of reset
            rows.append({k: v for k, v in x.items() if k != "environment"} if multi else x)
        threads = min(len(instances), MAX_TOOL_THREADS)
        with ThreadPoolExecutor(threads, thread_name_prefix="cr-resets") as pool:
            reset_at_once(instances, rows, pool)
        try:
            yield
        finally:
            undo_resets(instances)

    # ---- channel composition -------------------------------------------------------------
    def _compute_loss(self, model, inputs):
        self._loss_windows = inputs.get("completion_window")
        try:
            return self._channel_loss(model, inputs)
        finally:
            self._loss_windows = None

    def _channel_loss(self, model, inputs):
        if not self.channels and self.policy_weight == 1.0:
            return super()._compute_loss(model, inputs)
        capture = None
        if any(c.needs_student_hidden for c in self.channels):
            capture = HiddenCapture(model)
        # this micro-batch's own dict: a channel may replace its advantages (see_policy_logps)
        # without touching the batch TRL keeps for its next iteration
        inputs = self._loss_batch = dict(inputs)
        try:
            with capture.active() if capture is not None else contextlib.nullcontext():
                policy_loss = super()._compute_loss(model, inputs)
        finally:
            self._loss_batch = None
        unweighted = policy_loss.detach()
        if self.policy_weight != 1.0:  # channel 1's weight (0: the extra channels alone)
            policy_loss = policy_loss * self.policy_weight
        mode = "train" if model.training else "eval"
        ctx = LossContext(
            model=model,
            batch=inputs,
            mode=mode,
            grad_accum=self.current_gradient_accumulation_steps if mode == "train" else 1,
            global_step=self.state.global_step,
        )
        if capture is not None:
            comp = inputs["completion_ids"]
            ctx.student_hidden_BKH = capture.completion_states(comp.shape[0], comp.shape[1])
        total, metrics = compose_loss(policy_loss, [c.term(ctx) for c in self.channels])
        if self.policy_weight != 1.0:
            metrics.update({"policy/loss": unweighted, "policy/weight": self.policy_weight})
        for key, value in metrics.items():
            self._metrics[mode][key].append(
                _logged(key, value, ctx.grad_accum, self._is_count(key))
            )
        return total

    # ---- rollouts: dynamic sampling, then each channel's batch preparation ------------------
    def _score_round(self, inputs):
        """One generation + scoring round, with the per-row prompts and verdicts the channels
        need kept alongside (lists travel through TRL's shuffle/split like tensors)."""
        if self.rollout_source is not None and self.model.training:
            inputs = self._source_rows(inputs)
        self.rollout_rows = list(inputs)
        try:
            with self._resets_at_once(inputs):
                batch = super()._generate_and_score_completions(inputs)
            if self._round_windows is not None:
                k = batch["completion_ids"].shape[1]
                batch["completion_window"] = pad_windows(self._round_windows, k,
                                                         batch["completion_ids"].device)  # fmt: skip
                if self.channels:  # the teachers score each window in its own context
                    batch["_windows"] = [e.windows for e in self.context_episodes]
                self._log_context_metrics()
        finally:
            self._round_windows = None
        self._mask_machine_failures(batch)
        if self.rollout_source is not None and self.model.training:
            for key, value in self.rollout_source.batch_metrics(batch).items():
                self._metrics["train"][key].append(value)
        if "tool_mask" in batch and self.model.training:
            turns_B = turn_index(batch["tool_mask"], batch["completion_mask"]).amax(dim=1) + 1
            self._metrics["train"]["rollout/turns"].append(float(turns_B.float().mean()))
        if self.channels:  # the dataset row's columns (task ids, tags) for the channels
            batch["_columns"] = [{k: v for k, v in x.items() if k != "prompt"} for x in inputs]
        if self._graded_reward is not None:
            results = list(self._graded_reward.last_results)
            if len(results) != len(inputs):
                raise RuntimeError(
                    f"reward kept {len(results)} verdicts for {len(inputs)} completions"
                )
            batch["_prompts"] = [x["prompt"] for x in inputs]
            batch["_results"] = results
        return batch

    def _log_context_metrics(self) -> None:
        """Per round: summaries and windows per episode, summary length, summaries cut, context
        tokens the closed windows dropped, episodes ended at the cap (``rollout/*``)."""
        eps = self.context_episodes
        if not eps:
            return
        n = len(eps)
        mode = "train" if self.model.training else "eval"
        values = {f"rollout/{k}": v for k, v in context_stats(eps).items()}
        rewards = self._graded_rewards(n)
        if rewards is not None:  # reward by the number of summaries the episode wrote
            by: dict[int, list[float]] = {}
            for e, r in zip(eps, rewards, strict=True):
                if r is not None:
                    by.setdefault(len(e.summaries), []).append(r)
            for k, rs in by.items():
                values[f"rollout/reward_by_summaries/{k}"] = sum(rs) / len(rs)
        for key, value in values.items():
            self._metrics[mode][key].append(float(value))

    def _graded_rewards(self, n: int) -> list[float | None] | None:
        """The last round's rewards per rollout from a reward function that keeps its
        verdicts (``last_results``, EnvReward), if one graded ``n`` rollouts (None for a
        rollout without a verdict: one the Ray engine's record marks invalid)."""
        for f in self.reward_funcs:
            results = getattr(f, "last_results", None)
            if results is not None and len(results) == n:
                return [float(r.reward) if r is not None else None for r in results]
        return None

    # ---- rollouts from Ray workers (rollout.engine: ray; rollout_engine/learner.py) ----------
    def _take_rollouts_from(self, source: Any) -> None:
        """Score the groups ``source`` streams (its ``next_rows`` and ``rollout_func``)
        instead of generating. TRL's importance-sampling correction, gated on ``use_vllm``,
        is switched on so the behaviour log-probs the workers recorded give the truncated
        ratio of AReaL's decoupled PPO; nothing else of vLLM runs (the ``rollout_func`` path
        generates nothing, and no vLLM engine was built at init)."""
        self.rollout_source = source
        self.rollout_func = source.rollout_func
        self.use_vllm = True
        self.vllm_importance_sampling_correction = True
        self.add_callback(source.callback(self))

    def _source_tools(self) -> list[Any] | None:
        """The tools the rollout source's episodes were rendered with (None: no tools)."""
        return getattr(self.rollout_source, "tools", None) or None

    def _source_rows(self, inputs):
        """A step's rows from the rollout source (training only), TRL's weight-sync check
        marked done (the source pushes weights itself). Episodes of several context windows
        (``rollout.context`` on the workers) come packed: their windows are kept for this
        round's forwards and batch, as the local engine's loop keeps them."""
        n_groups = len(inputs) // self.num_generations
        rows = self.rollout_source.next_rows(n_groups, self.state.global_step)
        self._last_loaded_step = self.state.global_step
        self._round_windows = self.rollout_source.packed_windows()
        if self._round_windows is not None:
            self.context_episodes = self.rollout_source.context_episodes()
        return rows

    def _generate_and_score_completions(self, inputs):
        if self.model.training and self.rollout_source is None:  # Ray: the dispenser draws
            inputs = self._sampled_inputs(inputs)
        batch = self._dynamic_sampling(inputs) if self.model.training else self._score_round(inputs)
        self._check_infra_budget()
        if self.channels:
            results = batch.pop("_results", [])
            rollouts = Rollouts(
                prompts=batch.pop("_prompts", []),
                completions=[getattr(r, "observation", None) for r in results],
                results=results,
                group_size=self.num_generations,
                tools=self.tools or self._source_tools(),
                columns=batch.pop("_columns", None),
                windows=batch.pop("_windows", None),
            )
            for channel in self.channels:
                batch = channel.attach(batch, rollouts)
        return batch

    def _dynamic_sampling(self, inputs):
        batch = self._score_round(inputs)
        if not self.dynamic_sampling:
            return batch
        g = self.num_generations
        n_groups = batch["advantages"].shape[0] // g
        kept = [batch]
        keep_idx = [informative_groups(batch["advantages"], g)]
        refills = 0
        while sum(len(k) for k in keep_idx) < n_groups and refills < self.max_refills:
            fresh = self._score_round(self._next_refill_inputs(n_groups))
            kept.append(fresh)
            keep_idx.append(informative_groups(fresh["advantages"], g))
            refills += 1
        n_informative = sum(len(k) for k in keep_idx)
        self._metrics["train"]["dynamic_sampling/refills"].append(float(refills))
        self._metrics["train"]["dynamic_sampling/infra_dropped_groups"].append(
            float(self._infra_dropped)
        )
        self._metrics["train"]["dynamic_sampling/informative_frac"].append(
            min(n_informative, n_groups) / n_groups
        )
        if refills == 0:
            return batch
        # fill the batch with informative groups first, then (if still short) the original ties
        picks: list[tuple[int, int]] = [(b, gi) for b, idx in enumerate(keep_idx) for gi in idx]
        if len(picks) < n_groups:
            ties = [gi for gi in range(n_groups) if gi not in set(keep_idx[0])]
            picks += [(0, gi) for gi in ties[: n_groups - len(picks)]]
        return merge_groups(kept, picks[:n_groups], g)

    # ---- rollouts the machine failed leave the gradient (trainer/masking.py) ------------
    def _mask_machine_failures(self, batch: dict[str, Any]) -> None:
        """Mask the rows whose grading the machine failed (a reward function's
        ``last_infra_kinds``, as EnvReward keeps them); in training, count them for the step's
        budget (``grpo.max_infra_failed_frac``) and count the groups dropped."""
        kinds = self._infra_kinds()
        if kinds is None:
            return
        g = self.num_generations if self.model.training else self.num_generations_eval
        if self.accelerator.num_processes == 1:
            masked = mask_machine_failures(batch, kinds, g)
        else:  # groups may span processes: every process's marks, this one's rows
            from accelerate.utils import gather_object

            start = self.accelerator.process_index * len(kinds)
            rows, kinds = slice(start, start + len(kinds)), gather_object(kinds)
            masked = mask_machine_failures(batch, kinds, g, self._summed, rows)
        if self.model.training:
            self._step_kinds.extend(kinds)
            self._infra_dropped += masked.dropped_groups

    def _infra_kinds(self) -> list[str | None] | None:
        """Per row of the last scored round: the machine failure kind a reward function marked
        (``last_infra_kinds``, as EnvReward keeps them; the first), None for a graded row; None
        when no reward function marks them."""
        marks = [f.last_infra_kinds for f in self.reward_funcs if hasattr(f, "last_infra_kinds")]
        if not marks:
            return None
        return [next((k for k in row if k is not None), None) for row in zip(*marks, strict=True)]

    def _summed(self, count: torch.Tensor) -> torch.Tensor:
        """``count`` summed over the processes (as TRL counts ``num_items_in_batch``)."""
        return self.accelerator.gather(count).sum()

    def _check_infra_budget(self) -> None:
        """One step's rollouts (every round of it) against the budget: stops the run with one
        line naming the commonest kind after 3 steps in a row over it."""
        kinds, self._step_kinds, self._infra_dropped = self._step_kinds, [], 0
        if self.model.training and kinds:
            self.infra_budget.observe(kinds, self.state.global_step + 1)

    def _next_refill_inputs(self, n_groups: int) -> list[dict[str, Any]]:
        if self.task_sampler is not None and self.task_sampler.adaptive:
            return self._draw_rows(n_groups, "refill")
        if self._refill_rows is None:
            self._refill_rows = _cycle_shuffled(self.train_dataset, seed=self.args.seed + 1)
        rows = [next(self._refill_rows) for _ in range(n_groups)]
        return [row for row in rows for _ in range(self.num_generations)]

    # ---- data.sampler: the tasks of each training round (envs/sampler.py) -----------------
    def _check_sampler(self, sampler: TaskSampler | None) -> TaskSampler | None:
        """The sampler this process uses: an adaptive one needs one process (every process
        would have to draw the same groups and see every group's verdicts); a uniform one on
        several processes is dropped (a group may span processes: no ``sampler/*`` metrics)."""
        if sampler is None or self.accelerator.num_processes == 1:
            return sampler
        if sampler.adaptive:
            raise ValueError("data.sampler adaptive runs on one process (got "
                             f"{self.accelerator.num_processes})")  # fmt: skip
        log.info("data.sampler uniform on %d processes: no sampler/* metrics",
                 self.accelerator.num_processes)  # fmt: skip
        return None

    def _rows_of_tasks(self) -> dict[str, int]:
        """The first dataset row of each training task (the rows the sampler's draws become)."""
        if self.task_sampler is None:
            return {}
        rows: dict[str, int] = {}
        for index, task_id in enumerate(self.train_dataset[ROW_ID]):
            rows.setdefault(task_id, index)
        unknown = sorted(set(self.task_sampler.task_ids) - set(rows))
        if unknown:
            raise ValueError(f"data.sampler: tasks not in the training dataset: {unknown[:3]}")
        return rows

    def _sampled_inputs(self, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """A training round's rows: the dataloader's (uniform), or as many groups drawn from
        the adaptive sampler. Drawn here, at generation time, not in the dataloader: the
        loader runs a batch ahead (a checkpoint would hold the draws of a batch not trained
        on) and on resume HF skips the trained batches through it; TRL's loader stays as it
        is and only sets how many rows a round has, so skipping it draws nothing."""
        if self.task_sampler is None:
            return inputs
        if not self.task_sampler.adaptive:
            self._log_draws("batch", [x[ROW_ID] for x in inputs[:: self.num_generations]])
            return inputs
        return self._draw_rows(len(inputs) // self.num_generations, "batch")

    def _draw_rows(self, n_groups: int, kind: str) -> list[dict[str, Any]]:
        """``n_groups`` tasks from the sampler as dataset rows, each ``num_generations`` times
        in a row (TRL's ``RepeatSampler`` order: a group's rollouts are adjacent)."""
        tasks = self.task_sampler.next_tasks(n_groups)
        self._log_draws(kind, tasks)
        rows = [self.train_dataset[self._sampler_rows[t]] for t in tasks]
        return [row for row in rows for _ in range(self.num_generations)]

    def _log_draws(self, kind: str, tasks: list[str]) -> None:
        """One line of ``task_draws.jsonl`` in the run directory per training round."""
        if self.task_sampler is None or not self.accelerator.is_main_process:
            return
        line = {"step": self.state.global_step + 1, "round": kind, "tasks": tasks}
        with open(Path(self.args.output_dir) / DRAWS_FILE, "a") as fh:
            fh.write(json.dumps(line) + "\n")

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(
            inputs, prompts, completions, completion_ids_list
        )
        if self.task_sampler is not None and self.model.training:
            self._update_sampler(inputs, rewards_per_func)
        return rewards_per_func

    def _update_sampler(self, inputs: list[dict[str, Any]], rewards_per_func) -> None:
        """Each group's verdicts (a reward function's ``last_results[i].passed``, else the
        weighted reward against ``success_threshold``) into the sampler, but for rollouts whose
        grading the machine failed (``last_infra_kinds``: no verdict on the policy); its
        metrics logged."""
        g = self.num_generations
        verdicts = next(
            (f.last_results for f in self.reward_funcs
             if len(getattr(f, "last_results", ())) == len(inputs)),
            None,
        )  # fmt: skip
        if verdicts is not None:
            outcomes: list[float | bool] = [bool(r.passed) for r in verdicts]
        else:
            weights = self.reward_weights.to(rewards_per_func.device).unsqueeze(0)
            outcomes = (rewards_per_func * weights).nansum(dim=1).tolist()[: len(inputs)]
        kinds = self._infra_kinds() or [None] * len(inputs)
        for start in range(0, len(inputs), g):
            graded = [o for o, kind in zip(outcomes[start : start + g], kinds[start : start + g],
                                           strict=True) if kind is None]  # fmt: skip
            if graded:
                self.task_sampler.update(inputs[start][ROW_ID], graded)
        for key, value in self.task_sampler.drain_metrics().items():
            self._metrics["train"][key].append(value)

    def _save_sampler(self, ckpt: Path) -> None:
        if self.task_sampler is not None:
            state = json.dumps(self.task_sampler.state_dict(), sort_keys=True)
            (ckpt / SAMPLER_FILE).write_text(state)

    def _load_sampler(self, checkpoint: str | Path) -> None:
        """The sampler's state from the checkpoint (one saved without it: the sampler starts
        fresh, with a warning)."""
        if self.task_sampler is None or not isinstance(checkpoint, (str, Path)):
            return
        path = Path(checkpoint) / SAMPLER_FILE
        if not path.is_file():
            log.warning("%s has no %s: the task sampler starts fresh", checkpoint, SAMPLER_FILE)
            return
        self.task_sampler.load_state_dict(json.loads(path.read_text()))


class _ChannelCallback(TrainerCallback):
    """After each optimizer step: every channel's ``after_step``; at the end of training: the
    channels' reports (weight > 0 but never did anything; a distill teacher that scored
    nothing)."""

    def __init__(self, trainer: ComposerReplicationTrainer):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        for channel in self.trainer.channels:
            channel.after_step(self.trainer.model, state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        reports = [r for c in self.trainer.channels if (r := c.idle_report())]
        for report in reports:
            log.warning(report)
        self.trainer.channel_reports = reports


def _find_graded_reward(reward_funcs, channels: Sequence[Channel]):
    for f in reward_funcs:
        if hasattr(f, "last_results"):
            return f
    names = [c.name for c in channels if c.needs_verdicts]
    raise ValueError(
        f"channel(s) {names} need a reward function that keeps its verdicts (`last_results`, "
        "e.g. EnvReward): they are built from the verifier's feedback"
    )


def reduce_over_processes(
    per_rank: Sequence[dict[str, list[float]]],
    running: Callable[[str], bool],
    counted: Callable[[str], bool] = lambda key: False,
) -> dict[str, float]:
    """One value per metric from every process's values since the last log: the mean over the
    processes of each one's mean, except a running counter (``running(key)``: a teacher's
    requests, scored tokens, cost so far), which is each process's latest value summed over the
    processes (each counts only its own calls: the run's total is their sum), and a step count
    (``counted(key)``: tokens, pairs, rows; each micro-batch's logged as the step's share,
    :func:`_logged`), whose per-process mean (the step's count in that process) is summed
    over the processes: the step's count."""
    merged: dict[str, list[float]] = {}
    for metrics in per_rank:
        for key, all_values in metrics.items():
            if values := [v for v in all_values if not math.isnan(v)]:  # as TRL's mean does
                local = values[-1] if running(key) else sum(values) / len(values)
                merged.setdefault(key, []).append(local)
    return {
        key: sum(vals) if running(key) or counted(key) else sum(vals) / len(vals)
        for key, vals in merged.items()
    }


def _logged(key: str, value: Any, grad_accum: int, count: bool = False) -> float:
    """A micro-batch's metric as logged. A ``*/loss`` is this micro-batch's share of the step's
    loss (divided for gradient accumulation; the step's loss is the sum over its ``grad_accum``
    micro-batches) and TRL logs the mean over micro-batches, so it is logged times
    ``grad_accum``: the mean is then the step's loss, as TRL's ``loss`` is. A step ``count``
    (a channel's ``step_counts``: tokens, pairs, rows of this micro-batch) likewise, so the mean
    is the step's count in this process."""
    return float(value) * grad_accum if key.endswith("/loss") or count else float(value)


def _cycle_shuffled(dataset, seed: int) -> Iterator[dict[str, Any]]:
    epoch = 0
    while True:
        yield from dataset.shuffle(seed=seed + epoch)
        epoch += 1


def _pad_to(t: torch.Tensor, length: int, left: bool, value: float) -> torch.Tensor:
    pad = length - t.shape[1]
    if pad <= 0:
        return t
    filler = torch.full((t.shape[0], pad), value, dtype=t.dtype, device=t.device)
    return torch.cat([filler, t] if left else [t, filler], dim=1)


def merge_groups(
    batches: list[dict[str, Any]], picks: list[tuple[int, int]], group_size: int
) -> dict[str, Any]:
    """Build one generation batch from groups ``(batch_index, group_index)`` of several batches.

    Sequence tensors are re-padded to a common length (prompts on the left, completions on the
    right); ``num_items_in_batch`` is recomputed from the merged completion mask (one process).
    """
    out: dict[str, Any] = {}
    for key, first in batches[0].items():
        if isinstance(first, list):  # per-row objects (prompts, verdicts)
            out[key] = [
                batches[b][key][gi * group_size + j] for b, gi in picks for j in range(group_size)
            ]
            continue
        if not isinstance(first, torch.Tensor) or first.dim() == 0 or key == "num_items_in_batch":
            continue
        parts = []
        for b, gi in picks:
            rows = slice(gi * group_size, (gi + 1) * group_size)
            parts.append(batches[b][key][rows])
        if first.dim() == 2 and first.shape[0] == batches[0]["advantages"].shape[0]:
            length = max(p.shape[1] for p in parts)
            left = key in _LEFT_PADDED
            value = 0.0 if key not in ("prompt_ids", "completion_ids") else 0
            if key not in _LEFT_PADDED + _RIGHT_PADDED:
                raise KeyError(f"dynamic sampling cannot merge unknown sequence field {key!r}")
            parts = [_pad_to(p, length, left, value) for p in parts]
        out[key] = torch.cat(parts, dim=0)
    for key, value in batches[0].items():
        out.setdefault(key, value)
    mask = out["completion_mask"]
    if "tool_mask" in out:
        mask = mask * out["tool_mask"]
    out["num_items_in_batch"] = mask.sum().to(batches[0]["num_items_in_batch"].dtype)
    return out
