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

from dataclasses import dataclass
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


@capture_suspended()
def packed_logps_with_prefix(
    model: Any,
    ids_BL: Tensor,
    mask_BL: Tensor,
    logits_to_keep: int,
    windows_BK: Tensor,
    entropy: bool,
    checkpoint: bool = False,
    chunk_tokens: int = 4096,
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
    every window and are scored once. Windows are run in chunks of alike lengths (little
    padding: activations are kept for the backward, so padding costs memory). Gradients reach
    the prefix through the cache, as in
    :func:`~composer_replication.lm.prefix.forward_with_prefix`. Its forwards are not seen by
    :class:`~composer_replication.lm.models.HiddenCapture` (their rows are windows, not the
    packed rows a channel expects): a caller that needs the hidden states packs instead.

    ``chunk_tokens`` caps a chunk's padded suffix tokens. ``checkpoint``: each chunk's forward
    runs under ``torch.utils.checkpoint`` (non-reentrant) and is recomputed in the backward, so
    only one chunk's activations live at a time; this is gradient checkpointing for this path
    (transformers' per-layer checkpointing would drop the prefix's cache in training mode)."""
    k = logits_to_keep
    windows = window_sequences(mask_BL, k, windows_BK)
    rows = ids_BL.tolist()
    seqs = [[rows[b][c] for c in cols] for b, cols in windows]
    shared = min(common_prefix_len(seqs), min(map(len, seqs)) - 1)
    if shared < 2:
        return None
    n = shared - 1  # cached positions: each suffix starts with the last shared token
    first = ids_BL.shape[1] - k  # the first completion column
    parts = _head_scores(model, seqs, windows, n, first, entropy, ids_BL.device)
    scored = [[bool(m) and c >= first for c, m in enumerate(r)] for r in mask_BL.tolist()]
    parts += _suffix_scores(model, rows, scored, seqs, windows, n, entropy, checkpoint,
                            chunk_tokens, ids_BL.device)  # fmt: skip
    logps_BK = ids_BL.new_zeros(ids_BL.shape[0], k, dtype=torch.float32)
    ent_BK = torch.zeros_like(logps_BK) if entropy else None
    for part in parts:
        index = (torch.tensor(part.rows, device=ids_BL.device),
                 torch.tensor(part.cols, device=ids_BL.device) - first)  # fmt: skip
        logps_BK = logps_BK.index_put(index, part.logps.float())
        if ent_BK is not None:
            ent_BK = ent_BK.index_put(index, part.entropy.float())
    return logps_BK, ent_BK


@dataclass
class _Scored:
    """Log-probs (and entropies) of some tokens, with the row and column each one scores."""

    rows: list[int]
    cols: list[int]
    logps: Tensor
    entropy: Tensor | None


def _head_scores(model, seqs, windows, n: int, first: int, entropy: bool, device) -> list[_Scored]:
    """The shared prefix's positions ``0 .. n-1`` predict tokens ``1 .. n`` of every window:
    one forward scores them for the windows where those tokens are completion tokens (the
    windows after a summary, whose prompt is in the completion)."""
    scored = [(w, t) for w, (_, cols) in enumerate(windows) for t in range(n)
              if cols[t + 1] >= first]  # fmt: skip
    if not scored:
        return []
    out = model(input_ids=torch.tensor([seqs[0][:n]], device=device),
                shift_labels=torch.tensor([seqs[0][1 : n + 1]], device=device),
                fused_lm_head=True)  # fmt: skip
    ts = [t for _, t in scored]
    return [_Scored(rows=[windows[w][0] for w, _ in scored],
                    cols=[windows[w][1][t + 1] for w, t in scored],
                    logps=out.log_probs[0, ts],
                    entropy=out.entropy[0, ts] if entropy else None)]  # fmt: skip


def _suffix_scores(
    model, rows, scored, seqs, windows, n: int, entropy: bool, checkpoint: bool,
    chunk_tokens: int, device,
) -> list[_Scored]:  # fmt: skip
    """Each window's suffix (after the ``n`` cached prefix tokens) against the prefix's cache,
    in chunks of alike lengths (:func:`length_chunks`); each position scores the row's next
    token when that one is scored (``scored[b][c]``: a real completion token; the next
    window's first token after a window's last)."""
    prefix_ids = torch.tensor([seqs[0][:n]], device=device)
    parts = []

    def run(suffix_ids: Tensor, suffix_mask: Tensor, label_ids: Tensor):
        batch = PrefixBatch(
            prefix_ids=prefix_ids, prefix_mask=torch.ones_like(prefix_ids),
            row_group=torch.zeros(suffix_ids.shape[0], dtype=torch.long, device=device),
            suffix_ids=suffix_ids, suffix_mask=suffix_mask,
        )  # fmt: skip
        out = forward_with_prefix(backbone(model), model, batch, shift_labels=label_ids,
                                  fused_lm_head=True)  # fmt: skip
        return out.log_probs, out.entropy if entropy else None

    for members in length_chunks([len(s) - n for s in seqs], max_tokens=chunk_tokens):
        labels = [
            _next_tokens(rows[b], scored[b], cols[n:]) for b, cols in (windows[w] for w in members)
        ]
        suffix_ids, suffix_mask = pad_rows([seqs[w][n:] for w in members], 0, left=False)
        label_ids, _ = pad_rows(labels, -100, left=False)
        tensors = (suffix_ids.to(device), suffix_mask.to(device), label_ids.to(device))
        if checkpoint:  # this chunk's activations are recomputed in the backward, not kept
            lp, ent = torch.utils.checkpoint.checkpoint(run, *tensors, use_reentrant=False)
        else:
            lp, ent = run(*tensors)
        for r, w in enumerate(members):
            hits = [i for i, lab in enumerate(labels[r]) if lab != -100]
            if hits:
                b, cols = windows[w]
                parts.append(_Scored(rows=[b] * len(hits), cols=[cols[n + i] + 1 for i in hits],
                                     logps=lp[r, hits],
                                     entropy=ent[r, hits] if entropy else None))  # fmt: skip
    return parts


def _next_tokens(row: list[int], scored: list[bool], cols: list[int]) -> list[int]:
    """At each of ``cols``, the row's next token when it is scored, else -100 (TRL's
    pre-shifted labels)."""
    return [row[c + 1] if c + 1 < len(row) and scored[c + 1] else -100 for c in cols]


def length_chunks(
    lengths: list[int], ratio: float = 0.75, max_tokens: int | None = None
) -> list[list[int]]:
    """Indices of ``lengths`` in chunks, longest first, each chunk's lengths at least ``ratio``
    of its longest, so a chunk right-padded to its longest is at least ``ratio`` real tokens;
    with ``max_tokens``, a chunk's rows times its longest stays within it (a longer row alone
    is a chunk of its own)."""
    chunks: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda j: -lengths[j]):
        if chunks:
            top = lengths[chunks[-1][0]]
            room = max_tokens is None or (len(chunks[-1]) + 1) * top <= max_tokens
            if room and lengths[i] >= ratio * top:
                chunks[-1].append(i)
                continue
        chunks.append([i])
    return chunks
