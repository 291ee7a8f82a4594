"""The generation interface a rollout worker calls, and its transformers implementation.

``Generator.generate(prompt_ids_batch, sampling) -> [(completion_ids, logps)]``: one sampled
completion per prompt (cut after the first end-of-sequence token) with the log-prob of each of
its tokens under the sampling policy, recorded while generating (no second forward). The
log-prob is that of the *temperature-scaled* distribution, the quantity TRL's learner computes
for ``old_per_token_logps`` (logits / temperature; top-p is not renormalized, as in TRL), so
the learner's ratio of its pre-update policy to this behaviour policy is 1 at staleness 0 up to
float rounding. The shared batched generator of the generation issue (continuous batching)
implements the same interface and replaces :class:`HFGenerator` when it lands."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Sampling:
    """How to sample: TRL's ``temperature``/``top_p`` with ``top_k`` off."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0


class Generator(Protocol):
    def generate(
        self, prompt_ids_batch: list[list[int]], sampling: Sampling
    ) -> list[tuple[list[int], list[float]]]: ...


class HFGenerator:
    """``model.generate`` on a left-padded batch; log-probs from the per-step logits it
    returns (``output_logits``)."""

    def __init__(self, model: Any, pad_id: int, eos_ids: list[int]):
        self.model = model
        self.pad_id = pad_id
        self.eos_ids = set(eos_ids)

    def generate(
        self, prompt_ids_batch: list[list[int]], sampling: Sampling
    ) -> list[tuple[list[int], list[float]]]:
        import torch

        width = max(len(p) for p in prompt_ids_batch)
        ids_BP = torch.tensor(
            [[self.pad_id] * (width - len(p)) + list(p) for p in prompt_ids_batch]
        )
        mask_BP = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids_batch])
        self.model.eval()
        with torch.no_grad():
            out = self.model.generate(
                input_ids=ids_BP, attention_mask=mask_BP, max_new_tokens=sampling.max_new_tokens,
                do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=0,
                pad_token_id=self.pad_id, output_logits=True, return_dict_in_generate=True,
            )  # fmt: skip
        new_BN = out.sequences[:, width:]
        logits_BNV = torch.stack(out.logits, dim=1).float() / sampling.temperature
        logps_BN = logits_BNV.log_softmax(-1).gather(-1, new_BN.unsqueeze(-1)).squeeze(-1)
        return [
            self._cut(row.tolist(), lp.tolist()) for row, lp in zip(new_BN, logps_BN, strict=True)
        ]

    def _cut(self, ids: list[int], logps: list[float]) -> tuple[list[int], list[float]]:
        end = next((i for i, t in enumerate(ids) if t in self.eos_ids), None)
        n = len(ids) if end is None else end + 1
        return ids[:n], logps[:n]
