"""A scripted tiny model for the calculator tool environment: in its first assistant turn it
calls ``calculate("208 * 67")``, in its second it answers ``13936``: right for the task
``calc:208 * 67`` only, so other tasks fail at turn 1 ("answered 13936, expected ...")."""

from __future__ import annotations

import torch
from transformers import LlamaConfig

from composer_replication.envs.calculator import FEW_SHOT
from support.scripted_lm import ScriptedLlama

CALL = '<tool_call>{"name": "calculate", "arguments": {"expression": "208 * 67"}}</tool_call><|im_end|>'
ANSWER = "13936<|im_end|>"


def scripted_calculator_model(tok, turns: tuple[str, ...] = (CALL, ANSWER), seed: int = 0):
    """A 2-layer random Llama over ``tok``'s vocabulary pushed to write ``turns`` (one per
    assistant turn after the prompt's few-shot turns); ``tok`` must have the tool template."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
    )
    model = ScriptedLlama(cfg)
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    shots = sum(m["role"] == "assistant" for m in FEW_SHOT)  # assistant turns inside the prompt
    model.set_script(enc("<|im_start|>assistant\n"), [enc(t) for t in turns], shots)
    return model
