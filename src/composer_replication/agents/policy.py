"""What the proxy generates with: a causal LM sampled one prompt at a time, its tokens' log-probs
under the sampling distribution recorded (agents/proxy.py's ``Policy``).

:class:`TrainerPolicy` is the trainer's current policy on the trainer's own generation path
(``_generate_single_turn``: the shared-prefix generation, ``generation_config`` with the
run's temperature, top-p, top-k and ``max_completion_length``); :class:`ModelPolicy` is any
model with explicit settings (tests, serving a checkpoint).
"""

from __future__ import annotations

from typing import Any

import torch

from composer_replication.rollout import until_eos


def sampled_logprobs(
    model: Any, prompt_ids: list[int], completion_ids: list[int], temperature: float
) -> list[float]:
    """``log softmax(logits / temperature)`` of each completion token given what precedes it
    (TRL's sampling log-probs; top-p/top-k truncation is not reflected, as in TRL)."""
    if not completion_ids:
        return []
    device = next(model.parameters()).device
    ids = torch.tensor([prompt_ids + completion_ids], device=device)
    with torch.no_grad():
        logits_TV = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
    logp_TV = torch.log_softmax(logits_TV / max(temperature, 1e-6), dim=-1)
    target_T = torch.tensor(completion_ids, device=device)
    return logp_TV.gather(1, target_T[:, None])[:, 0].tolist()


class ModelPolicy:
    """``model`` sampled at ``temperature`` (greedy at 0) for up to ``max_new_tokens``."""

    def __init__(self, model: Any, tokenizer: Any, temperature: float = 1.0,
                 max_new_tokens: int = 128):  # fmt: skip
        self.model, self.tokenizer = model, tokenizer
        self.temperature, self.max_new_tokens = temperature, max_new_tokens

    def __call__(self, prompt_ids: list[int]) -> tuple[list[int], list[float]]:
        device = next(self.model.parameters()).device
        ids = torch.tensor([prompt_ids], device=device)
        kwargs: dict[str, Any] = {"max_new_tokens": self.max_new_tokens,
                                  "do_sample": self.temperature > 0}  # fmt: skip
        if self.temperature > 0:
            kwargs.update(temperature=self.temperature, top_k=0, top_p=1.0)
        with torch.no_grad():
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids),
                                      pad_token_id=self.tokenizer.pad_token_id, **kwargs)  # fmt: skip
        new = until_eos(out[0, len(prompt_ids) :].tolist(), self.tokenizer.eos_token_id)
        return new, sampled_logprobs(self.model, prompt_ids, new, max(self.temperature, 1e-6))


class TrainerPolicy:
    """The trainer's current policy on its own generation path (module docstring)."""

    def __init__(self, trainer: Any):
        self.trainer = trainer

    def __call__(self, prompt_ids: list[int]) -> tuple[list[int], list[float]]:
        t = self.trainer
        completions, _ = t._generate_single_turn([list(prompt_ids)], None, {}, 1)
        new = list(completions[0])
        return new, sampled_logprobs(t.model, list(prompt_ids), new, t.temperature)
