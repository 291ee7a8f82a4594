"""Where the trace tests read public agent logs: ``../shared/fixtures`` beside the checkout
when present (the wider set), else the vendored subset in ``tests/fixtures/traces``.
``CR_TRACE_FIXTURES=vendored`` forces the subset (to check a plain clone's view)."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED = (REPO.parent / "shared" / "fixtures").resolve()
VENDORED = REPO / "tests" / "fixtures" / "traces"


def trace_fixtures_dir() -> Path:
    """The fixture tree the trace tests use (see module docstring)."""
    if os.environ.get("CR_TRACE_FIXTURES") != "vendored" and SHARED.is_dir():
        return SHARED
    return VENDORED
