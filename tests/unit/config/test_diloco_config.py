"""DilocoConfig: defaults, ranges, cross-field checks, and its place in RunConfig."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError

from composer_replication.config import ConfigError, load_config
from composer_replication.config.diloco import DilocoConfig


def test_defaults_follow_the_paper_and_are_off():
    c = DilocoConfig()
    assert not c.enabled
    assert (c.outer_lr, c.outer_momentum, c.nesterov) == (0.7, 0.9, True)
    assert c.backend == "torchft"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"sync_every": 0},
        {"replicas": 0},
        {"outer_lr": 0.0},
        {"outer_momentum": 1.0},
        {"timeout_s": 0},
        {"compression": "fp8"},
        {"backend": "nccl"},
        {"unknown": 1},
    ],
)
def test_bad_values_rejected(kwargs):
    with pytest.raises(ValidationError):
        DilocoConfig(**kwargs)


def test_sync_every_must_be_multiple_of_fragments():
    DilocoConfig(sync_every=6, fragments=3)
    with pytest.raises(ValidationError, match="multiple of diloco.fragments"):
        DilocoConfig(sync_every=5, fragments=2)


def test_min_replicas_cannot_exceed_replicas():
    with pytest.raises(ValidationError, match="min_replicas"):
        DilocoConfig(replicas=2, min_replicas=3)


def test_object_store_backend_needs_uri():
    with pytest.raises(ValidationError, match="store_uri"):
        DilocoConfig(enabled=True, backend="object_store")
    DilocoConfig(enabled=True, backend="object_store", store_uri="file:///tmp/x")


def test_run_config_has_diloco_section_with_overrides():
    cfg = load_config(None, ["diloco.enabled=true", "diloco.sync_every=3"])
    assert cfg.diloco.enabled and cfg.diloco.sync_every == 3


def test_run_config_error_names_the_diloco_key():
    with pytest.raises(ConfigError, match=r"diloco\.sync_every"):
        load_config(None, ["diloco.sync_every=-1"])
    with pytest.raises(ConfigError, match=r"diloco\.bogus: unknown key"):
        load_config(None, ["diloco.bogus=1"])


def test_config_import_stays_torch_free():
    code = (
        "import sys, composer_replication.config, composer_replication.diloco; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
