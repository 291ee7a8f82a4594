"""DiLoCo replicas train on disjoint shards of the train split that together cover it."""

from __future__ import annotations

import pytest

from composer_replication.config import load_config
from composer_replication.diloco.replica import replica_overrides
from composer_replication.envs.arithmetic import ArithmeticEnv
from composer_replication.run.train import data_shard
from composer_replication.trainer.data import build_prompt_dataset, shard_tasks


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_arithmetic_shards_are_disjoint_and_cover_the_train_split(n):
    train = ArithmeticEnv(levels=[1, 2]).tasks("train")
    shards = [{t.task_id for t in shard_tasks(train, r, n)} for r in range(n)]
    assert sum(len(s) for s in shards) == len(train)  # disjoint (no id counted twice) ...
    assert set().union(*shards) == {t.task_id for t in train}  # ... and covering
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


def test_each_replica_dataset_draws_only_from_its_shard_and_covers_it():
    """Replica r's prompt dataset, built the way the trainer builds it (config -> launcher
    overrides -> data_shard), holds exactly shard r's tasks when num_train >= the shard size."""
    env = ArithmeticEnv(levels=[1])
    train = env.tasks("train")
    n = 3
    base = load_config(None, ["env.levels=[1]"])
    seen = []
    for r in range(n):
        cfg = load_config(None, ["env.levels=[1]", *replica_overrides(base, r, n, None, None)])
        assert data_shard(cfg) == (r, n)
        size = len(shard_tasks(train, r, n))
        ds = build_prompt_dataset(env, "train", size, cfg.env.seed, False, shard=data_shard(cfg))
        ids = set(ds["task_id"])
        assert ids == {t.task_id for t in train[r::n]}
        seen.append(ids)
    assert all(not (a & b) for i, a in enumerate(seen) for b in seen[i + 1 :])
    assert set().union(*seen) == {t.task_id for t in train}


def test_plain_run_uses_the_whole_split():
    assert data_shard(load_config(None, [])) == (0, 1)


def test_bad_shards_are_clear_errors():
    train = ArithmeticEnv(levels=[1]).tasks("train")
    with pytest.raises(ValueError, match="out of range"):
        shard_tasks(train, 2, 2)
    with pytest.raises(ValueError, match="is empty"):
        shard_tasks(train[:2], 2, 3)
    with pytest.raises(Exception, match="diloco.replica_id=2 out of range"):
        load_config(None, ["diloco.replicas=2", "diloco.replica_id=2"])
