"""Preference data on disk: the file ``composer-replication pairs`` writes (``PAIRS_FILE``, in
TRL's conversational preference format) and the checked reading the replay channel trains on.
A directory is searched for ``pairs.jsonl`` or a single ``*.jsonl``;
``embedded:fixture-replay-pairs`` is the small dataset shipped in the package (see
``composer_replication/data/README.md``). Imports no torch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from composer_replication.config import UserError

PAIRS_FILE = "pairs.jsonl"
"""The pairs file of an export directory (``export_pairs`` writes it, the replay channel
reads it)."""


class PreferenceDataError(UserError, ValueError):
    """A preference file that cannot be used; the message names the file and line."""


EMBEDDED_PAIRS = {"fixture-replay-pairs": "fixture_replay_pairs.jsonl"}


def resolve_pairs_file(path: str | Path) -> Path:
    """A JSONL file, a directory holding one, or ``embedded:NAME`` (shipped in the package)."""
    if str(path).startswith("embedded:"):
        name = str(path).split(":", 1)[1]
        if name not in EMBEDDED_PAIRS:
            raise PreferenceDataError(
                f"unknown embedded dataset {name!r}; known: {list(EMBEDDED_PAIRS)}"
            )
        return Path(__file__).resolve().parents[1] / "data" / EMBEDDED_PAIRS[name]
    p = Path(path).expanduser()
    if p.is_file():
        return p
    if p.is_dir():
        if (p / PAIRS_FILE).is_file():
            return p / PAIRS_FILE
        found = sorted(p.glob("*.jsonl"))
        if len(found) == 1:
            return found[0]
        raise PreferenceDataError(
            f"{p}: expected {PAIRS_FILE} or exactly one *.jsonl, found {len(found)}"
        )
    raise PreferenceDataError(f"preference data not found: {p}")


def check_pair(row: Any, where: str) -> None:
    """A `PreferenceDataError` (``where``: file:line) unless ``row`` is an object whose
    ``prompt``, ``chosen`` and ``rejected`` are each messages (a list) or a string."""
    if not isinstance(row, dict):
        raise PreferenceDataError(f"{where}: not a JSON object (a {type(row).__name__})")
    for key in ("prompt", "chosen", "rejected"):
        if key not in row:
            raise PreferenceDataError(f"{where}: missing field {key!r}")
        if not isinstance(row[key], list | str):
            raise PreferenceDataError(f"{where}: {key!r} must be messages or a string")


def load_pairs(path: str | Path, max_pairs: int) -> list[dict[str, Any]]:
    """Read up to ``max_pairs`` preference rows, validating each (errors name file:line)."""
    f = resolve_pairs_file(path)
    rows = []
    with f.open("rb") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError as err:
                raise PreferenceDataError(f"{f}:{lineno}: invalid JSON ({err})") from None
            check_pair(row, f"{f}:{lineno}")
            rows.append(row)
            if len(rows) >= max_pairs:
                break
    if not rows:
        raise PreferenceDataError(f"{f}: no preference pairs")
    return rows
