"""``sdpo.route_failures``: hinted (failed) rollouts leave the policy loss; the rest keep their
GRPO advantages."""

from __future__ import annotations

import torch

from composer_replication.channels.base import Rollouts
from composer_replication.channels.self_distill import SelfDistillChannel
from composer_replication.config import SdpoConfig
from composer_replication.envs.arithmetic import grade_answer


def _attach(tokenizer, route: bool, sources=("feedback",)):
    ch = SelfDistillChannel(
        SdpoConfig(weight=0.1, route_failures=route, hint_sources=list(sources))
    )
    ch.tokenizer = tokenizer
    replies = ["7", "8", "7", "6"]  # 3 + 4: right, wrong, right, wrong
    results = [grade_answer(r, 7) for r in replies]
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    batch = {"completion_ids": torch.zeros(4, 2, dtype=torch.long), "advantages": adv.clone()}
    rollouts = Rollouts(["What is 3 + 4?"] * 4, replies, results, group_size=4)
    return ch.attach(batch, rollouts)


def test_routing_zeroes_the_advantages_of_hinted_rows_only(tokenizer):
    routed = _attach(tokenizer, True)
    assert routed["sdpo_hinted"].tolist() == [False, True, False, True]
    assert routed["advantages"].tolist() == [1.0, 0.0, 1.0, 0.0]
    plain = _attach(tokenizer, False)
    assert plain["advantages"].tolist() == [1.0, -1.0, 1.0, -1.0]


def test_a_failure_without_a_hint_keeps_its_advantage(tokenizer):
    # siblings only, and none right: no hint, so GRPO keeps the row
    ch = SelfDistillChannel(SdpoConfig(weight=0.1, route_failures=True, hint_sources=["sibling"]))
    ch.tokenizer = tokenizer
    replies = ["8", "6"]
    batch = {
        "completion_ids": torch.zeros(2, 2, dtype=torch.long),
        "advantages": torch.tensor([0.5, -0.5]),
    }
    out = ch.attach(
        batch, Rollouts(["What is 3 + 4?"] * 2, replies, [grade_answer(r, 7) for r in replies], 2)
    )
    assert out["advantages"].tolist() == [0.5, -0.5]
