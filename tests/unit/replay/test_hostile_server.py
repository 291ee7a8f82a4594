"""Replay against a misbehaving server (issue 18): every attempt has an overall deadline."""

from __future__ import annotations

import asyncio
import time

import pytest

from composer_replication.replay.teachers import OpenAITeacher, TeacherError, TeacherSpec


def _spec(url: str, **kw) -> TeacherSpec:
    return TeacherSpec(name="t", base_url=url, model="m", **kw)


async def _no_sleep(_s: float) -> None:
    return None


def _ask(url: str, **kw):
    async def go():
        t = OpenAITeacher(_spec(url, **kw), sleep=_no_sleep)
        try:
            return await t.complete([{"role": "user", "content": "q"}])
        finally:
            await t.aclose()

    return asyncio.run(go())


def test_drip_body_ends_within_deadline_as_retryable_timeout(scripted):
    """Each byte arrives well within the read timeout (50 ms apart), so only an overall deadline
    stops it: a ~300-byte body would take ~15 s; two 0.4 s attempts must end in ~1 s."""
    script, url = scripted
    script.drip_s = 0.05
    t0 = time.perf_counter()
    with pytest.raises(TeacherError) as ei:
        _ask(url, max_retries=1, timeout_s=0.4)
    elapsed = time.perf_counter() - t0
    assert ei.value.kind == "timeout" and ei.value.retryable and ei.value.attempts == 2
    assert "deadline" in str(ei.value)
    assert elapsed < 3.0, elapsed
    assert sum(script.requests.values()) == 2


def test_drip_body_inside_deadline_is_parsed(scripted):
    """A slow but finite streamed body that completes within the deadline is a normal answer."""
    script, url = scripted
    script.drip_s = 0.001
    resp = _ask(url, max_retries=0, timeout_s=20)
    assert resp.text.startswith("Answer ") and resp.attempts == 1
