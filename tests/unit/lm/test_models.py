"""Model references: local paths, mistyped paths, hub ids with the hub unreachable."""

from __future__ import annotations

import pytest

from composer_replication.lm.models import ModelLoadError, resolve_model_path


@pytest.fixture
def hub_unreachable(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # a closed local port
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)


def test_a_missing_path_is_named_as_a_path(tmp_path):
    for ref in [str(tmp_path / "nope"), "./runs/quickstrat/final", "runs/a/b", "~/x/y/z"]:
        with pytest.raises(ModelLoadError, match="does not exist"):
            resolve_model_path(ref)


def test_a_directory_without_config_is_refused(tmp_path):
    with pytest.raises(ModelLoadError, match="has no config.json"):
        resolve_model_path(str(tmp_path))


def test_unreachable_hub_fails_with_the_hub_error(hub_unreachable, tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ModelLoadError, match=r"could not load 'Org/typo' .*ConnectionRefused"):
        resolve_model_path("Org/typo")


def test_unreachable_hub_uses_the_local_cache(hub_unreachable, tmp_path, monkeypatch):
    """A model in the HF cache loads from its snapshot directory when the hub does not answer."""
    from huggingface_hub import constants

    cache = tmp_path / "cache"
    snap = cache / "models--Org--cached" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    (cache / "models--Org--cached" / "refs").mkdir()
    (cache / "models--Org--cached" / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    assert resolve_model_path("Org/cached") == str(snap)
