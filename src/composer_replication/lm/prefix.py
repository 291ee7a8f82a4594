"""Forward passes that compute a shared prompt prefix once and reuse its KV cache.

Channel 2's teacher scores every failed rollout of a group with the same problem followed by a
per-row hint and the row's completion; channel 3 scores a chosen and a rejected answer after
the same prompt. The shared tokens are most of each row, so they are run once per group with
``use_cache=True``; the cache is then expanded to the rows (``index_select`` on the batch
dimension: differentiable, so channel 3's gradient still reaches the prompt's keys/values) and
only the per-row suffixes are run against it.

Position ids are passed explicitly (running count of real tokens), so padding between a
group's prefix and a row's suffix leaves no gap in the positions: the result equals one
unpadded forward of ``prefix + suffix`` per row up to float rounding
(``tests/unit/lm/test_prefix.py`` checks it against the plain padded forward).

Models whose caches are not plain full-attention KV lists (sliding-window layers, recurrent
states) take the plain padded forward instead: :func:`supports_prefix_cache`.

Gradient checkpointing (on by default in TRL's GRPOConfig) makes every decoder layer drop its
``past_key_values`` in training mode, which would silently run the suffixes without their
prefix. So :func:`forward_with_prefix` pauses the layers' checkpointing flags for its calls
(free under ``no_grad``, e.g. the SDPO teacher), and :func:`supports_prefix_cache` answers False
for a training-mode, checkpointing model when gradients are on (replay pairs), so those callers
keep the user's memory setting and take the padded forward.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from transformers import DynamicCache

from composer_replication.lm.models import backbone, capture_suspended


@dataclass
class PrefixBatch:
    """Rows split into group prefixes (left-padded) and per-row suffixes.

    A suffix is the rest of the row's prompt (left-padded, at least one token, so the last
    prompt position, which predicts the first answer token, is in it) followed by the row's
    tail (answer/completion tokens, right-padded, the same columns for every row).
    """

    prefix_ids: Tensor  # [G, P]
    prefix_mask: Tensor  # [G, P]
    row_group: Tensor  # [R] index into G
    suffix_ids: Tensor  # [R, S]
    suffix_mask: Tensor  # [R, S]


def common_prefix_len(seqs: list[list[int]]) -> int:
    """Length of the longest common prefix of token lists."""
    first = seqs[0]
    n = min(len(s) for s in seqs)
    for other in seqs[1:]:
        k = 0
        while k < n and other[k] == first[k]:
            k += 1
        n = k
    return n


def split_prefixes(
    prompts: list[list[int]],
    groups: list[int],
    tail_ids_RK: Tensor,
    tail_mask_RK: Tensor,
    pad_id: int,
) -> PrefixBatch:
    """Build a :class:`PrefixBatch` from unpadded prompts, a group label per row (rows of a
    group are expected to share a prompt prefix) and right-padded tails."""
    if len(prompts) != len(groups) or len(prompts) != tail_ids_RK.shape[0]:
        raise ValueError(
            f"{len(prompts)} prompts, {len(groups)} group labels, {tail_ids_RK.shape[0]} tails"
        )
    labels = sorted(set(groups))
    members = {g: [i for i, x in enumerate(groups) if x == g] for g in labels}
    cut = {}
    for g, rows in members.items():
        seqs = [prompts[i] for i in rows]
        if min(map(len, seqs)) < 1:
            raise ValueError("every prompt needs at least one token")
        cut[g] = min(common_prefix_len(seqs), min(map(len, seqs)) - 1)
    device = tail_ids_RK.device
    prefix_ids, prefix_mask = pad_rows(
        [prompts[members[g][0]][: cut[g]] for g in labels], pad_id, left=True
    )
    index = {g: k for k, g in enumerate(labels)}
    rests = [p[cut[g] :] for p, g in zip(prompts, groups, strict=True)]
    rest_ids, rest_mask = pad_rows(rests, pad_id, left=True)
    return PrefixBatch(
        prefix_ids=prefix_ids.to(device),
        prefix_mask=prefix_mask.to(device),
        row_group=torch.tensor([index[g] for g in groups], dtype=torch.long, device=device),
        suffix_ids=torch.cat([rest_ids.to(device), tail_ids_RK], dim=1),
        suffix_mask=torch.cat([rest_mask.to(device), tail_mask_RK.to(rest_mask.dtype)], dim=1),
    )


def pad_rows(seqs: list[list[int]], pad_id: int, left: bool) -> tuple[Tensor, Tensor]:
    """``[N, max_len]`` ids and 0/1 mask of token lists, padded on the left (prompts) or the
    right (answers, completions)."""
    width = max((len(s) for s in seqs), default=0)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            cols = slice(width - len(s), width) if left else slice(0, len(s))
            ids[i, cols] = torch.tensor(s, dtype=torch.long)
            mask[i, cols] = 1
    return ids, mask


def supports_prefix_cache(net, checkpointing_ok: bool = False) -> bool:
    """True for decoders with only full-attention layers whose forward takes explicit
    ``position_ids`` and ``past_key_values`` (Llama, Qwen2/3, Mistral without a window...).
    A model whose forward must see whole rows (e.g. a logit rule that reads the prompt) opts
    out with ``config.prefix_cache = False``. ``checkpointing_ok``: the caller checkpoints its
    own forwards (lm/packing.py), so a checkpointing model in training does not refuse."""
    cfg = getattr(net, "config", None)
    if cfg is None or getattr(cfg, "prefix_cache", True) is False:
        return False
    layer_types = getattr(cfg, "layer_types", None) or ["full_attention"]
    if any(t != "full_attention" for t in layer_types):
        return False
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):
        return False
    if not checkpointing_ok and torch.is_grad_enabled() and checkpointing_active(net):
        return False
    params = inspect.signature(net.forward).parameters
    return "position_ids" in params and cache_kwarg(net) in params


def use_prefix(net, shared_prefix: bool, checkpointing_ok: bool = False) -> bool:
    """Whether a forward runs shared prefixes once: the run's switch
    (``generation.shared_prefix``) and the model's support (``checkpointing_ok``: as in
    :func:`supports_prefix_cache`). The one decision the trainer, the channels and evaluation
    all ask."""
    return shared_prefix and supports_prefix_cache(net, checkpointing_ok)


def cache_kwarg(net) -> str:
    """The name ``net.forward`` takes its KV cache under: ``cache`` (transformers >= 5.24
    decoders) or ``past_key_values`` (earlier releases, most ``*ForCausalLM`` wrappers)."""
    params = inspect.signature(net.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def checkpointing_active(net) -> bool:
    """True if ``net`` is in training mode with gradient checkpointing on in some layer (then
    transformers drops ``past_key_values`` in every checkpointed layer)."""
    return net.training and any(getattr(m, "gradient_checkpointing", False) for m in net.modules())


@contextlib.contextmanager
def checkpointing_paused(*nets) -> Iterator[None]:
    """Turn the layers' gradient-checkpointing flags off for the block, then restore them."""
    flipped = [
        m for net in nets for m in net.modules() if getattr(m, "gradient_checkpointing", False)
    ]
    for m in flipped:
        m.gradient_checkpointing = False
    try:
        yield
    finally:
        for m in flipped:
            m.gradient_checkpointing = True


def forward_with_prefix(prefix_net, net, batch: PrefixBatch, **suffix_kwargs: Any) -> Any:
    """Run the group prefixes through ``prefix_net`` (the backbone: no LM head is needed for
    them) with a KV cache, expand the cache to the rows, and return ``net``'s output for the
    suffixes (``net`` is the backbone or the full causal LM sharing that backbone).

    Gradients flow through both calls unless the caller is under ``no_grad``. Gradient
    checkpointing is paused for both calls (module docstring).
    """
    with checkpointing_paused(prefix_net, net):
        return _forward_with_prefix(prefix_net, net, batch, **suffix_kwargs)


def _forward_with_prefix(prefix_net, net, batch: PrefixBatch, **suffix_kwargs: Any) -> Any:
    if batch.prefix_ids.shape[1] == 0:  # nothing shared: one plain forward of the suffixes
        pos = (batch.suffix_mask.cumsum(1) - 1).clamp(min=0)
        return net(
            input_ids=batch.suffix_ids,
            attention_mask=batch.suffix_mask,
            position_ids=pos,
            use_cache=False,
            **suffix_kwargs,
        )
    cache, prefix_mask_R = prefill(prefix_net, batch)
    n_prefix = prefix_mask_R.sum(1, keepdim=True)
    pos_suffix = n_prefix + (batch.suffix_mask.cumsum(1) - 1).clamp(min=0)
    return net(
        input_ids=batch.suffix_ids,
        attention_mask=torch.cat([prefix_mask_R, batch.suffix_mask], dim=1),
        position_ids=pos_suffix,
        use_cache=True,
        **{cache_kwarg(net): cache},
        **suffix_kwargs,
    )


def prefill(prefix_net, batch: PrefixBatch) -> tuple[DynamicCache, Tensor]:
    """Run the group prefixes through ``prefix_net`` (a backbone) into a KV cache and expand
    it to the rows; returns the cache and the rows' ``[R, P]`` prefix mask. The forward is
    not seen by :class:`~composer_replication.lm.models.HiddenCapture` (its states predict no
    completion token)."""
    cfg = getattr(prefix_net, "config", None)
    cache = DynamicCache(config=cfg) if cfg is not None else DynamicCache()
    pos_prefix = (batch.prefix_mask.cumsum(1) - 1).clamp(min=0)
    with capture_suspended():
        prefix_net(
            input_ids=batch.prefix_ids,
            attention_mask=batch.prefix_mask,
            position_ids=pos_prefix,
            use_cache=True,
            **{cache_kwarg(prefix_net): cache},
        )
    cache.batch_select_indices(batch.row_group)
    return cache, batch.prefix_mask.index_select(0, batch.row_group)


def prefix_groups(prompts: list[list[int]]) -> list[int]:
    """A group label per row for :func:`split_prefixes`, choosing the cheaper of two layouts by
    the number of tokens run: rows with the same prompt form a group (a GRPO group's
    generations), or all rows form one group around their common prefix (a system prompt, tool
    schemas and worked examples that every prompt repeats; later turns of tool rollouts, whose
    prompts hold different earlier completions)."""
    keys: dict[tuple[int, ...], int] = {}
    by_prompt = [keys.setdefault(tuple(p), len(keys)) for p in prompts]
    cost_by_prompt = sum(len(k) - 1 for k in keys) + len(prompts)
    shared = min(common_prefix_len(prompts), min(map(len, prompts)) - 1)
    cost_shared = shared + sum(len(p) - shared for p in prompts)
    return by_prompt if cost_by_prompt <= cost_shared else [0] * len(prompts)


def generate_with_prefix(
    model, prompts: list[list[int]], pad_id: int, shared_prefix: bool = True, **generate_kwargs: Any
):
    """``model.generate`` on unpadded ``prompts`` whose shared prefixes (:func:`prefix_groups`)
    are run once: the expanded cache is handed to ``generate``, which then runs only each row's
    rest. Returns the ``[B, N]`` new tokens (rows that stopped early are padded, as
    ``generate`` pads them). ``generate`` derives position ids from the attention mask, so
    the padding between a prefix and a row's rest leaves no gap in the positions; greedy
    output equals plain left-padded generation (``tests/unit/lm/test_prefix.py``).
    ``shared_prefix=False``: plain left-padded generation (:func:`use_prefix`)."""
    net = backbone(model)
    device = next(model.parameters()).device
    with torch.no_grad(), checkpointing_paused(net):
        batch = None
        if use_prefix(net, shared_prefix):
            empty = torch.zeros((len(prompts), 0), dtype=torch.long, device=device)
            batch = split_prefixes(prompts, prefix_groups(prompts), empty, empty, pad_id)
        if batch is None or batch.prefix_ids.shape[1] == 0:  # plain left-padded generation
            ids, mask = (t.to(device) for t in pad_rows(prompts, pad_id, left=True))
            out = model.generate(input_ids=ids, attention_mask=mask, **generate_kwargs)
            return out[:, ids.shape[1] :]
        cache, prefix_mask_R = prefill(net, batch)
        ids = torch.cat([batch.prefix_ids.index_select(0, batch.row_group), batch.suffix_ids], 1)
        mask = torch.cat([prefix_mask_R, batch.suffix_mask], dim=1)
        # use_cache=True whatever the model's generation config says (transformers' Trainer
        # turns it off in training): without it generate runs every row from its first token
        # on top of the prefix cache, i.e. the prefix twice, and the log-probs are wrong.
        out = model.generate(
            input_ids=ids, attention_mask=mask, **{cache_kwarg(model): cache},
            **(generate_kwargs | {"use_cache": True}),
        )  # fmt: skip
    return out[:, ids.shape[1] :]


def completion_logps_with_prefix(
    model, ids_BL: Tensor, mask_BL: Tensor, logits_to_keep: int, pad_id: int, entropy: bool
) -> tuple[Tensor, Tensor | None]:
    """TRL's per-token log-probs (and entropies) of the last ``logits_to_keep`` tokens of
    ``[prompt (left-padded) | completion (right-padded)]`` rows, through TRL's fused LM head
    (``model(..., labels=, fused_lm_head=True)``), with each shared prompt prefix
    (:func:`prefix_groups`) run once instead of once per row. Gradients reach the prefix's
    keys and values through the expanded cache."""
    k = logits_to_keep
    prompts = [
        row[m.bool()].tolist() for row, m in zip(ids_BL[:, :-k], mask_BL[:, :-k], strict=True)
    ]
    batch = split_prefixes(prompts, prefix_groups(prompts), ids_BL[:, -k:], mask_BL[:, -k:], pad_id)
    labels = batch.suffix_ids.masked_fill(batch.suffix_mask == 0, -100)
    labels[:, :-k] = -100
    out = forward_with_prefix(backbone(model), model, batch, labels=labels, fused_lm_head=True)
    logps = out.log_probs[:, -k:]
    return logps, out.entropy[:, -k:] if entropy else None
