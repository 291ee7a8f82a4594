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

from composer_replication.lm.models import backbone, capture_suspended
from composer_replication.lm.prefix import (
    PrefixBatch,
    common_prefix_len,
    forward_with_prefix,
    pad_rows,
)

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


def window_sequences(
    mask_BL: Tensor, logits_to_keep: int, windows_BK: Tensor
) -> list[tuple[int, list[int]]]:
    """Each window of each packed row as ``(row, columns)``: the row's columns holding the
    window's tokens in order (window 0: the prompt's real tokens, then its completion
    tokens). Every real token of a row is in exactly one window."""
    k, n_prompt = logits_to_keep, mask_BL.shape[1] - logits_to_keep
    out = []
    for b in range(mask_BL.shape[0]):
        real = mask_BL[b].bool().tolist()
        labels = windows_BK[b].tolist()
        by_window: dict[int, list[int]] = {0: [c for c in range(n_prompt) if real[c]]}
        for j in range(k):
            if real[n_prompt + j]:
                by_window.setdefault(int(labels[j]), []).append(n_prompt + j)
        out += [(b, cols) for _, cols in sorted(by_window.items()) if cols]
    return out


def packed_logps_with_prefix(
    model: Any,
    ids_BL: Tensor,
    mask_BL: Tensor,
    logits_to_keep: int,
    windows_BK: Tensor,
    entropy: bool,
) -> tuple[Tensor, Tensor | None] | None:
    """The packed rows' per-token log-probs (and entropies) of their last ``logits_to_keep``
    tokens, equal to :func:`packed_forward`'s (each window sees only itself), with the prefix
    that every window of the batch starts with (the system prompt, tool schemas, worked
    examples: every window after a summary repeats them) run once instead of once per window.
    Returns None when the windows share fewer than 2 tokens (the caller packs instead).

    A token's log-prob comes from the position before it in the row: inside its window, or,
    for a window's first token, the last position of the window before (as in the packed
    forward, whose logits there see only that earlier window). So each window is run as
    ``prefix (cached) + suffix`` with TRL's fused head scoring pre-shifted labels: at each
    suffix position the row's next token (the next window's first token after a window's
    last), -100 outside the completion. The prefix's own positions predict the same tokens in
    every window and are scored once. Windows are run in chunks of equal window index (their
    lengths are alike: less padding). Gradients reach the prefix through the cache, as in
    :func:`~composer_replication.lm.prefix.forward_with_prefix`. Its forwards are not seen by
    :class:`~composer_replication.lm.models.HiddenCapture` (their rows are windows, not the
    packed rows a channel expects): a caller that needs the hidden states packs instead."""
    with capture_suspended():
        return _packed_logps_with_prefix(model, ids_BL, mask_BL, logits_to_keep, windows_BK,
                                         entropy)  # fmt: skip


def _packed_logps_with_prefix(
    model: Any,
    ids_BL: Tensor,
    mask_BL: Tensor,
    logits_to_keep: int,
    windows_BK: Tensor,
    entropy: bool,
) -> tuple[Tensor, Tensor | None] | None:
    k = logits_to_keep
    first_scored = ids_BL.shape[1] - k
    windows = window_sequences(mask_BL, k, windows_BK)
    rows = ids_BL.tolist()
    seqs = [[rows[b][c] for c in cols] for b, cols in windows]
    shared = min(common_prefix_len(seqs), min(map(len, seqs)) - 1)
    if shared < 2:
        return None
    n = shared - 1  # cached positions: the suffix starts with the last shared token

    def next_label(b: int, col: int) -> int:
        nxt = col + 1
        ok = nxt < ids_BL.shape[1] and nxt >= first_scored and bool(mask_BL[b, nxt])
        return rows[b][nxt] if ok else -100

    logps_BK = ids_BL.new_zeros(ids_BL.shape[0], k, dtype=torch.float32)
    ent_BK = torch.zeros_like(logps_BK) if entropy else None
    device = ids_BL.device
    # the prefix's own positions 0 .. n-1 predict tokens 1 .. n of every window
    head_ids = torch.tensor([seqs[0][:n]], device=device)
    head_labels = torch.tensor([seqs[0][1 : n + 1]], device=device)
    head_cols = [[cols[t + 1] for t in range(n)] for _, cols in windows]
    scored_head = [(w, t) for w, hc in enumerate(head_cols) for t in range(n)
                   if hc[t] >= first_scored]  # fmt: skip
    parts: list[tuple[list[int], list[int], Tensor, Tensor | None]] = []
    if scored_head:
        out = model(input_ids=head_ids, shift_labels=head_labels, fused_lm_head=True)
        ws, ts = zip(*scored_head, strict=True)
        parts.append((
            [windows[w][0] for w in ws],
            [head_cols[w][t] - first_scored for w, t in zip(ws, ts, strict=True)],
            out.log_probs[0, list(ts)],
            out.entropy[0, list(ts)] if entropy else None,
        ))  # fmt: skip
    prefix_ids = head_ids
    chunks: dict[int, list[int]] = {}
    for w, (b, _) in enumerate(windows):
        index = sum(1 for b2, _ in windows[:w] if b2 == b)
        chunks.setdefault(index, []).append(w)
    for members in chunks.values():
        suffixes = [seqs[w][n:] for w in members]
        labels = [[next_label(windows[w][0], c) for c in windows[w][1][n:]] for w in members]
        suffix_ids, suffix_mask = pad_rows(suffixes, 0, left=False)
        label_ids, _ = pad_rows(labels, -100, left=False)
        batch = PrefixBatch(
            prefix_ids=prefix_ids, prefix_mask=torch.ones_like(prefix_ids),
            row_group=torch.zeros(len(members), dtype=torch.long, device=device),
            suffix_ids=suffix_ids.to(device), suffix_mask=suffix_mask.to(device),
        )  # fmt: skip
        out = forward_with_prefix(backbone(model), model, batch,
                                  shift_labels=label_ids.to(device), fused_lm_head=True)  # fmt: skip
        for r, w in enumerate(members):
            b, cols = windows[w]
            hits = [i for i, lab in enumerate(labels[r]) if lab != -100]
            if hits:
                parts.append((
                    [b] * len(hits),
                    [cols[n + i] + 1 - first_scored for i in hits],
                    out.log_probs[r, hits],
                    out.entropy[r, hits] if entropy else None,
                ))  # fmt: skip
    for bs, js, lp, ent in parts:
        index = (torch.tensor(bs, device=device), torch.tensor(js, device=device))
        logps_BK = logps_BK.index_put(index, lp.float())
        if ent_BK is not None:
            ent_BK = ent_BK.index_put(index, ent.float())
    return logps_BK, ent_BK
