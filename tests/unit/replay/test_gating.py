"""VOI gating: the entropy formula on hand-worked logits, per-state scores with a tiny model, and
threshold / top-percentile selection."""

from __future__ import annotations

import math

import pytest
import torch

from composer_replication.replay.gating import (
    mean_token_entropy,
    score_states,
    select_states,
    state_entropy,
)

from .conftest import make_states


def test_mean_token_entropy_hand_worked():
    """Row 0: uniform over 4 -> ln 4 = 1.3863. Row 1: logits (0, -inf...) one-hot -> 0.
    Row 2: two equal logits and two at -inf -> ln 2 = 0.6931 but masked out.
    Mean over rows 0,1 = (1.3863 + 0) / 2 = 0.6931."""
    ninf = float("-inf")
    logits_TV = torch.tensor(
        [[0.0, 0.0, 0.0, 0.0], [0.0, ninf, ninf, ninf], [1.0, 1.0, ninf, ninf]]
    )
    logits_TV = torch.nan_to_num(logits_TV, neginf=-1e4)
    ent, metrics = mean_token_entropy(logits_TV, torch.tensor([1.0, 1.0, 0.0]))
    assert float(ent) == pytest.approx(math.log(4) / 2, abs=1e-4)
    assert metrics["gating/tokens"] == 2
    ent, _ = mean_token_entropy(logits_TV, torch.zeros(3))
    assert float(ent) == 0.0


def test_state_entropy_uses_only_action_tokens(tokenizer, tiny_model):
    """Changing the action changes the score; the score is within [0, ln V]."""
    a, b = make_states(2)
    b.prefix = a.prefix
    sa = state_entropy(tiny_model, tokenizer, a)
    sb = state_entropy(tiny_model, tokenizer, b)
    assert 0 < sa <= math.log(len(tokenizer)) and sa != sb
    b.action.text = ""
    assert state_entropy(tiny_model, tokenizer, b) > 0  # template end tokens remain scored
    scores = score_states(make_states(3), (tiny_model, tokenizer))
    assert len(scores) == 3 and all(v > 0 for v in scores.values())


def test_select_states():
    scores = {"a": 0.1, "b": 0.9, "c": 0.5, "d": 0.7}
    assert select_states(scores) == set(scores)
    assert select_states(scores, threshold=0.6) == {"b", "d"}
    assert select_states(scores, top_percentile=50) == {"b", "d"}
    assert select_states(scores, top_percentile=25) == {"b"}
    assert select_states(scores, threshold=0.8, top_percentile=50) == {"b"}
    with pytest.raises(ValueError, match="top_percentile"):
        select_states(scores, top_percentile=0)
