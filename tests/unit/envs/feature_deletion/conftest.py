"""Shared fixtures of the feature_deletion tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from composer_replication.config import TaskGenConfig
from composer_replication.envs import get_env

TEXTKIT = Path(__file__).parents[3] / "fixtures" / "feature_deletion" / "textkit"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """The feature_deletion environment on the vendored textkit fixture (9 tasks)."""
    return get_env(
        "feature_deletion",
        sources=[str(TEXTKIT)],
        task_dir=tmp_path_factory.mktemp("tasks"),
        generation=TaskGenConfig(workers=2, suite_timeout_s=30),
        heldout_fraction=0.3,
    )
