"""Models built from a config (random init) where no weights can be fetched: a GPU machine
without network runs ``bench_step.py --model-config qwen2.5-0.5b`` on a model of
Qwen2.5-0.5B's shape. The tokenizer is a local one (by default the embedded SmolLM2's,
49152 ids, all inside Qwen's 151936; ids it lacks decode to nothing).

    python bench/config_models.py qwen2.5-0.5b /tmp/qwen-0.5b-random [--tokenizer DIR]
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

_QWEN = {"rms_norm_eps": 1e-6, "rope_theta": 1e6, "max_position_embeddings": 32768}
PRESETS: dict[str, dict] = {
    # shapes from the published config.json of Qwen/Qwen2.5-{0.5B,1.5B}-Instruct
    "qwen2.5-0.5b": {
        **_QWEN,
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    },
    "qwen2.5-1.5b": {
        **_QWEN,
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    },
    "tiny": {  # smoke runs on a CPU
        **_QWEN,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 49152,
        "tie_word_embeddings": True,
        "max_position_embeddings": 2048,
    },
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def default_tokenizer_dir() -> Path:
    """The embedded SmolLM2's converted directory (its tokenizer files)."""
    from composer_replication.lm.models import DEFAULT_MODEL, resolve_model_path

    return Path(resolve_model_path(DEFAULT_MODEL))


def copy_tokenizer(src: Path, dst: Path) -> None:
    """Copy the tokenizer files of ``src`` (those present) into ``dst``."""
    dst.mkdir(parents=True, exist_ok=True)
    found = [n for n in TOKENIZER_FILES if (src / n).is_file()]
    if "tokenizer.json" not in found:
        raise FileNotFoundError(f"no tokenizer.json in {src}")
    for name in found:
        shutil.copy2(src / name, dst / name)


def build_model_dir(
    preset: str,
    out_dir: Path,
    tokenizer_dir: Path | None = None,
    dtype: str = "bfloat16",
    seed: int = 0,
) -> Path:
    """A loadable model directory (config, random weights from ``seed``, tokenizer) of
    ``preset``'s shape."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config

    if preset not in PRESETS:
        raise ValueError(f"unknown model config {preset!r}; known: {sorted(PRESETS)}")
    out_dir = Path(out_dir)
    if (out_dir / "config.json").is_file():
        return out_dir
    copy_tokenizer(Path(tokenizer_dir or default_tokenizer_dir()), out_dir)
    tok = AutoTokenizer.from_pretrained(out_dir)
    eos = tok.eos_token_id
    cfg = Qwen2Config(
        **PRESETS[preset],
        bos_token_id=tok.bos_token_id if tok.bos_token_id is not None else eos,
        eos_token_id=eos,
        pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else eos,
    )
    torch.manual_seed(seed)  # on the CPU: the benchmark's parent process leaves the GPU alone
    model = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype))
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("preset", choices=sorted(PRESETS))
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--tokenizer", type=Path, default=None, help="dir with tokenizer.json")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--seed", type=int, default=0, help="of the random weights")
    args = ap.parse_args()
    print(build_model_dir(args.preset, args.out_dir, args.tokenizer, args.dtype, args.seed))


if __name__ == "__main__":
    main()
