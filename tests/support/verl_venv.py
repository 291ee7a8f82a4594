"""The virtual environment the verl recipe is tested in (verl 0.9 pins transformers < 5.11,
which our TRL pin excludes, so verl never enters the main environment).

``python tests/support/verl_venv.py`` (or :func:`ensure_verl_venv`) creates it once under
``~/.cache/composer-replication/`` with ``--system-site-packages`` (the pinned CPU torch and
pytest come from the main environment; verl, transformers < 5.11 and TransferQueue are
installed into the venv, which shadows the main environment's transformers), then installs
this checkout into it without dependencies so verl's ``verl.plugins`` entry point finds our
plugin. The requirements are ``pyproject.toml``'s ``verl`` extra.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

import tomllib

from composer_replication.lm.models import cache_entry_lock, fill_once

REPO = Path(__file__).resolve().parents[2]


def verl_requirements() -> list[str]:
    """The ``verl`` extra of pyproject.toml (one source of truth for the pins)."""
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    return list(meta["project"]["optional-dependencies"]["verl"])


def cached_venv(
    name: str,
    requirements: list[str],
    system_site_packages: bool = True,
    interpreter: str | None = None,
) -> Path:
    """The python of a venv with ``requirements`` installed, created once under
    ``~/.cache/composer-replication/{name}-venv-<key>`` (the key hashes the requirements and
    the venv's Python, so a change of either builds a new one). ``system_site_packages=False``:
    an isolated venv (nothing of the main environment visible); ``interpreter``: another
    Python than this one to build it with (harbor needs 3.12)."""
    isolated = "" if system_site_packages else "\nisolated"
    version = sys.version if interpreter is None else _version_of(interpreter)
    text = "\n".join(requirements) + version + isolated
    key = hashlib.sha256(text.encode()).hexdigest()[:12]
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    d = root / "composer-replication" / f"{name}-venv-{key}"
    python = d / "bin" / "python"
    done = d / ".installed"

    def build() -> None:
        if interpreter is None:
            venv.EnvBuilder(
                system_site_packages=system_site_packages, clear=True, with_pip=True
            ).create(d)
        else:
            flags = ["--system-site-packages"] if system_site_packages else []
            subprocess.run([interpreter, "-m", "venv", "--clear", *flags, str(d)], check=True)
        pip_install(python, *requirements)
        done.write_text("\n".join(requirements))

    fill_once(d, done, build)  # a second test worker waits for the first's build
    return python


def _version_of(interpreter: str) -> str:
    code = "import sys; print(sys.version)"
    return subprocess.run([interpreter, "-c", code], capture_output=True, text=True,
                          check=True).stdout  # fmt: skip


def assert_exactly_passed(r: subprocess.CompletedProcess, expected: int) -> None:
    """A pytest run in a venv (``r``: its completed process) exited 0 with exactly ``expected``
    tests passed and none skipped, xfailed or deselected."""
    import re

    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    m = re.search(r"(\d+) passed", r.stdout)
    assert m and int(m.group(1)) == expected, r.stdout[-2000:]
    assert not re.search(r"\d+ (skipped|xfailed|deselected)", r.stdout), r.stdout[-2000:]


def pip_install(python: Path, *args: str) -> None:
    cmd = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")


def ensure_verl_venv() -> Path:
    """The venv's python, creating the venv if needed and (re)installing this checkout."""
    python = cached_venv("verl", verl_requirements())
    with cache_entry_lock(python.parent.parent):  # one install into the venv at a time
        pip_install(python, "--no-deps", "--no-build-isolation", "-e", str(REPO))
    return python


if __name__ == "__main__":
    print(ensure_verl_venv())
