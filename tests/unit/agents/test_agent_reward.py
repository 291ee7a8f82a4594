"""The reward of agent episodes: an episode whose sandbox never started (the machine's
failure, agents/episodes.py) has no reward (None: out of its group's statistics) and is
counted per kind; the others keep the environment's verdict."""

from __future__ import annotations

from composer_replication.agents.episodes import AgentReward, episode_workers
from composer_replication.envs.base import StepResult, machine_failed
from composer_replication.sandbox.infra import SLOT_TIMEOUT, InfraFailure
from composer_replication.sandbox.sandbox import SLOTS, set_sandbox_slots


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


def test_episodes_never_queue_for_a_sandbox_slot():
    """An episode holds a slot for its whole run; more episodes at once than slots would make
    the queued ones wait on their siblings, and a wait past ``slot_wait_s`` is masked: a policy
    whose episodes run to their deadline would mask its own group's later episodes."""
    limit = SLOTS.limit
    set_sandbox_slots(2)
    try:
        assert episode_workers(8, 8) == 2  # asked for more than the slots
        assert episode_workers(8, 0) == 2 and episode_workers(1, 8) == 1
        assert episode_workers(8, 1) == 1
    finally:
        set_sandbox_slots(limit)
