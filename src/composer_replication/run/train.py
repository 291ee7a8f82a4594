"""Build the parts of a run from a RunConfig and run it: load, evaluate base, train, evaluate
trained, report. The CLI's ``train`` is a thin wrapper around :func:`run_training`."""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from composer_replication.config import ConfigError, RunConfig, dump_config
from composer_replication.envs.base import Environment
from composer_replication.progress import is_terminal, plain_line, progress_bar
from composer_replication.run.card import write_model_card
from composer_replication.run.preflight import (
    CONFIG_FILE,
    Checked,
    build_env,
    preflight,
    process_rank,
)


@dataclass
class RunSummary:
    """What a training run produced."""

    run_dir: Path
    base: dict[str, Any] | None
    trained: dict[str, Any] | None
    delta: dict[str, float] | None
    train_seconds: float
    total_seconds: float
    final_checkpoint: Path
    channel_reports: list[str] = field(default_factory=list)
    """Channels with weight > 0 that stayed inactive on every step (empty if none)."""


def run_header(cfg: RunConfig) -> list[tuple[str, str]]:
    """What a run is, in a few (label, text) rows printed when it starts: model, env, channels
    with their weights, steps, output dir and where the full config is written."""
    from composer_replication.config import CHANNEL_SECTIONS

    lora = f", LoRA r={cfg.peft.r}" if cfg.peft.enabled else ""
    model = f"{cfg.model.name} ({cfg.model.dtype}{lora})"
    env = cfg.env.name
    if getattr(cfg.env, "levels", None) and env == "arithmetic":
        env += f", levels {','.join(map(str, cfg.env.levels))}"
    if getattr(cfg.env, "openenv_url", None):
        env += f", tools on {cfg.env.openenv_url}"
    weights = [f"{name} {getattr(cfg, name).weight:g}" for name in CHANNEL_SECTIONS
               if getattr(cfg, name).enabled]  # fmt: skip
    g = cfg.generation
    out = Path(cfg.output_dir)
    return [
        ("model", model),
        ("env", env),
        ("channels", " + ".join([*_grpo_label(cfg), *weights])),
        ("steps", f"{cfg.max_steps} x {g.prompts_per_step} prompts x {g.num_generations} "
                  f"completions, lr {cfg.optim.learning_rate:g}, seed {cfg.seed}"),
        ("output", f"{out}  (full config: {out / CONFIG_FILE})"),
    ]  # fmt: skip


def _grpo_label(cfg: RunConfig) -> list[str]:
    """GRPO's part of the header's channel list: its loss type, its weight when not 1, nothing
    when it is off (``grpo.weight=0``: distillation or self-distillation alone)."""
    w = cfg.grpo.weight
    if w == 0:
        return []
    return [f"grpo ({cfg.grpo.loss_type})" + (f" {w:g}" if w != 1 else "")]


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def vllm_args(cfg: RunConfig) -> dict[str, Any]:
    """TRL's vLLM options for ``generation.backend``; a clear error when vLLM is missing."""
    if cfg.generation.backend != "vllm":
        return {"use_vllm": False}
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(
            "generation.backend=vllm: the vllm package is not installed (pip install vllm; it "
            "needs a CUDA GPU); use generation.backend=transformers on this machine"
        )
    v = cfg.generation.vllm
    out: dict[str, Any] = {"use_vllm": True, "vllm_mode": v.mode}
    if v.mode == "server":
        if v.server_base_url:
            out["vllm_server_base_url"] = v.server_base_url
    else:
        out.update(
            vllm_gpu_memory_utilization=v.gpu_memory_utilization,
            vllm_tensor_parallel_size=v.tensor_parallel_size,
            vllm_max_model_length=v.max_model_length,
        )
    return out


def correction_args(cfg: RunConfig) -> dict[str, Any]:
    """``rollout.engine: ray``: TRL's importance-sampling correction in token-truncate mode,
    capped at ``rollout.correction_cap`` (the behaviour-policy weight of AReaL's decoupled
    PPO; rollout_engine/learner.py). ``rollout.correction: false`` truncates it to [1, 1]:
    a weight of 1, with TRL's forward of the pre-update policy (and the ratio metrics) kept.
    TRL wants ``clip_min < clip_max``: the upper bound is the next double above 1, which is
    1 in float32 and bfloat16 (the weight is exactly 1; tests/unit/rollout_engine)."""
    r = cfg.rollout
    if r.engine != "ray":
        return {}
    return {
        "vllm_importance_sampling_correction": True,
        "vllm_importance_sampling_mode": "token_truncate",
        "vllm_importance_sampling_clip_max": (
            r.correction_cap if r.correction else math.nextafter(1.0, 2.0)
        ),
        "vllm_importance_sampling_clip_min": None if r.correction else 1.0,
    }


def build_engine(cfg: RunConfig, model, tokenizer, env: Environment):
    """The Ray rollout engine of ``rollout.engine: ray`` (not started: `run_training` starts
    it, and stops it whatever happens)."""
    from composer_replication.envs.sampler import TaskSampler
    from composer_replication.envs.tools import tool_functions
    from composer_replication.lm.generator import Sampling
    from composer_replication.rollout_engine.dispenser import TaskDispenser
    from composer_replication.rollout_engine.learner import (
        GROUPS_FILE,
        EngineSettings,
        RayRollouts,
    )
    from composer_replication.rollout_engine.worker import WorkerSettings

    g, r, w = cfg.generation, cfg.rollout, cfg.ray.worker
    heldout = [t.task_id for t in env.tasks("heldout")]
    train_ids = [t.task_id for t in env.tasks("train")]
    sampler = TaskSampler(train_ids, g.num_generations, cfg.seed, cfg.data.sampler, heldout)
    dispenser = TaskDispenser(train_ids, cfg.seed, heldout, sampler)
    settings = EngineSettings(
        num_workers=cfg.ray.num_workers, groups_per_step=g.prompts_per_step,
        max_staleness=r.max_staleness, force_staleness=r.force_staleness,
        correction_cap=r.correction_cap,
        address=cfg.ray.address, num_cpus=w.num_cpus, num_gpus=w.num_gpus,
        memory_gb=w.memory_gb, sandbox_slots=w.sandbox_slots,
        sandbox_slots_per_node=cfg.ray.sandbox_slots_per_node,
        object_store_gb=cfg.ray.object_store_gb, weight_sync_steps=cfg.ray.weight_sync_steps,
        weight_sync=cfg.ray.weight_sync, delta_codec=cfg.ray.delta_codec,
        timeout_s=cfg.ray.timeout_s, groups_log=str(Path(cfg.output_dir) / GROUPS_FILE),
    )  # fmt: skip
    sampling = Sampling(temperature=g.temperature, top_p=g.top_p,
                        max_new_tokens=g.max_completion_length)  # fmt: skip
    worker = WorkerSettings(
        g.num_generations, sampling, cfg.seed, num_threads=max(1, int(w.num_cpus)),
        timeout_s=cfg.ray.timeout_s, max_turns=r.max_turns, max_tool_calls=r.max_tool_calls,
        concurrent_tools=r.concurrent_tools, sandbox_slots=worker_sandbox_slots(cfg),
        context=r.context if r.context.strategy != "none" else None,
    )  # fmt: skip
    tools = tool_kwargs(cfg, env).get("environment_factory")
    return RayRollouts(settings, worker, model, tokenizer, functools.partial(build_env, cfg),
                       dispenser, tools=tool_functions(tools()) if tools else None)  # fmt: skip


def worker_sandbox_slots(cfg: RunConfig) -> int:
    """Sandboxes one rollout worker runs at once: the ``sandbox_slots`` it reserves from its
    node's Ray resource, else its CPU reservation (at least 1). Either way Ray keeps the sum
    over a node's workers within the node's budget (its ``sandbox_slots`` resource, or its
    CPUs): sandboxes are counted per node, not per process. ``sandbox.workers``, when set,
    caps it further."""
    w = cfg.ray.worker
    share = w.sandbox_slots or max(1, int(w.num_cpus))
    return min(share, cfg.sandbox.workers) if cfg.sandbox.workers else share


def checkpointing_arg(config_cls: type, enabled: bool) -> dict[str, bool]:
    """The activation-checkpointing switch under the name ``config_cls`` has: transformers
    5.23 renamed ``gradient_checkpointing`` to ``activation_checkpointing`` (the old name
    warns there); older 5.x, which pyproject accepts, knows only the old name."""
    import dataclasses

    fields = {f.name for f in dataclasses.fields(config_cls)}
    name = (
        "activation_checkpointing"
        if "activation_checkpointing" in fields
        else "gradient_checkpointing"
    )
    return {name: enabled}


def build_grpo_args(cfg: RunConfig):
    """Map our RunConfig onto TRL's GRPOConfig."""
    import torch
    from trl import GRPOConfig

    g, p, o = cfg.generation, cfg.grpo, cfg.optim
    save_steps = cfg.save_steps or cfg.max_steps
    return GRPOConfig(
        output_dir=cfg.output_dir,
        max_steps=cfg.max_steps,
        seed=cfg.seed,
        data_seed=cfg.seed,
        per_device_train_batch_size=g.prompts_per_step * g.num_generations,
        gradient_accumulation_steps=o.gradient_accumulation_steps,
        num_generations=g.num_generations,
        max_completion_length=g.max_completion_length,
        max_tool_calling_iterations=cfg.rollout.max_turns - 1,
        temperature=g.temperature,
        top_p=g.top_p,
        loss_type=p.loss_type,
        epsilon=p.epsilon,
        epsilon_high=p.epsilon_high,
        beta=p.beta,
        scale_rewards=p.scale_rewards,
        mask_truncated_completions=p.mask_truncated_completions,
        num_iterations=p.num_iterations,
        learning_rate=o.learning_rate,
        lr_scheduler_type=o.lr_scheduler,
        warmup_steps=o.warmup_steps,
        weight_decay=o.weight_decay,
        max_grad_norm=o.max_grad_norm,
        logging_steps=1,
        save_strategy="steps",
        save_steps=save_steps,
        save_total_limit=cfg.save_total_limit,
        save_only_model=cfg.save_only_model,
        report_to=cfg.logging.report_to or "none",
        run_name=cfg.logging.run_name or Path(cfg.output_dir).name,
        **checkpointing_arg(GRPOConfig, o.gradient_checkpointing),
        **vllm_args(cfg),
        **correction_args(cfg),
        disable_tqdm=True,
        use_cpu=not torch.cuda.is_available(),
        bf16=cfg.model.dtype == "bfloat16" and torch.cuda.is_available(),
        dataloader_num_workers=0,
    )


def build_reward_funcs(cfg: RunConfig, env, task_sampler=None) -> list:
    """The run's reward functions; ``task_sampler`` (the trainer's ``data.sampler``) gives
    EnvReward's hack telemetry its per-task pass-rate estimates (``TaskSampler.estimate``)."""
    from composer_replication.trainer.callbacks import EPISODES_FILE
    from composer_replication.trainer.rewards import EnvReward

    if cfg.agent_proxy.enabled:  # graded in the rollout function (agents/episodes.py)
        from composer_replication.agents.episodes import AgentReward

        funcs: list = [AgentReward()]
    elif cfg.rollout.engine == "ray":  # graded by the rollout workers
        from composer_replication.envs.tools import tool_methods
        from composer_replication.rollout_engine.learner import WorkerReward

        offered = tuple(tool_methods(env.tools_class())) if env.tools else None
        log = Path(cfg.output_dir) / EPISODES_FILE if env.tools else None
        funcs = [WorkerReward(env.name, offered, log)]
    elif env.tools and cfg.env.openenv_url:  # the server grades each rollout (openenv/adapter.py)
        from composer_replication.envs.openenv.adapter import OpenEnvReward

        funcs = [OpenEnvReward(env.name)]
    else:
        log = Path(cfg.output_dir) / EPISODES_FILE if env.tools else None
        estimates = task_sampler.estimate if task_sampler is not None else None
        funcs = [EnvReward(env, episode_log=log, task_estimates=estimates)]
    if cfg.grpo.overlong.enabled:
        from trl.rewards import get_soft_overlong_punishment

        funcs.append(
            get_soft_overlong_punishment(
                max_completion_len=cfg.generation.max_completion_length,
                soft_punish_cache=cfg.grpo.overlong.cache,
            )
        )
    return funcs


def tool_kwargs(cfg: RunConfig, env, tokenizer=None) -> dict[str, Any]:
    """``environment_factory`` for a tool environment (its tools bounded by
    ``rollout.max_tool_calls``); nothing for single-turn environments; with ``agent_proxy``
    on, a ``rollout_func`` that runs the agent harness instead (agents/episodes.py)."""

    from composer_replication.envs.tools import bounded_tools

    if cfg.agent_proxy.enabled:
        from composer_replication.agents.episodes import AgentEpisodes

        return {"rollout_func": AgentEpisodes(env, cfg.agent_proxy, tokenizer)}
    if not env.tools:
        return {}
    if cfg.env.openenv_url:  # tools (and grading) on an OpenEnv server
        from composer_replication.envs.openenv.adapter import openenv_tools_class

        tools = openenv_tools_class(cfg.env.openenv_url, cfg.env.max_tool_output_chars)
    else:
        tools = env.tools_class()
    return {"environment_factory": bounded_tools(tools, cfg.rollout.max_tool_calls)}


class VocabularyWarning(UserWarning):
    """Channel 3's pairs and the run's rollouts use different tool vocabularies."""


def check_pair_vocabulary(cfg: RunConfig, tools_class: type | None) -> str | None:
    """Warn (a :class:`VocabularyWarning`) when channel 3's pairs call tools the run's
    environment (or, with ``agent_proxy``, its harness) does not offer (pairs from Claude Code
    logs on the native tools, say);
    returns the warning's text, or None when the vocabularies match or channel 3 is off."""
    if not cfg.replay.enabled or not cfg.replay.dataset:
        return None
    import warnings

    from composer_replication.channels.replay import vocabulary_mismatch
    from composer_replication.envs.tools import tool_methods
    from composer_replication.prefs.dataset import load_pairs

    run_tools = set(tool_methods(tools_class)) if tools_class is not None else set()
    if cfg.agent_proxy.enabled:  # the rollouts speak the harness's tools
        from composer_replication.agents.harnesses import harness_tools

        run_tools = set(harness_tools(cfg.agent_proxy.harness))
    why = vocabulary_mismatch(load_pairs(cfg.replay.dataset, cfg.replay.max_pairs), run_tools)
    if why:
        warnings.warn(why, VocabularyWarning, stacklevel=2)
    return why


def data_shard(cfg: RunConfig) -> tuple[int, int]:
    """(index, count) of this run's slice of the train split: DiLoCo replica r of n trains on
    shard r of n; a plain run on the whole split."""
    d = cfg.diloco
    return (d.replica_id, d.replicas) if d.enabled else (0, 1)


def progress_callback(console=None):
    """The rich step bar on a terminal; off one (a log file, a pipe, CI) a plain line per step
    on ``console`` (stdout without one), flushed."""
    from composer_replication.trainer.callbacks import RichProgressCallback, StepLineCallback

    if is_terminal(console):
        return RichProgressCallback(console)
    if console is None:
        return StepLineCallback()
    return StepLineCallback(lambda line: plain_line(console, line))


def build_task_sampler(cfg: RunConfig, env, dataset):
    """``data.sampler`` over the training dataset's tasks (the held-out split's ids refused);
    None on the Ray engine, whose task dispenser (rollout_engine/dispenser.py) owns the run's
    sampler (:func:`build_engine`)."""
    from composer_replication.envs.sampler import TaskSampler
    from composer_replication.trainer.data import ROW_ID

    if cfg.rollout.engine == "ray":
        return None
    return TaskSampler(
        list(dict.fromkeys(dataset[ROW_ID])),
        cfg.generation.num_generations,
        cfg.seed,
        cfg.data.sampler,
        heldout_ids=[t.task_id for t in env.tasks("heldout")],
    )


def build_trainer(cfg: RunConfig, model, tokenizer, env, console=None, channel_kwargs=None):
    """A ComposerReplicationTrainer wired with our reward, dataset, channels and callbacks
    (``channel_kwargs``: extra constructor arguments per channel name, see build_channels)."""
    from composer_replication.channels import build_channels
    from composer_replication.trainer.callbacks import MetricsJsonlCallback, PlotCallback
    from composer_replication.trainer.data import build_prompt_dataset
    from composer_replication.trainer.trainer import ComposerReplicationTrainer

    dataset = build_prompt_dataset(
        env,
        "train",
        cfg.env.num_train,
        cfg.env.seed,
        conversational=bool(getattr(tokenizer, "chat_template", None)),
        shard=data_shard(cfg),
    )
    engine = build_engine(cfg, model, tokenizer, env) if cfg.rollout.engine == "ray" else None
    tools = tool_kwargs(cfg, env, tokenizer) if engine is None else {}
    check_pair_vocabulary(cfg, tools.get("environment_factory"))
    callbacks = [MetricsJsonlCallback(cfg.output_dir), PlotCallback(cfg.output_dir)]
    callbacks.append(progress_callback(console))
    if cfg.diloco.enabled:
        from composer_replication.diloco.callback import DilocoCallback

        callbacks.append(DilocoCallback(cfg.diloco, cfg.output_dir))
    sampler = build_task_sampler(cfg, env, dataset)
    trainer = ComposerReplicationTrainer(
        model=model,
        reward_funcs=build_reward_funcs(cfg, env, sampler),
        args=build_grpo_args(cfg),
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=callbacks,
        rollout_source=engine,
        channels=build_channels(cfg, **(channel_kwargs or {})),
        resume_override_channels=cfg.resume_override_channels,
        policy_weight=cfg.grpo.weight,
        dynamic_sampling=cfg.grpo.dynamic_sampling.enabled,
        max_refills=cfg.grpo.dynamic_sampling.max_refills,
        max_infra_failed_frac=cfg.grpo.max_infra_failed_frac,
        shared_prefix=cfg.generation.shared_prefix,
        concurrent_tools=cfg.rollout.concurrent_tools,
        context=cfg.rollout.context,
        task_sampler=sampler,
        **tools,
    )
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # our bar or step lines replace its raw dicts
    return trainer


def prepare(cfg: RunConfig, env: Environment | None = None):
    """Threads, seeds, run dir and config snapshot; returns (model, tokenizer, env) (``env``:
    the one `preflight` built; default: built here)."""
    import torch

    from composer_replication.lm.chat_templates import ensure_tool_template
    from composer_replication.lm.models import load_model, load_tokenizer

    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    seed_everything(cfg.seed)
    env = env or build_env(cfg)  # first: a code env refuses to start without its sandbox
    tokenizer = load_tokenizer(cfg.model.name)  # a bad model id fails here, nothing written yet
    if env.tools:
        ensure_tool_template(tokenizer)  # SmolLM2's own template cannot render tool calls
    model = load_model(cfg.model.name, dtype=cfg.model.dtype, peft=cfg.peft)
    run_dir = Path(cfg.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if process_rank()[0] == 0:
        (run_dir / CONFIG_FILE).write_text(dump_config(cfg))
    return model, tokenizer, env


def eval_turn_tokens(cfg: RunConfig) -> int:
    """Tokens per turn of a held-out evaluation: ``eval.max_new_tokens``; with a
    ``rollout.context`` strategy, ``generation.max_completion_length``, the per-turn cap the
    training budget is computed with, so that evaluation splits episodes into the same windows
    (docs/summarization.md)."""
    if cfg.rollout.context.strategy != "none":
        return cfg.generation.max_completion_length
    return cfg.eval.max_new_tokens


def evaluate_run(
    cfg: RunConfig, model, tokenizer, env, tag: str, console=None, n: int | None = None
):
    """Held-out evaluation of ``model`` as configured in ``cfg.eval`` (greedy by default),
    episodes under the run's ``rollout.context`` as in training."""
    from composer_replication.evaluation import evaluate

    n = n or cfg.eval.n
    with progress_bar(console, f"eval {tag}", min(n, len(env.tasks(cfg.eval.split)))) as adv:
        return evaluate(
            model,
            tokenizer,
            env,
            cfg.eval.split,
            n,
            eval_turn_tokens(cfg),
            cfg.eval.batch_size,
            progress=adv,
            max_turns=cfg.rollout.max_turns,
            max_tool_calls=cfg.rollout.max_tool_calls,
            temperature=cfg.eval.temperature,
            seed=cfg.eval.seed,
            shared_prefix=cfg.generation.shared_prefix,
            context=cfg.rollout.context,
        )


def run_training(
    cfg: RunConfig,
    console=None,
    extra_callbacks=(),
    report: Callable[[str, dict[str, Any]], None] | None = None,
    checked: Checked | None = None,
) -> RunSummary:
    """Evaluate the base model, train, evaluate the trained model, write results. The inputs
    are checked first (`preflight`; ``checked``: its result, when the caller ran it).

    ``report(tag, summary)`` is called with each held-out result as soon as it is known
    (``base`` before training starts, ``trained`` after), so a log shows the base score
    without waiting for the whole run."""
    from composer_replication.evaluation import paired_difference
    from composer_replication.trainer.callbacks import EVAL_FILE, METRICS_FILE, plot_metrics

    if async_enabled(cfg):  # GPU users: TRL's AsyncGRPOTrainer on a vLLM server
        return run_async_training(cfg)
    t_start = time.monotonic()
    checked = checked or preflight(cfg)
    resume = checked.resume
    model, tokenizer, env = prepare(cfg, checked.env)
    run_dir = Path(cfg.output_dir)
    evals = cfg.eval.before_and_after
    base = (
        evaluate_run(cfg, model, tokenizer, env, "base", console) if evals and not resume else None
    )
    if base is not None:
        _log_eval_episodes(run_dir, "base", base)
        if report is not None:
            report("base", base.summary())
    trainer = build_trainer(cfg, model, tokenizer, env, console)
    for cb in extra_callbacks:
        trainer.add_callback(cb)
    t_train = time.monotonic()
    try:
        start_engine(trainer, resume)
        trainer.train(resume_from_checkpoint=resume)
    finally:
        close_rollouts(trainer)
    train_seconds = time.monotonic() - t_train
    final = run_dir / "final"
    trainer.save_model(str(final))
    tokenizer.save_pretrained(str(final))
    trained = evaluate_run(cfg, model, tokenizer, env, "trained", console) if evals else None
    if trained is not None:
        _log_eval_episodes(run_dir, "trained", trained)
        if report is not None:
            report("trained", trained.summary())
    delta = paired_difference(base, trained) if base is not None and trained is not None else None
    summary = RunSummary(
        run_dir=run_dir,
        base=base.summary() if base else None,
        trained=trained.summary() if trained else None,
        delta=delta,
        train_seconds=train_seconds,
        total_seconds=time.monotonic() - t_start,
        final_checkpoint=final,
        channel_reports=list(trainer.channel_reports),
    )
    if trainer.args.should_save:  # rank 0 of a multi-process run writes the run's files
        record = _summary_json(summary)
        (run_dir / EVAL_FILE).write_text(json.dumps(record, indent=2))
        write_model_card(cfg, record, run_dir, final)
        plot_metrics(run_dir / METRICS_FILE)  # again, now with the held-out results
    return summary


def _log_eval_episodes(run_dir: Path, tag: str, result) -> None:
    """Append the evaluation's problems to the run's ``eval_episodes.jsonl`` (rank 0 only)."""
    from composer_replication.trainer.callbacks import EVAL_EPISODES_FILE

    if process_rank()[0] != 0:
        return
    with open(run_dir / EVAL_EPISODES_FILE, "a", encoding="utf-8") as fh:
        for line in result.episodes(tag):
            fh.write(json.dumps(line, default=str) + "\n")


def start_engine(trainer, resume: str | None) -> None:
    """Start the Ray rollout engine, if the run has one (a resume: from the checkpoint's
    dispenser state and policy version)."""
    engine = getattr(trainer, "rollout_source", None)
    if engine is not None:
        engine.start(resume_dir=resume)


def close_rollouts(trainer) -> None:
    """Stop what a ``rollout_func`` keeps running (the agent proxy's server; the Ray rollout
    engine: its workers, and the local Ray it started)."""
    engine = getattr(trainer, "rollout_source", None)
    if engine is not None:
        engine.close()
        return
    close = getattr(getattr(trainer, "rollout_func", None), "close", None)
    if close is not None:
        close()


def _summary_json(s: RunSummary) -> dict[str, Any]:
    return {
        "base": s.base,
        "trained": s.trained,
        "delta": s.delta,
        "train_seconds": s.train_seconds,
        "total_seconds": s.total_seconds,
        "final_checkpoint": str(s.final_checkpoint),
        "channel_reports": s.channel_reports,
    }


# ---- the asynchronous off-policy path (GPU users) ----------------------------------------
# ``generation.backend: vllm`` with
# ``generation.vllm.async_rollouts.enabled`` trains with TRL 1.16's experimental
# ``AsyncGRPOTrainer`` (``trl.experimental.async_grpo``) instead of our synchronous
# ``ComposerReplicationTrainer``.
#
# There, a rollout worker process sends every rollout to a vLLM server on its own (its turns and
# tool calls do not wait for the rest of the batch) and queues the scored samples; the trainer
# takes what is ready. A sample generated by weights up to ``max_staleness`` optimizer steps
# old is trained with the clipped importance ratio of the current policy to the sampling
# policy's log-probs (PPO's clip, Schulman et al. 2017, with DAPO's ``epsilon_high``); older
# ones are dropped. This section maps a run config onto it and refuses, in one line naming the
# key and before anything loads, what that trainer does not do (our channels, dynamic sampling,
# DiLoCo, a KL term, other loss types). Not run in this project (no GPU, no vLLM): tested up to
# the wire (the mapping, the refusals, a picklable environment factory).

ASYNC_KEY = "generation.vllm.async_rollouts"


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def async_enabled(cfg: RunConfig) -> bool:
    return cfg.generation.backend == "vllm" and cfg.generation.vllm.async_rollouts.enabled


def check_async(cfg: RunConfig) -> None:
    """``ConfigError`` (one line) for what ``AsyncGRPOTrainer`` cannot run, then for a
    missing vLLM; nothing is loaded before."""
    p = cfg.grpo
    refusals = [
        (bool(cfg.channel_settings()), f"the channels {sorted(cfg.channel_settings())} "
                                       "(set their weight to 0)"),
        (p.dynamic_sampling.enabled, "grpo.dynamic_sampling"),
        (cfg.diloco.enabled, "diloco"),
        (p.beta > 0, "grpo.beta > 0 (no reference model there)"),
        (p.loss_type != "dapo", f"grpo.loss_type={p.loss_type} (its loss is token-level, DAPO's)"),
        (p.num_iterations != 1, "grpo.num_iterations != 1"),
        (cfg.peft.enabled, "peft (pass a LoRA config to AsyncGRPOTrainer yourself)"),
    ]  # fmt: skip
    for bad, what in refusals:
        if bad:
            raise ConfigError(f"{ASYNC_KEY}: TRL's AsyncGRPOTrainer does not run {what}")
    if not vllm_installed():
        raise ConfigError(
            f"{ASYNC_KEY}: the vllm package is not installed (pip install vllm; it needs a CUDA GPU "
            "and a `trl vllm-serve` server); turn async_rollouts off on this machine"
        )


def async_grpo_args(cfg: RunConfig):
    """Our RunConfig as TRL's ``AsyncGRPOConfig``."""
    import torch
    from trl.experimental.async_grpo import AsyncGRPOConfig

    cuda = torch.cuda.is_available()  # bf16 is refused on CPU (this mapping's test runs there)

    g, p, o = cfg.generation, cfg.grpo, cfg.optim
    a, v = g.vllm.async_rollouts, g.vllm
    server = {"vllm_server_base_url": v.server_base_url} if v.server_base_url else {}
    return AsyncGRPOConfig(
        output_dir=cfg.output_dir, max_steps=cfg.max_steps, seed=cfg.seed,
        per_device_train_batch_size=g.prompts_per_step * g.num_generations,
        gradient_accumulation_steps=o.gradient_accumulation_steps,
        num_generations=g.num_generations, max_completion_length=g.max_completion_length,
        temperature=g.temperature, top_p=g.top_p,
        max_tool_calling_iterations=cfg.rollout.max_turns - 1,
        epsilon=p.epsilon, epsilon_high=p.epsilon_high,
        max_staleness=cfg.rollout.max_staleness, max_inflight_tasks=a.max_inflight,
        weight_sync_steps=a.weight_sync_steps,
        learning_rate=o.learning_rate, lr_scheduler_type=o.lr_scheduler,
        warmup_steps=o.warmup_steps, weight_decay=o.weight_decay, max_grad_norm=o.max_grad_norm,
        save_strategy="steps", save_steps=cfg.save_steps or cfg.max_steps,
        save_total_limit=cfg.save_total_limit, report_to=cfg.logging.report_to or "none",
        activation_checkpointing=o.gradient_checkpointing,
        dtype=cfg.model.dtype, bf16=cfg.model.dtype == "bfloat16" and cuda,
        use_cpu=not cuda, **server,
    )  # fmt: skip


class ToolsFactory:
    """A picklable ``environment_factory``: ``AsyncGRPOTrainer`` ships it to its rollout
    worker process, where it rebuilds the run's (bounded) tool class once and makes one
    instance per call. (The class ``bounded_tools`` builds exists only in the process that
    built it, so it cannot travel itself.)"""

    def __init__(self, cfg: RunConfig):
        self.cfg, self._cls = cfg, None

    def __getstate__(self) -> dict[str, Any]:
        return {"cfg": self.cfg, "_cls": None}

    def __call__(self) -> Any:
        if self._cls is None:
            self._cls = tool_kwargs(self.cfg, build_env(self.cfg))["environment_factory"]
        return self._cls()


def async_trainer_kwargs(cfg: RunConfig, tokenizer, env) -> dict[str, Any]:
    """Everything ``AsyncGRPOTrainer(**kwargs)`` gets from a run config (after
    :func:`check_async`): the model path (vLLM serves the same one), rewards, dataset, tools."""
    from composer_replication.lm.models import resolve_model_path
    from composer_replication.trainer.data import build_prompt_dataset

    dataset = build_prompt_dataset(env, "train", cfg.env.num_train, cfg.env.seed,
                                   conversational=True, shard=data_shard(cfg))  # fmt: skip
    out = {
        "model": resolve_model_path(cfg.model.name),
        "reward_funcs": build_reward_funcs(cfg, env),
        "args": async_grpo_args(cfg),
        "train_dataset": dataset,
        "processing_class": tokenizer,
    }
    if env.tools:
        out["environment_factory"] = ToolsFactory(cfg)
    return out


def run_async_training(cfg: RunConfig) -> Any:
    """Train with ``AsyncGRPOTrainer`` (GPU, vLLM server); the run's summary (no held-out
    evaluation: ``eval`` the saved ``final`` model)."""
    check_async(cfg)
    t0 = time.monotonic()
    from trl.experimental.async_grpo import AsyncGRPOTrainer

    from composer_replication.lm.chat_templates import ensure_tool_template
    from composer_replication.lm.models import load_tokenizer

    env = build_env(cfg)
    tokenizer = load_tokenizer(cfg.model.name)
    if env.tools:
        ensure_tool_template(tokenizer)
    trainer = AsyncGRPOTrainer(**async_trainer_kwargs(cfg, tokenizer, env))
    trainer.train()
    final = Path(cfg.output_dir) / "final"
    trainer.save_model(str(final))
    seconds = time.monotonic() - t0
    return RunSummary(Path(cfg.output_dir), None, None, None, seconds, seconds, final)
