"""The tool schemas of the harness whose logs a trace format holds (Claude Code's for
``claude_code``, Codex CLI's for ``codex``), as the harness profiles define them
(envs/profiles.py, stored in ``envs/profile_schemas.json``). Ingestion keeps them on each
state (``TraceState.tools``), replay sends them to teachers, and pairs carry them, so that
channel 3 trains in the vocabulary of a run whose environment uses the same profile.

Read from the stored file, not from the profiles module: importing the environments (and
transformers, which renders the schemas) costs seconds that ingestion does not need."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import orjson

SCHEMAS_FILE = Path(__file__).resolve().parents[1] / "envs" / "profile_schemas.json"


@lru_cache(maxsize=1)
def _by_format() -> dict[str, tuple[str, list[dict[str, Any]]]]:
    data = orjson.loads(SCHEMAS_FILE.read_bytes())
    return {fmt: (h, v["tools"]) for h, v in data.items() for fmt in v["source_formats"]}


def harness_of_format(source_format: str) -> str | None:
    """The harness profile whose vocabulary ``source_format``'s logs speak, or None."""
    found = _by_format().get(source_format)
    return found[0] if found else None


def format_tools(source_format: str) -> list[dict[str, Any]] | None:
    """The OpenAI ``tools`` list of that harness (one shared list: do not mutate), or None."""
    found = _by_format().get(source_format)
    return found[1] if found else None
