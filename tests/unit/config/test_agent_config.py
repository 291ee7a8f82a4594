"""The ``agent_proxy`` section: unknown keys rejected, the environment it needs, and a missing
harness venv named in one line before any model loads (preflight)."""

from __future__ import annotations

import pytest

from composer_replication.config import ConfigError, UserError, load_config
from composer_replication.run.preflight import preflight


def test_unknown_keys_and_the_wrong_environment_are_refused():
    with pytest.raises(ConfigError, match="agent_proxy.bogus"):
        load_config("agent_proxy.yaml", ["agent_proxy.bogus=1"])
    with pytest.raises(ConfigError, match="env.name=feature_deletion"):
        load_config("agent_proxy.yaml", ["env.name=calculator"])
    with pytest.raises(ConfigError, match="agent_proxy.command"):
        load_config("agent_proxy.yaml", ["agent_proxy.harness=command"])
    off = load_config("quickstart.yaml", [])
    assert not off.agent_proxy.enabled


def test_a_missing_harness_venv_is_one_line_before_anything_loads(tmp_path):
    cfg = load_config("agent_proxy.yaml", [f"agent_proxy.venv={tmp_path / 'nowhere'}"])
    with pytest.raises(
        UserError, match=r"agent_proxy.venv: .*nowhere is no virtual environment"
    ) as err:
        preflight(cfg)
    # the fix is in the message: the command that builds the harness's venv there
    assert "\n" not in str(err.value)
    assert f"python -m venv {tmp_path / 'nowhere'} && " in str(err.value)
    assert "pip install mini-swe-agent==" in str(err.value)
