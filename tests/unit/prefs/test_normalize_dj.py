"""The data-juicer backend (`DJNormalizer`) against the native one on the 24 embedded fixture
pairs plus planted cases: identical length filter, the documented word/special-character
relations, planted near-duplicates dropped by both, the missing-extra error, and the CLI path.

The data-juicer tests skip (with the install command as the reason) only when data-juicer is
not importable; it is in the ``dev`` extra, so CI runs them."""

from __future__ import annotations

import re
import string
import sys
from pathlib import Path

import orjson
import pytest
import typer
from typer.testing import CliRunner

from composer_replication.cli.replay import pairs_command
from composer_replication.prefs.agreement import DPOPair
from composer_replication.prefs.export import normalize_with_backend
from composer_replication.prefs.normalize import (
    NormalizeConfig,
    NormalizeReport,
    answer_text,
    normalize_pairs,
    special_char_ratio,
)

FIXTURE = Path(__file__).resolve().parents[3] / "src/composer_replication/data"
NO_FILTERS = {"min_chars": 0, "min_words": 0, "max_special_char_ratio": 1.0}
# data-juicer's special characters on printable ASCII: punctuation, digits, whitespace
DJ_ASCII_SPECIAL = set(string.punctuation + string.digits + string.whitespace)


def _pair(sid: str, chosen: dict) -> DPOPair:
    return DPOPair(sid, [{"role": "user", "content": sid}], chosen,
                   {"role": "assistant", "content": "agent"}, 2, ["a", "b"], cost=0.01)  # fmt: skip


def _t(text: str) -> dict:
    return {"role": "assistant", "content": text}


def fixture_pairs() -> list[DPOPair]:
    """The shipped pairs (chosen = the original OpenAI message) plus edge cases."""
    pairs = []
    for i, line in enumerate((FIXTURE / "fixture_replay_pairs.jsonl").read_bytes().splitlines()):
        pairs.append(_pair(f"f{i}", orjson.loads(orjson.loads(line)["chosen_json"])))
    extra = ["", "ok", "hello there", "--- ### 42 1234 ...", "x = 1 + 2 # 3 4 5 6",
             "ls -la ./src && cat README.md | head -20", "The END.  Really.\tDone\n\n- done"]  # fmt: skip
    return pairs + [_pair(f"e{i}", _t(t)) for i, t in enumerate(extra)]


@pytest.fixture(scope="module")
def dj():
    """data-juicer imported once for the module (the import takes seconds)."""
    pytest.importorskip(
        "data_juicer",
        reason="data-juicer not installed: pip install 'composer-replication[datajuicer]'",
    )
    from composer_replication.prefs.normalize_dj import DJNormalizer

    return DJNormalizer


def _pairs_cli(args: list[str]):
    """`pairs_command` as a one-command typer app (invoked without the command name)."""
    app = typer.Typer()
    app.command()(pairs_command)
    return CliRunner().invoke(app, args)


def _ids(pairs: list[DPOPair]) -> list[str]:
    return [p.state_id for p in pairs]


def _dj_words(text: str) -> int:
    """Documented relation for printable ASCII without \\r, \\v, \\f: a token counts only if it
    has a character outside punctuation, digits and whitespace, i.e. a letter."""
    return sum(1 for tok in re.findall(r"\S+", text) if set(tok) - DJ_ASCII_SPECIAL)


def _dj_special(text: str) -> float:
    """Documented relation for printable ASCII: native ratio + (digits + whitespace) / len."""
    extra = sum(ch.isdigit() or ch.isspace() for ch in text)
    return special_char_ratio(text) + (extra / len(text) if text else 0.0)


def test_length_filter_identical(dj):
    pairs = fixture_pairs()
    for lo, hi in [(1, 20_000), (60, 100)]:
        cfg = NormalizeConfig(**{**NO_FILTERS, "min_chars": lo}, max_chars=hi, dedup=False)
        kept_n, rep_n = normalize_pairs(pairs, cfg)
        kept_d, rep_d = dj(cfg)(pairs)
        assert _ids(kept_d) == _ids(kept_n) and rep_d.dropped == rep_n.dropped
        assert rep_d.dropped["text_length"] > 0 and rep_d.summary() == rep_n.summary()


def test_dj_statistics_follow_the_documented_relation(dj):
    """text_len equal; num_words <= native, equal to the letter-token count; special ratio =
    native + (digits + whitespace) / len (data-juicer stores it at 10 decimals)."""
    pairs = fixture_pairs()
    texts = [answer_text(p.chosen) for p in pairs]
    assert all(set(t) <= set(string.printable) - set("\r\x0b\x0c") for t in texts)
    stats = dj(NormalizeConfig(dedup=False)).stats(pairs)
    assert [s["text_len"] for s in stats] == [len(t) for t in texts]
    native_words = [len(t.split()) for t in texts]
    assert [s["num_words"] for s in stats] == [_dj_words(t) for t in texts]
    assert all(s["num_words"] <= n for s, n in zip(stats, native_words, strict=True))
    assert sum(s["num_words"] < n for s, n in zip(stats, native_words, strict=True)) >= 3
    for s, t in zip(stats, texts, strict=True):
        assert s["special_char_ratio"] == pytest.approx(_dj_special(t), abs=1e-9)


def test_word_and_special_filters_drop_by_the_documented_relation(dj):
    """Same thresholds, different statistics: data-juicer keeps exactly the pairs that pass on
    `_dj_words` / `_dj_special`, and here that differs from native (more drops)."""
    pairs = fixture_pairs()
    texts = {p.state_id: answer_text(p.chosen) for p in pairs}
    cases = [({"min_words": 5}, "word_count", lambda t: 5 <= _dj_words(t)),
             ({"max_special_char_ratio": 0.25}, "special_char_ratio",
              lambda t: _dj_special(t) <= 0.25)]  # fmt: skip
    for update, key, keep in cases:
        cfg = NormalizeConfig(**{**NO_FILTERS, **update}, dedup=False)
        kept_d, rep_d = dj(cfg)(pairs)
        _, rep_n = normalize_pairs(pairs, cfg)
        assert _ids(kept_d) == [p.state_id for p in pairs if keep(texts[p.state_id])]
        assert rep_d.dropped[key] == len(pairs) - len(kept_d) > rep_n.dropped[key]


def test_planted_near_duplicates_dropped_by_both(dj):
    """Three copies planted after their originals (upper-cased, one '!' appended, one '?'
    appended): both backends drop exactly those; the fixture has no other near-duplicates."""
    pairs = [p for p in fixture_pairs() if p.state_id.startswith("f")]
    base = {p.state_id: answer_text(p.chosen) for p in pairs}
    planted = [_pair("dup0", _t(base["f0"].upper())), _pair("dup2", _t(base["f2"] + "!")),
               _pair("dup10", _t(base["f10"] + "?"))]  # fmt: skip
    cfg = NormalizeConfig(**NO_FILTERS)
    for kept, rep in (normalize_pairs(pairs + planted, cfg), dj(cfg)(pairs + planted)):
        assert _ids(kept) == _ids(pairs) and rep.dropped["minhash_near_dup"] == 3


def test_dj_texts_shorter_than_a_shingle_are_all_duplicates(dj):
    """Documented difference: data-juicer gives a text shorter than ``shingle_size`` no
    shingles, so distinct short texts collide; native shingles them whole and keeps both."""
    pairs = [_pair("a", _t("yes")), _pair("b", _t("no")), _pair("c", _t("run the tests now"))]
    cfg = NormalizeConfig(**NO_FILTERS)
    assert _ids(normalize_pairs(pairs, cfg)[0]) == ["a", "b", "c"]
    assert _ids(dj(cfg)(pairs)[0]) == ["a", "c"]


def test_backend_option_and_report_shape(dj):
    pairs = fixture_pairs()
    cfg = NormalizeConfig(min_words=2, backend="datajuicer")
    kept, rep = normalize_with_backend(pairs, cfg)
    assert list(rep.dropped) == ["text_length", "word_count", "special_char_ratio",
                                 "minhash_near_dup"]  # fmt: skip
    assert rep.input == len(pairs) and rep.kept == len(kept)
    assert rep.kept == len(pairs) - sum(rep.dropped.values())
    assert rep.dropped["text_length"] == 1  # the empty answer
    empty = normalize_with_backend([], cfg)
    assert empty == ([], NormalizeReport(0, 0, dict.fromkeys(rep.dropped, 0)))
    _, rep = normalize_with_backend(pairs, cfg.model_copy(update={"dedup": False}))
    assert "minhash_near_dup" not in rep.dropped
    with pytest.raises(ValueError, match="backend"):
        NormalizeConfig(backend="spark")


def test_the_caller_picks_the_backend():
    """`normalize_pairs` is the native engine and refuses a data-juicer config rather than
    running the other recipe; `normalize_with_backend` with ``native`` is exactly it."""
    pairs = fixture_pairs()
    with pytest.raises(ValueError, match="native backend, the config asks for 'datajuicer'"):
        normalize_pairs(pairs, NormalizeConfig(backend="datajuicer"))
    cfg = NormalizeConfig(min_words=2)
    kept, rep = normalize_with_backend(pairs, cfg)
    assert (_ids(kept), rep) == (
        _ids(normalize_pairs(pairs, cfg)[0]),
        normalize_pairs(pairs, cfg)[1],
    )
    assert rep.dropped["word_count"] > 0


def test_missing_data_juicer_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "data_juicer", None)  # import raises ImportError
    cfg = NormalizeConfig(backend="datajuicer")
    with pytest.raises(ImportError, match=r"pip install 'composer-replication\[datajuicer\]'"):
        normalize_with_backend([_pair("a", _t("hello world"))], cfg)
    args = ["missing.db", "--out", "o", "--normalize-backend"]
    r = _pairs_cli([*args, "datajuicer"])
    assert r.exit_code == 2 and "composer-replication[datajuicer]" in " ".join(r.output.split())
    r = _pairs_cli([*args, "spark"])
    assert r.exit_code == 2 and "native or datajuicer" in r.output


def test_cli_pairs_with_datajuicer_backend(dj, tmp_path):
    """A journal written directly (two teachers agreeing per state), then `pairs
    --normalize-backend datajuicer`: the summary reports data-juicer's drops."""
    from support.scripted_openai import synthetic_states

    from composer_replication.replay.journal import CallRecord, Journal

    answers = ["run the unit tests and then fix the failing import in utils",
               "RUN THE UNIT TESTS AND THEN FIX THE FAILING IMPORT IN UTILS", "ok",
               "open the config file and raise the timeout to thirty seconds"]  # fmt: skip
    states = synthetic_states(len(answers))
    with Journal(tmp_path / "r.db") as jr:
        jr.add_states(states)
        for s, text in zip(states, answers, strict=True):
            for t in ("t0", "t1"):
                jr.record(CallRecord(s.state_id, t, "h", "ok", _t(text), cost_usd=0.001))
    r = _pairs_cli([str(tmp_path / "r.db"), "--out", str(tmp_path / "p"), "--no-embeddings",
                    "--min-words", "2", "--normalize-backend", "datajuicer"])  # fmt: skip
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())
    assert "normalize: 4 pairs -> 2 kept" in out and "word_count -1" in out
    assert "minhash_near_dup -1" in out
    assert len((tmp_path / "p" / "pairs.jsonl").read_text().splitlines()) == 2
