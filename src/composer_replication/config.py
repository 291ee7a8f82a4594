"""Run configuration: pydantic models loaded from YAML, with ``key=value`` overrides.

One model per concern; unknown keys and out-of-range values are errors that name the key.
This module imports no torch (configs are parsed by the CLI before anything heavy loads).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

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


class EnvConfig(_Strict):
    name: Literal["arithmetic", "humaneval"] = "arithmetic"
    """Embedded verifiable task (see envs/)."""
    levels: list[int] = Field(default_factory=lambda: [1, 2])
    """Arithmetic difficulty levels mixed in the train and held-out splits (see envs/arithmetic.py)."""
    heldout_fraction: float = Field(0.2, gt=0.0, lt=1.0)
    """Fraction of problems reserved for the held-out split (disjoint from train)."""
    num_train: int = Field(2000, ge=1)
    """Number of training prompts drawn from the train split."""
    seed: int = 0
    """Seed for drawing problems (the split itself is a fixed hash, independent of seeds)."""

    @model_validator(mode="after")
    def _check_levels(self) -> EnvConfig:
        from composer_replication.envs.arithmetic import LEVELS

        bad = [lv for lv in self.levels if lv not in LEVELS]
        if bad or not self.levels:
            raise ValueError(f"env.levels: {bad or 'empty'} not in {sorted(LEVELS)}")
        return self


class SandboxConfig(_Strict):
    """Where and how model-written code runs (envs/sandbox.py, docs/sandbox.md)."""

    unsafe_run_without_isolation: bool = False
    """Run model-written code without bubblewrap (limits and an audit hook only); the code can
    then read this user's files and environment. Only for machines that cannot run bwrap."""
    workers: int = Field(0, ge=0, le=256)
    """Gradings run in parallel (0 = one per CPU core)."""
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
    max_processes: int = Field(32, ge=1, le=4096)
    """Processes and threads the code may have at once (RLIMIT_NPROC, per sandbox)."""
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


class EvalConfig(_Strict):
    n: int = Field(200, ge=1)
    """Held-out problems evaluated (the same problems for base and trained model)."""
    split: Literal["train", "heldout"] = "heldout"
    """Which split to evaluate on."""
    max_new_tokens: int = Field(16, ge=1)
    """Greedy decoding length for evaluation."""
    batch_size: int = Field(32, ge=1)
    """Prompts decoded together."""
    before_and_after: bool = True
    """Evaluate the base model before training and the trained model after, and print both."""


class SdpoConfig(_Strict):
    """Channel 2: hint-conditioned self-distillation (SDPO/OPSD)."""

    hint_sources: list[Literal["feedback", "sibling", "model"]] = Field(
        default_factory=lambda: ["feedback", "sibling"]
    )
    """Where a failed completion's hint comes from, in order of preference."""
    teacher: Literal["live", "ema", "initial"] = "live"
    """Weights of the self-teacher: the current policy, an EMA of it, or the initial weights
    (with LoRA: the adapter disabled)."""
    ema_decay: float = Field(0.99, gt=0.0, lt=1.0)
    """EMA decay per optimizer step when ``teacher: ema``."""
    loss: Literal["jsd", "taid", "entropy_opd"] = "jsd"
    """Divergence between student and hinted teacher on the completion tokens."""
    jsd_beta: float = Field(0.5, ge=0.0, le=1.0)
    """Generalized JSD interpolation (0 forward KL, 1 reverse KL)."""
    temperature: float = Field(1.0, gt=0.0)
    """Temperature applied to both distributions."""
    token_clip: float | None = Field(None, gt=0.0)
    """Optional per-vocabulary-element clip of the divergence (OPSD)."""
    feedback_template: str = (
        "A previous attempt at this was wrong. Feedback on it: {feedback}. Answer correctly."
    )
    """Hint text from verifier feedback; ``{feedback}`` is filled in."""
    sibling_template: str = "Here is a correct answer to this, for reference:\n{sibling}"
    """Hint text from a successful sibling completion; ``{sibling}`` is filled in."""
    hint_model_url: str | None = None
    """OpenAI-compatible base_url of a hint model (source ``model``)."""
    hint_model_name: str | None = None
    """Model id at ``hint_model_url``."""


class ReplayChannelConfig(_Strict):
    """Channel 3: preference loss on pairs from multi-teacher trace replay."""

    dataset: str | None = None
    """Preference data (JSONL or a directory from ``composer-replication pairs``) in TRL's
    conversational format: prompt messages, chosen, rejected."""
    loss: Literal["dpo", "simpo"] = "dpo"
    """DPO (needs reference log-probs, computed once with the initial weights) or SimPO."""
    beta: float = Field(0.1, gt=0.0)
    """DPO/SimPO inverse temperature."""
    gamma: float = Field(1.0, ge=0.0)
    """SimPO target reward margin."""
    pairs_per_step: int = Field(2, ge=1)
    """Pairs drawn per optimizer step."""
    max_length: int = Field(512, ge=8)
    """Token limit of prompt + response (the prompt is truncated from the left)."""
    max_pairs: int = Field(4096, ge=1)
    """At most this many pairs are loaded (reference log-probs are precomputed for each)."""


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
    num_threads: int = Field(0, ge=0)
    """torch CPU threads (0 = leave torch's default)."""
    alpha_sdpo: float = Field(0.0, ge=0.0)
    """Weight of channel 2 (hint-conditioned self-distillation); 0 disables it at no cost."""
    beta_replay: float = Field(0.0, ge=0.0)
    """Weight of channel 3 (preference loss on replayed-trace pairs); 0 disables it at no cost."""
    resume_from: str | None = None
    """Checkpoint directory to resume from, or ``latest`` for the newest in output_dir."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    peft: PeftConfig = Field(default_factory=PeftConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    """Isolation and limits for model-written code (code environments such as humaneval)."""
    generation: GenerationConfig = Field(default_factory=GenerationConfig)
    grpo: GRPOConfigModel = Field(default_factory=GRPOConfigModel)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    sdpo: SdpoConfig = Field(default_factory=SdpoConfig)
    replay: ReplayChannelConfig = Field(default_factory=ReplayChannelConfig)
    diloco: DilocoConfig = Field(default_factory=DilocoConfig)
    """DiLoCo outer loop across replicas (off by default; see diloco/)."""

    @model_validator(mode="after")
    def _channels_need_inputs(self) -> RunConfig:
        if self.beta_replay > 0 and not self.replay.dataset:
            raise ValueError("beta_replay > 0 needs replay.dataset (a preference JSONL/dir)")
        if "model" in self.sdpo.hint_sources and not (
            self.sdpo.hint_model_url and self.sdpo.hint_model_name
        ):
            raise ValueError("sdpo.hint_sources has 'model': set sdpo.hint_model_url and _name")
        return self


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
    """Where each arm/seed run directory, the summary JSON and the plot go."""
    results_md: str | None = "docs/results.md"
    """Markdown file whose ablation section is (re)written with the table; None = skip."""


class ConfigError(ValueError):
    """A config file or override that does not validate; the message names the key."""


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b=value`` -> (["a", "b"], value parsed as a YAML scalar)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not of the form key=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r} has an empty key")
    value = yaml.safe_load(raw) if raw.strip() else ""
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
        msg = "unknown key" if e["type"] == "extra_forbidden" else e["msg"]
        lines.append(f"  {key}: {msg}")
    return "\n".join(lines)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Load a RunConfig from YAML (default: the shipped quickstart) plus overrides."""
    path = Path(path) if path is not None else default_config_path()
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError as err:
        raise ConfigError(f"config file not found: {path}") from err
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from err
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    data = apply_overrides(data, overrides or [])
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_validation_error(err, str(path))) from None


def load_ablation_config(path: str | Path, overrides: list[str] | None = None) -> AblationConfig:
    """Load an AblationConfig from YAML plus ``key=value`` overrides."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError as err:
        raise ConfigError(f"config file not found: {path}") from err
    data = apply_overrides(data, overrides or [])
    try:
        return AblationConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_validation_error(err, str(path))) from None


def resolve_config_path(name: str) -> Path:
    """A config path as given, or the file of that name under the shipped configs/."""
    p = Path(name)
    if p.is_file():
        return p
    candidate = default_config_path().parent / name
    if candidate.is_file():
        return candidate
    raise ConfigError(f"config not found: {name}")


def default_config_path() -> Path:
    """The shipped ``configs/quickstart.yaml`` (repo checkout) or its packaged copy."""
    here = Path(__file__).resolve()
    for candidate in (
        here.parents[2] / "configs" / DEFAULT_CONFIG,
        here.parent / "configs" / DEFAULT_CONFIG,
    ):
        if candidate.is_file():
            return candidate
    raise ConfigError(f"cannot find the default config {DEFAULT_CONFIG}; pass --config")


def dump_config(cfg: RunConfig) -> str:
    """YAML text of a config (what a run writes next to its metrics)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
