"""Accounting for an ingestion run: every line of every file is either parsed or skipped."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

MAX_EXAMPLES = 20  # per file and reason: locations kept for the report (counts are exact)
MIN_RECORDS_FOR_STATES = 20  # a file this long that gives no state was not understood


@dataclass
class FileReport:
    """Per-file counts. Invariant after a reader finishes: ``parsed + skipped == total_lines``.

    For whole-document JSON files a successfully parsed document counts all its lines as parsed;
    problems inside it are ``skipped_items`` (by reason, located by item index).
    """

    path: str
    format: str
    total_lines: int = 0
    parsed: int = 0
    skipped: int = 0
    skipped_by_reason: Counter[str] = field(default_factory=Counter)
    skipped_examples: dict[str, list[str]] = field(default_factory=dict)
    skipped_items: Counter[str] = field(default_factory=Counter)
    unknown_record_types: Counter[str] = field(default_factory=Counter)
    orphans: Counter[str] = field(default_factory=Counter)
    orphan_examples: list[str] = field(default_factory=list)
    sessions: set[str] = field(default_factory=set)
    states: int = 0
    bytes: int = 0
    items: int | None = None
    """Items of a whole-document file (messages, events), when its reader counts them; the
    file's records are then its items, else its non-blank lines."""
    warnings: Counter[str] = field(default_factory=Counter)
    """Readable but doubtful (``missing_parent``: a Claude Code record whose parent is not in
    the file was placed in file order; ``parent_cycle``: parent links that loop; ``branch_switch_budget``: a Claude Code file switched
    branches more than its budget allows, later switches were not rebuilt)."""
    context_changes: Counter[str] = field(default_factory=Counter)
    """What changed later contexts: ``rewind``, ``rollback``, ``compaction``,
    ``branch_switch`` (a record continued a branch an earlier rewind cut off)."""

    def skip(self, line: int, reason: str, n: int = 1) -> None:
        """Record ``n`` lines starting at ``line`` as skipped for ``reason``."""
        self.skipped += n
        self.skipped_by_reason[reason] += n
        ex = self.skipped_examples.setdefault(reason, [])
        if len(ex) < MAX_EXAMPLES:
            ex.append(f"{self.path}:{line}")

    def skip_item(self, index: int, reason: str) -> None:
        self.skipped_items[reason] += 1
        ex = self.skipped_examples.setdefault("item:" + reason, [])
        if len(ex) < MAX_EXAMPLES:
            ex.append(f"{self.path}#item{index}")

    def unknown(self, line: int, record_type: str) -> None:
        self.unknown_record_types[record_type] += 1
        self.skip(line, "unknown_record_type")

    def orphan(self, kind: str, line: int, call_id: str) -> None:
        """``kind`` is ``tool_result_without_call`` or ``tool_call_without_result``."""
        self.orphans[kind] += 1
        if len(self.orphan_examples) < MAX_EXAMPLES:
            self.orphan_examples.append(f"{self.path}:{line} {kind} {call_id}")

    @property
    def balanced(self) -> bool:
        return self.parsed + self.skipped == self.total_lines

    @property
    def records(self) -> int:
        """Records in the file: its items, or its lines less the blank ones."""
        if self.items is not None:
            return self.items
        return self.total_lines - self.skipped_by_reason["blank_line"]

    @property
    def records_understood(self) -> int:
        """Records the reader used (or knew to carry nothing for a model's context)."""
        if self.items is not None:
            return max(0, self.items - sum(self.skipped_items.values()))
        return self.parsed

    def summary(self) -> str:
        """``path: format, understood/total records understood, N states``."""
        return (
            f"{self.path}: {self.format}, {self.records_understood}/{self.records} records "
            f"understood, {self.states} states"
        )

    def check_failure(self) -> str | None:
        """Why this file was not understood (fewer than half of its records understood, or at
        least ``MIN_RECORDS_FOR_STATES`` records and no state), or None."""
        n, ok = self.records, self.records_understood
        if n and 2 * ok < n:
            why = "fewer than half understood"
        elif n >= MIN_RECORDS_FOR_STATES and self.states == 0:
            why = "no state"
        else:
            return None
        return (
            f"{self.path}: read as {self.format}, {ok} of {n} records understood, "
            f"{self.states} states ({why})"
        )


@dataclass
class IngestReport:
    """Totals over files; filled while `ingest` iterates (complete once the iterator is done)."""

    files: list[FileReport] = field(default_factory=list)
    not_traces: list[str] = field(default_factory=list)  # files under a directory with no format
    unreadable: dict[str, str] = field(default_factory=dict)  # path -> why it was skipped
    duplicates: list[str] = field(default_factory=list)  # paths of files already read once
    redactions: Counter[str] = field(default_factory=Counter)
    duplicate_decisions: int = 0
    """States dropped because another file already gave the same model response (an OpenHands
    LLM call log and its conversation's events; see traces/ingest.py)."""
    input_dirs: list[str] = field(default_factory=list)

    def check_failures(self) -> list[str]:
        """One line per file not understood, and per input directory with nothing readable."""
        out = [why for f in self.files if (why := f.check_failure())]
        for d in self.input_dirs:
            inside = d.rstrip("/") + "/"
            if not any(f.path == d or f.path.startswith(inside) for f in self.files):
                out.append(f"nothing readable in {d}")
        return out

    def context_changes(self) -> Counter[str]:
        out: Counter[str] = Counter()
        for f in self.files:
            out.update(f.context_changes)
        return out

    def warnings(self) -> Counter[str]:
        out: Counter[str] = Counter()
        for f in self.files:
            out.update(f.warnings)
        return out

    @property
    def total_lines(self) -> int:
        return sum(f.total_lines for f in self.files)

    @property
    def parsed_lines(self) -> int:
        return sum(f.parsed for f in self.files)

    @property
    def skipped_lines(self) -> int:
        return sum(f.skipped for f in self.files)

    @property
    def states(self) -> int:
        return sum(f.states for f in self.files)

    @property
    def sessions(self) -> int:
        return len({s for f in self.files for s in f.sessions})

    def skipped_by_reason(self) -> Counter[str]:
        out: Counter[str] = Counter()
        for f in self.files:
            out.update(f.skipped_by_reason)
        return out

    def skipped_items(self) -> Counter[str]:
        out: Counter[str] = Counter()
        for f in self.files:
            out.update(f.skipped_items)
        return out

    def unknown_record_types(self) -> Counter[str]:
        out: Counter[str] = Counter()
        for f in self.files:
            out.update(f.unknown_record_types)
        return out

    def orphans(self) -> Counter[str]:
        out: Counter[str] = Counter()
        for f in self.files:
            out.update(f.orphans)
        return out

    def by_format(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for f in self.files:
            row = out.setdefault(
                f.format, {"files": 0, "sessions": 0, "states": 0, "lines": 0, "skipped": 0}
            )
            row["files"] += 1
            row["sessions"] += len(f.sessions)
            row["states"] += f.states
            row["lines"] += f.total_lines
            row["skipped"] += f.skipped
        return out

    @property
    def balanced(self) -> bool:
        return all(f.balanced for f in self.files)
