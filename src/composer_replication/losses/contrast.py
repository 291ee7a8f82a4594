"""The placebo-contrast self-teacher of channel 2.

SDPO/OPSD distill the student toward the model shown a hint. At 135M every hint, a placebo
that says only "the answer is wrong" included, makes the model less sure of what it would
write (docs/results.md, step 1): part of the hinted teacher is the template's effect, not the
hint's. The contrast teacher keeps only the part that differs from a placebo in the same
template:

    z_teacher = z_student + g * (z_hinted - z_placebo)

with ``z`` the logits of the student (no hint), the hinted and the placebo-hinted contexts on
the same completion tokens, and ``g`` the scale. An uninformative hint (``z_hinted ==
z_placebo``) leaves the student as its own teacher: no signal. This is classifier-free
guidance of the hint against the placebo (Sanchez et al., "Stay on topic with
Classifier-Free Guidance", arXiv:2306.17806; contrastive decoding, Li et al., arXiv:2210.15097)
used as a distillation target; ``z_teacher - z_student`` is the logit-level advantage SDPO
reads into self-distillation (Hübotter et al., arXiv:2601.20802).
"""

from __future__ import annotations

import torch
from torch import Tensor


def contrast_weights(scale: float) -> tuple[float, float, float]:
    """The contrast teacher as a mixture of logits: ``(1, g, -g)`` on (student, hinted,
    placebo), as :func:`contrast_logits` computes it (``hints uplift`` mixes them this way)."""
    return 1.0, scale, -scale


def contrast_logits(
    student_logits_NV: Tensor, hinted_logits_NV: Tensor, placebo_logits_NV: Tensor, scale: float
) -> Tensor:
    """``z_s + g (z_h - z_p)``, detached: a target, never a path for gradients."""
    return (student_logits_NV + scale * (hinted_logits_NV - placebo_logits_NV)).detach()


def contrast_teacher_states(
    student_hidden_NH: Tensor,
    student_head_VH: Tensor,
    hinted_hidden_NH: Tensor,
    placebo_hidden_NH: Tensor,
    teacher_head_VH: Tensor,
    scale: float,
) -> tuple[Tensor, Tensor]:
    """Hidden states ``[N, 2H]`` and head ``[V, 2H]`` whose product is :func:`contrast_logits`
    of the three (the student's head and the teacher's may differ, e.g. an EMA teacher):
    ``[h_s, g (h_h - h_p)] @ [W_s, W_t]^T = h_s W_s^T + g (h_h W_t^T - h_p W_t^T)``. So the
    chunked fused-linear JSD takes the contrast teacher as it takes any teacher, without a
    ``[N, V]`` tensor."""
    hidden = torch.cat([student_hidden_NH, scale * (hinted_hidden_NH - placebo_hidden_NH)], -1)
    head = torch.cat([student_head_VH, teacher_head_VH], -1)
    return hidden.detach(), head.detach()
