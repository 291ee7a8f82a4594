"""Turning an environment's tasks into the prompt dataset TRL's GRPOTrainer consumes."""

from __future__ import annotations

import random

from composer_replication.envs.base import Environment, Task
from composer_replication.lm.chat import as_messages


def shard_tasks(tasks: list[Task], index: int, count: int) -> list[Task]:
    """Shard ``index`` of ``count`` of ``tasks``: every ``count``-th task from ``index`` on.

    The shards are disjoint and together cover ``tasks``; strided rather than contiguous so a
    split ordered by level (or hash) gives every shard the same mix. DiLoCo assumes each replica
    trains on its own shard (Douillard et al. 2023, arXiv:2311.08105, Sec. 2).
    """
    if not 0 <= index < count:
        raise ValueError(f"shard index {index} out of range for {count} shards")
    shard = tasks[index::count]
    if not shard:
        raise ValueError(
            f"shard {index} of {count} is empty: the split has only {len(tasks)} tasks"
        )
    return shard


def build_prompt_dataset(
    env: Environment,
    split: str,
    n: int,
    seed: int,
    conversational: bool,
    shard: tuple[int, int] = (0, 1),
):
    """A ``datasets.Dataset`` of ``n`` prompts drawn (with replacement past the shard size) from
    ``split``, with a ``task_id`` column the reward function uses to find the task.

    ``shard=(r, n_shards)`` draws only from shard ``r`` of the split (:func:`shard_tasks`)."""
    from datasets import Dataset

    tasks = env.tasks(split)
    if not tasks:
        raise ValueError(f"{env.name}: split {split!r} is empty")
    tasks = shard_tasks(tasks, *shard)
    rng = random.Random(seed)
    order: list[Task] = []
    while len(order) < n:
        block = list(tasks)
        rng.shuffle(block)
        order.extend(block)
    order = order[:n]
    if env.tools:  # rows with the env's messages and the columns its tools' reset needs
        return Dataset.from_list([env.row(t) for t in order])
    texts = [env.user_message(t) for t in order]
    prompts = [as_messages(x) for x in texts] if conversational else texts
    return Dataset.from_dict({"prompt": prompts, ROW_ID: [t.task_id for t in order]})


ROW_ID = "task_id"
"""The column every prompt dataset has (the reward function finds the task by it)."""


def row_columns(env: Environment, split: str = "train") -> list[str]:
    """The columns besides ``prompt`` of :func:`build_prompt_dataset`'s rows for ``env``
    (what the trainer hands the channels per row, e.g. for ``distill.route.column``), without
    building the dataset."""
    tasks = env.tasks(split)
    if env.tools and tasks:
        return sorted(k for k in env.row(tasks[0]) if k != "prompt")
    return [ROW_ID]
