from __future__ import annotations

from pathlib import Path

import pytest

# CI clones the project beside shared/; locally the worktree sits beside it too.
FIXTURES = (Path(__file__).resolve().parents[3] / ".." / "shared" / "fixtures").resolve()


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    if not FIXTURES.is_dir():
        pytest.skip(f"shared fixtures not found at {FIXTURES} (expected ../shared/fixtures)")
    return FIXTURES
