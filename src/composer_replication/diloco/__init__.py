"""DiLoCo outer loop: torchft (``outer``), the trainer callback (``callback``), the multi-replica
launcher (``launcher``) and serverless replicas over an object store (``serverless``).

Importing this package is cheap and torch-free (the run config imports ``diloco.config``);
the heavy names load on first use.
"""

from composer_replication.config.diloco import DilocoConfig

_LAZY = {
    "make_diloco_outer_loop": "composer_replication.diloco.outer",
    "make_manager": "composer_replication.diloco.outer",
    "DilocoRuntime": "composer_replication.diloco.outer",
    "params_checksum": "composer_replication.diloco.outer",
    "DilocoCallback": "composer_replication.diloco.callback",
    "launch_diloco": "composer_replication.diloco.launcher",
}

__all__ = ["DilocoConfig", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(name)
