"""The ``diloco:`` section of a run config (no torch import: parsed before anything heavy).

DiLoCo (Douillard et al. 2023, arXiv:2311.08105): every replica takes ``sync_every`` (H) inner
optimizer steps on its own data shard, then the replicas average their pseudo-gradients
``theta_initial - theta_local`` and an outer optimizer (SGD with Nesterov momentum) applies
the average to the shared weights. Streaming DiLoCo (arXiv:2501.18512) splits the model into
``fragments`` that are synced at staggered steps.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from composer_replication.config.base import StrictModel


class DilocoConfig(StrictModel):
    """Outer-loop settings. ``enabled: false`` (the default) leaves training untouched."""

    enabled: bool = False
    """Run the DiLoCo outer loop around the trainer's optimizer."""
    replicas: int = Field(2, ge=1, le=1024)
    """Number of replicas the launcher starts (each its own data shard and seed)."""
    min_replicas: int = Field(1, ge=1, le=1024)
    """Smallest quorum that may commit an outer step (fewer alive replicas -> steps wait)."""
    replica_id: int = Field(0, ge=0)
    """This process's replica index (set by the launcher): it trains on shard ``replica_id`` of
    ``replicas`` of the train split and samples with ``seed + replica_id``."""
    sync_every: int = Field(50, ge=1, le=1_000_000)
    """H: inner optimizer steps between outer syncs."""
    outer_lr: float = Field(0.7, gt=0.0, le=10.0)
    """Outer SGD learning rate (0.7 in the DiLoCo paper)."""
    outer_momentum: float = Field(0.9, ge=0.0, lt=1.0)
    """Outer SGD momentum (0.9 in the paper)."""
    nesterov: bool = True
    """Use Nesterov momentum in the outer SGD (the paper's choice)."""
    fragments: int = Field(1, ge=1, le=1024)
    """Streaming DiLoCo: split the parameters into this many fragments, each with its own outer
    optimizer, synced at staggered steps (``sync_every`` must be a multiple of it)."""
    quantize: bool = False
    """Ask torchft to quantize pseudo-gradients in its all-reduce (needs triton, i.e. a GPU;
    ignored by torchft on CPU). The object-store backend uses ``compression`` instead."""
    compression: Literal["none", "bf16", "int8"] = "none"
    """object_store backend: how pseudo-gradients are encoded on the wire."""
    lighthouse: str | None = None
    """torchft lighthouse address (``http://host:29510``); None = ``$TORCHFT_LIGHTHOUSE``."""
    backend: Literal["torchft", "object_store"] = "torchft"
    """torchft (gloo/NCCL all-reduce, lighthouse quorum, live recovery) or object_store
    (replicas meet in an fsspec store; for serverless jobs that cannot open sockets)."""
    store_uri: str | None = None
    """object_store backend: a ``file://`` or ``s3://`` prefix shared by all replicas (use a
    fresh prefix per run: a launcher refuses one that already holds rounds)."""
    store_endpoint_url: str | None = None
    """object_store backend on ``s3://``: an S3-compatible endpoint (MinIO, R2, a local test
    server); None = AWS. Credentials and region come from the usual AWS environment."""
    timeout_s: float = Field(600.0, gt=0.0, le=86_400.0)
    """Seconds a replica waits for its peers at a sync before failing with a timeout error."""

    @model_validator(mode="after")
    def _check(self) -> DilocoConfig:
        if self.sync_every % self.fragments != 0:
            raise ValueError(
                f"diloco.sync_every={self.sync_every} must be a multiple of "
                f"diloco.fragments={self.fragments}"
            )
        if self.min_replicas > self.replicas:
            raise ValueError(
                f"diloco.min_replicas={self.min_replicas} > diloco.replicas={self.replicas}"
            )
        if self.replica_id >= self.replicas:
            raise ValueError(
                f"diloco.replica_id={self.replica_id} out of range for "
                f"diloco.replicas={self.replicas}"
            )
        if self.enabled and self.backend == "object_store" and not self.store_uri:
            raise ValueError("diloco.backend=object_store needs diloco.store_uri")
        return self
