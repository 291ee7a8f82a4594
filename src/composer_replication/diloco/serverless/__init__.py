"""Serverless DiLoCo: replicas that meet through an object store (fsspec) instead of sockets.

``ObjectStoreAllReduce`` averages tensors through ``file://`` or ``s3://``; ``ObjectStoreManager``
lets torchft's DiLoCo run on top of it; executors start the replicas locally
(``LocalProcessExecutor``), on Modal (``ModalExecutor``) or on Hugging Face Jobs
(``HFJobsExecutor``).
"""

from composer_replication.diloco.serverless.allreduce import (
    ObjectStoreAllReduce,
    ObjectStoreManager,
    ObjectStoreTimeoutError,
    WireStats,
)
from composer_replication.diloco.serverless.executor import (
    RANK_ENV,
    LocalProcessExecutor,
    ReplicaFailedError,
    ReplicaTimeoutError,
    ServerlessExecutor,
)

__all__ = [
    "RANK_ENV",
    "LocalProcessExecutor",
    "ObjectStoreAllReduce",
    "ObjectStoreManager",
    "ObjectStoreTimeoutError",
    "ReplicaFailedError",
    "ReplicaTimeoutError",
    "ServerlessExecutor",
    "WireStats",
]


def __getattr__(name: str):
    if name == "ModalExecutor":
        from composer_replication.diloco.serverless.modal import ModalExecutor

        return ModalExecutor
    if name == "HFJobsExecutor":
        from composer_replication.diloco.serverless.hf_jobs import HFJobsExecutor

        return HFJobsExecutor
    raise AttributeError(name)
