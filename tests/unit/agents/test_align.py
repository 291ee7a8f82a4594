"""Joining an episode's recorded turns into one sequence (agents/align.py), on hand-made ids."""

from __future__ import annotations

from dataclasses import dataclass

from composer_replication.agents.align import join_turns


@dataclass
class T:
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]


def test_extending_turns_concatenate_with_an_env_mask():
    """Turn 2's prompt = turn 1's prompt [1, 2] + completion [3, 4] + the tool result [5, 6]."""
    turns = [T([1, 2], [3, 4], [-0.1, -0.2]), T([1, 2, 3, 4, 5, 6], [7], [-0.3])]
    j = join_turns(turns, max_completion_tokens=100)
    assert j.prompt_ids == [1, 2]
    assert j.completion_ids == [3, 4, 5, 6, 7]
    assert j.env_mask == [1, 1, 0, 0, 1]
    assert j.logprobs == [-0.1, -0.2, 0.0, 0.0, -0.3]
    assert (j.turns, j.dropped_turns, j.dropped_tokens, j.diverged) == (2, 0, 0, False)


def test_a_turn_that_does_not_extend_ends_the_sequence_and_is_counted():
    """Turn 2 re-renders turn 1's completion differently ([3, 9] instead of [3, 4]): turns 2
    and 3 are dropped, their 1 + 2 completion tokens counted."""
    turns = [T([1, 2], [3, 4], [-0.1, -0.2]), T([1, 2, 3, 9, 5], [7], [-0.3]),
             T([1, 2, 3, 9, 5, 7, 8], [6, 6], [-1.0, -1.0])]  # fmt: skip
    j = join_turns(turns, max_completion_tokens=100)
    assert j.completion_ids == [3, 4] and j.env_mask == [1, 1]
    assert (j.turns, j.dropped_turns, j.dropped_tokens, j.diverged) == (1, 2, 3, True)


def test_the_length_cap_drops_the_turn_that_would_pass_it():
    turns = [T([1], [2, 3], [0.0, 0.0]), T([1, 2, 3, 4, 5], [6, 7], [0.0, 0.0])]
    j = join_turns(turns, max_completion_tokens=5)  # 2 + 2 inserted + 2 = 6 > 5
    assert j.completion_ids == [2, 3]
    assert (j.turns, j.dropped_turns, j.dropped_tokens, j.diverged) == (1, 1, 2, False)
    assert join_turns([], 10) is None
    first_too_long = join_turns([T([1], [2, 3, 4], [0.0] * 3)], max_completion_tokens=2)
    assert first_too_long.completion_ids == [] and first_too_long.dropped_turns == 1
