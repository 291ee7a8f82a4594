"""Extra loss channels: each one object owning its weight, config, batch preparation, mask,
divisor, loss, metrics prefix and state (see :mod:`composer_replication.channels.base`).

* ``sdpo`` (:class:`SelfDistillChannel`): hint-conditioned self-distillation (SDPO / OPSD).
* ``replay`` (:class:`ReplayChannel`): DPO / SimPO on pairs from multi-teacher trace replay.
* ``distill`` (:class:`DistillChannel`): on-policy distillation from stronger teachers.

:func:`build_channels` makes one per channel section of a run config; the trainer keeps the
enabled ones (weight > 0). A new channel is a subclass of :class:`Channel` plus a config
section with a ``weight`` and an entry in :data:`CHANNEL_TYPES`.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from composer_replication.channels.base import Channel, LossContext, Rollouts
from composer_replication.channels.distill import DistillChannel
from composer_replication.channels.replay import ReplayChannel
from composer_replication.channels.self_distill import SelfDistillChannel
from composer_replication.config import CHANNEL_SECTIONS, recorded_channels

CHANNEL_TYPES: dict[str, type[Channel]] = {
    SelfDistillChannel.name: SelfDistillChannel,
    ReplayChannel.name: ReplayChannel,
    DistillChannel.name: DistillChannel,
}
if set(CHANNEL_TYPES) != set(CHANNEL_SECTIONS):  # one list of channels, checked at import
    raise RuntimeError(f"channel types {sorted(CHANNEL_TYPES)} != sections {CHANNEL_SECTIONS}")


def build_channels(cfg: Any, **kwargs: dict[str, Any]) -> list[Channel]:
    """One channel object per channel section of ``cfg`` (a RunConfig), enabled or not;
    ``kwargs`` maps a channel name to extra constructor arguments (e.g.
    ``sdpo={"hint_model": fn}``)."""
    return [cls(getattr(cfg, name), **kwargs.get(name, {})) for name, cls in CHANNEL_TYPES.items()]


def missing_state_files(
    checkpoint_dir: str | Path, enabled: Iterable[str], rank: int
) -> list[Path]:
    """State files process ``rank`` needs to resume ``enabled`` channels from ``checkpoint_dir``
    and does not find: those of the channels the checkpoint recorded that keep per-process
    state (a channel the checkpoint did not have starts fresh)."""
    recorded = recorded_channels(checkpoint_dir)
    files = [
        CHANNEL_TYPES[name].state_file(checkpoint_dir, rank)
        for name in enabled
        if name in recorded and CHANNEL_TYPES[name].state_per_rank
    ]
    return [f for f in files if not f.is_file()]


__all__ = [
    "CHANNEL_TYPES",
    "Channel",
    "DistillChannel",
    "LossContext",
    "ReplayChannel",
    "Rollouts",
    "SelfDistillChannel",
    "build_channels",
    "missing_state_files",
]
