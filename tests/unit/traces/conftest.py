from __future__ import annotations

from pathlib import Path

import pytest
from support.fixtures import trace_fixtures_dir


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """``../shared/fixtures`` when present, else the vendored subset (never a skip)."""
    return trace_fixtures_dir()
