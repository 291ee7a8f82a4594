"""Run the DiLoCo outer loop inside ``ComposerReplicationTrainer`` (any HF ``Trainer``).

The callback wraps the trainer's optimizer with torchft's DiLoCo when training begins: every
optimizer step is an inner step, and every ``diloco.sync_every`` steps the replicas average
their pseudo-gradients and the outer optimizer steps (see :mod:`.outer`). Each sync is appended
to ``{output_dir}/diloco.jsonl`` and printed; at the end ``diloco_final.json`` holds the
checksum of the final weights (equal on all replicas iff their weights are bit-equal).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from composer_replication.config.diloco import DilocoConfig

SYNC_LOG = "diloco.jsonl"
FINAL_FILE = "diloco_final.json"


def store_options(cfg: DilocoConfig) -> dict[str, Any]:
    """fsspec storage options for ``cfg.store_uri`` (an s3 endpoint when one is set)."""
    return {"endpoint_url": cfg.store_endpoint_url} if cfg.store_endpoint_url else {}


class DilocoCallback(TrainerCallback):
    """Attach ``DilocoRuntime`` to the trainer's optimizer for the length of ``train()``.

    ``manager`` overrides the torchft Manager (e.g. an ``ObjectStoreManager``); by default one
    is built from ``cfg`` (object_store backend: from ``cfg.store_uri``).
    """

    def __init__(self, cfg: DilocoConfig, output_dir: str | Path, manager: Any = None):
        self.cfg = cfg
        self.output_dir = Path(output_dir)
        self.manager = manager
        self.runtime = None
        self.initial_checksum: str | None = None
        self._t0 = time.monotonic()

    def _build_manager(self) -> Any:
        if self.manager is not None or self.cfg.backend == "torchft":
            return self.manager
        from composer_replication.diloco.serverless import ObjectStoreAllReduce, ObjectStoreManager

        reducer = ObjectStoreAllReduce(
            self.cfg.store_uri or "",
            rank=self.cfg.replica_id,
            world_size=self.cfg.replicas,
            timeout_s=self.cfg.timeout_s,
            compression=self.cfg.compression,
            storage_options=store_options(self.cfg),
        )
        return ObjectStoreManager(reducer)

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        from composer_replication.diloco.outer import DilocoRuntime

        if model is None or optimizer is None:
            raise RuntimeError("DilocoCallback needs the trainer's model and optimizer")
        inner = getattr(optimizer, "optimizer", optimizer)  # accelerate wraps the torch optimizer
        self.output_dir.mkdir(parents=True, exist_ok=True)
        (self.output_dir / SYNC_LOG).write_text("")
        self.runtime = DilocoRuntime(
            self.cfg, model, inner, manager=self._build_manager(), on_sync=self._on_sync
        )
        self.runtime.__enter__()
        self.initial_checksum = self.runtime.checksum()
        print(
            f"[diloco] replica {self.cfg.replica_id}: outer loop on, H={self.cfg.sync_every}, "
            f"backend={self.cfg.backend}, checksum {self.initial_checksum}",
            flush=True,
        )

    def _on_sync(self, event) -> None:
        row = {"replica": self.cfg.replica_id, **event.row()}
        with (self.output_dir / SYNC_LOG).open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        print(
            f"[diloco] replica {self.cfg.replica_id}: sync {event.manager_step} after inner step "
            f"{event.inner_step} with {event.participants} replicas, checksum {event.checksum}",
            flush=True,
        )

    def on_train_end(self, args, state, control, **kwargs):
        if self.runtime is None:
            return
        rt, self.runtime = self.runtime, None
        rt.__exit__(None, None, None)
        final = {
            "replica": self.cfg.replica_id,
            "checksum": rt.checksum(),
            "initial_checksum": self.initial_checksum,
            "syncs": len(rt.events),
            "inner_steps": rt.observer.inner_steps,
            "manager_step": rt.manager.current_step(),
            "synced_at_end": bool(rt.events)
            and rt.events[-1].inner_step == rt.observer.inner_steps,
            "seconds": time.monotonic() - self._t0,
        }
        (self.output_dir / FINAL_FILE).write_text(json.dumps(final, indent=2))
        print(
            f"[diloco] replica {self.cfg.replica_id}: final checksum {final['checksum']}",
            flush=True,
        )
        rt.shutdown()
