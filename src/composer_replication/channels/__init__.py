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


def missing_state_files(checkpoint_dir: str | Path, enabled: Iterable[str]) -> list[Path]:
    """Per-process state files a resume of ``enabled`` channels from ``checkpoint_dir`` needs
    and does not find: for each channel the checkpoint recorded that keeps per-process state
    (a channel it did not have starts fresh), rank 0's, or the first one below a rank that is
    there (a resume by another number of processes shares the saved ranks' state out)."""
    recorded = recorded_channels(checkpoint_dir)
    missing = []
    for name in enabled:
        cls = CHANNEL_TYPES[name]
        if name not in recorded or not cls.state_per_rank:
            continue
        saved = cls.saved_state_files(checkpoint_dir)  # rank 0 up to the first gap
        present = list(Path(checkpoint_dir).glob(cls.state_file(checkpoint_dir, "*").name))
        if not saved or len(saved) < len(present):
            missing.append(cls.state_file(checkpoint_dir, len(saved)))
    return missing


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
