"""A stand-in for verl's ``LLMServerClient`` that scores prompts with a Hugging Face model and
returns ``prompt_logprobs`` in the layout verl's vLLM server produces (row ``j``: token ``j+1``;
last row a dummy 0), optionally lying in a chosen way."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class ScoringOutput:
    token_ids: list[int]
    extra_fields: dict[str, Any] = field(default_factory=dict)


class HFScoringClient:
    """``await generate(request_id, prompt_ids=..., sampling_params=...)`` over ``model``."""

    def __init__(self, model, lie: str | None = None):
        self.model = model
        self.lie = lie
        self.calls: list[list[int]] = []

    @torch.no_grad()
    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict):
        assert sampling_params.get("prompt_logprobs") == 0, sampling_params
        self.calls.append(list(prompt_ids))
        ids = torch.tensor([prompt_ids])
        logp = torch.log_softmax(self.model(ids).logits.float(), -1)[0]
        rows = logp[:-1].gather(-1, ids[0, 1:, None])[:, 0].tolist() + [0.0]
        row_ids = list(prompt_ids[1:]) + [0]
        if self.lie == "short":
            rows, row_ids = rows[:-2], row_ids[:-2]
        elif self.lie == "shifted":
            row_ids = [row_ids[-1], *row_ids[:-1]]
        elif self.lie == "nan":
            rows = [float("nan")] * len(rows)
        return ScoringOutput(
            [0], {"prompt_ids": [[i] for i in row_ids], "prompt_logprobs": [[r] for r in rows]}
        )
