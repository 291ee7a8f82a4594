"""What the proxy generates with: a request's prompt ids sent to the one generator of the
run (lm/generator.py), answered with the completion ids, their log-probs under the sampling
distribution (recorded by the generation itself) and how long the request queued.

:class:`TrainerPolicy` is the trainer's current policy through the trainer's generator
(``ComposerReplicationTrainer.rollout_generator``: the shared-prefix generation, the trainer's
``generation_config`` with the run's temperature, top-p, top-k and ``max_completion_length``);
:class:`ModelPolicy` is any model with explicit settings (tests, serving a checkpoint), on a
generator of its own. Both may be called from many threads at once: the generator batches
concurrent requests in arrival order.
"""

from __future__ import annotations

from typing import Any

from composer_replication.lm.generator import Completion, Generator, Sampling
from composer_replication.lm.models import pad_token_id

__all__ = ["GeneratorPolicy", "ModelPolicy", "TrainerPolicy"]


class GeneratorPolicy:
    """``prompt_ids -> Completion`` on ``generator`` with ``sampling``."""

    def __init__(self, generator: Generator, sampling: Sampling):
        self.generator, self.sampling = generator, sampling

    def __call__(self, prompt_ids: list[int]) -> Completion:
        return self.generator.submit(prompt_ids, self.sampling).result()


class ModelPolicy(GeneratorPolicy):
    """``model`` sampled at ``temperature`` (greedy at 0; no top-p, no top-k) for up to
    ``max_new_tokens``, on a generator of its own (:meth:`close` stops it)."""

    def __init__(self, model: Any, tokenizer: Any, temperature: float = 1.0,
                 max_new_tokens: int = 128, max_batch: int = 64):  # fmt: skip
        generator = Generator(model, pad_token_id(tokenizer), tokenizer.eos_token_id,
                              max_batch=max_batch)  # fmt: skip
        super().__init__(
            generator, Sampling(temperature=temperature, max_new_tokens=max_new_tokens)
        )

    def close(self) -> None:
        self.generator.close()


class TrainerPolicy:
    """The trainer's current policy through its generator (module docstring); the sampling
    settings are read at each call, so a changed ``generation_config`` applies."""

    def __init__(self, trainer: Any):
        self.trainer = trainer

    def __call__(self, prompt_ids: list[int]) -> Completion:
        t = self.trainer
        sampling = Sampling.from_generation_config(t.generation_config)
        return t.rollout_generator().submit(prompt_ids, sampling).result()
