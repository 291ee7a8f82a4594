"""The journal's file handling: one lock per real file, saved answers written all or nothing
and checked field by field when imported, a path that cannot be a journal."""

from __future__ import annotations

import resource

import orjson
import pytest

from composer_replication.replay.journal import CallRecord, Journal, JournalBusy, JournalError


def _rec(i: int) -> CallRecord:
    return CallRecord(state_id=f"s{i}", teacher="t", params_hash="h", status="ok",
                      response={"role": "assistant", "content": f"answer {i}"}, cost_usd=0.01)  # fmt: skip


def test_a_symlink_to_the_journal_meets_the_same_lock(tmp_path):
    """Two replays of one journal, one through a symlink, each took its own lock file and
    spent the budget on its own."""
    (tmp_path / "alias.db").symlink_to(tmp_path / "r.db")
    with Journal(tmp_path / "r.db") as holder, holder.exclusive():
        with Journal(tmp_path / "alias.db") as other, pytest.raises(JournalBusy):
            with other.exclusive():
                pass
        assert Journal(tmp_path / "alias.db").unrecorded_path == holder.unrecorded_path


def test_saving_refused_answers_is_all_or_nothing(tmp_path):
    """A file-size limit hit mid-write (what a full disk does): the earlier saved answers stay
    as they were, no torn line is left for the next run to trip on, and the caller hears of it."""
    jr = Journal(tmp_path / "j.db")
    first = jr.save_unrecorded([(_rec(0), [1], [])])
    before = first.read_bytes()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (len(before) + 50, hard))
    try:
        with pytest.raises(OSError):
            jr.save_unrecorded([(_rec(i), [i], [0.5]) for i in range(1, 5)])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert first.read_bytes() == before
    assert not first.with_name(first.name + ".tmp").exists()
    assert jr.import_unrecorded() == 1 and jr.get("s0", "t", "h").status == "ok"


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("error", {"x": 1}, "field 'error' must be a string or null"),
        ("misreport", [1], "field 'misreport' must be a string or null"),
        ("error_kind", 3, "field 'error_kind' must be a string or null"),
        ("cost_usd", "0.1", "field 'cost_usd' must be a finite number"),
        ("intent_ids", [1, "2"], "field 'intent_ids' must be a list of integers"),
        ("charges", [-1], "field 'charges' must be a list of numbers >= 0"),
        ("surprise", 1, "unknown field 'surprise'"),
    ],
)
def test_a_saved_answer_of_the_wrong_shape_is_named_by_file_and_line(tmp_path, field, value,
                                                                     message):  # fmt: skip
    jr = Journal(tmp_path / "j.db")
    good = orjson.dumps({**_rec(0).__dict__, "intent_ids": [], "charges": []})
    obj = {**_rec(1).__dict__, "intent_ids": [], "charges": [], field: value}
    jr.unrecorded_path.write_bytes(good + b"\n" + orjson.dumps(obj) + b"\n")
    with pytest.raises(JournalError, match=rf"unrecorded\.jsonl:2: {message}"):
        jr.import_unrecorded()
    assert list(jr.calls()) == [] and jr.unrecorded_path.exists()


def test_a_path_under_a_file_is_a_journal_error(tmp_path):
    (tmp_path / "states.jsonl").write_text("{}\n")
    with pytest.raises(JournalError, match="cannot create its directory"):
        Journal(tmp_path / "states.jsonl" / "r.db")
