"""The distill channel's loss variants (channels/distill_variants.py): every ``distill.loss``
setting has its variant, and the ``as_advantage`` fold on hand-worked numbers."""

from __future__ import annotations

import math

import pytest
import torch

from composer_replication.channels.distill_variants import (
    FoldedReverseKl,
    Jsd,
    SampledReverseKl,
    build_variant,
)
from composer_replication.config import JsdDistillLoss, ReverseKlDistillLoss


@pytest.mark.parametrize(
    ("loss", "variant", "full", "top_k"),
    [
        (ReverseKlDistillLoss(), SampledReverseKl, False, 1),
        (ReverseKlDistillLoss(as_advantage=True), FoldedReverseKl, False, 1),
        (JsdDistillLoss(), Jsd, True, 20),  # the remote teacher's 20
        (JsdDistillLoss(top_k=32), Jsd, False, 32),
    ],
)  # fmt: skip
def test_every_loss_setting_has_its_variant(loss, variant, full, top_k):
    v = build_variant(loss, 0.5)
    assert type(v) is variant and v.full_vocabulary == full == loss.full_vocabulary
    assert v.top_k([20]) == top_k


def test_the_fold_adds_the_weighted_gap_on_scored_tokens():
    """Two rows of two tokens, weight 0.5, GRPO advantages [1, -1]. Row 0's tokens are scored:
    ``q = [-1, -2]``, ``p_old = [-1.5, -1]`` -> ``1 + 0.5 * [0.5, -1] = [1.25, 0.5]``. Row 1's
    second token was not reported (NaN) and its first is masked out: both keep ``-1``."""
    batch = {
        "advantages": torch.tensor([1.0, -1.0]),
        "distill_actual": torch.tensor([[-1.0, -2.0], [-3.0, math.nan]]),
    }
    mask_BK = torch.tensor([[True, True], [False, True]])
    old_BK = torch.tensor([[-1.5, -1.0], [-1.0, -1.0]])
    FoldedReverseKl(ReverseKlDistillLoss(as_advantage=True), 0.5).fold(batch, mask_BK, old_BK)
    torch.testing.assert_close(batch["advantages"], torch.tensor([[1.25, 0.5], [-1.0, -1.0]]))


def test_the_fold_prefers_trls_old_logps():
    """With ``old_per_token_logps`` in the batch (TRL computed them), those are ``p_old``, not
    the loss forward's: ``0 + 1 * (-1 - (-3)) = 2``."""
    batch = {
        "advantages": torch.zeros(1),
        "distill_actual": torch.tensor([[-1.0]]),
        "old_per_token_logps": torch.tensor([[-3.0]]),
    }
    fold = FoldedReverseKl(ReverseKlDistillLoss(as_advantage=True), 1.0).fold
    fold(batch, torch.ones(1, 1, dtype=torch.bool), torch.tensor([[-1.0]]))
    assert batch["advantages"].tolist() == [[2.0]]


def test_the_other_variants_leave_the_advantages_alone():
    batch = {"advantages": torch.tensor([1.0]), "distill_actual": torch.tensor([[-1.0]])}
    for variant in (SampledReverseKl(ReverseKlDistillLoss()), Jsd(JsdDistillLoss())):
        variant.fold(batch, torch.ones(1, 1, dtype=torch.bool), torch.tensor([[-5.0]]))
    assert batch["advantages"].tolist() == [1.0]
