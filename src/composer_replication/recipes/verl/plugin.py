"""Our losses registered with verl 0.9 (importing this module registers them).

verl imports this module itself through the ``verl.plugins`` entry point that our package
declares (``VERL_USE_EXTERNAL_PLUGINS=auto``, verl's default), or name it explicitly with
``VERL_USE_EXTERNAL_MODULES=composer_replication.recipes.verl.plugin``. Registered:

* advantage estimator ``composer_grpo`` (``algorithm.adv_estimator``):
  :func:`~composer_replication.recipes.verl.algos.group_advantages`, scaled by the group std
  when ``algorithm.norm_adv_by_std_in_grpo`` (verl's key) is true, else Dr. GRPO's unscaled
  form; the advantage is broadcast over the response tokens as verl expects.
* policy loss ``composer_dapo`` (``actor_rollout_ref.actor.policy_loss.loss_mode``): DAPO's
  clip-higher surrogate (:func:`~composer_replication.losses.dapo_clip_per_token`; eps from
  ``clip_ratio_low``/``clip_ratio_high``), times verl's rollout-correction weights when given,
  reduced by verl's own ``agg_loss`` (so every ``loss_agg_mode`` and its data-parallel
  bookkeeping hold). Unlike verl's ``vanilla`` there is no dual clip (``clip_ratio_c``) and no
  clamp of the log-ratio: DAPO has neither.
* distillation loss ``composer_sdpo`` (``distillation.distillation_loss.loss_mode``; an
  estimator loss): the sampled reverse KL to ``teacher_logprobs``
  (:func:`~composer_replication.losses.sampled_reverse_kl_per_token`, importance-weighted to
  the rollout's ``old_log_probs``). With :mod:`composer_replication.recipes.verl.hinted` the
  teacher is the policy itself scoring the rollout with a hint in its context (SDPO/OPSD); rows
  without a hint carry NaN teacher log-probs and contribute 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor
from verl.trainer.distillation.losses import DistillationLossSettings, register_distillation_loss
from verl.trainer.ppo.core_algos import agg_loss, register_adv_est, register_policy_loss
from verl.workers.utils.padding import no_padding_2_padding

from composer_replication.losses import dapo_clip_per_token, sampled_reverse_kl_per_token
from composer_replication.recipes.verl.algos import group_advantages

ADV_ESTIMATOR = "composer_grpo"
POLICY_LOSS = "composer_dapo"
SDPO_LOSS = "composer_sdpo"


@register_adv_est(ADV_ESTIMATOR)
def composer_grpo_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    index: np.ndarray | None = None,
    config: Any = None,
    epsilon: float = 1e-6,
    **_: Any,
) -> tuple[Tensor, Tensor]:
    """Advantages and returns ``[B, T]`` for verl (see module docstring); ``index`` is verl's
    per-row ``uid`` (rows of one prompt share it)."""
    if index is None:
        raise ValueError(f"{ADV_ESTIMATOR} needs verl's per-row 'uid' index to form groups")
    norm = True if config is None else bool(config.get("norm_adv_by_std_in_grpo", True))
    scores_B = token_level_rewards.sum(dim=-1)
    adv_B = group_advantages(scores_B, list(index), "group" if norm else "none", epsilon)
    adv_BT = adv_B.unsqueeze(-1) * response_mask
    return adv_BT, adv_BT


def _eps(config: Any) -> tuple[float, float]:
    base = config.clip_ratio
    low = config.clip_ratio_low if config.clip_ratio_low is not None else base
    high = config.clip_ratio_high if config.clip_ratio_high is not None else base
    return float(low), float(high)


@register_policy_loss(POLICY_LOSS)
def composer_dapo_loss(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Any]]:
    """verl's policy-loss signature over our DAPO surrogate (module docstring)."""
    if config is None:
        raise ValueError(f"{POLICY_LOSS} needs verl's actor config (clip_ratio_low/high)")
    low, high = _eps(config)
    per_token_BT, metrics = dapo_clip_per_token(
        log_prob, old_log_prob, advantages, response_mask, low, high
    )
    if rollout_is_weights is not None:
        per_token_BT = per_token_BT * rollout_is_weights
    loss = agg_loss(
        loss_mat=per_token_BT,
        loss_mask=response_mask,
        loss_agg_mode=loss_agg_mode,
        **config.global_batch_info,
    )
    return loss, {f"policy/{k}": v.item() for k, v in metrics.items()}


def _dense(t: Tensor) -> Tensor:
    return t.to_padded_tensor(0.0) if t.is_nested else t


@register_distillation_loss(DistillationLossSettings(names=[SDPO_LOSS], use_estimator=True))
def composer_sdpo_loss(
    config: Any, distillation_config: Any, model_output: dict, data: Any
) -> tuple[Tensor, dict[str, Any]]:
    """Per-token sampled reverse KL ``[B, T]`` to the (hint-conditioned) teacher log-probs;
    verl aggregates it with ``agg_loss`` and adds it times ``distillation_loss_coef``. The
    per-token value is already a policy-gradient surrogate, so verl's
    ``use_policy_gradient`` mode (which would treat it as a negative reward) is refused."""
    if distillation_config.distillation_loss.use_policy_gradient:
        raise ValueError(
            f"distillation.distillation_loss.use_policy_gradient=true with loss_mode={SDPO_LOSS}: "
            "this loss is backpropagated directly; set use_policy_gradient=false"
        )
    logp_BT = no_padding_2_padding(model_output["log_probs"], data)
    teacher_BT = no_padding_2_padding(data["teacher_logprobs"], data).squeeze(-1)
    behaviour_BT = _dense(data["old_log_probs"]).to(logp_BT.dtype)
    mask = data["response_mask"]
    mask_BT = (mask.to_padded_tensor(False) if mask.is_nested else mask).bool()
    hinted_BT = torch.isfinite(teacher_BT)
    teacher_BT = torch.where(hinted_BT, teacher_BT, logp_BT.detach())
    per_token_BT, metrics = sampled_reverse_kl_per_token(
        logp_BT, teacher_BT, behaviour_BT, mask_BT & hinted_BT
    )
    per_token_BT = per_token_BT * hinted_BT
    rows = mask_BT.any(-1)
    hinted_rows = (hinted_BT & mask_BT).any(-1)
    metrics["hinted_frac"] = hinted_rows.sum() / rows.sum().clamp_min(1)
    return per_token_BT, {f"sdpo/{k}": v.item() for k, v in metrics.items()}
