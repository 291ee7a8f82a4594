"""The virtual environment of the unmodified agent harness the proxy tests drive:
mini-swe-agent (SWE-agent's bash-only agent, from PyPI; nobody here wrote it).

``python tests/support/agent_venv.py`` (or :func:`ensure_agent_venv`) creates it once under
``~/.cache/composer-replication/`` (``cached_venv``, as the verl venv), isolated from the main
environment (no ``--system-site-packages``): the agent runs inside the bubblewrap sandbox,
which binds this venv read-only and none of the main environment's site-packages. It needs
PyPI once (~1-2 min, ~750 MB); afterwards nothing is fetched: the proxy run sets
``LITELLM_LOCAL_MODEL_COST_MAP`` and runs with no network but the proxy.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script

from composer_replication.agents.harnesses import MINI_SWE_AGENT_REQUIREMENTS  # noqa: E402
from support.verl_venv import cached_venv  # noqa: E402

REQUIREMENTS = list(MINI_SWE_AGENT_REQUIREMENTS)
"""The harness's pinned requirements (one source: ``agents.harnesses``)."""


def ensure_agent_venv() -> Path:
    """The venv's directory (``bin/mini`` is the harness), creating it if needed, linked from
    ``~/.cache/composer-replication/mini-swe-agent-venv`` (``agent_proxy.venv``'s default)."""
    python = cached_venv("mini-swe-agent", REQUIREMENTS, system_site_packages=False)
    venv = python.parent.parent
    link = venv.parent / "mini-swe-agent-venv"
    if not link.is_symlink() or link.resolve() != venv.resolve():
        tmp = venv.parent / f".mini-swe-agent-venv.{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(venv)
        tmp.replace(link)  # atomic: a concurrent reader sees the old link or the new one
    return venv


if __name__ == "__main__":
    print(ensure_agent_venv())
