"""Value-of-information gating: spend teacher calls where the student is unsure.

A state's score is the student's mean next-token entropy over the tokens of the trace's own
action, given the prefix:

    H(state) = 1/|A| * sum_{t in A} -sum_v p_t(v) log p_t(v),   p_t = softmax(logits_t)

where A are the action's token positions (teacher-forced). High entropy means the student has no
settled opinion at that decision, so a teacher consensus there is worth more (the
entropy-as-uncertainty heuristic of active learning; Settles 2009, "Active Learning Literature
Survey", section 3.1). States are then kept above a ``threshold`` or in the top
``top_percentile`` percent.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from composer_replication.lm.chat import render_prompt
from composer_replication.traces.schema import TraceState


def mean_token_entropy(logits_TV, mask_T):
    """Mean entropy (nats) of the softmax of ``logits_TV`` over rows where ``mask_T`` is 1.
    Returns ``(entropy, metrics)``; an empty mask gives 0."""
    import torch

    logp_TV = torch.log_softmax(logits_TV.float(), dim=-1)
    ent_T = -(logp_TV.exp() * logp_TV).sum(-1)
    n = mask_T.sum()
    ent = (ent_T * mask_T).sum() / n.clamp(min=1)
    return ent, {"gating/tokens": int(n)}


def _ids(tokenizer, messages: list[dict[str, Any]], add_generation_prompt: bool) -> list[int]:
    text = render_prompt(tokenizer, messages, add_generation_prompt=add_generation_prompt)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def state_entropy(
    model: Any, tokenizer: Any, state: TraceState, max_prompt_tokens: int = 768,
    max_action_tokens: int = 256,
) -> float:  # fmt: skip
    """The student's mean token entropy over ``state.action`` (see the module docstring)."""
    import torch

    prompt = state.prefix or [{"role": "user", "content": ""}]
    p_ids = _ids(tokenizer, prompt, add_generation_prompt=True)
    full = _ids(tokenizer, [*prompt, state.action.as_message()], False)
    a_ids = full[len(p_ids) :][:max_action_tokens]
    if not a_ids:
        return 0.0
    p_ids = p_ids[-max_prompt_tokens:]
    ids = torch.tensor([p_ids + a_ids], device=next(model.parameters()).device)
    with torch.no_grad():
        logits_TV = model(input_ids=ids).logits[0]
    mask_T = torch.zeros(ids.shape[1], device=ids.device)
    mask_T[len(p_ids) - 1 : ids.shape[1] - 1] = 1.0  # positions that predict action tokens
    ent, _ = mean_token_entropy(logits_TV, mask_T)
    return float(ent)


def score_states(
    states: Sequence[TraceState], student: str | tuple[Any, Any], **kw: Any
) -> dict[str, float]:
    """Entropy score per state id; ``student`` is a model reference or ``(model, tokenizer)``."""
    if isinstance(student, str):
        from composer_replication.lm.models import load_model, load_tokenizer

        student = (load_model(student).eval(), load_tokenizer(student))
    model, tok = student
    return {s.state_id: state_entropy(model, tok, s, **kw) for s in states}


def select_states(
    scores: Mapping[str, float], threshold: float | None = None,
    top_percentile: float | None = None,
) -> set[str]:  # fmt: skip
    """Ids with score >= ``threshold`` and/or in the top ``top_percentile`` % (both: both
    conditions). Neither: every id."""
    keep = set(scores)
    if threshold is not None:
        keep &= {k for k, v in scores.items() if v >= threshold}
    if top_percentile is not None:
        if not 0 < top_percentile <= 100:
            raise ValueError(f"top_percentile must be in (0, 100], got {top_percentile}")
        n = math.ceil(len(scores) * top_percentile / 100)
        ranked = sorted(scores, key=lambda k: (-scores[k], k))
        keep &= set(ranked[:n])
    return keep
