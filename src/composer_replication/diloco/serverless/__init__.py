"""Serverless DiLoCo: replicas that meet through an object store (fsspec) instead of sockets.

``ObjectStoreAllReduce`` averages tensors through ``file://`` or ``s3://``; ``ObjectStoreManager``
lets torchft's DiLoCo run on top of it; executors start the replicas locally
(``LocalProcessExecutor``), on Modal (``ModalExecutor``) or on Hugging Face Jobs
(``HFJobsExecutor``).
"""

_LAZY = {
    "ObjectStoreAllReduce": "allreduce",
    "ObjectStoreManager": "allreduce",
    "ObjectStoreTimeoutError": "allreduce",
    "ObjectStorePayloadError": "allreduce",
    "WireStats": "allreduce",
    "RANK_ENV": "executor",
    "LocalProcessExecutor": "executor",
    "ReplicaFailedError": "executor",
    "ReplicaTimeoutError": "executor",
    "ServerlessExecutor": "executor",
    "ModalExecutor": "modal",
    "HFJobsExecutor": "hf_jobs",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    """Names load on first use, so a spawned replica does not import torch before it needs to."""
    if name in _LAZY:
        import importlib

        module = importlib.import_module(f"composer_replication.diloco.serverless.{_LAZY[name]}")
        return getattr(module, name)
    raise AttributeError(name)
