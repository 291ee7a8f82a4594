"""References for the generator's tests (lm/generator.py): the log-probs a fresh forward
gives a recorded completion, and a counter of a model's forwards."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


def forward_logprobs(
    model, prompt_ids: list[int], completion_ids: list[int], temperature: float
) -> torch.Tensor:
    """``log_softmax(logits / T)`` of each completion token given what precedes it, from one
    plain forward of ``prompt + completion`` (TRL's convention; the reference the recorded
    log-probs are compared with)."""
    if not completion_ids:
        return torch.zeros(0)
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)])
    with torch.no_grad():
        logits_TV = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
    logp_TV = torch.log_softmax(logits_TV / temperature, dim=-1)
    return logp_TV.gather(1, torch.tensor(completion_ids)[:, None])[:, 0]


@contextlib.contextmanager
def counted_forwards(module) -> Iterator[list[int]]:
    """A list that grows by the batch size of each forward of ``module`` in the block."""
    calls: list[int] = []

    def hook(_module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        calls.append(int(ids.shape[0]) if ids is not None else 0)

    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield calls
    finally:
        handle.remove()


def gated_context(model, gate):
    """A generator ``model_context`` whose first batch waits (up to 30 s) for ``gate`` (a
    ``threading.Event``): requests pile up in the queue meanwhile."""
    first = [True]

    @contextlib.contextmanager
    def context():
        if first[0]:
            first[0] = False
            if not gate.wait(30):
                raise TimeoutError("the gate was never opened")
        yield model

    return context


def record_generators(monkeypatch) -> list:
    """The generators trainers hand out (``rollout_generator``), in order, each kept after its
    trainer closes it at the end of ``train`` (its ``batches`` still readable). A generator
    refers to its trainer: clear the list before checking that the trainer is collected."""
    from composer_replication.trainer.trainer import ComposerReplicationTrainer

    made = ComposerReplicationTrainer.rollout_generator
    seen: list = []

    def recording(trainer):
        generator = made(trainer)
        if not any(g is generator for g in seen):
            seen.append(generator)
        return generator

    monkeypatch.setattr(ComposerReplicationTrainer, "rollout_generator", recording)
    return seen
