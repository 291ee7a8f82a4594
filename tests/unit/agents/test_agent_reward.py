"""The reward of agent episodes: an episode whose sandbox never started (the machine's
failure, agents/episodes.py) has no reward (None: out of its group's statistics) and is
counted per kind; the others keep the environment's verdict."""

from __future__ import annotations

from composer_replication.agents.episodes import AgentReward
from composer_replication.envs.base import StepResult, machine_failed
from composer_replication.sandbox.infra import SLOT_TIMEOUT, InfraFailure


def test_an_episode_the_machine_failed_has_no_reward_and_is_counted():
    results = [
        StepResult("", 1.0, True, True, "ok"),
        machine_failed("", InfraFailure(SLOT_TIMEOUT, "no slot in 600 s")),
        StepResult("", 0.0, True, False, "2 of 3 target tests pass"),
    ]
    logged: dict[str, float] = {}
    reward = AgentReward()
    out = reward(None, None, agent_result=results, log_metric=logged.__setitem__)
    assert out == [1.0, None, 0.0]
    assert reward.last_infra_kinds == [None, SLOT_TIMEOUT, None]
    assert logged["env/pass_rate"] == 0.5  # of the two graded episodes
    assert logged["env/infra_failed_frac"] == 1 / 3
    assert logged[f"env/infra_failed/{SLOT_TIMEOUT}"] == 1.0
