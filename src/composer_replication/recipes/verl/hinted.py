"""The hint-conditioned self-teacher for verl, without importing verl (tested in the main env).

SDPO / OPSD (Zhao et al., arXiv:2601.20802; Hübotter et al., "Reinforcement Learning via
Self-Distillation", arXiv:2601.20802v2): the policy, shown a hint about its failed attempt,
scores that same attempt; the student is pulled toward those hint-conditioned log-probs.
verl's loss hook sees per-token log-probs only, so the teacher signal is the log-prob of each
*sampled* response token under ``[prompt with the hint] + response``.

Layout (verl's, from its vLLM ``prompt_logprobs`` extraction): for a sequence of ``S`` tokens the
server returns ``S`` rows where row ``j`` holds the log-prob (and id) of token ``j + 1`` and the
last row is a dummy. :func:`hinted_teacher_logprobs` returns rows in that layout for the
*student's* sequence ``prompt_ids + response_ids`` (``P + R`` rows), so verl pads and slices them
exactly as its own teacher's: row ``P - 1 + k`` is the hinted log-prob of response token ``k``;
rows of prompt tokens are 0. Rows of an attempt without a hint are NaN (the loss skips them).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol
from uuid import uuid4

import torch
from torch import Tensor

from composer_replication.channels.hints import HintTemplates, insert_hint
from composer_replication.lm.chat import as_messages, render_prompt

SCORING = {"max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0, "detokenize": False}


class TokenClient(Protocol):
    """verl's ``LLMServerClient``: ``await generate(request_id, prompt_ids=..., sampling_params=...)``
    returning an object whose ``extra_fields`` has ``prompt_ids``/``prompt_logprobs``."""

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict
    ) -> Any: ...


class TeacherMismatch(ValueError):
    """The scoring server returned rows that do not line up with the tokens sent."""


def feedback_hint(
    reward_score: float | None,
    reward_extra_info: Mapping[str, Any] | None,
    templates: HintTemplates | None = None,
    pass_reward: float = 1.0,
) -> str | None:
    """The hint for one scored rollout: the verifier's ``feedback`` (from the reward function's
    extra info) in the feedback template, for a rollout below ``pass_reward``; else None."""
    if reward_score is None or reward_score >= pass_reward:
        return None
    feedback = str((reward_extra_info or {}).get("feedback", "")).strip()
    if not feedback:
        return None
    return (templates or HintTemplates()).feedback.format(feedback=feedback)


def hinted_prompt_ids(
    tokenizer: Any, messages: Sequence[Mapping[str, Any]], hint: str, tools: Sequence | None = None
) -> list[int]:
    """Token ids of the conversation with ``hint`` after its last user turn, rendered with the
    chat template and a generation prompt (what our TRL channel's teacher sees)."""
    text = render_prompt(tokenizer, insert_hint(as_messages(list(messages)), hint), tools=tools)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def unhinted_rows(n_prompt: int, n_response: int) -> tuple[Tensor, Tensor]:
    """(ids, log-probs) rows for a rollout without a hint: ids 0, log-probs NaN."""
    n = n_prompt + n_response
    return torch.zeros(n, 1, dtype=torch.int32), torch.full((n, 1), math.nan)


async def hinted_teacher_logprobs(
    client: TokenClient,
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    hint: str,
    prompt_ids: Sequence[int],
    response_ids: Sequence[int],
    tools: Sequence | None = None,
) -> tuple[Tensor, Tensor]:
    """(ids ``[P+R, 1]`` int32, log-probs ``[P+R, 1]``) of the response under the hinted
    context, in verl's row layout for the student's sequence (module docstring). Raises
    :class:`TeacherMismatch` when the server's rows do not match the tokens sent."""
    hinted = hinted_prompt_ids(tokenizer, messages, hint, tools)
    sequence = hinted + list(response_ids)
    out = await client.generate(uuid4().hex, prompt_ids=sequence, sampling_params=dict(SCORING))
    ids = torch.as_tensor(out.extra_fields["prompt_ids"], dtype=torch.int64).reshape(-1)
    lps = torch.as_tensor(out.extra_fields["prompt_logprobs"], dtype=torch.float32).reshape(-1)
    if ids.numel() != len(sequence) or lps.numel() != len(sequence):
        raise TeacherMismatch(
            f"teacher scoring returned {ids.numel()} ids / {lps.numel()} log-probs for a "
            f"{len(sequence)}-token sequence (one row per token expected)"
        )
    h, p, r = len(hinted), len(prompt_ids), len(response_ids)
    got = ids[h - 1 : h - 1 + r]
    if not torch.equal(got, torch.as_tensor(list(response_ids), dtype=torch.int64)):
        bad = int((got != torch.as_tensor(list(response_ids))).nonzero()[0])
        raise TeacherMismatch(
            f"teacher row {h - 1 + bad} scores token {int(got[bad])}, but response token {bad} "
            f"is {response_ids[bad]}"
        )
    if not torch.isfinite(lps[h - 1 : h - 1 + r]).all():
        raise TeacherMismatch("teacher scoring returned non-finite log-probs for response tokens")
    out_ids, out_lps = torch.zeros(p + r, 1, dtype=torch.int32), torch.zeros(p + r, 1)
    out_ids[p - 1 : p - 1 + r, 0] = got.to(torch.int32)
    out_lps[p - 1 : p - 1 + r, 0] = lps[h - 1 : h - 1 + r]
    return out_ids, out_lps
