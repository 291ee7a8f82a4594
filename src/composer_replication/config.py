"""Run configuration: pydantic models loaded from YAML, with ``key=value`` overrides.

One model per concern; unknown keys and out-of-range values are errors that name the key.
This module imports no torch (configs are parsed by the CLI before anything heavy loads).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from composer_replication.diloco.config import DilocoConfig

DEFAULT_CONFIG = "quickstart.yaml"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(_Strict):
    name: str = "embedded:smollm2-135m-instruct"
    """Hub id, local directory, ``.gguf`` file, or ``embedded:NAME`` (see models.py)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype for training (fp32 on CPU)."""


class PeftConfig(_Strict):
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


class TaskGenConfig(_Strict):
    """Feature Deletion task generation (``composer-replication tasks generate``;
    envs/feature_deletion/generate.py)."""

    max_break_share: float = Field(0.5, gt=0.0, le=1.0)
    """A deletion that fails more than this share of the suite's passing tests is too broad
    to be a task (it deletes a foundation, not a feature)."""
    visible_tests: int = Field(3, ge=1, le=1000)
    """Failing tests the agent may see and run by name; the task's other failing tests stay
    hidden until grading."""
    workers: int = Field(0, ge=0, le=256)
    """Sandboxed suite runs in parallel (0: one per CPU core). Not part of the task set's
    identity."""
    suite_timeout_s: float = Field(120.0, gt=0.0, le=3600.0)
    """Wall-clock (and CPU-seconds) limit of one run of the suite."""
    memory_mb: int = Field(2048, ge=256, le=65536)
    """Address-space limit of one run of the suite."""
    max_candidates: int | None = Field(None, ge=1)
    """Try only the first N candidate functions (file order); None: all."""
    test_requirements: list[str] = Field(default_factory=list)
    """The suite's own test dependencies (pip requirement strings, e.g. ``freezegun``),
    installed next to pytest for the sandboxed runs (fetched from the package index)."""
    rename_package: bool = False
    """Rename the source's top-level package (and every word-boundary mention of it) to a
    name derived from the tree's hash, so a model cannot lean on memorized upstream code
    (the suite must still pass after the rename)."""


TOOL_ENVS = ("calculator", "feature_deletion")
"""Environment names whose rollouts are multi-turn tool conversations."""


class EnvConfig(_Strict):
    name: Literal["arithmetic", "humaneval", "calculator", "feature_deletion"] = "arithmetic"
    """Embedded verifiable task (see envs/); ``calculator`` and ``feature_deletion`` are
    multi-turn tool tasks (bounded by the ``rollout`` section; docs/agents.md,
    docs/feature_deletion.md)."""
    levels: list[int] = Field(default_factory=lambda: [1, 2])
    """Arithmetic difficulty levels mixed in the train and held-out splits (see envs/arithmetic.py)."""
    heldout_fraction: float = Field(0.2, gt=0.0, lt=1.0)
    """Fraction of problems reserved for the held-out split (disjoint from train)."""
    num_train: int = Field(2000, ge=1)
    """Number of training prompts drawn from the train split."""
    seed: int = 0
    """Seed for drawing problems (the split itself is a fixed hash, independent of seeds)."""
    openenv_url: str | None = None
    """Tool environments: run the tools and the grading on this OpenEnv server (ours served
    with ``python -m composer_replication.envs.openenv_server``, or any OpenEnv tool
    environment) through the generic adapter (envs/openenv_adapter.py); prompts still come
    from ``name``'s tasks. None = tools run in this process."""
    few_shot: bool = True
    """Tool environments: put worked tool exchanges before each task (the 135M base model
    never calls a tool from the schema alone; docs/agents.md)."""
    shots: int = Field(2, ge=0, le=2)
    """``calculator`` with ``few_shot``: how many of its two worked exchanges precede each
    task. The base 135M model passes greedily 100% with 2 and 3% with 1 (T=1: 6% and 0%;
    docs/agents.md), so 1 is the sparse-reward variant."""
    task_sources: list[str] = Field(
        default_factory=lambda: ["toolz==1.2.0", "inflection==0.5.1"], min_length=1
    )
    """``feature_deletion``: source trees to delete functions from: local directories with a
    pytest suite, or pinned PyPI packages (``name==version``, the sdist is fetched with pip at
    first use). Task sets are generated at first use and cached (``task_dir``)."""
    task_dir: str | None = None
    """``feature_deletion``: where generated task sets live (None: the cache,
    ``<cache>/feature_deletion/tasks``)."""
    task_generation: TaskGenConfig = Field(default_factory=lambda: TaskGenConfig())
    """``feature_deletion``: task generation and test-run limits (``tasks generate``)."""
    reward: Literal["all_or_nothing", "fraction"] = "all_or_nothing"
    """``feature_deletion``: 1 iff every target test passes and nothing regresses, or the
    share of target tests passing (0 on any regression)."""
    max_tool_output_chars: int = Field(2000, ge=100, le=1_000_000)
    """``feature_deletion``: tool results are cut to this many characters."""
    tests_budget_s: float | None = Field(300.0, ge=1.0, le=36_000.0)
    """``feature_deletion``: wall seconds the ``run_tests`` calls of one episode may take in
    all (each run is cut to what is left; once spent, ``run_tests`` is an error result and
    grading still runs). A workspace that hangs costs this once, not
    ``task_generation.suite_timeout_s`` per call. None: no budget."""

    @model_validator(mode="after")
    def _openenv_needs_tools(self) -> EnvConfig:
        if self.openenv_url and self.name not in TOOL_ENVS:
            raise ValueError(
                f"env.openenv_url: {self.name!r} is not a tool environment (tool envs: "
                f"{', '.join(TOOL_ENVS)})"
            )
        return self

    @model_validator(mode="after")
    def _shots_for_calculator(self) -> EnvConfig:
        if self.shots != 2 and (self.name != "calculator" or not self.few_shot):
            raise ValueError(
                f"env.shots={self.shots}: only the calculator with few_shot=true has shots "
                f"(env.name={self.name!r}, few_shot={self.few_shot})"
            )
        return self

    @model_validator(mode="after")
    def _check_levels(self) -> EnvConfig:
        from composer_replication.envs.arithmetic import LEVELS

        bad = [lv for lv in self.levels if lv not in LEVELS]
        if bad or not self.levels:
            raise ValueError(f"env.levels: {bad or 'empty'} not in {sorted(LEVELS)}")
        return self


class AsyncRolloutsConfig(_Strict):
    """Asynchronous off-policy rollouts (GPU only, not run on this project's CPU machines):
    TRL's experimental ``AsyncGRPOTrainer`` generates on a vLLM server, each rollout's turns
    and tool calls running on their own, while the trainer trains on the rollouts that are
    ready; a rollout made by weights at most ``max_staleness`` updates old is corrected by the
    clipped importance ratio of the current policy to the sampling one (``grpo.epsilon``,
    ``grpo.epsilon_high``). The channels, dynamic sampling and DiLoCo do not run there
    (docs/agents.md, "What runs at the same time")."""

    enabled: bool = False
    """Train with ``AsyncGRPOTrainer`` (needs ``generation.backend: vllm`` in ``server`` mode)."""
    max_staleness: int = Field(4, ge=0, le=1024)
    """Weight updates a rollout may lag behind the trained policy before it is dropped."""
    max_inflight: int = Field(-1, ge=-1, le=1_000_000)
    """Rollouts in flight on the server at once (-1: TRL's default, ``max_staleness`` times
    the rollouts of a step); with tool environments, how many episodes the machine can run."""
    weight_sync_steps: int = Field(1, ge=1, le=1024)
    """Optimizer steps between pushes of the weights to the vLLM server."""


class VllmConfig(_Strict):
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


class SandboxConfig(_Strict):
    """Where and how model-written code runs (envs/sandbox.py, docs/sandbox.md)."""

    unsafe_run_without_isolation: bool = False
    """Run model-written code without bubblewrap (limits and an audit hook only); the code can
    then read this user's files and environment. Only for machines that cannot run bwrap."""
    workers: int = Field(0, ge=0, le=256)
    """Sandbox slots: sandboxes running at once in this process, tool calls and gradings
    together (0 = one per CPU core, fewer if the available memory holds fewer)."""
    wall_timeout_s: float = Field(5.0, gt=0, le=600)
    """Wall-clock limit of one grading (interpreter start, loading and every test call)."""
    cpu_time_s: int = Field(5, ge=1, le=600)
    """CPU-seconds limit of the sandboxed process (RLIMIT_CPU)."""
    memory_mb: int = Field(512, ge=64, le=65536)
    """Address-space limit of each sandboxed process (RLIMIT_AS)."""
    file_size_mb: int = Field(16, ge=1, le=4096)
    """Largest file the code may write (RLIMIT_FSIZE)."""
    work_dir_mb: int = Field(64, ge=1, le=65536)
    """Size of the private tmpfs work directory, the only writable place."""
    max_processes: int = Field(1, ge=1, le=4096)
    """Processes and threads the code may have at once (RLIMIT_NPROC, per sandbox). 1: none
    can be started, even through a call the audit hook does not see (each child would get a
    memory limit of its own); a test suite that starts processes needs more."""
    max_output_kb: int = Field(64, ge=1, le=65536)
    """stdout/stderr bytes kept from a run (the rest is read and dropped)."""
    audit_hook: bool = True
    """Also install the in-process audit hook (a second layer under the OS isolation)."""


class GenerationConfig(_Strict):
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
    ``transformers`` generation and in the policy's log-prob forwards (evaluation always does).
    The same numbers up to float rounding (tests/unit/trainer/test_prefix.py); models with
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


class RolloutConfig(_Strict):
    """Bounds on multi-turn tool rollouts (tool environments; docs/agents.md)."""

    max_turns: int = Field(3, ge=1, le=256)
    """Assistant turns per rollout: after a turn with tool calls, the results are appended
    and the model continues, at most ``max_turns - 1`` times (TRL's
    ``max_tool_calling_iterations``). Calls written in the last turn are not run."""
    max_tool_calls: int = Field(4, ge=0, le=4096)
    """Tool calls run per rollout; later calls get an error result saying the budget is
    used up, without running."""
    concurrent_tools: bool = True
    """Run the tool calls of all rollouts of a turn at once (each rollout's calls in its own
    order), bounded by ``sandbox.workers`` slots for sandboxed tools and ``max_remote_calls``
    for OpenEnv ones; the same messages and rewards as one rollout after another."""
    max_remote_calls: int = Field(32, ge=1, le=1024)
    """OpenEnv calls (tool calls and gradings) in flight at once from this process."""


class OverlongConfig(_Strict):
    enabled: bool = False
    """DAPO soft overlong punishment: penalize completions that run into the length limit."""
    cache: int = Field(4, ge=0)
    """Length of the soft-penalty window before max_completion_length (DAPO's L_cache)."""


class DynamicSamplingConfig(_Strict):
    enabled: bool = False
    """DAPO dynamic sampling: drop groups whose rewards all tie and refill with fresh prompts."""
    max_refills: int = Field(2, ge=0, le=64)
    """Extra generation rounds per step to refill dropped groups (then train on what is left)."""


class GRPOConfigModel(_Strict):
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


class OptimConfig(_Strict):
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


class LoggingConfig(_Strict):
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


class EvalConfig(_Strict):
    n: int = Field(200, ge=1)
    """Held-out problems evaluated (the same problems for base and trained model)."""
    split: Literal["train", "heldout"] = "heldout"
    """Which split to evaluate on."""
    max_new_tokens: int = Field(16, ge=1)
    """Decoding length for evaluation (per turn in tool environments)."""
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


class JsdLossConfig(_Strict):
    """Generalized Jensen-Shannon divergence (OPSD; Agarwal et al., "On-Policy Distillation of
    Language Models", 2024): computed from hidden states by the chunked fused-linear kernel."""

    type: Literal["jsd"] = "jsd"
    beta: float = Field(0.5, ge=0.0, le=1.0)
    """Interpolation of the mixture (0 forward KL, 1 reverse KL)."""
    temperature: float = Field(1.0, gt=0.0, le=10.0)
    """Temperature applied to both distributions."""
    token_clip: float | None = Field(None, gt=0.0)
    """Optional clip of the divergence (OPSD's stabilizer); None = no clip."""
    token_clip_mode: Literal["vocab", "token"] = "vocab"
    """``vocab``: clamp each vocabulary element's term (OPSD; needs the ``[N, V]`` logits);
    ``token``: clamp each token's total (runs in the chunked kernel)."""


class TaidLossConfig(_Strict):
    """TAID (Shing et al., "TAID: Temporally Adaptive Interpolated Distillation", ICLR 2025):
    KL to a target interpolated from the student to the teacher; ``t`` follows the paper's
    adaptive schedule, fed with the step's objective value."""

    type: Literal["taid"] = "taid"
    t_start: float = Field(0.4, ge=0.0, lt=1.0)
    """Interpolation coefficient at step 0 (the paper's default)."""
    t_end: float = Field(1.0, gt=0.0, le=1.0)
    """Final interpolation coefficient (1 = plain forward KL to the teacher)."""
    alpha: float = Field(5e-4, ge=0.0, le=1.0)
    """Step size of the adaptive increase of ``t`` (the paper's alpha)."""
    momentum: float = Field(0.99, ge=0.0, lt=1.0)
    """Momentum of the relative objective change (the paper's beta)."""
    adaptive: bool = True
    """False = the linear schedule from t_start to t_end alone."""

    @model_validator(mode="after")
    def _check_range(self) -> TaidLossConfig:
        if self.t_end < self.t_start:
            raise ValueError(f"t_end ({self.t_end}) must be >= t_start ({self.t_start})")
        return self


class EntropyOpdLossConfig(_Strict):
    """Entropy-aware on-policy distillation: forward/reverse KL mixed by the teacher's
    normalized entropy per token (see losses/entropy_opd.py)."""

    type: Literal["entropy_opd"] = "entropy_opd"
    temperature: float = Field(1.0, gt=0.0, le=10.0)
    """Temperature applied to both distributions."""
    h_max: float | None = Field(None, gt=0.0)
    """Entropy normalizer; None = log(vocabulary size)."""


SdpoLossConfig = Annotated[
    JsdLossConfig | TaidLossConfig | EntropyOpdLossConfig, Field(discriminator="type")
]


class DpoLossConfig(_Strict):
    """DPO (Rafailov et al., 2023): needs reference log-probs, computed once with the initial
    weights."""

    type: Literal["dpo"] = "dpo"
    beta: float = Field(0.1, gt=0.0, le=100.0)
    """Inverse temperature of the implicit reward (the paper's beta)."""
    label_smoothing: float = Field(0.0, ge=0.0, lt=0.5)
    """Conservative DPO: assumed probability that a pair's label is flipped."""


class SimpoLossConfig(_Strict):
    """SimPO (Meng et al., "SimPO: Simple Preference Optimization with a Reference-Free
    Reward", NeurIPS 2024): length-normalized log-probs, no reference model. Defaults are the
    paper's Llama-3-Base setting (beta 2.0, gamma/beta 0.5)."""

    type: Literal["simpo"] = "simpo"
    beta: float = Field(2.0, gt=0.0, le=100.0)
    """Reward scale (the paper uses 2.0-2.5; DPO's 0.1 is far too small here)."""
    gamma: float = Field(1.0, ge=0.0)
    """Target reward margin."""
    label_smoothing: float = Field(0.0, ge=0.0, lt=0.5)
    """Assumed probability that a pair's label is flipped."""


PreferenceLossConfig = Annotated[DpoLossConfig | SimpoLossConfig, Field(discriminator="type")]


def _legacy_loss(data: Any, section: str, fields: dict[str, str]) -> Any:
    """Accept a channel section written before the loss became a union: ``loss: NAME`` and
    the flat loss fields (``section.<old>``) move into ``loss`` (``fields``: old -> new). A
    ``loss`` mapping without ``type`` is the section's default loss (jsd / dpo)."""
    if not isinstance(data, dict):
        return data
    data = dict(data)
    loss = data.get("loss")
    if isinstance(loss, str):
        loss = {"type": loss}
    moved = {new: data.pop(old) for old, new in fields.items() if old in data}
    if moved:
        loss = dict(loss or {})
        loss.setdefault("type", _default_loss_type(section))
        for key, value in moved.items():
            if key in loss and loss[key] != value:
                raise ValueError(f"{section}.{key} is set twice (flat and under loss)")
            loss[key] = value
    if isinstance(loss, dict) and "type" not in loss:  # `sdpo.loss.beta=0.3` means the default
        loss = {"type": _default_loss_type(section), **loss}
    if loss is not None:
        data["loss"] = loss
    return data


def _default_loss_type(section: str) -> str:
    return {"sdpo": "jsd", "replay": "dpo"}[section]


class SdpoConfig(_Strict):
    """Channel 2: hint-conditioned self-distillation (SDPO/OPSD)."""

    weight: float = Field(0.0, ge=0.0, le=1000.0)
    """Weight of the channel in the total loss; 0 disables it at no cost (alias:
    top-level ``alpha_sdpo``)."""
    hint_sources: list[Literal["feedback", "sibling", "model"]] = Field(
        default_factory=lambda: ["feedback", "sibling"]
    )
    """Where a failed completion's hint comes from, in order of preference."""
    teacher: Literal["live", "ema", "initial"] = "live"
    """Weights of the self-teacher: the current policy, an EMA of it, or the initial weights
    (with LoRA: the adapter disabled)."""
    ema_decay: float = Field(0.99, gt=0.0, lt=1.0)
    """EMA decay per optimizer step when ``teacher: ema``."""
    loss: SdpoLossConfig = Field(default_factory=JsdLossConfig)
    """Divergence between student and hinted teacher on the completion tokens, keyed on
    ``type`` (``jsd``, ``taid``, ``entropy_opd``), each with its own settings."""
    feedback_template: str = (
        "A previous attempt at this was wrong. Feedback on it: {feedback}. Answer correctly."
    )
    """Hint text from verifier feedback; ``{feedback}`` is filled in."""
    feedback_form: str = Field("verifier", min_length=1, max_length=64)
    """Which form of the verifier's feedback fills ``{feedback}``: ``verifier`` (its own
    message; arithmetic's contains the answer) or a form the environment offers in
    ``StepResult.info["feedback_forms"]`` (arithmetic: ``direction``, ``digits``, ``wrong``,
    which do not leak the answer). Measure which one the model can use with
    ``composer-replication hints uplift``."""
    route_failures: bool = False
    """SDPO's routing (Hübotter et al., arXiv:2601.20802): a failed rollout that got a hint
    leaves the policy loss (its GRPO advantage is set to 0) and is trained by this channel
    only; rollouts without a hint keep their advantages."""
    gate: Literal["none", "policy_signal"] = "none"
    """``policy_signal``: hint failures only in groups whose GRPO advantages are not all zero
    (their rewards differ), so the channel never steps alone. Adam's update does not depend on
    the gradient's scale: when every group's rewards are equal (the sparse regime before a
    first success) the channel is the only gradient and ``weight`` no longer limits its step
    (docs/results.md, regime (b)). ``none``: every failure can be hinted."""
    turn_scope: Literal["turn", "turn_and_rest", "all"] = "turn"
    """Multi-turn rollouts whose failure the environment pins to a turn (``failed_turn``):
    distill on that turn's tokens only (``turn``, Composer's targeted feedback), on that turn
    and every later one (``turn_and_rest``), or on the whole rollout (``all``). Tool-result
    tokens never count; single-turn rollouts are one turn."""
    contrast: Literal["none", "placebo"] = "none"
    """``placebo``: the teacher's logits are the student's plus ``contrast_scale`` times the
    difference between the hinted and a placebo-hinted teacher (the feedback template with the
    environment's content-free verdict, e.g. "the answer is wrong"). What any hint does to the
    model (at 135M: flatten it) cancels; what this hint says remains. Costs one more teacher
    forward per hinted row. ``none``: the hinted teacher itself (SDPO/OPSD)."""
    contrast_scale: float = Field(1.0, gt=0.0, le=16.0)
    """Scale ``g`` of the hint-minus-placebo logits when ``contrast: placebo``."""
    sibling_template: str = "Here is a correct answer to this, for reference:\n{sibling}"
    """Hint text from a successful sibling completion; ``{sibling}`` is filled in."""
    hint_model_url: str | None = None
    """OpenAI-compatible base_url of a hint model (source ``model``)."""
    hint_model_name: str | None = None
    """Model id at ``hint_model_url``."""

    @model_validator(mode="before")
    @classmethod
    def _legacy_fields(cls, data: Any) -> Any:
        return _legacy_loss(
            data,
            "sdpo",
            {"jsd_beta": "beta", "temperature": "temperature", "token_clip": "token_clip"},
        )

    @model_validator(mode="after")
    def _hint_model_named(self) -> SdpoConfig:
        if "model" in self.hint_sources and not (self.hint_model_url and self.hint_model_name):
            raise ValueError("hint_sources has 'model': set hint_model_url and hint_model_name")
        return self


class ReplayChannelConfig(_Strict):
    """Channel 3: preference loss on pairs from multi-teacher trace replay."""

    weight: float = Field(0.0, ge=0.0, le=1000.0)
    """Weight of the channel in the total loss; 0 disables it at no cost (alias:
    top-level ``beta_replay``)."""
    dataset: str | None = None
    """Preference data (JSONL or a directory from ``composer-replication pairs``) in TRL's
    conversational format: prompt messages, chosen, rejected."""
    loss: PreferenceLossConfig = Field(default_factory=DpoLossConfig)
    """Preference loss keyed on ``type``: ``dpo`` (reference log-probs computed once with the
    initial weights) or ``simpo`` (reference-free), each with its own beta."""
    pairs_per_step: int = Field(2, ge=1, le=4096)
    """Pairs drawn per optimizer step (split across its gradient-accumulation micro-batches)."""
    max_length: int = Field(512, ge=8)
    """Token limit of prompt + response (the prompt is truncated from the left)."""
    max_pairs: int = Field(4096, ge=1)
    """At most this many pairs are loaded (reference log-probs are precomputed for each)."""

    @model_validator(mode="before")
    @classmethod
    def _legacy_fields(cls, data: Any) -> Any:
        return _legacy_loss(data, "replay", {"beta": "beta", "gamma": "gamma"})

    @model_validator(mode="after")
    def _needs_data(self) -> ReplayChannelConfig:
        if self.weight > 0 and not self.dataset:
            raise ValueError("weight > 0 needs dataset (a preference JSONL or directory)")
        return self


CHANNEL_SECTIONS = ("sdpo", "replay")
"""Run-config sections that configure an extra loss channel (each has a ``weight``)."""
CHANNEL_ALIASES = {"alpha_sdpo": "sdpo", "beta_replay": "replay"}
"""Top-level weight aliases kept for old configs and commands: ``alpha_sdpo=0.1`` is
``sdpo.weight=0.1``."""


def _move_weight_aliases(data: Any) -> Any:
    """``alpha_sdpo``/``beta_replay`` at the top level -> ``sdpo.weight``/``replay.weight``."""
    if not isinstance(data, dict):
        return data
    data = dict(data)
    for alias, section in CHANNEL_ALIASES.items():
        if alias not in data:
            continue
        value = data.pop(alias)
        sec = data.get(section) or {}
        if not isinstance(sec, dict):
            continue  # the section's own validation reports it
        sec = dict(sec)
        if "weight" in sec and sec["weight"] != value:
            raise ValueError(
                f"{alias}={value} and {section}.weight={sec['weight']} disagree: set one"
            )
        sec["weight"] = value
        data[section] = sec
    return data


class RunConfig(_Strict):
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
    model: ModelConfig = Field(default_factory=ModelConfig)
    peft: PeftConfig = Field(default_factory=PeftConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
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
    diloco: DilocoConfig = Field(default_factory=DilocoConfig)
    """DiLoCo outer loop across replicas (off by default; see diloco/)."""

    @model_validator(mode="before")
    @classmethod
    def _weight_aliases(cls, data: Any) -> Any:
        return _move_weight_aliases(data)

    def channel_settings(self) -> dict[str, dict[str, Any]]:
        """Settings of every enabled channel (weight > 0), as plain data: what a checkpoint
        records and a resume compares."""
        return {
            name: getattr(self, name).model_dump(mode="json")
            for name in CHANNEL_SECTIONS
            if getattr(self, name).weight > 0
        }


class AblationArm(_Strict):
    name: str = Field(min_length=1)
    """Label of the arm in tables and plots."""
    overrides: list[str] = Field(default_factory=list)
    """``key=value`` overrides applied on top of the base config for this arm."""
    trainer: Literal["composer", "trl_sdpo"] = "composer"
    """``composer``: ComposerReplicationTrainer; ``trl_sdpo``: TRL's experimental SDPOTrainer
    (the peer), configured from the same run config."""


class AblationConfig(_Strict):
    """``composer-replication ablate``: arms x seeds on one base config, held-out eval curves."""

    base_config: str = "quickstart.yaml"
    """Run config every arm starts from (a path, or a file name under configs/)."""
    base_overrides: list[str] = Field(default_factory=list)
    """Overrides applied to every arm (e.g. a shorter max_steps)."""
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=1)
    """Seeds; every arm runs once per seed."""
    arms: list[AblationArm] = Field(min_length=1)
    """The arms to compare."""
    eval_every: int = Field(5, ge=1)
    """Held-out evaluation every N optimizer steps (for the score-vs-step curves)."""
    eval_n_during: int = Field(64, ge=1)
    """Held-out problems in the periodic evaluations (the final one uses eval.n)."""
    output_dir: str = "runs/ablation"
    """Where each arm/seed run directory, the summary JSON, ``results.md`` and the plot go."""
    results_md: str | None = None
    """Also (re)write the ablation section of this Markdown file and put the plot beside it
    (``results_md=docs/results.md`` updates the project's docs); None = only the run dir."""
    keep_checkpoints: bool = False
    """Keep each arm/seed's ``checkpoint-*`` (weights only, ~0.5 GB each for 135M); by default
    they are deleted once the arm's final evaluation is recorded."""
    section: str = Field("ablation", pattern=r"^[a-z0-9][a-z0-9-]*$")
    """Name of this experiment's section in ``results_md`` (between ``<!-- {section}:begin -->``
    and ``<!-- {section}:end -->``) and of its plot (``{section}_heldout_vs_step.png``), so
    several experiments share one results file."""
    title: str = "Ablation: what each channel does"
    """Heading of the section."""
    reference_arm: str | None = None
    """Arm the others are paired against per seed (default: the first arm)."""

    @model_validator(mode="after")
    def _reference_is_an_arm(self) -> AblationConfig:
        names = [a.name for a in self.arms]
        if len(set(names)) != len(names):
            raise ValueError(f"arm names must be unique: {names}")
        if self.reference_arm is not None and self.reference_arm not in names:
            raise ValueError(f"reference_arm {self.reference_arm!r} is not an arm: {names}")
        return self


DYNAMIC_SAMPLING_MULTIPROCESS = (
    "grpo.dynamic_sampling: not supported with several processes (each process would refill "
    "its own groups and desynchronize TRL's collective reward gathering); turn it off "
    "(grpo.dynamic_sampling.enabled=false) or run one process per DiLoCo replica"
)
"""Why DAPO dynamic sampling refuses a multi-process launch (checked before any model loads)."""


class ConfigError(ValueError):
    """A config file or override that does not validate; the message names the key."""


CHANNELS_FILE = "channels.json"
"""Written into every checkpoint: the enabled channels' settings (``RunConfig.channel_settings``)."""


class ChannelSettingsError(ConfigError):
    """Resuming a checkpoint whose channel settings differ from the config."""


def channel_setting_diffs(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """``section.key: checkpoint X, config Y`` for every channel setting that differs (a
    channel enabled on one side only is one line)."""
    out = []
    for name in sorted(set(saved) | set(current)):
        if name not in saved or name not in current:
            where = "config" if name in current else "checkpoint"
            out.append(f"{name}: enabled in the {where} only")
            continue
        out += [
            f"{name}.{key}: checkpoint {saved[name].get(key)!r}, config {current[name].get(key)!r}"
            for key in sorted(set(saved[name]) | set(current[name]))
            if saved[name].get(key) != current[name].get(key)
        ]
    return out


def nested_diffs(old: Any, new: Any, path: str = "") -> list[str]:
    """``a.b: X -> Y`` for every leaf where two nested dicts (config dumps) differ."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [
            line
            for key in sorted(set(old) | set(new), key=str)
            for line in nested_diffs(old.get(key), new.get(key), f"{path}.{key}" if path else str(key))
        ]  # fmt: skip
    return [] if old == new else [f"{path}: {old!r} -> {new!r}"]


def check_resume_channels(
    checkpoint_dir: str | Path, current: dict[str, Any], override: bool
) -> list[str]:
    """Compare the checkpoint's recorded channel settings with ``current``. Differences raise
    :class:`ChannelSettingsError` (naming each one) unless ``override``; they are returned
    either way so the caller can warn. A checkpoint without a record counts as no channels."""
    path = Path(checkpoint_dir) / CHANNELS_FILE
    try:
        saved = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError) as err:
        raise ChannelSettingsError(f"{path}: unreadable channel record: {err}") from None
    diffs = channel_setting_diffs(saved, current)
    if diffs and not override:
        raise ChannelSettingsError(
            f"resume: {checkpoint_dir} was trained with other channel settings:\n  "
            + "\n  ".join(diffs)
            + "\nset resume_override_channels=true to resume with this config's settings"
        )
    return diffs


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b=value`` -> (["a", "b"], value parsed as a YAML scalar)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not of the form key=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r} has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as err:
        problem = getattr(err, "problem", None) or type(err).__name__
        raise ConfigError(f"override {text!r}: the value is not valid YAML ({problem})") from None
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply dotted ``key=value`` overrides to a nested dict (a copy is returned)."""
    import copy

    out = copy.deepcopy(data)
    for text in overrides:
        path, value = parse_override(text)
        node = out
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {text!r}: {part!r} is not a section")
            node = child
        node[path[-1]] = value
    return out


def _format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"invalid config ({source}):"]
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(root)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key" + _did_you_mean(e["loc"])
        lines.append(f"  {key}: {msg}")
    return "\n".join(lines)


def _models_of(annotation: Any) -> Any:
    """The pydantic model of a field, or the list of models of a (discriminated) union."""
    import typing

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    found = []
    for arg in typing.get_args(annotation):
        sub = _models_of(arg)
        found.extend(sub if isinstance(sub, list) else [sub] if sub else [])
    return found


def _did_you_mean(loc: tuple) -> str:
    """``; did you mean 'x'?`` for an unknown key, from the section's field names."""
    import difflib

    model: Any = RunConfig
    for part in loc[:-1]:
        fields = getattr(model, "model_fields", {})
        if part in fields:
            model = _models_of(fields[part].annotation)
        else:  # a union's tag (`sdpo.loss.jsd.x`): the member whose `type` is that tag
            model = [m for m in model if m.model_fields["type"].default == part]
        if isinstance(model, list):
            model = model[0] if len(model) == 1 else model
        if not model:
            return ""
    if isinstance(model, list):
        return ""
    names = list(model.model_fields) + (list(CHANNEL_ALIASES) if model is RunConfig else [])
    close = difflib.get_close_matches(str(loc[-1]), names, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def load_yaml_mapping(path: str | Path, what: str = "config") -> dict[str, Any]:
    """The top-level mapping of a YAML file. Every config file of the project (run, ablation,
    teacher pool) is read here; a `ConfigError` names the file, and for a YAML syntax error the
    line and column. An empty file (or one with only comments) is an error: a run on all
    defaults from a truncated or mistyped file is never what was meant."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory, not a {what} file")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{what} file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot read the {what} file: {err}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(_yaml_error_message(path, err)) from None
    if data is None:
        raise ConfigError(f"{path}: the {what} file is empty (no key: value lines)")
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: top level must be a mapping (key: value lines), got {type(data).__name__}"
        )
    return data


def _yaml_error_message(path: Path, err: yaml.YAMLError) -> str:
    mark = getattr(err, "problem_mark", None)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
    problem = getattr(err, "problem", None) or str(err)
    context = getattr(err, "context", None)
    return f"{where}: not valid YAML: {problem}" + (f" ({context})" if context else "")


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Load a RunConfig from YAML (default: the shipped quickstart) plus overrides. ``path`` is
    a file, or the name of a shipped config (`resolve_config_path`)."""
    path = resolve_config_path(path) if path is not None else default_config_path()
    data = apply_overrides(load_yaml_mapping(path), overrides or [])
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_validation_error(err, str(path))) from None


def load_ablation_config(path: str | Path, overrides: list[str] | None = None) -> AblationConfig:
    """Load an AblationConfig from YAML plus ``key=value`` overrides."""
    path = resolve_config_path(path)
    data = apply_overrides(load_yaml_mapping(path, "ablation config"), overrides or [])
    try:
        return AblationConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_validation_error(err, str(path))) from None


def configs_dir() -> Path:
    """The shipped configs: package data (``composer_replication/configs``), so an installed
    wheel has them; a repository checkout sees the same directory as ``configs/``."""
    return Path(__file__).resolve().parent / "configs"


def resolve_config_path(name: str | Path) -> Path:
    """``name`` if it is a file, else the shipped config of that name: ``quickstart.yaml``,
    ``configs/quickstart.yaml`` and ``teachers/local.yaml`` all resolve from any directory."""
    p = Path(name)
    if p.is_file():
        return p
    if p.is_dir():
        raise ConfigError(f"{name}: is a directory, not a config file")
    shipped = Path(*p.parts[1:]) if len(p.parts) > 1 and p.parts[0] == "configs" else p
    candidate = configs_dir() / shipped
    if not p.is_absolute() and candidate.is_file():
        return candidate
    raise ConfigError(f"config file not found: {name} (nor under the shipped {configs_dir()})")


def default_config_path() -> Path:
    """The shipped ``quickstart.yaml``."""
    path = configs_dir() / DEFAULT_CONFIG
    if not path.is_file():
        raise ConfigError(f"the default config is missing from the package: {path}; pass --config")
    return path


def dump_config(cfg: RunConfig) -> str:
    """YAML text of a config (what a run writes next to its metrics)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
