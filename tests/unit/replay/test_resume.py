"""Resume: SIGKILL the `replay` CLI process mid-run, rerun it, and check that no call completed
before the kill is sent again and that the final journal equals an uninterrupted run's."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from composer_replication.config import RemoteTeacherConfig
from composer_replication.replay.journal import Journal
from composer_replication.replay.replay import replay_trace

from .conftest import digest, make_states

SRC = Path(__file__).resolve().parents[3] / "src"


def _cli(states: Path, pool: Path, db: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.Popen(
        [sys.executable, "-m", "composer_replication.cli", "replay", str(states),
         "--teachers", str(pool), "--budget-usd", "10", "--out", str(db), "--no-progress"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=_sigint_default,
    )  # fmt: skip


def _sigint_default() -> None:
    """Ctrl-C as in a terminal: a test run started in the background by a non-interactive
    shell ignores SIGINT, and a child would inherit that (Python then never raises
    KeyboardInterrupt: the replay ran on after the signal)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _ok_rows(db: Path) -> set[tuple]:
    if not db.exists():
        return set()
    con = sqlite3.connect(db)
    try:
        return set(con.execute(
            "SELECT state_id, teacher, params_hash, response_json FROM calls WHERE status='ok'"
        ))  # fmt: skip
    except sqlite3.OperationalError:  # tables not created yet
        return set()
    finally:
        con.close()


def test_sigkill_then_resume(scripted, tmp_path):
    script, url = scripted
    script.delay_s = 0.04
    states = make_states(40)
    sfile = tmp_path / "states.jsonl"
    sfile.write_bytes(b"".join(s.to_json() + b"\n" for s in states))
    pool = tmp_path / "pool.yaml"
    pool.write_text(yaml.safe_dump({"teachers": [
        {"name": f"t{i}", "base_url": url, "model": f"m{i}", "max_tokens": 8,
         "max_concurrency": 2, "price_in_per_mtok": 1, "price_out_per_mtok": 2}
        for i in range(2)
    ]}))  # fmt: skip
    db = tmp_path / "killed.db"
    proc = _cli(sfile, pool, db)
    deadline = time.monotonic() + 120
    while len(_ok_rows(db)) < 20:
        assert proc.poll() is None, proc.stdout.read().decode()
        assert time.monotonic() < deadline, "replay made no progress"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    done_before = _ok_rows(db)
    assert 20 <= len(done_before) < 80  # really killed mid-run

    proc = _cli(sfile, pool, db)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out.decode()
    model_of = {"t0": "m0", "t1": "m1"}
    prefix_of = {s.state_id: digest(s.prefix) for s in states}
    for sid, teacher, _, _ in done_before:  # no completed call was sent again
        assert script.answered[(model_of[teacher], prefix_of[sid])] == 1
    resumed = _ok_rows(db)

    clean_db = tmp_path / "clean.db"
    proc = _cli(sfile, pool, clean_db)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out.decode()
    assert len(resumed) == 80 and resumed == _ok_rows(clean_db)
    rerun = _cli(sfile, pool, db)
    n = sum(script.requests.values())
    out, _ = rerun.communicate(timeout=180)
    assert sum(script.requests.values()) == n  # finished replay: zero requests
    assert b"0 sent" in out and b"80 from journal" in out


def test_attempts_lost_by_killed_runs_count_against_the_budget(scripted, tmp_path):
    """Three killed runs each left the same call in flight: three intents (not one merged row),
    each charged at its worst case on resume, so a budget they use up sends nothing more."""
    from composer_replication.replay.budget import worst_case_cost, worst_case_prompt_tokens

    _, url = scripted
    spec = RemoteTeacherConfig(name="t", base_url=url, model="m", max_tokens=64,
                       price_in_per_mtok=1.0, price_out_per_mtok=2.0, timeout_s=5)  # fmt: skip
    states = make_states(4)
    worst = worst_case_cost(spec, worst_case_prompt_tokens(states[0].prefix))
    db = tmp_path / "j.db"
    with Journal(db) as jr:
        for _ in range(3):  # kill -9 between add_intent and record, three times
            jr.add_intent(states[0].state_id, "t", "h", worst)
        assert jr.pending_intents() == 3
    r = asyncio.run(replay_trace(states, [spec], journal=db, budget_usd=3.5 * worst))
    assert r.calls_maybe_paid_twice == 3 and r.calls_sent == 0 and r.budget_exhausted
    assert r.lost_usd == pytest.approx(3 * worst) and "counted against the budget" in r.summary()
    r = asyncio.run(replay_trace(states, [spec], journal=db, budget_usd=3.5 * worst))
    assert r.calls_maybe_paid_twice == 0 and r.calls_sent == 0  # charged once, forever


def test_an_older_journals_pending_intent_is_priced_from_its_state_and_teacher(scripted, tmp_path):
    """A journal written before intents were kept per attempt (and before lost calls had a
    reason) opens; its pending intent, which kept no amount, is priced by the replay as the
    worst case of its state for its teacher and counted as killed in flight."""
    from composer_replication.replay.budget import worst_case_cost, worst_case_prompt_tokens

    script, url = scripted
    db = tmp_path / "old.db"
    c = sqlite3.connect(db)
    c.execute("CREATE TABLE intents (state_id TEXT NOT NULL, teacher TEXT NOT NULL, "
              "params_hash TEXT NOT NULL, created_at REAL NOT NULL, "
              "PRIMARY KEY (state_id, teacher, params_hash))")  # fmt: skip
    c.execute("CREATE TABLE lost_calls (id INTEGER PRIMARY KEY, state_id TEXT NOT NULL, "
              "teacher TEXT NOT NULL, params_hash TEXT NOT NULL, worst_usd REAL NOT NULL, "
              "created_at REAL NOT NULL)")  # fmt: skip
    c.execute("INSERT INTO lost_calls VALUES (1, 'st0001', 't', 'h', 0.5, 1.0)")
    c.execute("INSERT INTO intents VALUES ('st0000', 't', 'h', 1.0)")
    c.commit()
    c.close()
    spec = RemoteTeacherConfig(name="t", base_url=url, model="m", max_tokens=8, price_in_per_mtok=1.0,
                       price_out_per_mtok=4.0)  # fmt: skip
    states = make_states(2)
    worst = worst_case_cost(spec, worst_case_prompt_tokens(states[0].prefix))
    r = asyncio.run(replay_trace(states, [spec], journal=db))
    assert r.calls_maybe_paid_twice == 1
    assert r.lost_usd == pytest.approx(0.5 + worst)  # the old row kept, the intent priced
    with Journal(db) as jr:
        assert jr.pending_intents() == 0 and jr.lost_usd("killed") == pytest.approx(0.5 + worst)


def test_ctrl_c_prints_the_summary_and_exits_130(scripted, tmp_path):
    """SIGINT while calls are in flight: exit 130 after the summary of what was done (it used
    to exit 130 with nothing said)."""
    script, url = scripted
    script.delay_s = 0.5
    sfile = tmp_path / "states.jsonl"
    sfile.write_bytes(b"".join(s.to_json() + b"\n" for s in make_states(40)))
    pool = tmp_path / "pool.yaml"
    pool.write_text(yaml.safe_dump({"teachers": [
        {"name": "t0", "base_url": url, "model": "m", "max_tokens": 8, "max_concurrency": 2}
    ]}))  # fmt: skip
    proc = _cli(sfile, pool, tmp_path / "r.db")
    deadline = time.monotonic() + 60
    while sum(script.answered.values()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out = " ".join(proc.communicate(timeout=60)[0].decode().split())
    assert proc.returncode == 130, out
    assert "states: 40 total" in out and "interrupted: calls in flight were abandoned" in out
    assert "Traceback" not in out
