"""Pure tensor pieces of the verl recipe (no verl import, so they are tested in the main env).

Group-relative advantages as our TRL trainer computes them (GRPO, Shao et al., arXiv:2402.03300,
Eq. 3; ``scale="none"`` is Dr. GRPO, Liu et al., arXiv:2503.20783). For rollout ``i`` of group
``g`` with sequence reward ``r_i``::

    A_i = (r_i - mean_g(r)) / (std_g(r) + eps)     scale = "group"  (unbiased std, as TRL and verl)
    A_i = (r_i - mean_g(r)) / (std_B(r) + eps)     scale = "batch"  (std over the whole batch)
    A_i =  r_i - mean_g(r)                          scale = "none"

Groups are given by ``index`` (any hashable per row, e.g. verl's ``uid``), not by position. A
group of one gets advantage 0 (nothing to compare with); verl's built-in ``grpo`` instead
passes its raw score through, which is the one place the two differ.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Literal

import torch
from torch import Tensor

Scale = Literal["group", "batch", "none"]


def group_advantages(
    scores_B: Tensor, index: Sequence[Hashable], scale: Scale = "group", eps: float = 1e-4
) -> Tensor:
    """Advantages ``[B]`` of the sequence rewards ``scores_B`` grouped by ``index`` (module
    docstring).

    Hand-worked: scores (1, 0, 0, 0) in one group: mean 0.25, unbiased std 0.5, so
    A = (0.75, -0.25, -0.25, -0.25) / (0.5 + eps) = (1.5, -0.5, -0.5, -0.5) at eps = 0.
    """
    if scores_B.dim() != 1 or len(index) != scores_B.shape[0]:
        raise ValueError(
            f"scores_B must be [B] with one index per row; got {tuple(scores_B.shape)} and "
            f"{len(index)} indices"
        )
    if scale not in ("group", "batch", "none"):
        raise ValueError(f"scale={scale!r}: expected 'group', 'batch' or 'none'")
    scores = scores_B.detach().double()
    labels: dict[Hashable, int] = {}
    gid_B = torch.tensor([labels.setdefault(k, len(labels)) for k in index], device=scores.device)
    n_G = torch.zeros(len(labels), dtype=scores.dtype, device=scores.device)
    n_G.index_add_(0, gid_B, torch.ones_like(scores))
    mean_G = torch.zeros_like(n_G).index_add_(0, gid_B, scores) / n_G
    centered_B = scores - mean_G[gid_B]
    single_B = n_G[gid_B] < 2
    if scale == "group":
        ss_G = torch.zeros_like(n_G).index_add_(0, gid_B, centered_B**2)
        std_G = (ss_G / (n_G - 1).clamp_min(1)).sqrt()
        centered_B = centered_B / (std_G[gid_B] + eps)
    elif scale == "batch" and scores.numel() > 1:
        centered_B = centered_B / (scores.std() + eps)
    return centered_B.masked_fill(single_B, 0.0).to(scores_B.dtype)
