"""Replay against a misbehaving server (issue 18): every attempt has an overall deadline."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import typer
import yaml
from support.scripted_openai import Script, ServerThread, ask_teacher, make_app
from typer.testing import CliRunner

from composer_replication.cli.common import CHECK_FAILED
from composer_replication.cli.replay import replay_command
from composer_replication.config import RemoteTeacherConfig
from composer_replication.replay.journal import Journal, JournalBusy
from composer_replication.replay.replay import replay_trace
from composer_replication.teachers.edge import TeacherError

from .conftest import make_states

app = typer.Typer()
app.command("replay")(replay_command)
app.command("other")(lambda: None)  # two commands: typer keeps the "replay" subcommand name
runner = CliRunner()


def _spec(url: str, **kw) -> RemoteTeacherConfig:
    return RemoteTeacherConfig(name="t", base_url=url, model="m", **kw)


async def _no_sleep(_s: float) -> None:
    return None


def _ask(url: str, **kw):
    return ask_teacher(_spec(url, **kw), sleep=_no_sleep)


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
    assert elapsed < 6.0, elapsed  # broken: ~15 s; room for a loaded machine
    # never a third request; the server may not have counted the second one yet when the
    # client's deadline ended it (seen on a loaded machine), so the client's count is the proof
    assert sum(script.requests.values()) <= 2


def test_drip_body_inside_deadline_is_parsed(scripted):
    """A slow but finite streamed body that completes within the deadline is a normal answer."""
    script, url = scripted
    script.drip_s = 0.001
    resp = _ask(url, max_retries=0, timeout_s=20)
    assert resp.text.startswith("Answer ") and resp.attempts == 1


LYING_USAGE = {
    "string": ({"prompt_tokens": "many", "completion_tokens": "lots"}, False),
    "huge": ({"prompt_tokens": 10**30, "completion_tokens": 2**70}, False),
    "negative": ({"prompt_tokens": -(10**9), "completion_tokens": -5}, False),
    "missing": ({}, True),
    "over_max_tokens": ({"completion_tokens": 16 * 205}, False),
    "zero": ({"prompt_tokens": 0, "completion_tokens": 0}, False),  # too low: not free
}


@pytest.mark.parametrize("case", sorted(LYING_USAGE))
def test_lying_usage_never_overspends_under_concurrency_16(scripted, tmp_path, case):
    """Whatever usage the server reports, journaled spend stays <= budget, every billed count is
    within what was asked (0 <= completion <= max_tokens), the raw usage is journaled, and the
    teacher is flagged as misreporting in the summary. Runs 2 teachers x concurrency 16."""
    script, url = scripted
    script.usage_patch, script.no_usage = LYING_USAGE[case]
    states = make_states(40)
    specs = [
        RemoteTeacherConfig(name=f"t{i}", base_url=url, model=f"m{i}", price_in_per_mtok=2.0,
                    price_out_per_mtok=8.0, max_tokens=16, max_concurrency=16, timeout_s=5)
        for i in range(2)
    ]  # fmt: skip
    budget = 0.004
    with Journal(tmp_path / "j.db") as jr:
        r = asyncio.run(replay_trace(states, specs, journal=jr, budget_usd=budget))
        calls = list(jr.calls("ok"))
        spend = jr.spent_usd()
    assert calls and spend <= budget + 1e-12 and r.max_committed_usd <= budget + 1e-12
    assert all(0 <= c.completion_tokens <= 16 and c.prompt_tokens >= 0 for c in calls)
    assert all(c.cost_usd >= 0 and c.misreport for c in calls)
    if not script.no_usage:
        patched = next(iter(script.usage_patch))
        sent = script.usage_patch[patched]  # JSON ints past 64 bits come back as floats
        want = float(sent) if isinstance(sent, int) else sent
        assert all(c.raw_usage[patched] == want for c in calls)
    else:
        assert all(c.raw_usage is None for c in calls)
    assert sum(r.misreported_usage.values()) == len(calls)
    assert "misreported usage" in r.summary() and "'t0'" in r.summary()


def test_honest_usage_is_billed_as_reported(scripted, tmp_path):
    """An honest server is billed exactly as it reports and is not flagged."""
    script, url = scripted
    spec = RemoteTeacherConfig(name="t", base_url=url, model="m", price_in_per_mtok=1.0,
                       price_out_per_mtok=1.0, max_tokens=16, timeout_s=5)  # fmt: skip
    with Journal(tmp_path / "j.db") as jr:
        r = asyncio.run(replay_trace(make_states(3), [spec], journal=jr))
        calls = list(jr.calls("ok"))
    assert len(calls) == 3 and not r.misreported_usage
    assert all(c.completion_tokens == script.completion_tokens for c in calls)
    assert all(c.raw_usage["prompt_tokens"] == c.prompt_tokens for c in calls)
    assert all(c.misreport is None for c in calls)


def _cli_files(tmp_path, url: str, n: int, **teacher):
    sfile = tmp_path / "states.jsonl"
    sfile.write_bytes(b"".join(s.to_json() + b"\n" for s in make_states(n)))
    pool = tmp_path / "pool.yaml"
    spec = {"name": "t0", "base_url": url, "model": "m", "max_tokens": 8, **teacher}
    pool.write_text(yaml.safe_dump({"teachers": [spec]}))
    return ["replay", str(sfile), "--teachers", str(pool), "--budget-usd", "1",
            "--out", str(tmp_path / "r.db"), "--no-progress"]  # fmt: skip


def test_all_calls_failing_exits_1_and_counts_every_failed_state(scripted, tmp_path):
    """100% failures: exit code 1 (calls failed), and all 25 failed states are counted even though
    only 10 are listed."""
    script, url = scripted
    script.always_fail = 1.0
    r = runner.invoke(app, _cli_files(tmp_path, url, 25, max_retries=0))
    out = " ".join(r.output.split())
    assert r.exit_code == CHECK_FAILED == 1, r.output
    assert "failed states: 25 (server=25)" in out and "and 15 more failed states" in out
    assert len(re.findall(r"failed \S+: t0: server:", out)) == 10


def test_no_server_names_endpoint_and_rerun_retries_connection_failures(tmp_path):
    """Replay with nothing listening: exit 1, the summary names the URL; after the server starts,
    the same command sends every call again and succeeds (exit 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    args = _cli_files(tmp_path, url, 3, max_retries=0)
    r = runner.invoke(app, args)
    out = " ".join(r.output.split())
    assert r.exit_code == 1, r.output
    assert f"could not connect to {url}" in out and "failed connections are retried" in out
    with ServerThread(make_app(Script()), port=port):
        r = runner.invoke(app, args)
    out = " ".join(r.output.split())
    assert r.exit_code == 0, r.output
    assert "states: 3 total, 3 completed" in out and "calls: 3 sent" in out


def test_intent_left_by_a_killed_run_is_reported_as_maybe_paid_twice(scripted, tmp_path):
    """A run killed between send and record leaves its intent: the next run reports the call as
    possibly paid twice, sends it again and clears the intent; a clean run leaves none."""
    _, url = scripted
    spec = RemoteTeacherConfig(name="t", base_url=url, model="m", max_tokens=8, timeout_s=5)
    states = make_states(3)
    db = tmp_path / "j.db"
    r = asyncio.run(replay_trace(states, [spec], journal=db))
    assert r.calls_maybe_paid_twice == 0
    with Journal(db) as jr:
        assert jr.pending_intents() == 0
        victim = next(jr.calls())
        jr.conn.execute("DELETE FROM calls WHERE state_id=?", (victim.state_id,))  # kill -9 here
        jr.add_intent(victim.state_id, victim.teacher, victim.params_hash)
    r = asyncio.run(replay_trace(states, [spec], journal=db))
    assert r.calls_maybe_paid_twice == 1 and r.calls_sent == 1
    assert "1 calls were in flight" in r.summary()
    with Journal(db) as jr:
        assert jr.pending_intents() == 0


def test_no_secret_reaches_a_teacher_from_states_written_elsewhere(scripted, tmp_path):
    """States not made by our ingest (a file written by another tool) with secrets in user
    text, in tool-call arguments holding nested JSON, and in .env lines: the request bodies
    the teacher receives hold none of them, whatever their encoding."""
    import json

    from composer_replication.traces.schema import Action, StateMeta, TraceState

    gh, aws = "ghp_" + "Z9y8X7w6V5u4T3s2R1q0P9o8N7m6L5k4J3i2", "AKIA" + "Q7W6E5R4T3Y2U1I0P9O8"
    pw = "S3cretPassw0rd-xyz"
    nested = json.dumps({"cmd": json.dumps({"password": pw, "token": gh})})
    prefix = [
        {"role": "user", "content": f"deploy with AWS_ACCESS_KEY_ID={aws}"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
         "function": {"name": "bash", "arguments": nested}}]},
        {"role": "tool", "tool_call_id": "c1", "content": f"# .env\nDB_PASSWORD={pw}\nX=1"},
    ]  # fmt: skip
    state = TraceState(state_id="s-secret", session_id="elsewhere", step=0, prefix=prefix,
                       action=Action(text="ok"),
                       meta=StateMeta(source_format="openai_messages", file="x", line=1))  # fmt: skip
    script, url = scripted
    spec = RemoteTeacherConfig(name="t", base_url=url, model="m", max_tokens=8, timeout_s=5)
    asyncio.run(replay_trace([state], [spec], journal=tmp_path / "j.db"))
    assert script.bodies, "the teacher was never called"
    for raw in script.bodies:
        text = raw.decode()
        seen = text + json.dumps(json.loads(text))  # also what one decoding layer shows
        for secret in (gh, aws, pw):
            assert secret not in seen and secret not in seen.replace("\\", "")
        assert "<REDACTED:" in text


def test_no_assignment_secret_of_any_spelling_reaches_a_teacher(scripted, tmp_path):
    """Issue 37's matrix of assignment spellings (name x separator x quoting x container, nested
    JSON, tool-call arguments), planted in states written elsewhere as user text, tool-call
    arguments and tool results: no value is in any request body the teacher receives."""
    import json

    from support.planted_secrets import assignment_matrix

    from composer_replication.traces.schema import Action, StateMeta, TraceState

    matrix = assignment_matrix(seed=37)
    states, planted = [], []
    for i in range(0, len(matrix), 24):  # 24 spellings per state, three places each
        chunk = matrix[i : i + 24]
        planted += [value for _, value, _ in chunk]
        texts = [text for _, _, text in chunk]
        prefix = [
            {"role": "user", "content": "\n".join(texts[0::3])},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
             "function": {"name": "bash", "arguments": json.dumps({"command": "\n".join(texts[1::3])})}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "\n".join(texts[2::3])},
        ]  # fmt: skip
        states.append(TraceState(state_id=f"s-{i}", session_id="elsewhere", step=i, prefix=prefix,
                                 action=Action(text="ok"),
                                 meta=StateMeta(source_format="openai_messages", file="x", line=i + 1)))  # fmt: skip
    script, url = scripted
    spec = RemoteTeacherConfig(name="t", base_url=url, model="m", max_tokens=8, timeout_s=5)
    asyncio.run(replay_trace(states, [spec], journal=tmp_path / "j.db"))
    assert len(script.bodies) == len(states)
    bodies = "".join(raw.decode() + json.dumps(json.loads(raw)) for raw in script.bodies)
    assert "<REDACTED:" in bodies
    survivors = [v for v in planted if v in bodies or v in bodies.replace("\\", "")]
    assert survivors == [], f"{len(survivors)} of {len(planted)} planted values reached the teacher"


def test_second_replay_of_a_journal_in_use_is_refused(scripted, tmp_path):
    """Two replays of one journal at once would each enforce the budget alone: while one holds
    the journal, another gets exit 2 naming it and sends nothing."""
    script, url = scripted
    args = _cli_files(tmp_path, url, 3)
    db = tmp_path / "r.db"
    with Journal(db) as holder, holder.exclusive():
        r = runner.invoke(app, args)
        with pytest.raises(JournalBusy, match="in use by another replay"):
            asyncio.run(replay_trace(make_states(1), [_spec(url)], journal=db))
    assert r.exit_code == 2, r.output
    assert f"{db} is in use by another replay (pid {os.getpid()})" in " ".join(r.output.split())
    assert sum(script.requests.values()) == 0
    assert runner.invoke(app, args).exit_code == 0  # released: the next run goes ahead


class _Broken(BaseHTTPRequestHandler):
    """POST /loop/...: a redirect to itself, forever; POST /close/...: hang up, no answer."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *a) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path.startswith("/loop/"):
            self.send_response(307)
            self.send_header("Location", self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)


@pytest.mark.parametrize(("mode", "cause"), [("loop", "TooManyRedirects"),
                                             ("close", "RemoteProtocolError")])  # fmt: skip
def test_broken_exchange_is_not_reported_as_could_not_connect(mode, cause):
    """A redirect loop or a server hanging up used to be reported as "could not connect ...
    start that server": the error says what happened and stays retryable."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Broken)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}/{mode}/v1"
        with pytest.raises(TeacherError) as ei:
            _ask(url, max_retries=0, timeout_s=10)
    finally:
        srv.shutdown()
    assert ei.value.kind == "transport" and ei.value.retryable
    assert ei.value.message.startswith(cause)


def test_nothing_listening_is_could_not_connect():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(TeacherError) as ei:
        _ask(f"http://127.0.0.1:{port}/v1", max_retries=0)
    assert ei.value.kind == "connection" and "could not connect" in ei.value.message


@pytest.mark.parametrize("finish", ["length", "content_filter"])
def test_a_cut_answer_is_paid_for_but_never_a_consensus_answer(scripted, tmp_path, finish):
    """An answer cut at max_tokens or by a content filter used to be journaled as a whole answer
    and could become the consensus a preference pair is built on. It is billed (it was
    generated), journaled as ``incomplete`` with the reason, and left out of the answers."""
    script, url = scripted
    script.finish_by_model = {"cut": finish}
    specs = [RemoteTeacherConfig(name=n, base_url=url, model=n, price_in_per_mtok=1.0,
                         price_out_per_mtok=1.0, max_tokens=16, timeout_s=5)
             for n in ("whole", "cut")]  # fmt: skip
    with Journal(tmp_path / "j.db") as jr:
        r = asyncio.run(replay_trace(make_states(2), specs, journal=jr))
        errors = [c for c in jr.calls("error") if c.teacher == "cut"]
        actions = jr.teacher_actions()
        paid = jr.spent_usd() + jr.lost_usd()
        # paid as a charge, so a --retry-failed run replacing the row cannot erase it
        again = asyncio.run(replay_trace(make_states(2), specs, journal=jr, retry_failed=True))
        assert jr.spent_usd() + jr.lost_usd() == pytest.approx(paid + again.cost_usd)
    assert len(errors) == 2 and all(c.error_kind == "incomplete" for c in errors)
    assert all(f"finish_reason {finish!r}" in c.error for c in errors)
    assert all(c.completion_tokens == script.completion_tokens for c in errors)
    assert all(c.response["content"].startswith("Answer") for c in errors)  # kept, for audit
    assert r.charged_usd > 0 and r.cost_usd > r.charged_usd  # the cut calls, at their usage
    assert again.calls_sent == 2 and again.charged_usd == pytest.approx(r.charged_usd)
    assert r.errors_by_kind == {"incomplete": 2}
    assert all(set(answers) == {"whole"} for answers in actions.values())
    assert all(set(answers) == {"whole"} for answers in r.teacher_actions.values())
    if finish == "length":
        assert "raise the teacher's max_tokens" in errors[0].error


def test_keep_cut_answers_keeps_a_length_cut_but_never_a_filtered_one(scripted, tmp_path):
    script, url = scripted
    script.finish_by_model = {"long": "length", "filtered": "content_filter"}
    specs = [RemoteTeacherConfig(name=n, base_url=url, model=n, max_tokens=16, timeout_s=5,
                         keep_cut_answers=True) for n in ("long", "filtered")]  # fmt: skip
    with Journal(tmp_path / "j.db") as jr:
        r = asyncio.run(replay_trace(make_states(2), specs, journal=jr))
    assert all(set(answers) == {"long"} for answers in r.teacher_actions.values())
    assert r.errors_by_kind == {"incomplete": 2}
