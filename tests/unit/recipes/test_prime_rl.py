"""The PRIME-RL custom loss on duck-typed LossInputs: hand-worked numbers, parity with our
loss functions, the shipped TOML resolves to the function with valid kwargs."""

from __future__ import annotations

import importlib
import inspect
import math
from dataclasses import dataclass
from pathlib import Path

import pytest
import tomllib
import torch

from composer_replication.losses import prime_rl_policy_loss
from composer_replication.recipes import prime_rl
from composer_replication.recipes.prime_rl import composer_loss


@dataclass
class Inputs:
    """The fields of prime_rl.trainer.rl.loss.LossInputs (commit 559b447)."""

    trainer_logprobs: torch.Tensor
    inference_logprobs: torch.Tensor
    ref_logprobs: torch.Tensor | None
    advantages: torch.Tensor
    loss_mask: torch.Tensor
    loss_weights: torch.Tensor | None = None


def _inputs(ref=True, weights=None) -> Inputs:
    lp = torch.log(torch.tensor([0.5, 0.6, 0.2, 0.9])).requires_grad_()
    return Inputs(
        trainer_logprobs=lp,
        inference_logprobs=torch.log(torch.tensor([0.5, 0.4, 0.4, 0.1])),
        ref_logprobs=torch.log(torch.tensor([0.25, 0.6, 0.2, 0.9])) if ref else None,
        advantages=torch.tensor([1.0, 1.0, -1.0, 1.0]),
        loss_mask=torch.tensor([True, True, True, False]),
        loss_weights=weights,
    )


def test_dapo_hand_worked_sum_over_the_sequence():
    """Ratios 1.0, 1.5, 0.5 (the 4th token is masked). A=+1, r=1: -1. A=+1, r=1.5 > 1.28:
    -1.28. A=-1, r=0.5 < 0.8: -min(-0.5, -0.8) = 0.8. Sum = -1.48 (a sum: PRIME-RL divides
    by its global token count itself)."""
    out = composer_loss(_inputs(ref=False), policy="dapo")
    assert out.loss.item() == pytest.approx(-1.48, abs=1e-6)
    assert out.metrics["policy/clip_high_frac"].item() == pytest.approx(1 / 3)
    assert out.metrics["policy/clip_low_frac"].item() == pytest.approx(1 / 3)


def test_dapo_gradient_only_on_unclipped_tokens():
    """Only the unclipped first token carries gradient: d(-r * A)/dlogp = -r = -1."""
    x = _inputs(ref=False)
    composer_loss(x, policy="dapo").loss.backward()
    assert x.trainer_logprobs.grad.tolist() == pytest.approx([-1.0, 0.0, 0.0, 0.0])


def test_dppo_is_our_prime_rl_policy_loss_summed():
    x = _inputs(ref=False, weights=torch.tensor([1.0, 0.5, 2.0, 1.0]))
    out = composer_loss(x, policy="dppo", kl_tau=0.01)
    ref, _ = prime_rl_policy_loss(x.trainer_logprobs, x.inference_logprobs, x.advantages,
                                  x.loss_mask, kl_tau=0.01, loss_weights=x.loss_weights,
                                  divisor=1)  # fmt: skip
    assert out.loss.item() == pytest.approx(ref.item(), rel=1e-6)


def test_self_distillation_term_hand_worked():
    """Only token 1 differs from the teacher: log 0.5 vs log 0.25, on-policy (ratio 1):
    0.1 * log 2 is added to the DAPO sum; gradient on token 1: -1 + 0.1 * log 2."""
    x = _inputs()
    out = composer_loss(x, policy="dapo", sdpo_weight=0.1)
    assert out.loss.item() == pytest.approx(-1.48 + 0.1 * math.log(2), abs=1e-6)
    assert out.metrics["sdpo/active"].item() == 1.0
    assert out.metrics["sdpo/reverse_kl"].item() == pytest.approx(math.log(2) / 3)
    out.loss.backward()
    assert x.trainer_logprobs.grad[0].item() == pytest.approx(-1 + 0.1 * math.log(2))
    assert x.trainer_logprobs.grad[3].item() == 0.0  # masked token


def test_without_ref_logprobs_the_term_is_reported_inactive():
    out = composer_loss(_inputs(ref=False), sdpo_weight=0.1)
    assert out.metrics["sdpo/active"].item() == 0.0
    assert out.loss.item() == pytest.approx(-1.48, abs=1e-6)


def test_bad_policy_name():
    with pytest.raises(ValueError, match="'dapo' or 'dppo'"):
        composer_loss(_inputs(), policy="ppo")


def test_shipped_toml_points_at_the_function_with_valid_kwargs():
    path = Path(prime_rl.__file__).with_name("prime_rl.toml")
    cfg = tomllib.loads(path.read_text())["loss"]
    assert cfg["type"] == "custom"
    module, name = cfg["import_path"].rsplit(".", 1)
    fn = getattr(importlib.import_module(module), name)
    assert fn is composer_loss
    params = inspect.signature(fn).parameters
    assert set(cfg["kwargs"]) <= set(params) - {"inputs"}
    out = fn(_inputs(), **cfg["kwargs"])
    assert torch.isfinite(out.loss)
