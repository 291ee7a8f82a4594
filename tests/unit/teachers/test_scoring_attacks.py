"""A teacher server's ``prompt_logprobs`` answer is untrusted input: every answer that is not
vLLM's shape makes the row it spoils a malformed :class:`TeacherError` (the channel reports it
unscored), never an exception into the training step and never a number the losses would
turn into NaN or a negative divergence; the other rows of the same request are still scored.
Answers a real server sends (vLLM's -9999.0 for a token of probability 0, ``decoded_token``
keys, odd ``rank`` values, bfloat16 rounding) are read, not refused."""

from __future__ import annotations

import asyncio
import json
import math

import pytest
from fastapi import FastAPI
from fastapi.responses import Response
from support.scripted_openai import ServerThread

from composer_replication.config import ConfigError, RemoteTeacherConfig
from composer_replication.teachers.edge import TeacherError
from composer_replication.teachers.scoring import RemoteScorer, RowScores

SEQ = [5, 7, 9]
"""Each row: a 1-token prompt and two completion tokens (7, then 9)."""

FAULTS = {
    "id not a number": {"abc": {"logprob": -1.0}},
    "negative id": {"-5": {"logprob": -1.0}},
    "non-ascii digits": {"\u0663": {"logprob": -1.0}},
    "fractional id": {"9.0": {"logprob": -1.0}},
    "empty id": {"": {"logprob": -1.0}},
    "huge id": {"9" * 40: {"logprob": -1.0}},
    "positive logprob": {"9": {"logprob": 3.0}},
    "+inf logprob": {"9": {"logprob": math.inf}},
    "nan logprob": {"9": {"logprob": math.nan}},
    "bool logprob": {"9": {"logprob": True}},
    "string logprob": {"9": {"logprob": "-1.0"}},
    "nested logprob": {"9": {"logprob": [[-1.0]]}},
    "bare number": {"9": -0.5},
    "missing logprob": {"9": {"rank": 1}},
    "same id twice": {"9": {"logprob": -1.0}, "09": {"logprob": -2.0}},
    "mass above one": {"9": {"logprob": -0.1}, "4": {"logprob": -0.1}},
    "entry a list": [["9", -1.0]],
    "entry null": None,
}
"""What position 2 (token 9) of row 0 holds instead of a well-formed entry."""


def _entries(last) -> list:
    return [None, {"7": {"logprob": -1.0, "rank": 1}}, last]


def _app(first_row_last) -> FastAPI:
    """Two choices per request: row 0's last position is ``first_row_last``, row 1 is sane.
    The body is written with ``json.dumps`` (which writes NaN and Infinity as Python does)."""
    app = FastAPI()

    @app.post("/v1/completions")
    async def completions(req: dict):
        sane = {"9": {"logprob": -0.5, "rank": 1}, "4": {"logprob": -2.0, "rank": 2}}
        choices = [
            {"index": 0, "text": "", "prompt_logprobs": _entries(first_row_last)},
            {"index": 1, "text": "", "prompt_logprobs": _entries(sane)},
        ]
        return Response(json.dumps({"choices": choices}), media_type="application/json")

    return app


def _score(app: FastAPI, top_k: int = 2) -> tuple[list, RemoteScorer]:
    with ServerThread(app) as srv:
        spec = RemoteTeacherConfig(name="t", base_url=srv.base_url, model="m", top_k=top_k,
                                   rows_per_request=2, max_retries=0)  # fmt: skip
        scorer = RemoteScorer(spec)
        rows = asyncio.run(scorer.ascore([SEQ, SEQ], [1, 1], top_k, 0))
    return rows, scorer


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_malformed_position_fails_its_row_only(fault):
    rows, scorer = _score(_app(FAULTS[fault]))
    assert isinstance(rows[0], TeacherError) and rows[0].kind == "malformed", rows[0]
    assert "prompt_logprobs[2]" in rows[0].message
    assert isinstance(rows[1], RowScores) and rows[1].actual == [-1.0, -0.5]
    assert rows[1].top_ids[1] == [9, 4]
    assert scorer.stats.scored_rows == 1 and scorer.stats.failed_rows == 1


@pytest.mark.parametrize("zero", [-9999.0, -math.inf, -1e30])
def test_what_real_servers_send_is_read(zero):
    """Probability 0 (vLLM writes -9999.0; ``-Infinity``; anything below) is the sampled
    token's log-prob ``-inf`` (masked by the channel) and never a top-k entry (its
    ``0 * -inf`` would be NaN in the divergence); ``rank`` is ignored (order by log-prob)."""
    last = {
        "9": {"logprob": zero, "rank": "unknown", "decoded_token": "x"},
        "4": {"logprob": -3.0, "rank": None, "decoded_token": "y"},
        "2": {"logprob": -1.5, "rank": 7},
        "3": {"logprob": -1.5, "rank": [1]},
        "6": {"logprob": -9999.0, "rank": 49000},
    }
    rows, scorer = _score(_app(last), top_k=4)
    row = rows[0]
    assert isinstance(row, RowScores), row
    assert row.actual[1] == -math.inf
    assert row.top_ids[1] == [2, 3, 4] and row.top_logps[1] == [-1.5, -1.5, -3.0]
    assert scorer.stats.failed_rows == 0 and scorer.stats.scored_rows == 2


def test_rounding_is_read_and_only_rounding():
    """A log-prob a hair above 0 is read as 0; a bfloat16 server's top-k summing to ~1.01 is
    read; 1.05 is not."""
    rows, _ = _score(_app({"9": {"logprob": 1e-7}}))
    assert isinstance(rows[0], RowScores) and rows[0].actual[1] == 0.0
    bf16 = {"9": {"logprob": math.log(0.6)}, "4": {"logprob": math.log(0.41)}}  # 1.01
    rows, _ = _score(_app(bf16))
    assert isinstance(rows[0], RowScores)
    over = {"9": {"logprob": math.log(0.6)}, "4": {"logprob": math.log(0.45)}}  # 1.05
    rows, _ = _score(_app(over))
    assert isinstance(rows[0], TeacherError) and "sum to 1.05" in rows[0].message


UNREADABLE = {
    "nested past the JSON reader's recursion limit": b"[" * 100_000 + b"]" * 100_000,
    "choices not a list": b'{"choices": 5}',
    "index not a number": b'{"choices": [{"index": "zero", "prompt_logprobs": []}]}',
    "a row missing": b'{"choices": [{"index": 0, "prompt_logprobs": []}]}',
    "not json": b"\xff\xfe not json",
    "index past a float": b'{"choices": [{"index": 1e400, "prompt_logprobs": []}]}',
}


@pytest.mark.parametrize("body", UNREADABLE.values(), ids=UNREADABLE.keys())
def test_an_unreadable_answer_fails_every_row_of_the_request(body):
    app = FastAPI()

    @app.post("/v1/completions")
    async def completions(req: dict):
        return Response(body, media_type="application/json")

    rows, scorer = _score(app)
    assert all(isinstance(r, TeacherError) and r.kind == "malformed" for r in rows), rows
    assert scorer.stats.failed_rows == 2 and scorer.stats.failed_requests == 1
    assert scorer.stats.scored_tokens == 2 * len(SEQ)  # answered: billed all the same


def test_an_unforeseen_failure_fails_its_rows_and_a_config_error_stops_the_run(monkeypatch):
    async def broken(self, seqs):
        raise RuntimeError("something no rule foresaw")

    monkeypatch.setattr(RemoteScorer, "_post", broken)
    spec = RemoteTeacherConfig(name="t", base_url="http://127.0.0.1:9/v1", model="m")
    scorer = RemoteScorer(spec)
    rows = asyncio.run(scorer.ascore([SEQ, SEQ], [1, 1], 1, 0))
    assert all(isinstance(r, TeacherError) and r.kind == "other" for r in rows)
    assert "something no rule foresaw" in rows[0].message
    assert scorer.stats.failed_rows == 2 and scorer.stats.failed_requests == 1
    monkeypatch.undo()
    monkeypatch.delenv("CR_TEST_UNSET_KEY", raising=False)
    keyed = RemoteTeacherConfig(name="t", base_url="http://127.0.0.1:9/v1", model="m",
                                api_key_env="CR_TEST_UNSET_KEY")  # fmt: skip
    with pytest.raises(ConfigError, match="CR_TEST_UNSET_KEY is not set"):
        asyncio.run(RemoteScorer(keyed).ascore([SEQ], [1], 1, 0))
