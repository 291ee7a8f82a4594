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


@pytest.mark.parametrize("ref", ["/nope", "./x", "../x", "~/x", "a/b/c", "models\\x", "x/"])
def test_a_name_that_can_only_be_a_path_fails_at_once_with_the_rule(
    ref, hub_unreachable, tmp_path, monkeypatch
):
    """No hub probe for these: they cannot be hub ids. The error states the rule. Run from an
    empty directory with an empty home, so no ``x`` of this machine's (a ``/tmp/x`` next to the
    checkout did) makes a relative ref exist."""
    from composer_replication.lm.models import MODEL_RULE, resolve_model_source

    (tmp_path / "home").mkdir()
    (tmp_path / "a" / "cwd").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path / "a" / "cwd")
    with pytest.raises(ModelLoadError, match="does not exist") as err:
        resolve_model_source(ref)
    assert MODEL_RULE in str(err.value) and "\n" not in str(err.value)


def test_org_name_is_a_path_when_its_first_part_is_a_local_directory(
    tmp_path, monkeypatch, hub_unreachable
):
    """``models/my-smollm`` with a ``models/`` directory here was meant as a path (it used to
    go to the hub and fail after 32 s with a DNS error); without one it is a hub id."""
    from composer_replication.lm.models import resolve_model_source

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(constants_module(), "HF_HUB_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ModelLoadError, match="could not load 'models/my-smollm' from the Hugging"
                       ) as err:  # fmt: skip
        resolve_model_source("models/my-smollm")
    assert "Read as a local path, 'models/my-smollm' does not exist either" in str(err.value)
    (tmp_path / "models").mkdir()
    with pytest.raises(ModelLoadError, match="model path 'models/my-smollm' does not exist"):
        resolve_model_source("models/my-smollm")
    (tmp_path / "models" / "my-smollm").mkdir()
    (tmp_path / "models" / "my-smollm" / "config.json").write_text("{}")
    source = resolve_model_source("models/my-smollm")
    assert (source.kind, source.location) == ("dir", "models/my-smollm")


def test_offline_hub_id_must_be_in_the_cache(tmp_path, monkeypatch):
    from composer_replication.lm.models import resolve_model_source

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants_module(), "HF_HUB_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ModelLoadError, match="not in the local HF cache and HF_HUB_OFFLINE is"):
        resolve_model_source("HuggingFaceTB/SmolLM2-135M")


def test_a_hub_that_never_answers_is_given_up_within_the_probe_timeout(monkeypatch):
    """A name lookup that hangs (a socket timeout does not bound it) is cut at the timeout."""
    import socket
    import threading
    import time

    from composer_replication.lm.models import _probe_hub

    release = threading.Event()

    def hang(*args, **kwargs):  # then fails as a lookup would (it returned None: the probe
        release.wait(30)  # thread's .close() raised in whichever test ran next)
        raise OSError("the lookup was released by the test")

    monkeypatch.setattr(socket, "create_connection", hang)
    t0 = time.monotonic()
    try:
        with pytest.raises(TimeoutError, match="no answer from"):
            _probe_hub(timeout_s=0.2)
        assert time.monotonic() - t0 < 20  # not the 30 s the lookup would have taken
    finally:
        release.set()


def test_embedded_and_gguf_sources():
    from composer_replication.lm.models import DEFAULT_MODEL, resolve_model_source

    source = resolve_model_source(DEFAULT_MODEL)
    assert source.kind == "embedded" and source.location.endswith(".gguf")
    with pytest.raises(ModelLoadError, match="GGUF file not found"):
        resolve_model_source("nope.gguf")


def constants_module():
    from huggingface_hub import constants

    return constants
