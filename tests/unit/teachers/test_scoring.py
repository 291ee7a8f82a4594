"""Scoring teachers (teachers/scoring.py) and the ``prompt_logprobs`` protocol ``serve`` answers
(replay/server.py), over real HTTP on 127.0.0.1: the numbers are the model's own, the sampled
token is always reported with its true rank, bad requests are refused, a transient failure is
retried at the edge and a malformed answer becomes a per-row error, never a crash or a 0."""

from __future__ import annotations

import asyncio
import math

import httpx
import pytest
import torch
from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from support.scripted_openai import ServerThread

from composer_replication.config import RemoteTeacherConfig
from composer_replication.replay.server import create_app
from composer_replication.teachers.edge import TeacherError
from composer_replication.teachers.local_model import LocalChatModel
from composer_replication.teachers.scoring import (
    RemoteScorer,
    RowScores,
    parse_prompt_logprobs,
    tokenizer_fingerprint,
)


@pytest.fixture
def served(tokenizer, tiny_model):
    with ServerThread(
        create_app(LocalChatModel.from_objects(tiny_model, tokenizer), "tiny")
    ) as srv:
        yield srv.base_url, tiny_model


def test_prompt_logprobs_are_the_models_and_include_the_sampled_token(served, tokenizer):
    base_url, model = served
    ids = tokenizer("What is 2 + 3?")["input_ids"]
    body = {"model": "tiny", "prompt": [ids], "max_tokens": 1, "prompt_logprobs": 2}
    r = httpx.post(f"{base_url}/completions", json=body, timeout=60).json()
    (choice,) = r["choices"]
    entries = choice["prompt_logprobs"]
    assert entries[0] is None and len(entries) == len(ids)
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0], -1)
    for t in range(1, len(ids)):
        row, entry = logp[t - 1], entries[t]
        top = row.topk(2)
        for rank, (tid, lp) in enumerate(
            zip(top.indices.tolist(), top.values.tolist(), strict=True)
        ):
            assert entry[str(tid)]["rank"] == rank + 1
            assert entry[str(tid)]["logprob"] == pytest.approx(lp, abs=1e-5)
        actual = entry[str(ids[t])]  # always there, with its true rank
        assert actual["logprob"] == pytest.approx(float(row[ids[t]]), abs=1e-5)
        assert actual["rank"] == int((row > row[ids[t]]).sum()) + 1
    assert r["usage"]["prompt_tokens"] == len(ids)


def test_the_tokenizer_fingerprint_is_served(served, tokenizer):
    base_url, _ = served
    got = httpx.get(f"{base_url}/tokenizer", timeout=30).json()
    assert got == {"fingerprint": tokenizer_fingerprint(tokenizer), "vocab_size": len(tokenizer)}


@pytest.mark.parametrize(
    "body, status",
    [
        ({"prompt": [[1, 2]], "max_tokens": 2, "prompt_logprobs": 1}, 422),  # scoring only
        ({"prompt": [[1, 10**9]], "max_tokens": 1, "prompt_logprobs": 1}, 400),  # not a token
        ({"prompt": [[1, 2]], "max_tokens": 1, "model": "other"}, 404),
        ({"prompt": [[1, 2]], "max_tokens": 1, "stream": True}, 400),
    ],
)
def test_bad_scoring_requests_are_refused(served, body, status):
    base_url, _ = served
    assert httpx.post(f"{base_url}/completions", json=body, timeout=30).status_code == status


def test_parse_orders_by_logprob_and_flags_a_short_answer():
    entries = [None, {"7": {"logprob": -2.0, "rank": 2}, "3": {"logprob": -0.5, "rank": 1}}]
    row = parse_prompt_logprobs(entries, [5, 7], 1, top_k=2)
    assert row == RowScores(actual=[-2.0], top_ids=[[3, 7]], top_logps=[[-0.5, -2.0]])
    missing = parse_prompt_logprobs([None, {"3": {"logprob": -0.5, "rank": 1}}], [5, 7], 1, 1)
    assert math.isnan(missing.actual[0])  # the sampled token not reported: NaN, masked later
    with pytest.raises(TeacherError, match="malformed"):
        parse_prompt_logprobs([None], [5, 7], 1, 1)


def _flaky_app(fail_first: int, body: bytes | None = None) -> FastAPI:
    """503 for the first ``fail_first`` requests, then ``body`` (or a valid answer)."""
    app, calls = FastAPI(), []

    @app.post("/v1/completions")
    async def completions(req: dict):
        calls.append(req)
        if len(calls) <= fail_first:
            return JSONResponse({"error": "busy"}, status_code=503)
        if body is not None:
            return Response(body, media_type="application/json")
        choices = [
            {"index": i, "text": "", "prompt_logprobs": [None] + [
                {str(t): {"logprob": -1.0, "rank": 1}} for t in p[1:]]}
            for i, p in enumerate(req["prompt"])
        ]  # fmt: skip
        return {"choices": choices}

    app.state.calls = calls
    return app


def _scorer(url: str, **kw) -> RemoteScorer:
    spec = RemoteTeacherConfig(name="t", base_url=url, model="m", rows_per_request=2, **kw)
    return RemoteScorer(spec, sleep=lambda _s: asyncio.sleep(0))


def test_a_busy_server_is_retried_at_the_edge_and_rows_are_batched():
    app = _flaky_app(fail_first=1)
    with ServerThread(app) as srv:
        scorer = _scorer(srv.base_url, max_retries=2, max_concurrency=1)
        rows = asyncio.run(scorer.ascore([[1, 2, 3]] * 3, [1, 1, 1], 1, 0))
    assert all(isinstance(r, RowScores) and r.actual == [-1.0, -1.0] for r in rows)
    assert [len(c["prompt"]) for c in app.state.calls] == [2, 2, 1]  # 503, retried, then the rest
    first = app.state.calls[0]
    assert first["prompt_logprobs"] == 8 and first["max_tokens"] == 1 and first["model"] == "m"
    assert scorer.stats.requests == 3 and scorer.stats.scored_rows == 3


def test_failures_and_malformed_answers_become_per_row_errors():
    with ServerThread(_flaky_app(fail_first=10)) as srv:
        scorer = _scorer(srv.base_url, max_retries=1)
        rows = asyncio.run(scorer.ascore([[1, 2]] * 2, [1, 1], 1, 0))
    assert all(isinstance(r, TeacherError) and r.kind == "server" for r in rows)
    assert scorer.stats.failed_rows == 2
    with ServerThread(_flaky_app(0, body=b'{"choices": [{"index": 0}]}')) as srv:
        rows = asyncio.run(_scorer(srv.base_url).ascore([[1, 2]], [1], 1, 0))
    assert isinstance(rows[0], TeacherError) and rows[0].kind == "malformed"


def test_a_remote_teacher_whose_model_the_server_does_not_list_is_refused(served):
    """``model: tiny2`` on a server that lists ``tiny``: every scoring call would answer 404
    and the run would train without the channel, so it is refused before any model loads,
    with or without the tokenizer check; the right name and an empty one pass."""
    from composer_replication.config import ConfigError
    from composer_replication.lm.models import DEFAULT_MODEL
    from composer_replication.teachers.scoring import check_same_tokenizer

    base_url, _ = served
    for check in (True, False):
        wrong = RemoteTeacherConfig(name="t", base_url=base_url, model="tiny2",
                                    check_tokenizer=check)  # fmt: skip
        with pytest.raises(ConfigError) as info:
            check_same_tokenizer(DEFAULT_MODEL, [wrong])
        assert f"'t': model 'tiny2' is not served at {base_url} (GET /models lists ['tiny'])" in (
            str(info.value)
        )
    for name in ("tiny", ""):
        check_same_tokenizer(DEFAULT_MODEL, [RemoteTeacherConfig(name="t", base_url=base_url,
                                                                 model=name)])  # fmt: skip


def test_a_server_without_a_tokenizer_fingerprint_is_refused_unless_told(tokenizer):
    """A plain vLLM server has no ``GET /v1/tokenizer``: it is refused before any model loads,
    the message naming ``check_tokenizer=false``; with that set it is accepted."""
    from composer_replication.config import ConfigError
    from composer_replication.lm.models import DEFAULT_MODEL
    from composer_replication.teachers.scoring import check_same_tokenizer

    app = FastAPI()

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "plain", "object": "model"}]}

    with ServerThread(app) as srv:
        spec = RemoteTeacherConfig(name="v", base_url=srv.base_url, model="plain")
        with pytest.raises(ConfigError) as info:
            check_same_tokenizer(DEFAULT_MODEL, [spec])
        assert f"'v' reports no tokenizer fingerprint (GET {srv.base_url}/tokenizer)" in str(
            info.value
        )
        assert "set check_tokenizer=false" in str(info.value)
        check_same_tokenizer(DEFAULT_MODEL, [spec.model_copy(update={"check_tokenizer": False})])
