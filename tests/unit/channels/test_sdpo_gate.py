"""``sdpo.gate=policy_signal``: failures are hinted only in groups whose GRPO advantages are not
all zero (their rewards differ), so the channel never takes an optimizer step alone."""

from __future__ import annotations

import torch
from support.constructed_sdpo import setup_case, train_one_step

from composer_replication.channels.base import Rollouts
from composer_replication.channels.self_distill import SelfDistillChannel
from composer_replication.config import SdpoConfig
from composer_replication.envs.arithmetic import grade_answer


def _hinted(tokenizer, gate: str) -> list[bool]:
    ch = SelfDistillChannel(SdpoConfig(weight=0.1, hint_sources=["feedback"], gate=gate))
    ch.tokenizer = tokenizer
    replies = ["7", "8", "9", "6", "5", "4"]  # 3 + 4 in groups of 2: right/wrong, then all wrong
    results = [grade_answer(r, 7) for r in replies]
    rewards_GN = torch.tensor([r.reward for r in results]).view(3, 2)
    adv = (rewards_GN - rewards_GN.mean(dim=1, keepdim=True)).flatten()  # GRPO's, unscaled
    batch = {"completion_ids": torch.zeros(6, 2, dtype=torch.long), "advantages": adv}
    rollouts = Rollouts(["What is 3 + 4?"] * 6, replies, results, group_size=2)
    return ch.attach(batch, rollouts)["sdpo_hinted"].tolist()


def test_gate_drops_the_hints_of_groups_without_policy_signal(tokenizer):
    assert _hinted(tokenizer, "none") == [False, True, True, True, True, True]
    assert _hinted(tokenizer, "policy_signal") == [False, True, False, False, False, False]


def test_gated_channel_does_not_move_the_model_when_every_reply_fails(tmp_path, tokenizer):
    """The constructed case of step 2 (every reply wrong, the teacher knows better): ungated,
    the channel moves the LM head (test_sdpo_constructed.py); gated, nothing moves."""
    cfg, env, model, *_ = setup_case(tmp_path, tokenizer, 1.0, extra=("sdpo.gate=policy_signal",))
    before, after, trainer = train_one_step(cfg, env, model, tokenizer)
    assert [r["reward"] for r in trainer.state.log_history if "reward" in r] == [0.0]
    torch.testing.assert_close(after, before, rtol=0, atol=0)


def test_an_inactive_step_logs_no_per_token_divergence(tmp_path, tokenizer):
    """A step on which the gated channel hints nothing measured no divergence: its row says
    ``sdpo/active`` 0 and 0 tokens, and has no ``sdpo/jsd_per_token`` (a logged 0 would read as
    "teacher and student agreed" and pull means over steps toward 0)."""
    cfg, env, model, *_ = setup_case(tmp_path, tokenizer, 1.0, extra=("sdpo.gate=policy_signal",))
    *_, trainer = train_one_step(cfg, env, model, tokenizer)
    (row,) = [r for r in trainer.state.log_history if "sdpo/active" in r]
    assert row["sdpo/active"] == 0.0 and row["sdpo/num_tokens"] == 0.0
    assert "sdpo/jsd_per_token" not in row
