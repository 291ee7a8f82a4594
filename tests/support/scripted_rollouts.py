"""A rollout source without Ray: the learner side of rollout_engine/learner.py handing the
trainer groups given in advance (the trainer cannot tell them from a worker's)."""

from __future__ import annotations

from typing import Any

from composer_replication.rollout_engine.group import GroupRecord
from composer_replication.rollout_engine.learner import EngineSettings, RayRollouts


class ScriptedRollouts(RayRollouts):
    """``take_groups`` returns the next of ``batches`` (each a step's groups)."""

    def __init__(self, batches: list[list[GroupRecord]], version: int = 0):
        settings = EngineSettings(num_workers=0, groups_per_step=len(batches[0]),
                                  max_staleness=1024, force_staleness=None)  # fmt: skip
        super().__init__(settings, None, None, None, None, None)
        self.batches = list(batches)
        self.version = version

    def take_groups(self, n: int, version: int) -> list[GroupRecord]:
        groups = self.batches.pop(0)
        assert len(groups) == n, (len(groups), n)
        return groups

    def callback(self, trainer: Any) -> Any:
        from transformers import TrainerCallback

        return TrainerCallback()
