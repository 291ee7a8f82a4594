"""The ``ray:`` section: where the rollout workers of ``rollout.engine: ray`` run (a local Ray
that starts and stops with the run, or a cluster's address), how many, and what each takes.
Imports no torch and no ray (Ray is an extra, refused before any model loads when missing:
run/preflight.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from composer_replication.config.base import StrictModel


class RayWorkerResources(StrictModel):
    """What one rollout worker (a Ray actor holding a policy copy, its generator and its
    environments) reserves on its node."""

    num_cpus: float = Field(1.0, ge=0.0, le=1024.0)
    """CPU cores Ray reserves for the worker."""
    num_gpus: float = Field(0.0, ge=0.0, le=64.0)
    """GPUs (fractions allowed) Ray reserves for the worker's generator."""
    memory_gb: float | None = Field(None, gt=0.0, le=65536.0)
    """Host memory Ray reserves (None: no reservation)."""
    sandbox_slots: int = Field(0, ge=0, le=4096)
    """Sandbox slots each worker takes from its node's ``sandbox_slots`` Ray resource (0: no
    per-node accounting). With ``ray.sandbox_slots_per_node`` set, a node runs at most
    ``sandbox_slots_per_node // sandbox_slots`` workers, so sandboxes are budgeted per node,
    not per process."""


class RayConfig(StrictModel):
    """Ray for ``rollout.engine: ray`` (docs/scaling.md). Unused by the ``local`` engine."""

    address: str | None = None
    """``ray.init`` address of a running cluster (``auto``, ``ray://host:10001``, ...). None: a
    local Ray on 127.0.0.1 that starts with the run and stops with it (Ctrl-C included)."""
    num_workers: int = Field(2, ge=1, le=4096)
    """Rollout workers (Ray actors), each with its own policy copy and environments."""
    worker: RayWorkerResources = Field(default_factory=RayWorkerResources)
    """Resources each worker reserves."""
    object_store_gb: float | None = Field(None, gt=0.0, le=4096.0)
    """Object store of the local Ray (None: sized from the model, four copies of its weights
    and at least 0.5 GiB). Ignored when ``address`` is set (the cluster's own setting)."""
    sandbox_slots_per_node: int | None = Field(None, ge=1, le=65536)
    """The local Ray node's ``sandbox_slots`` resource (None: the node's CPU count); on a
    cluster, start each node with ``--resources '{"sandbox_slots": N}'``."""
    weight_sync_steps: int = Field(1, ge=1, le=1024)
    """Optimizer steps between pushes of the learner's weights to the workers."""
    weight_sync: Literal["full", "lora", "delta"] = "full"
    """What a push carries (rollout_engine/weight_sync.py): ``full``, the whole state dict;
    ``lora`` (needs ``peft.enabled``; the only mode PEFT runs with), the adapter's tensors
    after a first whole push, workers holding the same unmerged PEFT model; ``delta``, the
    difference from what the workers hold in ``delta_codec``, with error feedback (a learner
    mirror the workers equal bit for bit)."""
    delta_codec: Literal["int8", "bf16"] = "int8"
    """``weight_sync: delta``: ``int8`` (per-tensor absmax scale, ~1/4 of float32 bytes) or
    ``bf16`` (1/2)."""
    timeout_s: float = Field(600.0, gt=0.0, le=86400.0)
    """Deadline of every wait on Ray (a worker's start, a group, a weight push): past it the
    run stops with a one-line error naming what it waited for."""

    @field_validator("address")
    @classmethod
    def _not_empty(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("empty address: leave it unset for a local Ray")
        return value
