"""The virtual environment of the lowest versions ``pyproject.toml`` accepts (issue 35:
"declared versions are tested versions").

``python tests/support/lowest_venv.py`` (or :func:`ensure_lowest_venv`) creates it once under
``~/.cache/composer-replication/`` with ``--system-site-packages`` (everything else, pytest
included, comes from the main environment) and installs the lower bound of each of
:data:`BOUNDED` exactly (``transformers==5.17.0``, ...), read from ``pyproject.toml``'s
dependencies: one source of truth. tests/lowest_env runs in it
(tests/integration/test_lowest_versions.py starts it) with this checkout's ``src`` first on
the path. torch's bound is the version CI installs (README: ``pip install torch==2.13.0``): PyPI
has no CPU build of an older torch, and a CUDA build is several GB.
"""

from __future__ import annotations

import re
from pathlib import Path

import tomllib

from support.verl_venv import cached_venv

REPO = Path(__file__).resolve().parents[2]
BOUNDED = ("torch", "transformers", "trl", "peft", "accelerate")
"""The packages whose lowest accepted version must run the smoke train."""


def lowest_versions() -> dict[str, str]:
    """``{package: lower bound}`` of :data:`BOUNDED` from pyproject.toml's dependencies."""
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    out = {}
    for dep in deps:
        m = re.match(r"([A-Za-z0-9_.-]+)\s*(?:\[.*\])?\s*>=\s*([0-9][^,;\s]*)", dep)
        if m and m.group(1).lower() in BOUNDED:
            out[m.group(1).lower()] = m.group(2)
    missing = set(BOUNDED) - set(out)
    if missing:
        raise ValueError(f"pyproject.toml declares no '>=' lower bound for {sorted(missing)}")
    return out


def pins() -> list[str]:
    return [f"{name}=={version}" for name, version in sorted(lowest_versions().items())]


def ensure_lowest_venv() -> Path:
    """The venv's python, creating the venv (the pinned lowest versions) if needed."""
    return cached_venv("lowest", pins())


if __name__ == "__main__":
    print(ensure_lowest_venv())
