"""Turning an environment's tasks into the prompt dataset TRL's GRPOTrainer consumes."""

from __future__ import annotations

import random

from composer_replication.envs.base import Environment, Task


def as_messages(env: Environment, task: Task) -> list[dict[str, str]]:
    """The conversational prompt of a task (one user turn)."""
    return [{"role": "user", "content": env.user_message(task)}]


def render_prompt(tokenizer, prompt: list[dict[str, str]] | str) -> str:
    """The exact text the model sees: the chat template with a generation prompt, if any.

    Models without a chat template (base models) see the user text as is.
    """
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
    return "\n".join(m["content"] for m in prompt)


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
    prompts = [as_messages(env, t) if conversational else env.user_message(t) for t in order]
    return Dataset.from_dict({"prompt": prompts, "task_id": [t.task_id for t in order]})
