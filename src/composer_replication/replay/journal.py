"""The replay journal: one SQLite file holding the states, every teacher call's outcome (answer,
usage, cost, error) and the run's metadata.

Calls are keyed by ``(state_id, teacher, params_hash)`` where ``params_hash`` hashes the full
request (model, base_url, max_tokens, temperature, messages, tools). Each outcome is committed in
its own transaction before the next step depends on it; SQLite in WAL mode keeps every committed
transaction through a SIGKILL of the process, so a resumed run skips every call it finds here and
a re-run of a finished replay sends no request.

Before each attempt is sent an *intent* row with its reserved worst case is committed, and the
outcome's transaction deletes it. Intents still pending when a run starts belong to attempts a
killed run may have been billed for: they become ``lost_calls`` whose worst case counts as spent
from then on, so killing and resuming a replay cannot spend past its budget.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import math
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson

from composer_replication.config.base import UserError
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
CREATE TABLE IF NOT EXISTS lost_calls (
    id INTEGER PRIMARY KEY,
    state_id TEXT NOT NULL,
    teacher TEXT NOT NULL,
    params_hash TEXT NOT NULL,
    worst_usd REAL NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS scores (state_id TEXT PRIMARY KEY, entropy REAL NOT NULL);
"""
BUSY_TIMEOUT_S = 5.0
"""Seconds a write waits for another process's lock on the database before it fails."""
ADDED_CALL_COLUMNS = {"raw_usage": "BLOB", "misreport": "TEXT"}  # journals from older versions
ADDED_LOST_COLUMNS = {"reason": "TEXT NOT NULL DEFAULT 'killed'"}
"""``lost_calls.reason``: ``killed`` (in flight when a run died: its worst case) or ``charged``
(an attempt that got no answer we kept but may have been billed: a rejected answer at its
reported usage, a timed-out or broken exchange at its worst case)."""
INTENTS = """
CREATE TABLE IF NOT EXISTS intents (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    state_id TEXT NOT NULL,
    teacher TEXT NOT NULL,
    params_hash TEXT NOT NULL,
    worst_usd REAL,
    created_at REAL NOT NULL
)"""
"""One row per attempt to send a call (not per call key: a call sent by three killed runs may
have been paid three times). ``worst_usd`` is the reservation it held; NULL in rows migrated from
journals of older versions, which keyed intents by call and kept no amount."""


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


Unrecorded = tuple[CallRecord, Sequence[int], Sequence[float]]
"""An outcome the journal refused, with its attempts' intent ids and charges."""


class JournalError(UserError):
    """The journal cannot be used (not a journal, corrupt, busy); the message names the file."""


class JournalBusy(JournalError):
    """Another process replays into the same journal right now."""


class Journal:
    """SQLite journal of a replay (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        # the lock and the saved-answers file are named after the real file, so a replay that
        # names the journal through a symlink meets the same lock (hard links are not covered)
        self.real = self.path if str(path) == ":memory:" else Path(os.path.realpath(self.path))
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:  # a parent that is a file, no permission
            raise JournalError(f"{self.path}: cannot create its directory: {err}") from err
        try:
            self._open()
        except sqlite3.DatabaseError as err:  # a text file, a torn copy, bad pages
            if hasattr(self, "conn"):
                self.conn.close()
            raise JournalError(
                f"{self.path}: not a replay journal, or a damaged one (SQLite: {err})"
            ) from err

    def _open(self) -> None:
        # a short busy wait: it blocks the replay's event loop (and the calls in flight) while
        # another process holds a write lock; after it the write fails and the run stops
        self.conn = sqlite3.connect(str(self.path), isolation_level=None, timeout=BUSY_TIMEOUT_S)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.executescript(SCHEMA)
        have = {r[1] for r in self.conn.execute("PRAGMA table_info(calls)")}
        for name, kind in ADDED_CALL_COLUMNS.items():
            if name not in have:
                self.conn.execute(f"ALTER TABLE calls ADD COLUMN {name} {kind}")
        have = {r[1] for r in self.conn.execute("PRAGMA table_info(lost_calls)")}
        for name, kind in ADDED_LOST_COLUMNS.items():
            if name not in have:
                self.conn.execute(f"ALTER TABLE lost_calls ADD COLUMN {name} {kind}")
        self._migrate_intents()

    def _migrate_intents(self) -> None:
        """Older journals keyed intents by call (``INSERT OR REPLACE`` merged repeated attempts);
        their rows are kept, one per attempt, with an unknown amount."""
        cols = {r[1] for r in self.conn.execute("PRAGMA table_info(intents)")}
        if "id" in cols:
            return
        with self.conn:
            self.conn.execute("BEGIN")
            if cols:
                self.conn.execute("ALTER TABLE intents RENAME TO intents_v0")
            self.conn.execute(INTENTS)
            if cols:
                self.conn.execute(
                    "INSERT INTO intents (state_id, teacher, params_hash, created_at) "
                    "SELECT state_id, teacher, params_hash, created_at FROM intents_v0"
                )
                self.conn.execute("DROP TABLE intents_v0")

    def close(self) -> None:
        self.conn.close()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold ``<journal>.lock`` (``flock``, released by the kernel when the process dies) for
        a replay: two replays of one journal would each enforce the budget alone. A sidecar
        file, never the database itself: closing any descriptor of the database would drop
        SQLite's own POSIX locks. Raises `JournalBusy` naming the journal."""
        if str(self.path) == ":memory:":
            yield
            return
        lock = self.real.with_name(self.real.name + ".lock")
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise JournalError(f"{self.path}: cannot open its lock file {lock}: {err}") from err
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                raise JournalBusy(
                    f"{self.path} is in use by another replay (pid {holder}); wait for it to "
                    "finish or replay into another --out"
                ) from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
            yield
        finally:
            os.close(fd)  # releases the lock

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # states -----------------------------------------------------------------------------------
    def add_states(self, states: Iterable[TraceState]) -> None:
        """Store states (idempotent; keeps the first order seen). A state whose id the journal
        holds with other content is a `JournalError`, before anything is stored: its answers
        would be paired with the journaled state's prompt and action."""
        states = list(states)
        self._check_same_states(states)
        start = self.conn.execute("SELECT COALESCE(MAX(ord), -1) + 1 FROM states").fetchone()[0]
        rows = [(s.state_id, start + i, s.to_json()) for i, s in enumerate(states)]
        with self.conn:
            self.conn.execute("BEGIN")
            self.conn.executemany(
                "INSERT OR IGNORE INTO states (state_id, ord, state_json) VALUES (?, ?, ?)", rows
            )

    def _check_same_states(self, states: list[TraceState]) -> None:
        ids = {s.state_id for s in states}
        known = {
            sid: blob
            for sid, blob in self.conn.execute("SELECT state_id, state_json FROM states")
            if sid in ids
        }
        for s in states:
            if s.state_id not in known:
                continue
            if _replayed_part(TraceState.from_json(known[s.state_id])) != _replayed_part(s):
                raise JournalError(
                    f"{self.real}: already holds state {s.state_id!r} with other content (the "
                    "states file was made again?); replay it into a new --out journal"
                )

    def state(self, state_id: str) -> TraceState | None:
        row = self.conn.execute(
            "SELECT state_json FROM states WHERE state_id=?", (state_id,)
        ).fetchone()
        return TraceState.from_json(row[0]) if row else None

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

    def add_intent(
        self, state_id: str, teacher: str, phash: str, worst_usd: float | None = None
    ) -> int:
        """Commit that a call is about to be sent, with the worst case it reserved; returns the
        intent's id, which `record` clears. An intent left by a killed run marks an attempt that
        may have been paid although its answer was lost (`adopt_lost_intents`)."""
        cur = self.conn.execute(
            "INSERT INTO intents (state_id, teacher, params_hash, worst_usd, created_at) "
            "VALUES (?,?,?,?,?)",
            (state_id, teacher, phash, worst_usd, time.time()),
        )
        return int(cur.lastrowid or 0)

    def pending_intents(self) -> int:
        """Attempts sent by an earlier run that never recorded an outcome (possibly paid)."""
        return int(self.conn.execute("SELECT COUNT(*) FROM intents").fetchone()[0])

    def adopt_lost_intents(self, worst_for: Callable[[str, str], float]) -> tuple[int, float]:
        """Turn every pending intent (only a run that holds the journal's lock may call this:
        then no pending intent is live) into a lost call whose worst case counts as spent
        forever, since the provider may have billed it. ``worst_for(state_id, teacher)`` prices
        intents migrated without an amount. Returns (intents adopted, their worst case)."""
        rows = self.conn.execute(
            "SELECT id, state_id, teacher, params_hash, worst_usd, created_at FROM intents"
        ).fetchall()
        lost = [(*r[:4], r[4] if r[4] is not None else worst_for(r[1], r[2]), r[5]) for r in rows]
        with self.conn:
            self.conn.execute("BEGIN")
            self.conn.executemany(  # new row ids: an intent's id may be a lost row's already
                "INSERT INTO lost_calls (state_id, teacher, params_hash, worst_usd, "
                "created_at, reason) VALUES (?,?,?,?,?,'killed')",
                [r[1:] for r in lost],
            )
            self.conn.executemany("DELETE FROM intents WHERE id=?", [(r[0],) for r in rows])
        return len(lost), sum(r[4] for r in lost)

    def lost_usd(self, reason: str | None = None) -> float:
        """Dollars counted as spent without a journaled answer (see ``ADDED_LOST_COLUMNS``):
        attempts killed in flight and charged attempts, or only those of ``reason``."""
        q = "SELECT COALESCE(SUM(worst_usd), 0) FROM lost_calls"
        if reason is not None:
            return float(self.conn.execute(q + " WHERE reason=?", (reason,)).fetchone()[0])
        return float(self.conn.execute(q).fetchone()[0])

    def record(
        self, rec: CallRecord, intents: Sequence[int] = (), charges: Sequence[float] = ()
    ) -> None:
        """Commit one call outcome (replaces an earlier error for the same key), clear the
        intents of its attempts, and keep ``charges``: dollars of its attempts that gave no
        answer but may have been billed. One transaction."""
        with self.conn:
            self.conn.execute("BEGIN")
            self._insert(rec)
            self._settle_attempts(rec, intents, charges)

    def _settle_attempts(
        self, rec: CallRecord, intents: Sequence[int], charges: Sequence[float]
    ) -> None:
        key = (rec.state_id, rec.teacher, rec.params_hash)
        self.conn.executemany(  # only this call's intents, never another call's
            "DELETE FROM intents WHERE id=? AND state_id=? AND teacher=? AND params_hash=?",
            [(i, *key) for i in intents],
        )
        self.conn.executemany(
            "INSERT INTO lost_calls (state_id, teacher, params_hash, worst_usd, created_at, "
            "reason) VALUES (?,?,?,?,?,'charged')",
            [(*key, usd, time.time()) for usd in charges],
        )

    @property
    def unrecorded_path(self) -> Path:
        """Where a replay saves paid answers this journal refused to store (JSON lines)."""
        return self.real.with_name(self.real.name + ".unrecorded.jsonl")

    def save_unrecorded(self, recs: Sequence[Unrecorded]) -> Path:
        """Add outcomes the journal refused (each with its attempts' intents and charges) to
        `unrecorded_path`, all or nothing: the file is rewritten beside itself and swapped in,
        so a full disk leaves the earlier file as it was (raises OSError then)."""
        path = self.unrecorded_path
        tmp = path.with_name(path.name + ".tmp")
        lines = [
            orjson.dumps({**asdict(rec), "intent_ids": list(ids), "charges": list(usd)}) + b"\n"
            for rec, ids, usd in recs
        ]
        try:
            with open(tmp, "wb") as fh:
                if path.exists():
                    fh.write(path.read_bytes())
                fh.writelines(lines)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise
        return path

    def import_unrecorded(self) -> int:
        """Store the answers an earlier run saved in `unrecorded_path` because the journal
        refused them, then remove the file; returns how many were stored. Each clears its own
        attempts' intents and keeps its charges, so the run is charged once for it; an answer
        whose key already has a successful outcome is dropped. A file that does not parse is
        left untouched and raises `JournalError` naming the file and line, before anything
        is stored."""
        path = self.unrecorded_path
        if not path.exists():
            return 0
        entries = [_unrecorded_entry(path, i, line) for i, line in _lines(path)]
        with self.conn:
            self.conn.execute("BEGIN")
            for rec, intents, charges in entries:
                old = self.get(rec.state_id, rec.teacher, rec.params_hash)
                if old is None or old.status != "ok":
                    self._insert(rec)
                self._settle_attempts(rec, intents, charges)
        path.unlink()
        return len(entries)

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


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    try:
        data = path.read_bytes()
    except OSError as err:
        raise JournalError(f"{path}: cannot read saved answers: {err}") from err
    for i, line in enumerate(data.splitlines(), 1):
        if line.strip():
            yield i, line


def _unrecorded_entry(path: Path, lineno: int, line: bytes) -> Unrecorded:
    """One line of an unrecorded-answers file, checked field by field."""
    where = f"{path}:{lineno}"
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as err:
        raise JournalError(f"{where}: not JSON ({err}); fix or remove this line") from None
    if not isinstance(obj, dict):
        raise JournalError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    intents = obj.pop("intent_ids", [])
    charges = obj.pop("charges", [])
    if not (isinstance(intents, list) and all(type(i) is int for i in intents)):
        raise JournalError(f"{where}: field 'intent_ids' must be a list of integers")
    if not (isinstance(charges, list) and all(_amount(c) for c in charges)):
        raise JournalError(f"{where}: field 'charges' must be a list of numbers >= 0")
    if unknown := sorted(set(obj) - set(CallRecord.__dataclass_fields__)):
        raise JournalError(f"{where}: unknown field {unknown[0]!r}")
    try:
        rec = CallRecord(**obj)
    except TypeError as err:  # a required field is missing
        raise JournalError(f"{where}: {err}") from None
    if problem := _record_problem(rec):
        raise JournalError(f"{where}: {problem}")
    return rec, intents, charges


def _amount(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value) and value >= 0


def _record_problem(rec: CallRecord) -> str | None:
    """What makes ``rec`` unfit for the journal's columns, or None."""
    for name in ("state_id", "teacher", "params_hash"):
        if not isinstance(getattr(rec, name), str):
            return f"field {name!r} must be a string"
    if rec.status not in ("ok", "error"):
        return f"field 'status' must be 'ok' or 'error', got {rec.status!r}"
    if rec.status == "ok" and not isinstance(rec.response, dict):
        return "field 'response' must be an object for status 'ok'"
    if rec.response is not None and not isinstance(rec.response, dict):
        return "field 'response' must be an object or null"
    for name in ("error_kind", "error", "misreport"):
        if getattr(rec, name) is not None and not isinstance(getattr(rec, name), str):
            return f"field {name!r} must be a string or null"
    for name in ("prompt_tokens", "completion_tokens", "attempts", "tier"):
        if type(getattr(rec, name)) is not int:
            return f"field {name!r} must be an integer"
    for name in ("cost_usd", "latency_s"):
        if not _amount(getattr(rec, name)):
            return f"field {name!r} must be a finite number >= 0"
    return None


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


def _replayed_part(state: TraceState) -> TraceState:
    """``state`` without its provenance (``meta``: the log file and line it was read from, its
    timestamp): the same log ingested again from another path, or after it moved, is the same
    state; what a teacher is sent (prefix, action, tools) is compared."""
    return dataclasses.replace(state, meta=None)
