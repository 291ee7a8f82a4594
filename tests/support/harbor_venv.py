"""The virtual environment Harbor's own tools run in, to validate ``tasks export --format
harbor`` (harbor needs Python >= 3.12; the main environment may be older, so harbor never
enters it).

``python tests/support/harbor_venv.py`` (or :func:`ensure_harbor_venv`) creates it once under
``~/.cache/composer-replication/`` with a Python 3.12 interpreter (:func:`python312`),
isolated from the main environment, with ``pyproject.toml``'s ``harbor`` extra installed.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from pathlib import Path

import tomllib

from support.verl_venv import REPO, cached_venv

PYTHON312_ENV = "COMPOSER_PYTHON312"
"""A Python >= 3.12 interpreter to build the venv with (else ``python3.12`` on PATH, else
pyenv's newest 3.12)."""


def python312() -> str:
    """A Python >= 3.12 interpreter of this machine that runs (a pyenv shim of a version not
    selected does not); a RuntimeError naming how to provide one."""
    pyenv = sorted(glob.glob(str(Path.home() / ".pyenv/versions/3.1[2-9]*/bin/python")))
    candidates = [os.environ.get(PYTHON312_ENV), shutil.which("python3.12"), *reversed(pyenv)]
    check = "import sys; sys.exit(sys.version_info < (3, 12))"
    for python in filter(None, candidates):
        if subprocess.run([python, "-c", check], capture_output=True).returncode == 0:
            return python
    raise RuntimeError(f"harbor needs Python >= 3.12 and none was found: set "
                       f"{PYTHON312_ENV}, or put python3.12 on PATH")  # fmt: skip


def harbor_requirements() -> list[str]:
    """The ``harbor`` extra of pyproject.toml (one source of truth for the pin)."""
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    return list(meta["project"]["optional-dependencies"]["harbor"])


def ensure_harbor_venv() -> Path:
    """The venv's python (harbor installed), creating the venv on first use."""
    return cached_venv("harbor", harbor_requirements(), system_site_packages=False,
                       interpreter=python312())  # fmt: skip


def harbor_cli(python: Path) -> Path:
    """The venv's ``harbor`` console script."""
    return Path(python).parent / "harbor"


if __name__ == "__main__":
    print(ensure_harbor_venv())
