"""``ComposerReplicationTrainer``: TRL's ``GRPOTrainer`` with the hooks the three channels need.

Channel 1 is TRL's GRPO loss, unchanged (its loss types, clip-higher ``epsilon_high``, token-level
aggregation, truncated-completion masking). This subclass adds:

* ``_compute_loss`` as the single place channels compose. With ``alpha_sdpo == beta_replay == 0``
  it returns exactly what ``GRPOTrainer._compute_loss`` returns (same tensor, same graph), so
  loss and gradients are bit-identical to plain GRPO.
* DAPO dynamic sampling (Yu et al., "DAPO: An Open-Source LLM Reinforcement Learning System at
  Scale", 2025, sec. 3.2), which TRL lacks: groups whose rewards all tie carry no advantage, so
  they are replaced by groups generated from fresh prompts, up to ``max_refills`` extra rounds.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from trl import GRPOTrainer

# tensors of a generation batch padded on the left (prompts) or the right (completions)
_LEFT_PADDED = ("prompt_ids", "prompt_mask")
_RIGHT_PADDED = (
    "completion_ids",
    "completion_mask",
    "old_per_token_logps",
    "ref_per_token_logps",
    "sampling_per_token_logps",
    "tool_mask",
    "importance_sampling_ratio",
)


class ComposerReplicationTrainer(GRPOTrainer):
    """GRPO trainer whose loss is the sum of the composer channels.

    Extra keyword arguments (all optional):
        alpha_sdpo, beta_replay: channel weights; only 0 is accepted until the channels land.
        dynamic_sampling: enable DAPO dynamic sampling.
        max_refills: extra generation rounds per step for dynamic sampling.
    """

    def __init__(
        self,
        *args: Any,
        alpha_sdpo: float = 0.0,
        beta_replay: float = 0.0,
        dynamic_sampling: bool = False,
        max_refills: int = 2,
        **kwargs: Any,
    ):
        if alpha_sdpo != 0.0 or beta_replay != 0.0:
            raise NotImplementedError(
                "channels 2 (alpha_sdpo) and 3 (beta_replay) are not wired in yet; use 0"
            )
        super().__init__(*args, **kwargs)
        if dynamic_sampling and self.accelerator.num_processes > 1:
            raise NotImplementedError(
                "dynamic sampling refills per process; multi-process runs would desynchronize "
                "TRL's collective reward gathering. Use it with one process per replica."
            )
        self.alpha_sdpo = alpha_sdpo
        self.beta_replay = beta_replay
        self.dynamic_sampling = dynamic_sampling
        self.max_refills = max_refills
        self._refill_rows: Iterator[dict[str, Any]] | None = None

    # ---- channel composition -------------------------------------------------------------
    def _compute_loss(self, model, inputs):
        policy_loss = super()._compute_loss(model, inputs)
        return policy_loss

    # ---- DAPO dynamic sampling -----------------------------------------------------------
    def _generate_and_score_completions(self, inputs):
        batch = super()._generate_and_score_completions(inputs)
        if not self.dynamic_sampling or not self.model.training:
            return batch
        g = self.num_generations
        n_groups = batch["advantages"].shape[0] // g
        kept = [batch]
        keep_idx = [informative_groups(batch["advantages"], g)]
        refills = 0
        while sum(len(k) for k in keep_idx) < n_groups and refills < self.max_refills:
            fresh = super()._generate_and_score_completions(self._next_refill_inputs(n_groups))
            kept.append(fresh)
            keep_idx.append(informative_groups(fresh["advantages"], g))
            refills += 1
        n_informative = sum(len(k) for k in keep_idx)
        self._metrics["train"]["dynamic_sampling/refills"].append(float(refills))
        self._metrics["train"]["dynamic_sampling/informative_frac"].append(
            min(n_informative, n_groups) / n_groups
        )
        if refills == 0:
            return batch
        # fill the batch with informative groups first, then (if still short) the original ties
        picks: list[tuple[int, int]] = [(b, gi) for b, idx in enumerate(keep_idx) for gi in idx]
        if len(picks) < n_groups:
            ties = [gi for gi in range(n_groups) if gi not in set(keep_idx[0])]
            picks += [(0, gi) for gi in ties[: n_groups - len(picks)]]
        return merge_groups(kept, picks[:n_groups], g)

    def _next_refill_inputs(self, n_groups: int) -> list[dict[str, Any]]:
        if self._refill_rows is None:
            self._refill_rows = _cycle_shuffled(self.train_dataset, seed=self.args.seed + 1)
        rows = [next(self._refill_rows) for _ in range(n_groups)]
        return [row for row in rows for _ in range(self.num_generations)]


def informative_groups(advantages_B: torch.Tensor, group_size: int, tol: float = 1e-6) -> list[int]:
    """Indices of groups whose advantages are not all (numerically) zero."""
    adv_GN = advantages_B.view(-1, group_size)
    return torch.nonzero(adv_GN.abs().amax(dim=1) > tol).flatten().tolist()


def _cycle_shuffled(dataset, seed: int) -> Iterator[dict[str, Any]]:
    epoch = 0
    while True:
        yield from dataset.shuffle(seed=seed + epoch)
        epoch += 1


def _pad_to(t: torch.Tensor, length: int, left: bool, value: float) -> torch.Tensor:
    pad = length - t.shape[1]
    if pad <= 0:
        return t
    filler = torch.full((t.shape[0], pad), value, dtype=t.dtype, device=t.device)
    return torch.cat([filler, t] if left else [t, filler], dim=1)


def merge_groups(
    batches: list[dict[str, Any]], picks: list[tuple[int, int]], group_size: int
) -> dict[str, Any]:
    """Build one generation batch from groups ``(batch_index, group_index)`` of several batches.

    Sequence tensors are re-padded to a common length (prompts on the left, completions on the
    right); ``num_items_in_batch`` is recomputed from the merged completion mask (one process).
    """
    out: dict[str, Any] = {}
    for key, first in batches[0].items():
        if not isinstance(first, torch.Tensor) or first.dim() == 0 or key == "num_items_in_batch":
            continue
        parts = []
        for b, gi in picks:
            rows = slice(gi * group_size, (gi + 1) * group_size)
            parts.append(batches[b][key][rows])
        if first.dim() == 2 and first.shape[0] == batches[0]["advantages"].shape[0]:
            length = max(p.shape[1] for p in parts)
            left = key in _LEFT_PADDED
            value = 0.0 if key not in ("prompt_ids", "completion_ids") else 0
            if key not in _LEFT_PADDED + _RIGHT_PADDED:
                raise KeyError(f"dynamic sampling cannot merge unknown sequence field {key!r}")
            parts = [_pad_to(p, length, left, value) for p in parts]
        out[key] = torch.cat(parts, dim=0)
    for key, value in batches[0].items():
        out.setdefault(key, value)
    mask = out["completion_mask"]
    if "tool_mask" in out:
        mask = mask * out["tool_mask"]
    out["num_items_in_batch"] = mask.sum().to(batches[0]["num_items_in_batch"].dtype)
    return out
