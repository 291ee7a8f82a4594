"""The trainer's public seams other modules use instead of TRL's private members:
``log_metric`` (TRL's ``_metrics``) and ``load_checkpoint`` (transformers'
``_load_from_checkpoint``)."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

from composer_replication.trainer.trainer import ComposerReplicationTrainer


def _trainer_like(training: bool) -> SimpleNamespace:
    return SimpleNamespace(model=SimpleNamespace(training=training),
                           _metrics={"train": defaultdict(list), "eval": defaultdict(list)})  # fmt: skip


def test_log_metric_adds_to_the_mode_of_the_model_or_the_one_given():
    t = _trainer_like(training=True)
    ComposerReplicationTrainer.log_metric(t, "agent/turns", 2)
    ComposerReplicationTrainer.log_metric(t, "agent/turns", 3.5)
    ComposerReplicationTrainer.log_metric(t, "agent/turns", 1, mode="eval")
    assert t._metrics["train"]["agent/turns"] == [2.0, 3.5]
    assert t._metrics["eval"]["agent/turns"] == [1.0]
    t.model.training = False
    ComposerReplicationTrainer.log_metric(t, "env/pass_rate", 0.5)
    assert t._metrics["eval"]["env/pass_rate"] == [0.5]


def test_load_checkpoint_loads_through_transformers(tmp_path):
    calls = []
    t = SimpleNamespace(_load_from_checkpoint=calls.append)
    ComposerReplicationTrainer.load_checkpoint(t, tmp_path / "checkpoint-8")
    assert calls == [str(tmp_path / "checkpoint-8")]
