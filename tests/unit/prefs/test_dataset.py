"""`load_pairs` (the replay channel's preference data, read by ``train``'s preflight before any
model loads): every line that cannot be a pair is one error naming file and line."""

from __future__ import annotations

import pytest

from composer_replication.prefs.dataset import PreferenceDataError, load_pairs

GOOD = b'{"prompt": "q", "chosen": "a", "rejected": "b"}\n'


@pytest.mark.parametrize(
    "line, problem",
    [
        (b"5\n", "not a JSON object (a int)"),
        (b'"prompt chosen rejected"\n', "not a JSON object (a str)"),
        (b"[1]\n", "not a JSON object (a list)"),
        (b'{"prompt": "q", "chosen": 1, "rejected": "b"}\n', "'chosen' must be messages or a string"),
        (b'{"prompt": "q", "chosen": "a", "rejected": null}\n',
         "'rejected' must be messages or a string"),
    ],
)  # fmt: skip
def test_a_line_that_is_not_a_pair_names_its_line(tmp_path, line, problem):
    """Before, a number or a string line raised a bare TypeError (a traceback from ``train``)
    and a pair whose ``chosen`` was a number was accepted, to fail inside the trainer."""
    path = tmp_path / "pairs.jsonl"
    path.write_bytes(GOOD + line)
    with pytest.raises(PreferenceDataError) as info:
        load_pairs(path, 10)
    assert str(info.value) == f"{path}:2: {problem}"


def test_good_pairs_load(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_bytes(
        GOOD + b"\n" + GOOD.replace(b'"a"', b'[{"role": "assistant", "content": "a"}]')
    )
    rows = load_pairs(path, 10)
    assert [r["chosen"] for r in rows] == ["a", [{"role": "assistant", "content": "a"}]]
