"""``data.sampler`` (config/data.py): a union keyed on ``type``, a bare name for the defaults,
unknown keys and out-of-range values refused."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from composer_replication.config import load_config
from composer_replication.config.data import DataConfig


def test_config_union_and_yaml_override():
    assert DataConfig().sampler.type == "uniform"
    cfg = load_config(None, ["data.sampler=adaptive"])
    assert cfg.data.sampler.type == "adaptive" and cfg.data.sampler.floor == 0.02
    with pytest.raises(ValidationError):
        DataConfig(sampler={"type": "adaptive", "flor": 0.1})
    with pytest.raises(ValidationError):
        DataConfig(sampler={"type": "uniform", "floor": 0.1})
    with pytest.raises(ValidationError):
        DataConfig(sampler={"type": "adaptive", "retire_pass_rate": 1.5})
