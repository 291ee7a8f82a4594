"""The run config (``composer-replication train``): one pydantic model per concern, loaded from
YAML plus ``key=value`` overrides. Unknown keys and out-of-range values are errors that name
the key. This module imports no torch (configs are parsed by the CLI before anything heavy
loads)."""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, SerializeAsAny, ValidationError, field_validator, model_validator

from composer_replication.config.agent import AgentProxyConfig
from composer_replication.config.base import (
    ConfigError,
    StrictModel,
    apply_overrides,
    default_config_path,
    format_validation_error,
    home_expanded,
    load_yaml_mapping,
    parse_override,
    resolve_config_path,
)
from composer_replication.config.channels import (
    CHANNEL_ALIASES,
    CHANNEL_SECTIONS,
    DistillConfig,
    ReplayChannelConfig,
    SdpoConfig,
    move_weight_aliases,
)
from composer_replication.config.data import DataConfig
from composer_replication.config.diloco import DilocoConfig
from composer_replication.config.env import (
    ArithmeticEnvConfig,
    EnvConfig,
    RolloutConfig,
    SandboxConfig,
    ToolEnvConfig,
    env_config,
)
from composer_replication.config.ray import RayConfig
from composer_replication.config.teachers import LocalTeacherConfig


class ModelConfig(StrictModel):
    name: str = "embedded:smollm2-135m-instruct"
    """Hub id, local directory, ``.gguf`` file, or ``embedded:NAME`` (see lm/models.py)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype for training (fp32 on CPU)."""


class PeftConfig(StrictModel):
    enabled: bool = False
    """Train a LoRA adapter instead of the full model."""
    r: int = Field(16, ge=1, le=1024)
    """LoRA rank."""
    alpha: int = Field(32, ge=1)
    """LoRA scaling numerator (scale = alpha / r)."""
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """Dropout on the LoRA branch."""
    target_modules: list[str] | str = "all-linear"
    """Module names to adapt, or ``all-linear``."""


class AsyncRolloutsConfig(StrictModel):
    """Asynchronous off-policy rollouts (GPU only, not run on this project's CPU machines):
    TRL's experimental ``AsyncGRPOTrainer`` generates on a vLLM server, each rollout's turns
    and tool calls running on their own, while the trainer trains on the rollouts that are
    ready; a rollout made by weights at most ``max_staleness`` updates old is corrected by the
    clipped importance ratio of the current policy to the sampling one (``grpo.epsilon``,
    ``grpo.epsilon_high``). The channels, dynamic sampling and DiLoCo do not run there
    (docs/agents.md, "What runs at the same time")."""

    enabled: bool = False
    """Train with ``AsyncGRPOTrainer`` (needs ``generation.backend: vllm`` in ``server`` mode).
    Rollouts more than ``rollout.max_staleness`` weight updates old are dropped (the former
    ``max_staleness`` of this section, deprecated: `fold_deprecated_keys`)."""
    max_inflight: int = Field(-1, ge=-1, le=1_000_000)
    """Rollouts in flight on the server at once (-1: TRL's default, ``max_staleness`` times
    the rollouts of a step); with tool environments, how many episodes the machine can run."""
    weight_sync_steps: int = Field(1, ge=1, le=1024)
    """Optimizer steps between pushes of the weights to the vLLM server."""


class VllmConfig(StrictModel):
    """TRL's vLLM generation (needs a GPU and ``pip install vllm``)."""

    mode: Literal["colocate", "server"] = "colocate"
    """``colocate``: vLLM shares the training GPUs; ``server``: a ``trl vllm-serve`` process."""
    server_base_url: str | None = None
    """URL of the ``trl vllm-serve`` server (mode ``server``); None = TRL's host/port default."""
    gpu_memory_utilization: float = Field(0.3, gt=0.0, le=1.0)
    """Fraction of GPU memory vLLM may take (colocate: leave room for training)."""
    tensor_parallel_size: int = Field(1, ge=1)
    """GPUs one vLLM engine spans (colocate)."""
    max_model_length: int | None = Field(None, ge=1)
    """Context length vLLM allocates for (None = the model's)."""
    async_rollouts: AsyncRolloutsConfig = Field(default_factory=AsyncRolloutsConfig)
    """Asynchronous off-policy training on the vLLM server (TRL's ``AsyncGRPOTrainer``)."""

    @model_validator(mode="after")
    def _async_needs_server(self) -> VllmConfig:
        if self.async_rollouts.enabled and self.mode != "server":
            raise ValueError(
                "generation.vllm.async_rollouts needs generation.vllm.mode=server (TRL's "
                "AsyncGRPOTrainer generates on a separate vLLM server)"
            )
        return self


class GenerationConfig(StrictModel):
    num_generations: int = Field(8, ge=2)
    """Completions sampled per prompt (the GRPO group size)."""
    prompts_per_step: int = Field(2, ge=1)
    """Distinct prompts per optimizer step (batch = prompts_per_step * num_generations)."""
    max_completion_length: int = Field(16, ge=1, le=32768)
    """Maximum new tokens per completion."""
    temperature: float = Field(1.0, gt=0.0, le=5.0)
    """Sampling temperature for rollouts."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling for rollouts."""
    backend: Literal["transformers", "vllm"] = "transformers"
    """Rollout engine: ``transformers`` generate (CPU or GPU) or vLLM (GPU; ``generation.vllm``
    picks colocated or a separate server), mapped onto TRL's ``use_vllm``/``vllm_mode``."""
    vllm: VllmConfig = Field(default_factory=lambda: VllmConfig())
    """vLLM settings, used when ``backend: vllm``."""
    shared_prefix: bool = True
    """Run the prompt tokens rows share (a GRPO group's prompt; a system prompt, tool schemas
    and worked examples every prompt repeats) once, with the KV cache expanded to the rows, in
    ``transformers`` generation, in the policy's log-prob forwards, in the channels' forwards
    (the hinted teacher, the preference pairs) and in evaluation; the trainer's default too.
    The same numbers up to float rounding (tests/unit/lm/test_prefix.py); models with
    sliding-window or recurrent layers, and gradient checkpointing with gradients on, take the
    plain padded forward. ``false``: TRL's own padded forwards, bit for bit."""

    @model_validator(mode="after")
    def _async_needs_vllm(self) -> GenerationConfig:
        if self.vllm.async_rollouts.enabled and self.backend != "vllm":
            raise ValueError(
                "generation.vllm.async_rollouts needs generation.backend=vllm (the rollouts "
                "are generated on a vLLM server)"
            )
        return self


class OverlongConfig(StrictModel):
    enabled: bool = False
    """DAPO soft overlong punishment: penalize completions that run into the length limit."""
    cache: int = Field(4, ge=0)
    """Length of the soft-penalty window before max_completion_length (DAPO's L_cache)."""


class DynamicSamplingConfig(StrictModel):
    enabled: bool = False
    """DAPO dynamic sampling: drop groups whose rewards all tie and refill with fresh prompts."""
    max_refills: int = Field(2, ge=0, le=64)
    """Extra generation rounds per step to refill dropped groups (then train on what is left)."""


class GRPOConfigModel(StrictModel):
    weight: float = Field(1.0, ge=0.0, le=1000.0)
    """Weight of channel 1, the GRPO policy loss, in the total (1: TRL's loss unchanged). 0:
    the extra channels train alone, e.g. on-policy distillation without RL (rollouts are still
    generated and graded; rewards are logged)."""
    loss_type: Literal["dapo", "grpo", "bnpo", "dr_grpo", "cispo", "sapo"] = "dapo"
    """TRL loss aggregation; DAPO is token-level over the whole batch."""
    epsilon: float = Field(0.2, gt=0.0, le=1.0)
    """Lower clip range of the importance ratio."""
    epsilon_high: float = Field(0.28, gt=0.0, le=10.0)
    """Upper clip range (DAPO clip-higher)."""
    beta: float = Field(0.0, ge=0.0)
    """KL penalty against the reference model (0 = no reference forward)."""
    scale_rewards: Literal["group", "batch", "none"] = "group"
    """How advantages are scaled by reward std."""
    mask_truncated_completions: bool = True
    """Exclude completions that hit the length limit from the loss (DAPO)."""
    overlong: OverlongConfig = Field(default_factory=OverlongConfig)
    """Soft overlong punishment reward."""
    dynamic_sampling: DynamicSamplingConfig = Field(default_factory=DynamicSamplingConfig)
    """Dynamic sampling of groups with non-zero reward variance."""
    num_iterations: int = Field(1, ge=1)
    """PPO-style updates per generated batch."""
    max_infra_failed_frac: float = Field(0.5, ge=0.0, le=1.0)
    """Gradings the machine failed (sandbox start, grader killed, slot timeout, server 5xx;
    docs/sandbox.md) are masked, out of the loss and of their group's statistics. When more
    than this share of a step's rollouts are masked for 3 steps in a row, the run stops with
    one line naming the commonest kind (1.0: never)."""


class OptimConfig(StrictModel):
    learning_rate: float = Field(1e-5, gt=0.0, le=1.0)
    """Peak learning rate (AdamW)."""
    lr_scheduler: Literal["constant", "linear", "cosine", "constant_with_warmup"] = "constant"
    """Learning-rate schedule."""
    warmup_steps: int = Field(0, ge=0)
    """Linear warm-up steps."""
    weight_decay: float = Field(0.0, ge=0.0)
    """AdamW weight decay."""
    max_grad_norm: float = Field(1.0, gt=0.0)
    """Gradient clipping norm."""
    gradient_accumulation_steps: int = Field(1, ge=1)
    """Micro-batches per optimizer step."""
    gradient_checkpointing: bool = True
    """Recompute activations in the backward pass (TRL's default; saves memory, costs time)."""


class LoggingConfig(StrictModel):
    """Where metrics go besides ``metrics.jsonl`` and the PNG (always written)."""

    report_to: list[Literal["tensorboard", "wandb", "trackio"]] = Field(default_factory=list)
    """Trackers transformers reports to (empty = none); each needs its package installed."""
    run_name: str | None = None
    """Run name shown by the trackers (None = the output directory's name)."""

    @model_validator(mode="before")
    @classmethod
    def _one_or_none(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("report_to"), str):
            value = data["report_to"]
            data = {**data, "report_to": [] if value == "none" else [value]}
        return data


class EvalConfig(StrictModel):
    n: int = Field(200, ge=1)
    """Held-out problems evaluated (the same problems for base and trained model)."""
    split: Literal["train", "heldout"] = "heldout"
    """Which split to evaluate on."""
    max_new_tokens: int = Field(16, ge=1)
    """Decoding length for evaluation (per turn in tool environments). With a
    ``rollout.context`` strategy the per-turn cap is ``generation.max_completion_length``
    instead, the one the training budget uses (run/train.py ``eval_turn_tokens``)."""
    batch_size: int = Field(32, ge=1)
    """Prompts decoded together."""
    temperature: float = Field(0.0, ge=0.0, le=5.0)
    """0 = greedy pass@1; > 0 = pass@1 of one sample per problem at this temperature (top-p
    1, no top-k), drawn with ``seed``: base and trained model are evaluated with the same
    random stream (common random numbers for the paired difference)."""
    seed: int = 1234
    """Sampling seed of the evaluation (``temperature`` > 0)."""
    before_and_after: bool = True
    """Evaluate the base model before training and the trained model after, and print both."""


class RunConfig(StrictModel):
    """A whole training run. Top-level scalars are the knobs people override most."""

    output_dir: str = "runs/quickstart"
    """Run directory: metrics.jsonl, plots, checkpoints, config.yaml."""
    seed: int = 0
    """Seed for torch, sampling and data order."""
    max_steps: int = Field(50, ge=1)
    """Optimizer steps."""
    save_steps: int = Field(0, ge=0)
    """Checkpoint every N steps (0 = only at the end)."""
    save_total_limit: int | None = Field(1, ge=1)
    """Keep only the newest N ``checkpoint-*`` directories (None keeps all). A full checkpoint
    of a 135M model with its AdamW state is ~1.6 GB; ``final/`` (weights only) is kept always."""
    save_only_model: bool = False
    """Checkpoints hold the weights only (about a third of the size) and cannot be resumed
    with ``resume_from`` (no optimizer, scheduler or RNG state)."""
    num_threads: int = Field(0, ge=0)
    """torch CPU threads (0 = leave torch's default)."""
    resume_from: str | None = None
    """Checkpoint directory to resume from, or ``latest`` for the newest in output_dir."""
    resume_override_channels: bool = False
    """Resume even when the checkpoint's channel settings (``sdpo``, ``replay``) differ from
    this config's (this config's settings then apply from the resumed step on)."""
    resume_override_config: bool = False
    """Resume even when the run's saved ``config.yaml`` differs from this config in what it
    trains (seed, model, peft, env, sandbox, generation, rollout, grpo, optim, agent_proxy, data;
    this config's settings then apply from the resumed step on). ``max_steps``, threads,
    ``eval``, ``logging``, ``diloco`` and where the run saves may change without it; channel
    settings have ``resume_override_channels``."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    peft: PeftConfig = Field(default_factory=PeftConfig)
    env: SerializeAsAny[EnvConfig] = Field(default_factory=ArithmeticEnvConfig)
    """The environment, keyed on ``name`` (config/env.py)."""
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    """Isolation and limits for model-written code (code environments such as humaneval)."""
    generation: GenerationConfig = Field(default_factory=GenerationConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    """Turn and tool-call bounds of multi-turn tool rollouts (tool environments only)."""
    grpo: GRPOConfigModel = Field(default_factory=GRPOConfigModel)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    sdpo: SdpoConfig = Field(default_factory=SdpoConfig)
    replay: ReplayChannelConfig = Field(default_factory=ReplayChannelConfig)
    distill: DistillConfig = Field(default_factory=DistillConfig)
    """On-policy distillation from stronger teachers (off by default; docs/channels.md)."""
    diloco: DilocoConfig = Field(default_factory=DilocoConfig)
    """DiLoCo outer loop across replicas (off by default; see diloco/)."""
    agent_proxy: AgentProxyConfig = Field(default_factory=AgentProxyConfig)
    """Rollouts by an unmodified agent harness driving the policy through a proxy (off by
    default; docs/agents.md)."""
    data: DataConfig = Field(default_factory=DataConfig)
    """Which training tasks each step's groups are for: ``data.sampler: uniform | adaptive``
    (config/data.py, envs/sampler.py; docs/channels.md)."""
    # -- asynchronous rollouts on Ray (issue 54; docs/scaling.md) --
    ray: RayConfig = Field(default_factory=RayConfig)
    """Where the rollout workers of ``rollout.engine: ray`` run, how many, with what."""

    @model_validator(mode="before")
    @classmethod
    def _deprecated_keys(cls, data: Any) -> Any:
        return fold_deprecated_keys(data)

    @model_validator(mode="after")
    def _ray_engine(self) -> RunConfig:
        check_ray_engine(self)
        return self

    @model_validator(mode="after")
    def _context_budget(self) -> RunConfig:
        check_context(self)
        return self

    @model_validator(mode="before")
    @classmethod
    def _weight_aliases(cls, data: Any) -> Any:
        return move_weight_aliases(data)

    @field_validator("output_dir")
    @classmethod
    def _home(cls, value: str) -> str:
        return home_expanded(value)

    @field_validator("env", mode="before")
    @classmethod
    def _env_variant(cls, data: Any) -> Any:
        return env_config(data)

    @model_validator(mode="after")
    def _agent_proxy_env(self) -> RunConfig:
        if self.agent_proxy.enabled and self.env.name != "feature_deletion":
            raise ValueError(
                f"agent_proxy runs its harness on Feature Deletion workspaces; env.name is "
                f"{self.env.name!r} (set env.name=feature_deletion)"
            )
        if self.agent_proxy.enabled and self.generation.backend != "transformers":
            raise ValueError("agent_proxy generates with the trainer's transformers model "
                             "(generation.backend=transformers)")  # fmt: skip
        return self

    @model_validator(mode="after")
    def _something_trains(self) -> RunConfig:
        if self.grpo.weight == 0 and not self.channel_settings():
            raise ValueError(
                "grpo.weight=0 with no extra channel (sdpo, replay, distill weight > 0) trains "
                "nothing"
            )
        return self

    @model_validator(mode="after")
    def _advantage_needs_the_policy_loss(self) -> RunConfig:
        loss = self.distill.loss
        if self.distill.enabled and loss.as_advantage and not self.grpo.weight:
            raise ValueError(
                "distill.loss.as_advantage=true trains through GRPO's loss: grpo.weight must be > 0"
            )
        return self

    @model_validator(mode="after")
    def _teacher_is_not_the_student(self) -> RunConfig:
        for t in self.distill.teachers:
            if (
                isinstance(t, LocalTeacherConfig)
                and t.model == self.model.name
                and not t.allow_student_weights
            ):
                raise ValueError(
                    f"distill.teachers: {t.name!r} loads the student's own weights "
                    f"({t.model}): a frozen copy of the student teaches nothing; point it at a "
                    "stronger model, or set allow_student_weights=true"
                )
        return self

    def channel_settings(self) -> dict[str, dict[str, Any]]:
        """Settings of every enabled channel (weight > 0), as plain data: what a checkpoint
        records and a resume compares."""
        return {
            name: getattr(self, name).model_dump(mode="json")
            for name in CHANNEL_SECTIONS
            if getattr(self, name).enabled
        }


log = logging.getLogger(__name__)

DEPRECATED_KEYS = {
    ("generation", "vllm", "async_rollouts", "max_staleness"): ("rollout", "max_staleness"),
    ("env", "harness"): ("env", "tool_profile"),
}
"""Old key -> its new place: `fold_deprecated_keys` moves a value given under the old key."""

_warned: set[str] = set()


def fold_deprecated_keys(data: Any) -> Any:
    """Move each `DEPRECATED_KEYS` value to its new key, with one line logged once per process
    (``X is deprecated: use Y``); both set to different values is an error. A run's saved
    ``config.yaml`` written before the move still loads (and compares equal)."""
    if not isinstance(data, dict):
        return data
    data = copy.deepcopy(data)
    for old, new in DEPRECATED_KEYS.items():
        parent = _section(data, old[:-1])
        if parent is None or old[-1] not in parent:
            continue
        value = parent.pop(old[-1])
        target = _section(data, new[:-1], create=True)
        if target is None:
            continue  # the section's own validation reports it
        old_key, new_key = ".".join(old), ".".join(new)
        if new[-1] in target and target[new[-1]] != value:
            raise ValueError(f"{old_key}={value} (deprecated) and {new_key}={target[new[-1]]} "
                             f"disagree: set {new_key} only")  # fmt: skip
        target[new[-1]] = value
        if old_key not in _warned:
            _warned.add(old_key)
            log.warning("%s is deprecated: use %s", old_key, new_key)
    return data


def _section(data: dict[str, Any], path: tuple[str, ...], create: bool = False) -> Any:
    """The nested mapping at ``path`` (None if a part is missing, or not a mapping)."""
    node: Any = data
    for part in path:
        if create and part not in node:
            node[part] = {}
        node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            return None
    return node


def check_ray_engine(cfg: RunConfig) -> None:
    """``rollout.engine: ray`` with what it does not run (raised as a one-line error naming
    the key): vLLM generation (the workers generate with the shared generator,
    lm/generator.py), TRL's async path, the agent proxy, DiLoCo, PEFT but with
    ``ray.weight_sync=lora`` (and that mode without PEFT), a tool environment served over
    OpenEnv; and a forced staleness past the bound."""
    r = cfg.rollout
    if r.force_staleness is not None and r.force_staleness > r.max_staleness:
        raise ValueError(f"rollout.force_staleness={r.force_staleness} is above "
                         f"rollout.max_staleness={r.max_staleness}: every group would be dropped")  # fmt: skip
    if r.engine != "ray":
        if r.force_staleness is not None:
            raise ValueError("rollout.force_staleness needs rollout.engine=ray")
        if not r.correction:
            raise ValueError(
                "rollout.correction=false needs rollout.engine=ray (the local "
                "engine trains on-policy: there is no correction to switch off)"
            )
        return
    refusals = [
        (cfg.generation.backend != "transformers", "generation.backend=vllm (workers generate "
                                                   "with transformers)"),
        (cfg.agent_proxy.enabled, "agent_proxy"),
        (cfg.diloco.enabled, "diloco"),
        (cfg.peft.enabled and cfg.ray.weight_sync != "lora",
         f"peft with ray.weight_sync={cfg.ray.weight_sync} (workers hold the PEFT model: set "
         "ray.weight_sync=lora)"),
        (cfg.ray.weight_sync == "lora" and not cfg.peft.enabled,
         "ray.weight_sync=lora without peft.enabled=true (no adapter to push)"),
        (isinstance(cfg.env, ToolEnvConfig) and bool(cfg.env.openenv_url),
         "env.openenv_url (tools and grading on an OpenEnv server) yet"),
    ]  # fmt: skip
    for bad, what in refusals:
        if bad:
            raise ValueError(f"rollout.engine=ray does not run {what}")


SUMMARY_ROOM = 64
"""Tokens ``rollout.context.max_tokens`` must leave, besides a turn and a summary, for the
system prompt, the task and the summary instruction (checked again on the real prompt once it
is tokenized: ``rollout.ContextLoop``)."""


def check_context(cfg: RunConfig) -> None:
    """``rollout.context`` against the rest of the run (one-line errors naming the keys): a
    context strategy needs a tool environment and the transformers backend (either engine);
    the window must hold a turn (``generation.max_completion_length``), and with ``summarize``
    also the summary and ``SUMMARY_ROOM`` (docs/summarization.md). Evaluation runs the same
    loop (evaluation.py)."""
    c = cfg.rollout.context
    if c.strategy == "none":
        return
    key = f"rollout.context.strategy={c.strategy}"
    turn = cfg.generation.max_completion_length
    need = turn + (c.summary_max_tokens + SUMMARY_ROOM if c.strategy == "summarize" else 1)
    refusals = [
        (not isinstance(cfg.env, ToolEnvConfig),
         f"needs a tool environment (env.name={cfg.env.name} has no multi-turn loop)"),
        (cfg.generation.backend != "transformers", "needs generation.backend=transformers"),
        (cfg.agent_proxy.enabled, "does not compact for the agent proxy (out of scope)"),
        (c.max_tokens < need,
         f"needs rollout.context.max_tokens >= {need} (a turn of "
         f"generation.max_completion_length={turn}"
         + (f" + summary_max_tokens={c.summary_max_tokens} + {SUMMARY_ROOM} for the prompt"
            if c.strategy == "summarize" else "") + f"), got {c.max_tokens}"),
    ]  # fmt: skip
    for bad, what in refusals:
        if bad:
            raise ValueError(f"{key} {what}")


DYNAMIC_SAMPLING_MULTIPROCESS = (
    "grpo.dynamic_sampling: not supported with several processes (each process would refill "
    "its own groups and desynchronize TRL's collective reward gathering); turn it off "
    "(grpo.dynamic_sampling.enabled=false) or run one process per DiLoCo replica"
)
"""Why DAPO dynamic sampling refuses a multi-process launch (checked before any model loads)."""


def check_processes(dynamic_sampling: bool, processes: int) -> None:
    """DAPO dynamic sampling refuses a multi-process launch (``DYNAMIC_SAMPLING_MULTIPROCESS``
    says why); the one check, also run by the trainer for callers that build it directly."""
    if dynamic_sampling and processes > 1:
        raise ConfigError(DYNAMIC_SAMPLING_MULTIPROCESS)


def nested_diffs(old: Any, new: Any, path: str = "") -> list[str]:
    """``a.b: X -> Y`` for every leaf where two nested dicts (config dumps) differ."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [
            line
            for key in sorted(set(old) | set(new), key=str)
            for line in nested_diffs(old.get(key), new.get(key), f"{path}.{key}" if path else str(key))
        ]  # fmt: skip
    return [] if old == new else [f"{path}: {old!r} -> {new!r}"]


SAVING_FIELDS = frozenset({"output_dir", "save_steps", "save_total_limit", "save_only_model",
                           "resume_from"})  # fmt: skip
"""Run-config fields that change where and what a run saves, never what it trains: a run is
reused, or resumed, whatever they were (``checkpoint_every`` may be turned on mid-study)."""


RESUME_MAY_CHANGE = SAVING_FIELDS | {
    "max_steps", "num_threads", "resume_override_channels", "resume_override_config", "eval",
    "logging", "diloco", "ray", *CHANNEL_SECTIONS,
}  # fmt: skip
"""Run-config fields a resume may change without ``resume_override_config``: how long and
where it trains, how it evaluates and logs, the outer loop (set by the DiLoCo launcher), and
the channel sections (compared with the checkpoint's own record, ``resume_override_channels``)."""


RERUN_MAY_DIFFER: dict[str, Any] = {
    **dict.fromkeys(SAVING_FIELDS, True), "num_threads": True, "resume_override_channels": True,
    "resume_override_config": True, "diloco": {"lighthouse": True, "store_uri": True},
    "ray": {"address": True},
}  # fmt: skip
"""What a fresh run into a directory that holds the same experiment may change (pydantic's
``exclude`` form): where it saves, threads, the resume override flags (a resume that passed
them wrote them into config.yaml; they change nothing the run trains), and where DiLoCo's
replicas meet: the torchft lighthouse's address (the launcher starts one on a free port at each
launch) or the object store's prefix (the launcher refuses one holding an earlier run's
rounds: each launch needs a fresh one)."""


def saved_config_diffs(
    saved: str | Path,
    cfg: RunConfig,
    exclude: AbstractSet[str] | Mapping[str, Any] = SAVING_FIELDS,
) -> list[str]:
    """``key: saved -> cfg`` for each setting where the config a run saved (its
    ``config.yaml``, read with today's defaults) differs from ``cfg``, but for the fields in
    ``exclude`` (top-level names, or pydantic's nested ``exclude`` mapping). A `ConfigError` if
    the saved file cannot be read as a run config."""
    skip = dict(exclude) if isinstance(exclude, Mapping) else set(exclude)
    return nested_diffs(
        load_config(saved, []).model_dump(exclude=skip), cfg.model_dump(exclude=skip)
    )


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Load a RunConfig from YAML (default: the shipped quickstart) plus overrides. ``path`` is
    a file, or the name of a shipped config (`resolve_config_path`)."""
    path = resolve_config_path(path) if path is not None else default_config_path()
    data = apply_overrides(fresh_env_on_switch(load_yaml_mapping(path), overrides or []),
                           overrides or [])  # fmt: skip
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(
            format_validation_error(
                err, str(path), RunConfig, tuple(CHANNEL_ALIASES), overrides or []
            )
        ) from None


def dump_config(cfg: RunConfig) -> str:
    """YAML text of a config (what a run writes next to its metrics)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def fresh_env_on_switch(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """An ``env.name`` override naming another environment than the file's drops the file's
    ``env`` section (its options belong to the other environment)."""
    names = [value for path, value in map(parse_override, overrides) if path == ["env", "name"]]
    env = data.get("env")
    if names and isinstance(env, dict) and env.get("name", "arithmetic") != names[-1]:
        return {**data, "env": {}}
    return data
