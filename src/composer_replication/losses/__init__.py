"""Loss library: every Composer channel as a pure tensor function returning ``(loss, metrics)``.

* channel 1 (policy): :func:`prime_rl_policy_loss`, :func:`dapo_clip_loss` (TRL's GRPO loss is
  used as-is by the trainer; these serve engines with a loss hook, see ``recipes/``)
* self-distillation on sampled tokens only: :func:`sampled_reverse_kl_loss`
* channel 2 (self-distillation): :func:`generalized_jsd_loss`, its chunked fused-linear twin
  :func:`chunked_generalized_jsd_loss`, :func:`taid_loss` + :class:`TAIDScheduler`,
  :func:`entropy_aware_opd_loss`
* channel 3 (replay pairs): :func:`dpo_loss`, :func:`simpo_loss`, :func:`sequence_logps`
* the placebo-contrast teacher of channel 2: :func:`contrast_logits`,
  :func:`contrast_teacher_states`, :func:`contrast_weights`
* on-policy distillation from a stronger teacher (channel ``distill``): the sampled reverse KL
  above, the chunked JSD, and :func:`topk_distill_loss` over a teacher's top-k with a tail bucket
* :func:`self_distill_loss` / :func:`preference_loss` dispatch a channel's inputs to those;
  :func:`compose_loss` sums :class:`ChannelTerm` s (weight, loss, metrics) onto the policy loss.
"""

from .chunked import chunked_generalized_jsd_loss, default_chunk_size
from .compose import (
    ChannelTerm,
    ReplayInputs,
    SdpoInputs,
    compose_loss,
    preference_loss,
    self_distill_loss,
)
from .contrast import contrast_logits, contrast_teacher_states, contrast_weights
from .distill import (
    add_tail_bucket,
    gather_student_logps,
    sparse_divergence_per_token,
    topk_distill_loss,
)
from .entropy_opd import entropy_aware_opd_loss
from .jsd import generalized_jsd_loss
from .policy import prime_rl_policy_loss
from .preference import dpo_loss, sequence_logps, simpo_loss
from .sampled import (
    dapo_clip_loss,
    dapo_clip_per_token,
    sampled_reverse_kl_loss,
    sampled_reverse_kl_per_token,
)
from .taid import TAIDScheduler, taid_loss

__all__ = [
    "ChannelTerm",
    "add_tail_bucket",
    "gather_student_logps",
    "sparse_divergence_per_token",
    "topk_distill_loss",
    "ReplayInputs",
    "SdpoInputs",
    "TAIDScheduler",
    "chunked_generalized_jsd_loss",
    "compose_loss",
    "contrast_logits",
    "contrast_teacher_states",
    "contrast_weights",
    "dapo_clip_loss",
    "dapo_clip_per_token",
    "default_chunk_size",
    "dpo_loss",
    "entropy_aware_opd_loss",
    "generalized_jsd_loss",
    "preference_loss",
    "sampled_reverse_kl_loss",
    "sampled_reverse_kl_per_token",
    "prime_rl_policy_loss",
    "self_distill_loss",
    "sequence_logps",
    "simpo_loss",
    "taid_loss",
]
