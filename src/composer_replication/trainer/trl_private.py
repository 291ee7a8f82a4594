"""Every private member of TRL's ``GRPOTrainer`` (and of transformers' ``Trainer`` under it)
that the adapter to TRL (this folder, and rollout.py's ``ToolLoop``, which runs TRL's tool loop
outside a trainer for the Ray workers) overrides, calls or reads, in one table.

Nowhere else in the package touches a private member of another object
(tests/unit/test_private_access.py reads the source and fails on one). TRL does not promise
these members from one release to the next, so each is recorded here with the parameters it
has in the TRL we run (trl 1.16, transformers 5.2x): tests/unit/trainer/test_trl_private.py
compares them with the installed TRL, and a release that renames or reshapes one fails there,
naming the member, instead of deep inside a training run.
"""

from __future__ import annotations

import importlib
import inspect
import re
from dataclasses import dataclass

__all__ = ["TRL_PRIVATE", "PrivateMember", "drift"]


@dataclass(frozen=True)
class PrivateMember:
    """One private member of a third-party class that the adapter relies on."""

    owner: str
    """The class, as ``module:QualName`` (where the member is looked up)."""
    name: str
    params: tuple[str, ...] | None
    """A method's parameter names (``self`` first) as the installed release has them; None
    for a data attribute (then the owner's source must assign it)."""
    use: str
    """What the adapter does with it (the code that breaks when it changes)."""


GRPO = "trl:GRPOTrainer"
_SELF_LOGPS = ("self", "model", "input_ids", "attention_mask", "logits_to_keep", "batch_size",
               "compute_entropy", "compute_aux_loss", "pixel_values", "image_grid_thw",
               "num_images", "pixel_attention_mask", "spatial_shapes", "num_tiles",
               "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids")  # fmt: skip

TRL_PRIVATE: tuple[PrivateMember, ...] = (
    PrivateMember(
        GRPO,
        "_compute_loss",
        ("self", "model", "inputs"),
        "overridden: the channels' terms are summed onto TRL's policy loss",
    ),
    PrivateMember(
        GRPO,
        "_generate_single_turn",
        ("self", "prompt_ids", "images", "multimodal_fields", "num_generations", "has_tool_images"),
        "overridden: generation through the trainer's one Generator",
    ),
    PrivateMember(
        GRPO,
        "_tool_call_loop",
        (
            "self",
            "prompts",
            "prompt_ids",
            "completion_ids",
            "completions",
            "logprobs",
            "images",
            "multimodal_fields",
        ),
        "overridden: a turn's tool calls run at once (rollout.TurnCalls); called unbound by "
        "rollout.ToolLoop (the Ray worker's tool loop, outside a trainer)",
    ),
    PrivateMember(
        GRPO,
        "_get_tool_suffix_ids",
        ("self", "tool_messages"),
        "called unbound by rollout.ToolLoop: the tokens of tool results between turns",
    ),
    PrivateMember(
        GRPO,
        "_get_per_token_logps_and_entropies",
        _SELF_LOGPS,
        "overridden: shared prompt prefixes run once (lm/prefix.py)",
    ),
    PrivateMember(
        GRPO,
        "_generate_and_score_completions",
        ("self", "inputs"),
        "overridden: dynamic sampling, task sampler, channel attach",
    ),
    PrivateMember(
        GRPO,
        "_calculate_rewards",
        ("self", "inputs", "prompts", "completions", "completion_ids_list"),
        "overridden: the task sampler's updates from the verdicts",
    ),
    PrivateMember(
        GRPO,
        "_save_checkpoint",
        ("self", "model", "trial"),
        "overridden: the channels' state is saved with the checkpoint",
    ),
    PrivateMember(
        GRPO, "_get_output_dir", ("self", "trial"), "called: where the checkpoint being saved goes"
    ),
    PrivateMember(
        GRPO,
        "_load_from_checkpoint",
        ("self", "resume_from_checkpoint", "model"),
        "called by load_checkpoint: a finished run's weights without training",
    ),
    PrivateMember(GRPO, "_metrics", None, "appended to by log_metric (TRL's logged means)"),
    PrivateMember(GRPO, "_multi_environment", None, "read: which environment serves a row"),
    PrivateMember(GRPO, "_environment_pool", None, "read: the instances TRL will reset"),
    PrivateMember(GRPO, "_sync_tool_dicts", None, "swapped for the concurrent tool calls"),
    PrivateMember(GRPO, "_dist", None, "read: full parameters summoned for generation"),
    PrivateMember(GRPO, "_last_loaded_step", None, "set: the Ray source synced the weights"),
    PrivateMember(GRPO, "_async_tool_dicts", None, "set by rollout.ToolLoop: no async tools"),
    PrivateMember(GRPO, "_is_vlm", None, "set by rollout.ToolLoop: text only"),
    PrivateMember(
        GRPO, "_tokenizer", None, "set by rollout.ToolLoop: what TRL's loop encodes with"
    ),
)
"""The members, each with its recorded parameters (module docstring)."""

NAMES = frozenset(m.name for m in TRL_PRIVATE)


def owner_class(member: PrivateMember) -> type:
    """The class ``member.owner`` names (imported)."""
    module, _, qualname = member.owner.partition(":")
    obj: object = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    assert isinstance(obj, type)
    return obj


def drift(member: PrivateMember) -> str:
    """How the installed release differs from the recorded ``member`` ('' if it does not):
    a method gone or with other parameters, an attribute its class no longer assigns."""
    cls = owner_class(member)
    if member.params is not None:
        fn = getattr(cls, member.name, None)
        if not callable(fn):
            return f"{member.owner}.{member.name} is no longer a method"
        have = tuple(inspect.signature(fn).parameters)
        if have != member.params:
            return f"{member.owner}.{member.name} takes {have}, recorded {member.params}"
        return ""
    assigned = re.compile(rf"self\.{re.escape(member.name)}\s*(:[^=\n]*)?=[^=]")
    for klass in cls.__mro__:
        try:
            if assigned.search(inspect.getsource(klass)):
                return ""
        except (OSError, TypeError):
            continue
    return f"{member.owner} no longer assigns self.{member.name}"
