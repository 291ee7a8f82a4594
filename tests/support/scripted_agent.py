"""A scripted tiny model for the calculator tool environment: in its first assistant turn it
calls ``calculate("208 * 67")``, in its second it answers ``13936``: right for the task
``calc:208 * 67`` only, so other tasks fail at turn 1 ("answered 13936, expected ...")."""

from __future__ import annotations

from conftest import make_tiny_model

from composer_replication.envs.calculator import FEW_SHOT
from support.scripted_lm import ScriptedLlama

CALL = '<tool_call>{"name": "calculate", "arguments": {"expression": "208 * 67"}}</tool_call><|im_end|>'
ANSWER = "13936<|im_end|>"


def scripted_calculator_model(
    tok, turns: tuple[str, ...] = (CALL, ANSWER), seed: int = 0, shots: int | None = None
):
    """A 2-layer random Llama over ``tok``'s vocabulary pushed to write ``turns`` (one per
    assistant turn after the prompt's ``shots`` few-shot assistant turns; default: all of
    ``FEW_SHOT``'s); ``tok`` must have the tool template."""
    model = make_tiny_model(len(tok), seed, cls=ScriptedLlama, max_positions=1024)
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    if shots is None:
        shots = sum(m["role"] == "assistant" for m in FEW_SHOT)
    model.set_script(enc("<|im_start|>assistant\n"), [enc(t) for t in turns], shots)
    return model
