"""``ComposerReplicationTrainer``: TRL's ``GRPOTrainer`` with the hooks the three channels need.

Channel 1 is TRL's GRPO loss, unchanged (its loss types, clip-higher ``epsilon_high``, token-level
aggregation, truncated-completion masking). This subclass adds:

* ``_compute_loss`` as the single place channels compose (``losses.compose_loss``):
  ``total = policy + alpha_sdpo * self_distill + beta_replay * preference``. With both weights 0
  it returns exactly what ``GRPOTrainer._compute_loss`` returns (same tensor, same graph), so
  loss and gradients are bit-identical to plain GRPO, and nothing else is computed.
* channel 2 (trainer/sdpo.py): failed rollouts get hints; the self-teacher scores the same
  completion tokens with the hint in context; generalized JSD / TAID / entropy-aware OPD.
* channel 3 (trainer/replay_channel.py): DPO or SimPO on replayed-trace preference pairs.
* DAPO dynamic sampling (Yu et al., "DAPO: An Open-Source LLM Reinforcement Learning System at
  Scale", 2025, sec. 3.2), which TRL lacks: groups whose rewards all tie carry no advantage, so
  they are replaced by groups generated from fresh prompts, up to ``max_refills`` extra rounds.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from transformers import TrainerCallback
from trl import GRPOTrainer

from composer_replication.config import ReplayChannelConfig, SdpoConfig
from composer_replication.losses import compose_loss

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
        alpha_sdpo, beta_replay: channel weights (0 = channel off, costs nothing).
        sdpo: SdpoConfig for channel 2 (hint sources, teacher weights, divergence).
        replay: ReplayChannelConfig for channel 3 (preference dataset, DPO/SimPO).
        hint_model: callable (prompt, completion, feedback) -> hint, for hint source "model".
        dynamic_sampling: enable DAPO dynamic sampling.
        max_refills: extra generation rounds per step for dynamic sampling.

    Channel 2 needs a reward function that keeps its verdicts (``last_results``, as
    :class:`~composer_replication.trainer.rewards.EnvReward` does): the hints come from them.
    """

    def __init__(
        self,
        *args: Any,
        alpha_sdpo: float = 0.0,
        beta_replay: float = 0.0,
        sdpo: SdpoConfig | None = None,
        replay: ReplayChannelConfig | None = None,
        hint_model=None,
        dynamic_sampling: bool = False,
        max_refills: int = 2,
        **kwargs: Any,
    ):
        if alpha_sdpo < 0 or beta_replay < 0:
            raise ValueError("alpha_sdpo and beta_replay must be >= 0")
        super().__init__(*args, **kwargs)
        self.self_teacher = None
        self.replay = None
        self._graded_reward = None
        if alpha_sdpo > 0:
            self._graded_reward = _find_graded_reward(self.reward_funcs)
            from composer_replication.trainer.sdpo import SelfTeacher

            self.self_teacher = SelfTeacher(
                sdpo or SdpoConfig(),
                self.processing_class,
                self.model,
                self.args.max_steps,
                hint_model,
            )
            self.add_callback(_AfterStep(self))
        if beta_replay > 0:
            if replay is None or not replay.dataset:
                raise ValueError("beta_replay > 0 needs replay=ReplayChannelConfig(dataset=...)")
            from composer_replication.trainer.replay_channel import ReplayChannel

            self.replay = ReplayChannel(replay, self.processing_class, self.model, self.args.seed)
        self._last_sdpo_loss: float | None = None
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

    # ---- checkpoints carry the channels' own state ---------------------------------------
    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        if resume_from_checkpoint and self.self_teacher is not None:
            self.self_teacher.load(str(resume_from_checkpoint))
        if resume_from_checkpoint and self.replay is not None:
            self.replay.load(str(resume_from_checkpoint))
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        ckpt = f"{self._get_output_dir(trial)}/checkpoint-{self.state.global_step}"
        if self.self_teacher is not None:
            self.self_teacher.save(ckpt)
        if self.replay is not None:
            self.replay.save(ckpt)

    # ---- channel composition -------------------------------------------------------------
    def _compute_loss(self, model, inputs):
        if self.self_teacher is None and self.replay is None:
            return super()._compute_loss(model, inputs)
        from composer_replication.trainer.sdpo import HiddenCapture

        capture = HiddenCapture(model) if self.self_teacher is not None else None
        with capture.active() if capture is not None else contextlib.nullcontext():
            policy_loss = super()._compute_loss(model, inputs)
        mode = "train" if model.training else "eval"
        accum = self.current_gradient_accumulation_steps if mode == "train" else 1
        sdpo_in, extra = None, {}
        if self.self_teacher is not None:
            k = inputs["completion_ids"].shape[1]
            student = capture.completion_states(inputs["completion_ids"].shape[0], k)
            n_tok = int((inputs["completion_mask"].bool() & inputs["sdpo_hinted"][:, None]).sum())
            sdpo_in, extra = self.self_teacher.sdpo_inputs(
                model, inputs, student, divisor=max(n_tok, 1) * accum
            )
        replay_in = None
        if self.replay is not None:
            replay_in = self.replay.replay_inputs(
                model, divisor=self.replay.cfg.pairs_per_step * accum
            )
        total, metrics = compose_loss(
            policy_loss,
            sdpo=sdpo_in,
            replay=replay_in,
            alpha_sdpo=self.alpha_sdpo,
            beta_replay=self.beta_replay,
        )
        self._log_channel_metrics(mode, metrics, extra)
        return total

    def _log_channel_metrics(self, mode: str, metrics: dict, extra: dict) -> None:
        for key, value in metrics.items():
            self._metrics[mode][key].append(float(value))
        for key, value in extra.items():
            self._metrics[mode][f"sdpo/{key}"].append(float(value))
        if "sdpo/num_tokens" in metrics:
            active = float(metrics["sdpo/num_tokens"]) > 0
            self._metrics[mode]["sdpo/active"].append(float(active))
            self._last_sdpo_loss = float(metrics["sdpo/loss"]) if active else None

    # ---- rollouts: dynamic sampling, then hints for channel 2 -----------------------------
    def _score_round(self, inputs):
        """One generation + scoring round, with the per-row prompts and verdicts channel 2
        needs kept alongside (lists travel through TRL's shuffle/split like tensors)."""
        batch = super()._generate_and_score_completions(inputs)
        if self.self_teacher is not None:
            results = list(self._graded_reward.last_results)
            if len(results) != len(inputs):
                raise RuntimeError(
                    f"reward kept {len(results)} verdicts for {len(inputs)} completions"
                )
            batch["_prompts"] = [x["prompt"] for x in inputs]
            batch["_results"] = results
        return batch

    def _generate_and_score_completions(self, inputs):
        batch = self._dynamic_sampling(inputs) if self.model.training else self._score_round(inputs)
        if self.self_teacher is not None:
            results = batch.pop("_results")
            batch = self.self_teacher.attach(
                batch,
                batch.pop("_prompts"),
                [r.observation for r in results],
                results,
                self.num_generations,
            )
        return batch

    def _dynamic_sampling(self, inputs):
        batch = self._score_round(inputs)
        if not self.dynamic_sampling:
            return batch
        g = self.num_generations
        n_groups = batch["advantages"].shape[0] // g
        kept = [batch]
        keep_idx = [informative_groups(batch["advantages"], g)]
        refills = 0
        while sum(len(k) for k in keep_idx) < n_groups and refills < self.max_refills:
            fresh = self._score_round(self._next_refill_inputs(n_groups))
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


class _AfterStep(TrainerCallback):
    """After each optimizer step: the self-teacher's EMA update and TAID schedule."""

    def __init__(self, trainer: ComposerReplicationTrainer):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        t = self.trainer
        t.self_teacher.after_step(t.model, t._last_sdpo_loss, state.global_step)


def _find_graded_reward(reward_funcs):
    for f in reward_funcs:
        if hasattr(f, "last_results"):
            return f
    raise ValueError(
        "alpha_sdpo > 0 needs a reward function that keeps its verdicts (`last_results`, e.g. "
        "EnvReward): the hints are built from the verifier's feedback"
    )


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
        if isinstance(first, list):  # per-row objects (prompts, verdicts)
            out[key] = [
                batches[b][key][gi * group_size + j] for b, gi in picks for j in range(group_size)
            ]
            continue
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
