"""Groups dropped as too stale are counted by episode length (issue 54: long episodes grow
stale first, so a length bias is measured, not assumed): the bins, and the learner's take
counting what arrived and what it dropped, with the hub as a plain object behind a stand-in
for Ray's remote calls."""

from __future__ import annotations

from types import SimpleNamespace

from composer_replication.rollout_engine.dispenser import TaskDispenser
from composer_replication.rollout_engine.group import (
    GroupRecord,
    Rollout,
    Sequence,
    StalenessByLength,
    length_bin,
)
from composer_replication.rollout_engine.hub import Hub
from composer_replication.rollout_engine.learner import EngineSettings, RayRollouts


def _group(gid: int, tokens: list[int], version: int) -> GroupRecord:
    rollouts = [Rollout([Sequence([1], [7] * n, [0.0] * n, [1] * n, [version])], 0.0)
                for n in tokens]  # fmt: skip
    return GroupRecord(gid, f"t{gid}", {}, rollouts)


def test_length_bins_are_powers_of_two():
    assert [length_bin(n) for n in (0, 0.5, 1, 2, 3, 63, 64, 65, 1000)] == [
        0, 0, 1, 2, 2, 32, 64, 64, 512]  # fmt: skip


def test_the_episode_length_is_the_mean_over_valid_rollouts():
    """(10 + 30) / 2 = 20 tokens; the invalid rollout's 1000 are not counted."""
    g = _group(0, [10, 30, 1000], 0)
    g.rollouts[2].valid = False
    assert g.episode_tokens == 20.0
    counts = StalenessByLength()
    counts.count(g, dropped=True)
    counts.count(_group(1, [5], 0), dropped=False)
    assert counts.metrics() == {
        "rollout/arrived_by_tokens/16": 1.0, "rollout/dropped_by_tokens/16": 1.0,
        "rollout/arrived_by_tokens/4": 1.0, "rollout/dropped_by_tokens/4": 0.0,
    }  # fmt: skip


class _Remote:
    """``hub.method.remote(...)`` runs ``hub.method(...)`` now (Ray runs an actor's methods
    one at a time)."""

    def __init__(self, target):
        self.target = target

    def __getattr__(self, name):
        return SimpleNamespace(remote=getattr(self.target, name))


_RAY = SimpleNamespace(get=lambda x, timeout=None: x, wait=lambda refs, **kw: ([], refs))


def test_the_learner_counts_dropped_groups_by_their_length():
    """max_staleness 1 at learner version 3: the two long groups (made at version 1, 2 steps
    stale) are dropped, the two short ones (version 2) are used; a later short group fills
    the step. Arrived: 3 in bin 8 (8-token episodes), 2 in bin 128 (200-token); dropped: the
    2 long ones."""
    settings = EngineSettings(num_workers=0, groups_per_step=3, max_staleness=1,
                              force_staleness=None)  # fmt: skip
    engine = RayRollouts(settings, None, None, None, None, None)
    hub = Hub(TaskDispenser([f"t{i}" for i in range(8)], 0), groups_per_step=3, max_staleness=1)
    made = [([200, 200], 1), ([8, 8], 2), ([200], 1), ([8], 2), ([8, 9], 3)]
    for tokens, version in made:
        hub.put_group(0, _group(hub.dispenser.next().group_id, tokens, version))
    engine.ray, engine.hub = _RAY, _Remote(hub)
    fresh = engine.take_groups(3, version=3)
    assert [g.group_id for g in fresh] == [1, 3, 4]
    assert engine.dropped_groups == 2
    m = engine.metrics
    assert m["rollout/arrived_by_tokens/8"] == 3 and m["rollout/dropped_by_tokens/8"] == 0
    assert m["rollout/arrived_by_tokens/128"] == 2 and m["rollout/dropped_by_tokens/128"] == 2
