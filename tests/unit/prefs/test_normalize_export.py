"""Normalization filters (each reports its drops), MinHash near-dup removal, the TRL export, the
journal -> pairs path, and the one-call replay_and_normalize_trace."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from support.scripted_openai import Script, ServerThread, make_app
from support.scripted_openai import synthetic_states as make_states

from composer_replication.config import RemoteTeacherConfig
from composer_replication.prefs.agreement import DPOPair
from composer_replication.prefs.export import (
    export_pairs,
    pairs_from_journal,
    replay_and_normalize_trace,
)
from composer_replication.prefs.normalize import (
    NormalizeConfig,
    normalize_pairs,
    special_char_ratio,
)


def _pair(i: int, chosen: dict, rejected: dict | None = None) -> DPOPair:
    return DPOPair(
        state_id=f"s{i}", state_messages=[{"role": "user", "content": f"q{i}"}], chosen=chosen,
        rejected=rejected or {"role": "assistant", "content": "agent"}, n_teachers_agreeing=2,
        teachers=["a", "b"], cost=0.01, n_teachers=3,
    )  # fmt: skip


def _t(text: str) -> dict:
    return {"role": "assistant", "content": text}


def test_each_filter_reports_its_drops():
    """7 pairs: 1 empty (length), 1 of one word (words, min 2), 1 mostly symbols (special),
    2 near-identical long texts (1 near-dup), 2 distinct good ones."""
    base = "the quick brown fox jumps over the lazy dog near the river bank today"
    pairs = [
        _pair(0, _t("")),
        _pair(1, _t("hello")),
        _pair(2, _t("{{{ ### $$$ !!! ))) ((( %%% ^^^ a b")),
        _pair(3, _t(base)),
        _pair(4, _t(base + "!")),
        _pair(5, _t("run the unit tests then fix the failing import in utils")),
        _pair(6, {"role": "assistant", "content": "",
                  "tool_calls": [{"id": "1", "type": "function",
                                  "function": {"name": "bash", "arguments": '{"cmd": "pytest -x tests"}'}}]}),
    ]  # fmt: skip
    cfg = NormalizeConfig(min_chars=1, min_words=2, max_special_char_ratio=0.4)
    kept, report = normalize_pairs(pairs, cfg)
    assert report.dropped == {"text_length": 1, "word_count": 1, "special_char_ratio": 1,
                              "minhash_near_dup": 1}  # fmt: skip
    assert [p.state_id for p in kept] == ["s3", "s5", "s6"] and report.kept == 3
    assert "7 pairs -> 3 kept" in report.summary()
    kept, report = normalize_pairs(pairs, cfg.model_copy(update={"dedup": False}))
    assert "minhash_near_dup" not in report.dropped and len(kept) == 4


def test_special_char_ratio_and_config_validation():
    assert special_char_ratio("ab!!") == 0.5 and special_char_ratio("") == 0.0
    with pytest.raises(ValueError, match="min_chars"):
        NormalizeConfig(min_chars=10, max_chars=5)
    with pytest.raises(ValueError):
        NormalizeConfig(colour=1)


def test_export_trl_conversational_format(tmp_path):
    tool_chosen = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]}  # fmt: skip
    pairs = [_pair(0, _t("fix it")), _pair(1, tool_chosen)]
    ds = export_pairs(pairs, tmp_path / "text")
    assert {"prompt", "chosen", "rejected", "state_id", "teachers", "cost_usd"} <= set(
        ds.column_names
    )
    assert ds[1]["chosen"] == [
        {
            "role": "assistant",
            "content": '<tool_call>\n{"name": "ls", "arguments": {}}\n</tool_call>',
        }
    ]
    assert orjson.loads(ds[1]["chosen_json"]) == tool_chosen
    lines = (tmp_path / "text" / "pairs.jsonl").read_bytes().splitlines()
    assert [orjson.loads(x)["state_id"] for x in lines] == ["s0", "s1"]
    from datasets import load_from_disk

    assert load_from_disk(str(tmp_path / "text" / "dataset")).num_rows == 2
    ds = export_pairs(pairs, tmp_path / "openai", tool_format="openai")
    assert ds[1]["chosen"][0]["tool_calls"][0]["function"]["name"] == "ls"
    assert export_pairs([], tmp_path / "empty").num_rows == 0


def test_replay_and_normalize_in_one_call(tmp_path):
    """Scripted server: t0 and t1 agree (same model name), so every state with an answer yields
    a pair (the synthetic agent said something else)."""
    script = Script()
    states = make_states(6)
    with ServerThread(make_app(script)) as srv:
        specs = [RemoteTeacherConfig(name=f"t{i}", base_url=srv.base_url, model="same", max_tokens=8,
                             price_in_per_mtok=1, price_out_per_mtok=1) for i in range(2)]  # fmt: skip
        result, pairs = asyncio.run(replay_and_normalize_trace(
            states, specs, journal=tmp_path / "r.db", budget_usd=1.0, out_dir=tmp_path / "out",
            normalize=NormalizeConfig(dedup=False),
        ))  # fmt: skip
    assert result.states_completed == 6
    assert pairs.agreement.pairs == 6 and len(pairs.pairs) == 6 and pairs.dataset.num_rows == 6
    assert all(p.cost > 0 and p.teachers == ["t0", "t1"] for p in pairs.pairs)
    again = pairs_from_journal(tmp_path / "r.db", agreement_threshold=3)
    assert again.agreement.no_consensus == 6 and again.pairs == []
    with pytest.raises(FileNotFoundError, match="replay journal not found"):
        pairs_from_journal(tmp_path / "missing.db")
    (tmp_path / "r.db.unrecorded.jsonl").write_bytes(b"{}\n")  # answers a replay could not journal
    with pytest.warns(UserWarning, match="not in these pairs: run the same replay again"):
        pairs_from_journal(tmp_path / "r.db", agreement_threshold=3)


def test_pairs_skip_states_with_an_incomplete_context(tmp_path):
    """Issue 57: a state marked ``context_complete: false`` (an encrypted compaction, thinking
    not logged) makes no pair by default; ``include_incomplete`` keeps it."""
    script = Script()
    states = make_states(4)
    states[1].meta.context_complete = False
    states[1].meta.context_note = "encrypted_compaction"
    with ServerThread(make_app(script)) as srv:
        specs = [RemoteTeacherConfig(name=f"t{i}", base_url=srv.base_url, model="same", max_tokens=8,
                             price_in_per_mtok=1, price_out_per_mtok=1) for i in range(2)]  # fmt: skip
        _, pairs = asyncio.run(replay_and_normalize_trace(
            states, specs, journal=tmp_path / "r.db", budget_usd=1.0,
            normalize=NormalizeConfig(dedup=False),
        ))  # fmt: skip
    skipped = states[1].state_id
    assert len(pairs.pairs) == 3 and skipped not in {p.state_id for p in pairs.pairs}
    every = pairs_from_journal(tmp_path / "r.db", normalize=NormalizeConfig(dedup=False),
                               include_incomplete=True)  # fmt: skip
    assert len(every.pairs) == 4
