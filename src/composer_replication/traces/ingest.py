"""`ingest(paths)`: agent log files/directories -> redacted `TraceState`s, with a full report.

run = ingest(["~/.claude/projects"])
for state in run:           # streaming: one file open at a time, states as they are ready
    ...
run.report                  # IngestReport: complete once iteration has finished
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from . import aider, claude_code, codex, gemini_cli, openai_messages, openhands, swe_agent
from ._base import EVENT_FILE, ReaderContext, is_event_dir, line_count, unreadable_reason
from .detect import FORMATS, UnknownFormatError, detect_format, sniff
from .redact import Redactor
from .report import FileReport, IngestReport
from .schema import TraceState

READERS: dict[str, Callable[[ReaderContext], Iterator[TraceState]]] = {
    "claude_code": claude_code.read,
    "codex": codex.read,
    "swe_agent": swe_agent.read,
    "openhands": openhands.read,
    "gemini_cli": gemini_cli.read,
    "openai_messages": openai_messages.read,
    "aider": aider.read,
}
assert set(READERS) == set(FORMATS)

DEDUPE_FORMATS = frozenset({"openhands", "openai_messages"})
"""Formats whose states are deduplicated by ``meta.response_id`` across formats: one OpenHands
decision is in its conversation's events and in its LLM call log (read as openai_messages)."""

LOG_SUFFIXES = (".jsonl", ".json", ".traj", ".md", ".ndjson")
COMPRESSED_SUFFIXES = tuple(s + ".gz" for s in LOG_SUFFIXES)  # listed as unreadable, not skipped
NOT_UTF8 = {
    b"\x1f\x8b": "gzip-compressed: decompress it first (gunzip)",
    b"\xff\xfe": "UTF-16/32 text, not UTF-8: convert it first (iconv -t UTF-8)",
    b"\xfe\xff": "UTF-16 text, not UTF-8: convert it first (iconv -t UTF-8)",
}


class IngestRun:
    """Iterator of TraceStates plus the `IngestReport` it fills while iterating."""

    def __init__(
        self,
        paths: Iterable[str | os.PathLike[str]],
        fmt: str,
        redactor: Redactor,
        exclude: Iterable[str | os.PathLike[str]] = (),
    ):
        if fmt != "auto" and fmt not in READERS:
            raise ValueError(f"unknown format {fmt!r}; choose auto or one of {', '.join(FORMATS)}")
        self.paths = [Path(p).expanduser() for p in paths]
        self.exclude = {os.path.realpath(Path(p).expanduser()) for p in exclude}
        self.format = fmt
        self.redactor = redactor
        self.report = IngestReport()
        self.report.input_dirs = [str(p) for p in self.paths if p.is_dir() and not is_event_dir(p)]
        self._decisions: dict[str, str] = {}  # response id -> format of the state kept
        self._it = self._run()

    def __iter__(self) -> Iterator[TraceState]:
        return self._it  # the generator itself: no Python-level __next__ per state

    def __next__(self) -> TraceState:
        return next(self._it)

    def _format(self, path: Path, explicit: bool) -> str | None:
        """The reader for ``path`` (None: not a log, listed in ``not_traces``)."""
        if path.is_dir():  # an OpenHands SDK events/ directory (_iter_files)
            return "openhands"
        if self.format != "auto":
            return self.format
        if explicit:
            return detect_format(path)
        found = sniff(path)
        if found is None:
            self.report.not_traces.append(str(path))
        return found

    def _read(self, path: Path, explicit: bool) -> Iterator[TraceState]:
        fmt = self._format(path, explicit)
        if fmt is None:
            return
        rep = FileReport(path=str(path), format=fmt)
        self.report.files.append(rep)
        states = READERS[fmt](ReaderContext(path, fmt, rep, self.redactor))
        if fmt not in DEDUPE_FORMATS:
            yield from states
            return
        for state in states:
            if self._is_duplicate(state, fmt):
                rep.states -= 1
                self.report.duplicate_decisions += 1
                continue
            yield state

    def _is_duplicate(self, state: TraceState, fmt: str) -> bool:
        """True when another format already gave this model response (same ``response_id``)."""
        rid = state.meta.response_id
        if rid is None:
            return False
        kept = self._decisions.setdefault(rid, fmt)
        return kept != fmt

    def _run(self) -> Iterator[TraceState]:
        """Files first, OpenHands SDK event directories last: a decision also in an LLM call
        log is kept from the call log (its exact messages and tool schemas)."""
        found = list(_iter_files(self.paths, self.exclude, self.report.duplicates))
        found.sort(key=lambda pe: pe[0].is_dir())  # stable: files keep their order
        for path, explicit in found:
            why = None if path.is_dir() else unreadable_reason(path) or encoding_problem(path)
            if why is not None:
                self.report.unreadable[str(path)] = why
                continue
            try:  # a file can still fail while read (EIO, a vanished mount): report, go on
                yield from self._read(path, explicit)
            except OSError as err:
                self.report.unreadable[str(path)] = f"read failed: {err.strerror or err}"
            except UnknownFormatError:
                raise  # a file named explicitly that is no log: bad input, the caller says so
            except Exception as err:  # noqa: BLE001 - a bug on one odd file must not end the run
                why = f"reader failed: {type(err).__name__}: {err}"[:300]
                self.report.unreadable[str(path)] = self._after_failure(path, why)
        self.report.redactions = self.redactor.counts

    def _after_failure(self, path: Path, why: str) -> str:
        """A reader that failed part-way: the states it gave are kept (they are whole and
        already written), the file's lines it never reached are counted as skipped
        (``reader_failed``) so the line balance holds, and the listing says what was kept."""
        rep = next((f for f in reversed(self.report.files) if f.path == str(path)), None)
        if rep is None:
            return why
        if path.is_file():
            rep.total_lines = max(rep.total_lines, line_count(path.read_bytes()))
        if rest := rep.total_lines - rep.parsed - rep.skipped:
            rep.skip(rep.parsed + rep.skipped + 1, "reader_failed", n=rest)
        if rep.states:
            return f"partially read: {rep.states} states kept, then {why}"
        return why


def ingest(
    paths: Iterable[str | os.PathLike[str]] | str | os.PathLike[str],
    format: str = "auto",
    *,
    redactor: Redactor | None = None,
    exclude: Iterable[str | os.PathLike[str]] = (),
) -> IngestRun:
    """Read agent logs into TraceStates (secrets redacted). ``paths`` may be files or directories
    (searched recursively for ``*.jsonl``, ``*.json``, ``*.traj``, ``*.md``). With
    ``format="auto"`` each file's format is detected; a file named explicitly whose format is
    unknown raises `UnknownFormatError`, one found under a directory is listed in
    ``report.not_traces``. Files in ``exclude`` are never read (the output of an earlier run
    written inside an input directory is not a log)."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    return IngestRun(paths, format, redactor or Redactor(), exclude)


def _iter_files(
    paths: list[Path], exclude: set[str] = frozenset(), duplicates: list[str] | None = None
) -> Iterator[tuple[Path, bool]]:
    """Log files under ``paths`` except those whose real path is in ``exclude``, each real file
    once (a file named directly and found in a directory, a symlink to a file already seen:
    read twice, its states would be replayed and paid twice); later sightings are appended to
    ``duplicates``. An OpenHands SDK ``events/`` directory (one JSON file per event) is yielded
    once, as the directory, since its files only make sense together."""
    seen: set[str] = set()
    for path, explicit in _walk(paths):
        real = os.path.realpath(path)
        if real in exclude:
            continue
        if real in seen:
            if duplicates is not None:
                duplicates.append(str(path))
            continue
        seen.add(real)
        yield path, explicit


def encoding_problem(path: Path) -> str | None:
    """Why a file's bytes cannot be a UTF-8 log (gzip, UTF-16/32), from its first bytes; read
    line by line, such a file would only be skipped line after line, with exit code 0."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(64)
    except OSError:
        return None  # the read itself reports it
    for magic, why in NOT_UTF8.items():
        if head.startswith(magic):
            return why
    if b"\x00" in head:
        return "NUL bytes: UTF-16/32 text or binary, not a UTF-8 log"
    return None


def _walk(paths: list[Path]) -> Iterator[tuple[Path, bool]]:
    for p in paths:
        if p.is_dir() and is_event_dir(p):
            yield p, True
        elif p.is_file() and EVENT_FILE.match(p.name) and is_event_dir(p.parent):
            yield p.parent, True  # one event of a conversation: the conversation is the log
        elif p.is_dir():
            for root, dirs, files in os.walk(p):
                dirs.sort()
                if is_event_dir(Path(root), files):
                    yield Path(root), False
                    continue
                for name in sorted(files):
                    if name.endswith(LOG_SUFFIXES + COMPRESSED_SUFFIXES):
                        yield Path(root) / name, False
        elif p.is_file():
            yield p, True
        else:
            raise FileNotFoundError(f"{p}: no such file or directory")


__all__ = ["IngestRun", "UnknownFormatError", "ingest", "READERS"]
