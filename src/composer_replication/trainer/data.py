"""Turning an environment's tasks into the prompt dataset TRL's GRPOTrainer consumes."""

from __future__ import annotations

import random

from composer_replication.chat import as_messages
from composer_replication.envs.base import Environment, Task


def build_prompt_dataset(env: Environment, split: str, n: int, seed: int, conversational: bool):
    """A ``datasets.Dataset`` of ``n`` prompts drawn (with replacement past the split size) from
    ``split``, with a ``task_id`` column the reward function uses to find the task."""
    from datasets import Dataset

    tasks = env.tasks(split)
    if not tasks:
        raise ValueError(f"{env.name}: split {split!r} is empty")
    rng = random.Random(seed)
    order: list[Task] = []
    while len(order) < n:
        block = list(tasks)
        rng.shuffle(block)
        order.extend(block)
    order = order[:n]
    texts = [env.user_message(t) for t in order]
    prompts = [as_messages(x) for x in texts] if conversational else texts
    return Dataset.from_dict({"prompt": prompts, "task_id": [t.task_id for t in order]})
