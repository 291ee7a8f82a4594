"""The extra loss channels' sections (``sdpo``, ``replay``) with their loss unions keyed on
``type``, and the record of channel settings a checkpoint keeps and a resume compares.
Imports no torch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, model_validator

from composer_replication.config.base import ConfigError, StrictModel
from composer_replication.config.teachers import TeacherConfig, teacher_shorthand


class JsdLossConfig(StrictModel):
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


class TaidLossConfig(StrictModel):
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


class EntropyOpdLossConfig(StrictModel):
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


class DpoLossConfig(StrictModel):
    """DPO (Rafailov et al., 2023): needs reference log-probs, computed once with the initial
    weights."""

    type: Literal["dpo"] = "dpo"
    beta: float = Field(0.1, gt=0.0, le=100.0)
    """Inverse temperature of the implicit reward (the paper's beta)."""
    label_smoothing: float = Field(0.0, ge=0.0, lt=0.5)
    """Conservative DPO: assumed probability that a pair's label is flipped."""


class SimpoLossConfig(StrictModel):
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


class ChannelSection(StrictModel):
    """A loss channel's config section: it answers whether the channel is on."""

    weight: float

    @property
    def enabled(self) -> bool:
        """The one predicate that switches a channel on: ``weight > 0`` (a channel whose
        weight is 0 is never built and costs nothing)."""
        return self.weight > 0


class SdpoConfig(ChannelSection):
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


class ReplayChannelConfig(ChannelSection):
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
        if self.enabled and not self.dataset:
            raise ValueError("weight > 0 needs dataset (a preference JSONL or directory)")
        return self


class ReverseKlDistillLoss(StrictModel):
    """The sampled reverse KL of on-policy distillation (Thinking Machines; MOPD; GKD): the
    per-token advantage ``log q(y) - log p(y)`` in the importance-sampled policy gradient
    (losses/distill.py). Works with every teacher."""

    type: Literal["reverse_kl"] = "reverse_kl"
    full_vocabulary: ClassVar[bool] = False
    """Compares sampled tokens only: no teacher distribution is needed."""
    as_advantage: bool = False
    """Fold the per-token advantage into GRPO's instead of a loss term of its own: ``A_t =
    A_GRPO + distill.weight * (log q(y_t) - log p_old(y_t))``, trained by the clipped policy
    loss (OPD combined with RL through the advantage, as in Thinking Machines' tinker-cookbook
    on-policy distillation recipe). The channel's own term is then an exact 0; its metrics
    still report. Needs ``grpo.weight`` > 0."""


class JsdDistillLoss(StrictModel):
    """Generalized JSD between student and teacher distributions on the sampled positions:
    the full vocabulary for a local teacher (chunked fused kernel), the teacher's top-k with
    a tail bucket for a remote one (losses/distill.py)."""

    type: Literal["jsd"] = "jsd"
    as_advantage: ClassVar[bool] = False
    """The JSD always trains as a loss term of its own."""
    beta: float = Field(0.0, ge=0.0, le=1.0)
    """0 forward KL(q || p) (mode covering), 1 reverse KL(p || q), in between the JSD."""
    temperature: float = Field(1.0, gt=0.0, le=10.0)
    """Divides the student's logits (a local teacher's too; a remote teacher scores at T=1)."""
    top_k: int | None = Field(None, ge=1, le=1000)
    """A local teacher: None = the full vocabulary; k = its top-k with a tail, like a remote
    one. Remote teachers always use their ``top_k``."""
    add_tail: bool = True
    """Sparse support: add the tail bucket (else renormalise both over the top-k)."""

    @property
    def full_vocabulary(self) -> bool:
        """Whole distributions compared (a local teacher through its head): no ``top_k``."""
        return self.top_k is None


DistillLossConfig = Annotated[ReverseKlDistillLoss | JsdDistillLoss, Field(discriminator="type")]


class SingleRoute(StrictModel):
    """Every row to the one teacher."""

    type: Literal["single"] = "single"


class ColumnRoute(StrictModel):
    """A teacher per kind of task, read from a dataset column (MOPD's domain teachers): a row
    goes to the first teacher one of whose patterns matches the row's ``column`` value
    (shell-style wildcards, e.g. ``task_id`` ``L1:*``). A column the environment's rows lack is
    refused before any model loads (run/preflight.py). A row matching none is not scored and
    is counted in ``distill/unrouted_frac``."""

    type: Literal["column"] = "column"
    column: str = Field("task_id", min_length=1)
    """Dataset column read per row (``task_id`` always exists; a tool environment's rows add
    their own)."""
    match: dict[str, list[str]] = Field(min_length=1)
    """Teacher name -> patterns of ``column`` values it scores."""


class BestRoute(StrictModel):
    """The best of several teachers per sample: every teacher scores every row, and the row is
    distilled from the teacher that gives the student's own tokens the highest mean log-prob
    (the nearest teacher: the smallest sampled reverse KL ``log p - log q`` for this student),
    so the student is never pulled toward two teachers' conflicting modes at once. Costs one
    scoring per teacher per row."""

    type: Literal["best"] = "best"


RouteConfig = Annotated[SingleRoute | ColumnRoute | BestRoute, Field(discriminator="type")]


def _check_loss_keys(loss: dict[str, Any], defaulted: bool) -> None:
    """A key of the other loss type (``top_k`` under the default ``reverse_kl``) names the
    type it belongs to, rather than an unknown key under a type the user never wrote."""
    kinds = {"reverse_kl": ReverseKlDistillLoss, "jsd": JsdDistillLoss}
    mine = kinds.get(loss.get("type"))
    if mine is None:
        return  # an unknown type: the union reports it
    for key in loss:
        owner = next((k for k, c in kinds.items() if c is not mine and key in c.model_fields), None)
        if key not in mine.model_fields and owner is not None:
            default = " (the default when loss.type is not set)" if defaulted else ""
            raise ValueError(
                f"loss.{key} is a key of loss.type={owner}, not of {loss['type']}{default}: "
                f"set distill.loss.type={owner} to use it"
            )


class DistillConfig(ChannelSection):
    """The on-policy distillation channel (``distill``): stronger teachers score the student's
    own completion tokens and the student is pulled toward them (channels/distill.py)."""

    weight: float = Field(0.0, ge=0.0, le=1000.0)
    """Weight of the channel in the total loss; 0 disables it at no cost."""
    teachers: list[TeacherConfig] = Field(default_factory=list)
    """The teachers: ``{type: local, name, model, device, dtype}`` or ``{type: remote, name,
    base_url, model, top_k}``. Shorthand: a string (a model reference, or a URL for a remote
    teacher) or a list of them. They must use the student's tokenizer (checked before any model
    loads; cross-tokenizer distillation is not supported)."""
    loss: DistillLossConfig = Field(default_factory=ReverseKlDistillLoss)
    """``reverse_kl`` (sampled, OPD) or ``jsd`` (full vocabulary / top-k with a tail)."""
    route: RouteConfig = Field(default_factory=SingleRoute)
    """Which teacher scores which row: ``single``, ``column`` or ``best``."""
    budget_usd: float | None = Field(None, ge=0.0)
    """Stop calling priced remote teachers once this many dollars are spent; later rows are
    reported over budget (``distill/over_budget_frac``), never silently 0. None: no limit.
    With several processes each gets an equal share. Checkpoints carry what was spent."""
    max_scored_tokens: int | None = Field(None, ge=1)
    """Stop scoring once the teachers have scored this many tokens in all (local ones too);
    with several processes each gets an equal share."""

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        for key in ("loss", "route"):  # `distill.route=best`: the type alone
            if isinstance(data, dict) and isinstance(data.get(key), str):
                data = {**data, key: {"type": data[key]}}
        if isinstance(data, dict) and isinstance(data.get("loss"), dict):
            defaulted = "type" not in data["loss"]
            if defaulted:  # `distill.loss.x=...` alone: the default loss's x
                data = {**data, "loss": {"type": "reverse_kl", **data["loss"]}}
            _check_loss_keys(data["loss"], defaulted)
        if isinstance(data, dict) and isinstance(data.get("route"), dict):
            if "type" not in data["route"]:  # a route with `match` is a column route
                kind = "column" if "match" in data["route"] else "single"
                data = {**data, "route": {"type": kind, **data["route"]}}
        if not isinstance(data, dict) or "teachers" not in data:
            return data
        teachers = data["teachers"]
        teachers = [teachers] if isinstance(teachers, str | dict) else teachers
        if isinstance(teachers, list):
            data = {**data, "teachers": [teacher_shorthand(t, i, "distill.teachers")
                                          for i, t in enumerate(teachers)]}  # fmt: skip
        return data

    @property
    def full_vocabulary(self) -> bool:
        """The loss compares whole distributions (the JSD without ``top_k``): local teachers
        are scored through their heads, which must cover the tokenizer's ids."""
        return self.loss.full_vocabulary

    @model_validator(mode="after")
    def _check(self) -> DistillConfig:
        names = [t.name for t in self.teachers]
        if len(set(names)) != len(names):
            raise ValueError(f"teacher names must be unique: {names}")
        if slashed := [n for n in names if "/" in n]:
            raise ValueError(f"teacher names {slashed} hold '/' (metric keys carry the name)")
        if self.enabled and not self.teachers:
            raise ValueError("weight > 0 needs at least one teacher (distill.teachers)")
        route = self.route
        if isinstance(route, SingleRoute) and len(self.teachers) > 1:
            raise ValueError(
                f"{len(self.teachers)} teachers need a routing rule: route.type column or best"
            )
        if isinstance(route, BestRoute) and len(self.teachers) < 2:
            raise ValueError("route.type=best needs at least two teachers")
        if isinstance(route, ColumnRoute):
            unknown = sorted(set(route.match) - set(names))
            if unknown:
                raise ValueError(f"route.match names unknown teachers {unknown}; teachers: {names}")
        return self


CHANNEL_SECTIONS = ("sdpo", "replay", "distill")
"""Run-config sections that configure an extra loss channel (each has a ``weight``)."""
CHANNEL_ALIASES = {"alpha_sdpo": "sdpo", "beta_replay": "replay"}
"""Top-level weight aliases kept for old configs and commands: ``alpha_sdpo=0.1`` is
``sdpo.weight=0.1``."""


def move_weight_aliases(data: Any) -> Any:
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


def recorded_channels(checkpoint_dir: str | Path) -> dict[str, Any]:
    """The channel settings a checkpoint recorded (``CHANNELS_FILE``), by channel name; none
    recorded is ``{}``. An unreadable record raises :class:`ChannelSettingsError`."""
    path = Path(checkpoint_dir) / CHANNELS_FILE
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError) as err:
        raise ChannelSettingsError(f"{path}: unreadable channel record: {err}") from None


def normalized(recorded: dict[str, Any]) -> dict[str, Any]:
    """Recorded channel settings as this version of the config writes them: each section
    validated again by its model (old keys move to their new place, fields added since get
    their defaults), so a checkpoint written before a config change compares equal to the same
    settings written now. A section that no longer validates is kept as recorded (the
    comparison then names what differs)."""
    sections = {"sdpo": SdpoConfig, "replay": ReplayChannelConfig, "distill": DistillConfig}
    out = dict(recorded)
    for name, section in recorded.items():
        if name in sections and isinstance(section, dict):
            try:
                out[name] = sections[name].model_validate(section).model_dump(mode="json")
            except ValueError:
                continue
    return out


def check_resume_channels(
    checkpoint_dir: str | Path, current: dict[str, Any], override: bool
) -> list[str]:
    """Compare the checkpoint's recorded channel settings with ``current``. Differences raise
    :class:`ChannelSettingsError` (naming each one) unless ``override``; they are returned
    either way so the caller can warn. A checkpoint without a record counts as no channels."""
    diffs = channel_setting_diffs(normalized(recorded_channels(checkpoint_dir)), current)
    if diffs and not override:
        raise ChannelSettingsError(
            f"resume: {checkpoint_dir} was trained with other channel settings:\n  "
            + "\n  ".join(diffs)
            + "\nset resume_override_channels=true to resume with this config's settings"
        )
    return diffs
