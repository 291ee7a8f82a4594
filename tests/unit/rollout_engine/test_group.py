"""The group record: its shape checks, the per-rollout mask and staleness from the oldest
turn."""

from __future__ import annotations

import pickle

import pytest

from composer_replication.rollout_engine.group import GroupRecord, Rollout, Sequence


def _seq(versions: list[int], n: int = 3) -> Sequence:
    return Sequence([1, 2], list(range(n)), [-0.5] * n, [1] * n, versions)


def test_a_sequence_refuses_mismatched_lengths_and_no_turns():
    with pytest.raises(ValueError, match="3 completion tokens, 2 log-probs"):
        Sequence([1], [1, 2, 3], [0.0, 0.0], [1, 1, 1], [0])
    with pytest.raises(ValueError, match="no turn versions"):
        Sequence([1], [1], [0.0], [1], [])


def test_staleness_is_measured_from_the_oldest_turn_of_any_sequence():
    """Rollout 1's second sequence has a turn made by version 3; the group's oldest turn is
    version 3, so at learner version 7 the group is 4 steps stale."""
    group = GroupRecord(
        group_id=5, task_id="t", row={"task_id": "t"},
        rollouts=[Rollout([_seq([6, 7])], 1.0),
                  Rollout([_seq([5]), _seq([3, 6])], 0.0),
                  Rollout([_seq([7])], 0.0, valid=False)],
    )  # fmt: skip
    assert group.oldest_version == 3 and group.staleness(7) == 4
    assert group.valid_mask == [True, True, False]
    assert group.completion_tokens == 9  # the invalid rollout's tokens are not counted
    assert pickle.loads(pickle.dumps(group)) == group  # it travels through Ray's object store
