"""Several context windows of one episode packed into one row (docs/summarization.md).

A summarized episode is trained as ONE row: window 0's prompt, then its completion, then each
later window's prompt and completion. A window was generated without the earlier windows in
its context, so it must be scored without them: positions restart at 0 at each window and
attention is block-diagonal. transformers (5.24, ``masking_utils``) builds exactly that mask
from ``position_ids`` alone: ``find_packed_sequence_indices`` starts a new sequence wherever
the position does not grow by 1, but only when the 2D ``attention_mask`` is None and there is
no cache. So the packed forward passes ``attention_mask=None``, ``use_cache=False`` and
positions in which every padding run (the prompt's left padding, the completion's right
padding) is a sequence of its own: no real token attends to padding, none to another window.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

LEFT_PAD, RIGHT_PAD = -1, -2
"""Run labels of padding (windows are labelled 0, 1, ...)."""


def packed_position_ids(
    prompt_mask_BP: Tensor, completion_mask_BK: Tensor, window_BK: Tensor
) -> Tensor:
    """``[B, P + K]`` positions of ``[prompt (left padded) | completion (right padded)]``
    rows whose completion tokens belong to windows ``window_BK`` (0 = the prompt's window):
    each run of one label (left padding, a window, right padding) counts from 0."""
    prompt_lab = torch.where(prompt_mask_BP.bool(), 0, LEFT_PAD)
    comp_lab = torch.where(completion_mask_BK.bool(), window_BK.long(), RIGHT_PAD)
    lab_BL = torch.cat([prompt_lab.long(), comp_lab], dim=1)
    idx_BL = torch.arange(lab_BL.shape[1], device=lab_BL.device).expand_as(lab_BL)
    new_BL = torch.ones_like(lab_BL, dtype=torch.bool)
    new_BL[:, 1:] = lab_BL[:, 1:] != lab_BL[:, :-1]
    start_BL = torch.where(new_BL, idx_BL, torch.zeros_like(idx_BL)).cummax(dim=1).values
    return idx_BL - start_BL


def packed_forward(model: Any, ids_BL: Tensor, position_ids_BL: Tensor, **kwargs: Any) -> Any:
    """``model`` on packed rows: block-diagonal attention from the positions (no 2D mask, no
    cache; module docstring). ``kwargs`` go to the model (labels, TRL's fused head)."""
    return model(input_ids=ids_BL, position_ids=position_ids_BL, attention_mask=None,
                 use_cache=False, **kwargs)  # fmt: skip


def pad_windows(windows: list[list[int]], length: int, device: Any = None) -> Tensor:
    """Per-row window indices, right padded with 0 to ``length`` (padding is labelled by the
    completion mask, not by this value)."""
    out = torch.zeros(len(windows), length, dtype=torch.long, device=device)
    for b, w in enumerate(windows):
        n = min(len(w), length)
        out[b, :n] = torch.tensor(w[:n], dtype=torch.long)
    return out
