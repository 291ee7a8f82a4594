"""Teacher pool YAML validation, Retry-After parsing, backoff, response parsing, and the OpenAI
SDK client's retries against the scripted HTTP server."""

from __future__ import annotations

import asyncio
import email.utils
import time
from pathlib import Path

import httpx
import orjson
import pytest
from support.scripted_openai import ask_teacher

from composer_replication.config import PoolError, RemoteTeacherConfig, load_pool
from composer_replication.teachers.chat import OpenAITeacher, parse_completion
from composer_replication.teachers.edge import TeacherError, backoff_delay, parse_retry_after

REPO = Path(__file__).resolve().parents[3]

POOL = """
teachers:
  - name: a
    base_url: http://127.0.0.1:9/v1
    model: m
    price_in_per_mtok: 1.5
    price_out_per_mtok: 6
    max_tokens: 16
    temperature: 0.7
    max_concurrency: 3
    timeout_s: 5
    tier: 1
  - {name: b, base_url: "https://openrouter.ai/api/v1", model: x/y, api_key_env: MY_KEY}
"""


def test_pool_yaml_fields(tmp_path):
    p = tmp_path / "pool.yaml"
    p.write_text(POOL)
    pool = load_pool(p)
    a, b = pool.teachers
    assert (a.name, a.price_in_per_mtok, a.max_concurrency, a.tier, a.temperature) == (
        "a", 1.5, 3, 1, 0.7,
    )  # fmt: skip
    assert b.api_key_env == "MY_KEY" and b.tier == 0
    assert a.cost_usd(1_000_000, 500_000) == pytest.approx(1.5 + 3.0)


@pytest.mark.parametrize(
    ("yaml_text", "needle"),
    [
        ("teachers:\n  - {name: a, base_url: http://x/v1, model: m, price_in_per_mtok: -1}\n",
         "teachers.0.price_in_per_mtok"),
        ("teachers:\n  - {name: a, base_url: http://x/v1, model: m, colour: red}\n",
         "teachers.0.colour"),
        ("teachers:\n  - {name: a, base_url: ftp://x, model: m}\n", "teachers.0"),
        ("teachers:\n  - {name: a, base_url: http://x/v1, model: m}\n"
         "  - {name: a, base_url: http://x/v1, model: n}\n", "duplicate teacher names"),
        ("teachers: []\n", "teachers"),
        ("teachers: [\n", "not valid YAML"),
        ("teachers:\n  - {name: a, base_url: http://x/v1, model: m, api_key_env: 'sk-abc def'}\n",
         "teachers.0.api_key_env"),
        # strict types: a quoted number or a boolean is no count (both were coerced)
        ("teachers:\n  - {name: a, base_url: http://x/v1, model: m, max_tokens: '12'}\n",
         "teachers.0.max_tokens: Input should be a valid integer"),
        ("teachers:\n  - {name: a, base_url: http://x/v1, model: m, tier: true}\n",
         "teachers.0.tier: Input should be a valid integer"),
    ],
)  # fmt: skip
def test_pool_errors_name_file_and_field(tmp_path, yaml_text, needle):
    p = tmp_path / "bad.yaml"
    p.write_text(yaml_text)
    with pytest.raises(PoolError) as ei:
        load_pool(p)
    assert str(p) in str(ei.value) and needle in str(ei.value)


def test_shipped_pools_parse_and_hold_no_keys():
    files = sorted((REPO / "configs" / "teachers").glob("*.yaml"))
    assert len(files) >= 2
    for f in files:
        pool = load_pool(f)
        text = f.read_text()
        assert "sk-" not in text and "api_key:" not in text
        for t in pool.teachers:
            if t.base_url.startswith("https://"):
                assert t.api_key_env, f"{f}: remote teacher {t.name} needs api_key_env"


def test_missing_key_env_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("NOPE_KEY", raising=False)
    spec = RemoteTeacherConfig(name="r", base_url="https://example.invalid/v1", model="m",
                       api_key_env="NOPE_KEY")  # fmt: skip
    with pytest.raises(PoolError, match="NOPE_KEY is not set"):
        OpenAITeacher(spec)


def test_retry_after_parsing():
    assert parse_retry_after(httpx.Headers({"retry-after": "3"})) == 3.0
    assert parse_retry_after(httpx.Headers({"retry-after-ms": "250"})) == 0.25
    future = email.utils.formatdate(time.time() + 10, usegmt=True)
    assert 8 <= parse_retry_after(httpx.Headers({"retry-after": future})) <= 10.5
    assert parse_retry_after(httpx.Headers({"retry-after": "soon"})) is None
    assert parse_retry_after(httpx.Headers({})) is None


def test_backoff_is_jittered_exponential_and_honours_retry_after():
    for attempt in range(6):
        d = [backoff_delay(attempt, None, base=0.5, cap=4) for _ in range(200)]
        assert 0 <= min(d) and max(d) <= min(4, 0.5 * 2**attempt)
        assert len(set(d)) > 100  # jitter
    assert backoff_delay(0, 3.0, base=0.5, cap=4) >= 3.0
    assert backoff_delay(0, 1e9, base=0.5, cap=4) <= 4  # Retry-After never waits past the cap


def test_parse_completion_rejects_malformed():
    ok = parse_completion(
        b'{"choices":[{"message":{"content":"hi","tool_calls":[{"id":"1","type":"function",'
        b'"function":{"name":"f","arguments":{"a":1}}}]},"finish_reason":"stop"}],'
        b'"usage":{"prompt_tokens":3,"completion_tokens":2}}'
    )
    assert ok.text == "hi" and ok.prompt_tokens == 3 and ok.completion_tokens == 2
    assert ok.tool_calls[0]["function"]["arguments"] == '{"a":1}'
    no_id = parse_completion(
        b'{"choices":[{"message":{"content":"","tool_calls":[{"id":null,"type":"function",'
        b'"function":{"name":"f","arguments":"{}"}}]}}]}'
    )
    assert no_id.tool_calls[0]["id"] == ""
    for bad in (
        b'{"choices": [',
        b"{}",
        b'{"choices": []}',
        b"[1]",
        b'{"choices":[{"message":1}]}',
        # a non-string tool-call id broke `pairs --tool-format openai` after pairs.jsonl
        b'{"choices":[{"message":{"content":"","tool_calls":[{"id":7,"type":"function",'
        b'"function":{"name":"f","arguments":"{}"}}]}}]}',
    ):
        with pytest.raises(TeacherError) as ei:
            parse_completion(bad)
        assert ei.value.kind == "malformed" and not ei.value.retryable


def _spec(base_url: str, **kw) -> RemoteTeacherConfig:
    kw = {"timeout_s": 0.5, "backoff_base_s": 0.01, "backoff_cap_s": 0.05, **kw}
    return RemoteTeacherConfig(name="t", base_url=base_url, model="m", max_tokens=8, **kw)


def test_client_retries_429_and_500_then_succeeds(scripted):
    script, url = scripted
    script.p429, script.p500 = 0.45, 0.45
    sleeps: list[float] = []

    async def fake_sleep(s: float) -> None:
        sleeps.append(s)

    async def go():
        # no attempt may time out (this test counts 429/500 retries: a busy machine once let a
        # 0.5 s attempt expire before the server had counted it)
        t = OpenAITeacher(_spec(url, max_retries=30, timeout_s=30.0), sleep=fake_sleep)
        try:
            return [await t.complete([{"role": "user", "content": f"q{i}"}]) for i in range(6)]
        finally:
            await t.aclose()

    out = asyncio.run(go())
    assert all(r.text.startswith("Answer ") for r in out)
    assert sum(r.attempts for r in out) == sum(script.requests.values())
    assert sum(r.attempts - 1 for r in out) == len(sleeps) > 0


def test_client_honours_retry_after_header(scripted):
    script, url = scripted
    script.p429, script.retry_after = 1.0, "2"  # every attempt: 429 with Retry-After: 2
    error, sleeps = _failing_call_with_recorded_sleeps(
        url, max_retries=2, backoff_cap_s=5, timeout_s=30
    )
    assert error.kind == "rate_limit" and error.attempts == 3
    assert sleeps and all(s >= 2.0 for s in sleeps)


def _failing_call_with_recorded_sleeps(url: str, **spec) -> tuple[TeacherError, list[float]]:
    """One completion that must fail; the error and every back-off sleep it asked for
    (``timeout_s`` long enough that a loaded machine never turns a 429 into a timeout)."""
    sleeps: list[float] = []

    async def fake_sleep(s: float) -> None:
        sleeps.append(s)

    with pytest.raises(TeacherError) as ei:
        ask_teacher(_spec(url, **spec), sleep=fake_sleep)
    return ei.value, sleeps


def test_retry_after_longer_than_the_backoff_cap_fails_fast_and_says_so(scripted):
    """``Retry-After: 1000000000`` used to sleep 300 s per retry in silence: a wait longer than
    ``backoff_cap_s`` is not slept; the call fails at once (transient: a re-run retries it) with
    the requested wait in its message."""
    script, url = scripted
    script.p429, script.retry_after = 1.0, "1000000000"
    error, sleeps = _failing_call_with_recorded_sleeps(
        url, max_retries=5, backoff_cap_s=0.2, timeout_s=30
    )
    assert error.kind == "rate_limit" and error.retryable and error.attempts == 1
    assert "asked to wait 1e+09 s (Retry-After), more than backoff_cap_s=0.2 s" in str(
        error.message
    )
    assert sleeps == []


def test_client_times_out_and_reports_malformed(scripted):
    script, url = scripted

    script.phang, script.hang_s = 1.0, 2.0
    with pytest.raises(TeacherError) as ei:
        ask_teacher(_spec(url, max_retries=1, timeout_s=0.2))
    assert ei.value.kind == "timeout" and ei.value.attempts == 2
    script.phang, script.pinvalid = 0.0, 1.0
    with pytest.raises(TeacherError) as ei:
        ask_teacher(_spec(url, max_retries=3))
    assert ei.value.kind == "malformed" and ei.value.attempts == 1  # not retried


def test_connection_refused_is_retried_then_reported():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now

    # refused at once; 30 s per attempt so a loaded machine's slow first attempt (the client's
    # set-up) is not a timeout (it was, once, at 0.5 s)
    with pytest.raises(TeacherError) as ei:
        ask_teacher(_spec(f"http://127.0.0.1:{port}/v1", max_retries=2, timeout_s=30))
    assert ei.value.kind == "connection" and ei.value.attempts == 3


def test_answer_from_another_model_or_with_several_choices_is_flagged():
    """A response for another model, or with 5 choices when one was asked, was accepted
    silently: it is kept (the first choice) and flagged; a dated or provider-prefixed name of
    the requested model is not."""

    def body(model: str, n: int = 1) -> bytes:
        choice = {"message": {"content": "hi"}, "finish_reason": "stop"}
        return orjson.dumps({"model": model, "choices": [choice] * n})

    assert parse_completion(body("gpt-4o-2024-08-06"), "openai/gpt-4o").anomalies == []
    odd = parse_completion(body("gpt-evil", n=5), "m")
    assert odd.text == "hi"
    assert odd.anomalies == ["answered by model 'gpt-evil' (asked 'm')",
                             "5 choices (1 asked; the first is used)"]  # fmt: skip


@pytest.mark.parametrize(
    ("served", "asked", "flagged"),
    [
        ("gpt-4o-2024-08-06", "gpt-4o", False),
        ("GPT-4o", "openai/gpt-4o", False),
        ("claude-3-5-sonnet-20241022", "claude-3-5-sonnet", False),
        ("llama3:latest", "llama3", False),
        ("gpt-4o-mini", "gpt-4o", True),  # a cheaper sibling shares the prefix
        ("gpt-4", "openai/gpt-4o", True),  # a prefix of the name asked for
        ("claude-3", "claude-3-5-sonnet", True),
        ("qwen", "qwen2.5-coder-32b", True),
        ("", "gpt-4o", True),  # an empty name is no model
        (7, "gpt-4o", True),
    ],
)
def test_only_the_model_asked_for_up_to_a_date_or_revision_is_unflagged(served, asked, flagged):
    choice = {"message": {"content": "hi"}, "finish_reason": "stop"}
    resp = parse_completion(orjson.dumps({"model": served, "choices": [choice]}), asked)
    assert bool(resp.anomalies) is flagged, resp.anomalies
