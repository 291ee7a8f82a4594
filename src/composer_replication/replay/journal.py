"""The replay journal: one SQLite file holding the states, every teacher call's outcome (answer,
usage, cost, error) and the run's metadata.

Calls are keyed by ``(state_id, teacher, params_hash)`` where ``params_hash`` hashes the full
request (model, base_url, max_tokens, temperature, messages, tools). Each outcome is committed in
its own transaction before the next step depends on it; SQLite in WAL mode keeps every committed
transaction through a SIGKILL of the process, so a resumed run skips every call it finds here and
a re-run of a finished replay sends no request.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from composer_replication.traces.schema import TraceState

SCHEMA = """
CREATE TABLE IF NOT EXISTS states (
    state_id TEXT PRIMARY KEY,
    ord INTEGER NOT NULL,
    state_json BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS calls (
    state_id TEXT NOT NULL,
    teacher TEXT NOT NULL,
    params_hash TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('ok', 'error')),
    response_json BLOB,
    error_kind TEXT,
    error TEXT,
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    cost_usd REAL NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 1,
    latency_s REAL NOT NULL DEFAULT 0,
    tier INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    raw_usage BLOB,
    misreport TEXT,
    PRIMARY KEY (state_id, teacher, params_hash)
);
CREATE TABLE IF NOT EXISTS intents (
    state_id TEXT NOT NULL,
    teacher TEXT NOT NULL,
    params_hash TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (state_id, teacher, params_hash)
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS scores (state_id TEXT PRIMARY KEY, entropy REAL NOT NULL);
"""
ADDED_CALL_COLUMNS = {"raw_usage": "BLOB", "misreport": "TEXT"}  # journals from older versions


def params_hash(request: dict[str, Any]) -> str:
    """Stable hash of a request's parameters (canonical JSON, sorted keys)."""
    blob = orjson.dumps(request, option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(blob, digest_size=16).hexdigest()


@dataclass
class CallRecord:
    """One journal row."""

    state_id: str
    teacher: str
    params_hash: str
    status: str
    response: dict[str, Any] | None = None
    error_kind: str | None = None
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    attempts: int = 1
    latency_s: float = 0.0
    tier: int = 0
    raw_usage: Any = None  # the server's usage block as sent, for audit
    misreport: str | None = None  # why the server's usage was not used for billing


class Journal:
    """SQLite journal of a replay (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.conn = sqlite3.connect(str(self.path), isolation_level=None, timeout=30)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.executescript(SCHEMA)
        have = {r[1] for r in self.conn.execute("PRAGMA table_info(calls)")}
        for name, kind in ADDED_CALL_COLUMNS.items():
            if name not in have:
                self.conn.execute(f"ALTER TABLE calls ADD COLUMN {name} {kind}")

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # states -----------------------------------------------------------------------------------
    def add_states(self, states: Iterable[TraceState]) -> None:
        """Store states (idempotent; keeps the first order seen)."""
        start = self.conn.execute("SELECT COALESCE(MAX(ord), -1) + 1 FROM states").fetchone()[0]
        rows = [(s.state_id, start + i, s.to_json()) for i, s in enumerate(states)]
        with self.conn:
            self.conn.execute("BEGIN")
            self.conn.executemany(
                "INSERT OR IGNORE INTO states (state_id, ord, state_json) VALUES (?, ?, ?)", rows
            )

    def states(self) -> list[TraceState]:
        rows = self.conn.execute("SELECT state_json FROM states ORDER BY ord").fetchall()
        return [TraceState.from_json(r[0]) for r in rows]

    # calls ------------------------------------------------------------------------------------
    def get(self, state_id: str, teacher: str, phash: str) -> CallRecord | None:
        row = self.conn.execute(
            "SELECT * FROM calls WHERE state_id=? AND teacher=? AND params_hash=?",
            (state_id, teacher, phash),
        ).fetchone()
        return _row_to_record(row) if row else None

    def add_intent(self, state_id: str, teacher: str, phash: str) -> None:
        """Commit that a call is about to be sent (cleared by `record`): an intent left by a killed
        run marks a call that may have been paid although its answer was lost."""
        self.conn.execute(
            "INSERT OR REPLACE INTO intents VALUES (?,?,?,?)",
            (state_id, teacher, phash, time.time()),
        )

    def pending_intents(self) -> int:
        """Calls sent by an earlier run that never recorded an outcome (possibly paid)."""
        return int(self.conn.execute("SELECT COUNT(*) FROM intents").fetchone()[0])

    def record(self, rec: CallRecord) -> None:
        """Commit one call outcome (replaces an earlier error for the same key) and clear its
        intent, in one transaction."""
        with self.conn:
            self.conn.execute("BEGIN")
            self._insert(rec)
            self.conn.execute(
                "DELETE FROM intents WHERE state_id=? AND teacher=? AND params_hash=?",
                (rec.state_id, rec.teacher, rec.params_hash),
            )

    def _insert(self, rec: CallRecord) -> None:
        self.conn.execute(
            "INSERT OR REPLACE INTO calls VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                rec.state_id,
                rec.teacher,
                rec.params_hash,
                rec.status,
                orjson.dumps(rec.response) if rec.response is not None else None,
                rec.error_kind,
                rec.error,
                rec.prompt_tokens,
                rec.completion_tokens,
                rec.cost_usd,
                rec.attempts,
                rec.latency_s,
                rec.tier,
                time.time(),
                orjson.dumps(rec.raw_usage) if rec.raw_usage is not None else None,
                rec.misreport,
            ),
        )

    def calls(self, status: str | None = None) -> Iterator[CallRecord]:
        q = "SELECT * FROM calls" + (" WHERE status=?" if status else "") + " ORDER BY rowid"
        for row in self.conn.execute(q, (status,) if status else ()):
            yield _row_to_record(row)

    def spent_usd(self) -> float:
        return float(
            self.conn.execute("SELECT COALESCE(SUM(cost_usd), 0) FROM calls").fetchone()[0]
        )

    def teacher_actions(self) -> dict[str, dict[str, dict[str, Any]]]:
        """``{state_id: {teacher: assistant message}}`` over successful calls (latest params)."""
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for rec in self.calls("ok"):
            out.setdefault(rec.state_id, {})[rec.teacher] = rec.response or {}
        return out

    def costs_by_state(self) -> dict[str, float]:
        rows = self.conn.execute("SELECT state_id, SUM(cost_usd) FROM calls GROUP BY state_id")
        return {r[0]: float(r[1]) for r in rows}

    # meta / scores ----------------------------------------------------------------------------
    def set_meta(self, key: str, value: Any) -> None:
        self.conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, orjson.dumps(value)))

    def get_meta(self, key: str, default: Any = None) -> Any:
        row = self.conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return orjson.loads(row[0]) if row else default

    def set_scores(self, scores: dict[str, float]) -> None:
        with self.conn:
            self.conn.execute("BEGIN")
            self.conn.executemany(
                "INSERT OR REPLACE INTO scores VALUES (?, ?)", list(scores.items())
            )

    def scores(self) -> dict[str, float]:
        return {r[0]: r[1] for r in self.conn.execute("SELECT state_id, entropy FROM scores")}


def _row_to_record(row: tuple) -> CallRecord:
    return CallRecord(
        state_id=row[0],
        teacher=row[1],
        params_hash=row[2],
        status=row[3],
        response=orjson.loads(row[4]) if row[4] is not None else None,
        error_kind=row[5],
        error=row[6],
        prompt_tokens=row[7],
        completion_tokens=row[8],
        cost_usd=row[9],
        attempts=row[10],
        latency_s=row[11],
        tier=row[12],
        raw_usage=orjson.loads(row[14]) if row[14] is not None else None,
        misreport=row[15],
    )
