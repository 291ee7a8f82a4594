"""Models for GPU tests built from a config, with no download: the shapes of the models
``configs/gpu/*.yaml`` name (from their published ``config.json``), fewer layers, and the
vocabulary of a local tokenizer (a GPU machine without network has no Qwen tokenizer)."""

from __future__ import annotations

QWEN2_SHAPES = {
    "Qwen/Qwen2.5-0.5B-Instruct": dict(hidden_size=896, intermediate_size=4864,
                                       num_attention_heads=14, num_key_value_heads=2,
                                       tie_word_embeddings=True),
    "Qwen/Qwen2.5-1.5B-Instruct": dict(hidden_size=1536, intermediate_size=8960,
                                       num_attention_heads=12, num_key_value_heads=2,
                                       tie_word_embeddings=True),
    "Qwen/Qwen2.5-7B-Instruct": dict(hidden_size=3584, intermediate_size=18944,
                                     num_attention_heads=28, num_key_value_heads=4,
                                     tie_word_embeddings=False),
}  # fmt: skip


def qwen2_from_config(name: str, vocab_size: int, layers: int = 2, dtype=None, seed: int = 0):
    """A randomly initialised Qwen2 with ``name``'s widths, ``layers`` layers, ``vocab_size``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if name not in QWEN2_SHAPES:
        raise KeyError(f"no shape for {name!r}; known: {sorted(QWEN2_SHAPES)}")
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=vocab_size, num_hidden_layers=layers, rope_theta=1e6,
                      max_position_embeddings=4096, **QWEN2_SHAPES[name])  # fmt: skip
    return Qwen2ForCausalLM(cfg).to(dtype or torch.float32)
