"""channels/packed.py on hand-made windows: where each window's completion sits in the packed
row, the summary tokens, a truncated window's hinted prompt, and each window as a teacher's
own sequence (the summarized case runs on a real episode in
tests/unit/trainer/test_summarize_channels.py)."""

from __future__ import annotations

import pytest

from composer_replication.channels.packed import (
    hinted_windows,
    summary_mask,
    window_parts,
    window_spans,
)
from composer_replication.rollout import Window

# window 0: prompt [1, 2, 3], completion [4, 5, 6] (6 a summary of 1 token);
# window 1 (truncate-like): window 0's prompt, a kept token 5, then its completion [7, 8]
W0 = Window([1, 2, 3], [4, 5, 6], [1, 1, 1], summary="s", summary_tokens=1)
W1 = Window([1, 2, 3, 5], [7, 8], [1, 1])


def test_spans_summaries_and_parts():
    assert window_spans([W0, W1]) == [(0, 3), (7, 9)]
    assert summary_mask([W0, W1], 9) == [False, False, True] + [False] * 6
    assert window_parts([1, 2, 3], [W0, W1], 9) == [([1, 2, 3, 4, 5, 6], 3, 0),
                                                    ([1, 2, 3, 5, 7, 8], 4, 7)]  # fmt: skip
    # a packed completion cut at 8 tokens: window 1 keeps its first token
    assert window_parts([1, 2, 3], [W0, W1], 8)[1] == ([1, 2, 3, 5, 7], 4, 7)


def test_a_truncated_window_gets_the_hinted_prompt_then_the_turns_it_kept():
    ids, window, index = hinted_windows(None, [W0, W1], [], [1, 2, 99, 3])
    assert ids == [4, 5, 6, 1, 2, 99, 3, 5, 7, 8]
    assert window == [0, 0, 0, 1, 1, 1, 1, 1, 1, 1]
    assert index == [0, 1, 2, -1, -1, -1, -1, 8, 9]  # the same tokens: 7 and 8
    assert [ids[i] for i in index if i >= 0] == [4, 5, 6, 7, 8]
    with pytest.raises(ValueError, match="cannot insert the hint"):
        hinted_windows(None, [W0, Window([9, 9], [7])], [], [1, 2, 99, 3])
