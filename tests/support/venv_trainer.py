"""A trainer process living in a virtual environment over the running interpreter (issue 55):
pyenv, conda and ``python:3.x`` images put the packages in the base interpreter's
``site-packages``, and a trainer in an isolated venv over it does not list that directory in
``site``: the sandbox must hide it anyway.

:func:`venv_python` builds ``python -m venv --without-pip`` once per Python under
``~/.cache/composer-replication/`` (no network, well under a second; cached like
verl_venv.cached_venv). :func:`run_in_venv` runs code with that venv's interpreter, the
worktree's ``src`` and ``tests`` and a shim directory of links to the few host packages the
sandbox module imports (pydantic and its dependencies, pyyaml) on ``PYTHONPATH``: the base
``site-packages`` itself is never on its ``sys.path``, as in a real isolated venv.

:data:`VISIBILITY_PROBE` walks the sandbox's whole file system and tries to import host
packages from every place the trainer knows of and from ensurepip's bundled wheels;
:func:`originals_seen` lists what it found outside the standard library.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

from composer_replication.lm.models import fill_once

REPO = Path(__file__).resolve().parents[2]
SHIM_MODULES = ("pydantic", "pydantic_core", "typing_extensions", "typing_inspection",
                "annotated_types", "yaml", "certifi")  # fmt: skip
"""What ``composer_replication.sandbox`` imports from the host's site-packages."""
HOST_PACKAGES = ("pydantic", "yaml", "pip", "setuptools", "_distutils_hack", "typing_extensions",
                 "pytest", "packaging", "idna", "torch")  # fmt: skip
"""Host packages (and the bundled wheels' vendored ones) the probe tries to import."""


def venv_python() -> Path:
    """The interpreter of a cached ``--without-pip`` venv over this Python, with the shim."""
    key = hashlib.sha256(f"{sys.version}{sys.base_prefix}".encode()).hexdigest()[:12]
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    d = root / "composer-replication" / f"bare-venv-{key}"
    done = d / ".built"

    def build() -> None:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--clear", str(d)],
                       check=True, capture_output=True, timeout=120)  # fmt: skip
        shim = d / "trainer-shim"
        shim.mkdir()
        for name in SHIM_MODULES:
            spec = __import__(name).__spec__
            origin = Path(spec.origin)
            src = origin.parent if origin.name == "__init__.py" else origin
            (shim / src.name).symlink_to(src)
        done.write_text(sys.version)

    fill_once(d, done, build)
    return d / "bin" / "python"


def run_in_venv(
    code: str, timeout: float = 180, packages: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    """``code`` run by the venv's interpreter (not activated: PATH is the host's). ``packages``:
    host packages beyond the shim's that the code imports (e.g. the trace readers' ``orjson``),
    linked into a directory of their own for this call."""
    python = venv_python()
    path = [str(REPO / "src"), str(REPO / "tests"), str(python.parent.parent / "trainer-shim")]
    if packages:
        extra = Path(tempfile.mkdtemp(prefix="venv-packages-"))
        for name in packages:
            origin = Path(__import__(name).__spec__.origin)
            src = origin.parent if origin.name == "__init__.py" else origin
            (extra / src.name).symlink_to(src)
        path.append(str(extra))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    env.pop("VIRTUAL_ENV", None)
    try:
        return subprocess.run([str(python), "-c", code], env=env, cwd=REPO, capture_output=True,
                              text=True, timeout=timeout)  # fmt: skip
    finally:
        if packages:
            shutil.rmtree(extra, ignore_errors=True)


def trainer_package_dirs() -> list[str]:
    """Every place this trainer process could import a host package from: its own and the
    base interpreter's site-packages, and its ``sys.path`` outside the standard library."""
    stdlib = os.path.realpath(sysconfig.get_path("stdlib"))
    base = {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}
    dirs = [*site.getsitepackages(), *(sysconfig.get_path(k, vars=base) for k in ("purelib",
            "platlib"))]  # fmt: skip
    dirs += [p for p in sys.path if p and not os.path.realpath(p).startswith(stdlib)]
    return sorted({os.path.realpath(d) for d in dirs if os.path.isdir(d)})


VISIBILITY_PROBE = r"""
import glob, json, os, sys
STDLIB, EXTRA, NAMES = json.loads(ARGS)
skip = {"/proc", "/dev", "/sys", "/work", "/tmp"}
files, packages = [], []
for top, dirs, names in os.walk("/"):
    dirs[:] = [d for d in dirs if os.path.join(top, d) not in skip]
    if "__init__.py" in names and not top.startswith(STDLIB + "/"):
        packages.append(top)
    for f in names:
        p = os.path.join(top, f)
        if ("site-packages/" in p or "dist-packages/" in p or "/ensurepip/_bundled/" in p
                or (f.endswith((".whl", ".egg")) and not p.startswith(STDLIB + "/test/"))):
            files.append(p)
wheels = glob.glob(STDLIB + "/ensurepip/_bundled/*.whl")
sys.path[:0] = EXTRA + wheels
imported = []
for name in NAMES:
    try:
        __import__(name)
        imported.append(name)
    except BaseException:
        pass
print(json.dumps({"files": files[:20], "packages": packages[:20], "imported": imported,
                  "walked": len(packages)}))
"""


def probe_code() -> str:
    """:data:`VISIBILITY_PROBE` with this trainer's standard library and package dirs."""
    args = [os.path.realpath(sysconfig.get_path("stdlib")), trainer_package_dirs(),
            list(HOST_PACKAGES)]  # fmt: skip
    return f"ARGS = {json.dumps(json.dumps(args))}\n" + VISIBILITY_PROBE


def originals_seen(stdout: str) -> dict[str, list[str]]:
    """The probe's findings that are not empty (files, package dirs, imported names)."""
    got = json.loads(stdout.strip().splitlines()[-1])
    return {k: v for k, v in got.items() if k != "walked" and v}


def sandboxed_stdout(code: str, cfg: Any, trainer: str) -> str:
    """What ``code`` printed in a sandbox (``run_python`` with ``cfg``, a ``SandboxConfig``)
    started by this process (``trainer="host"``) or by a trainer in the ``--without-pip``
    virtual environment over this interpreter (``"venv"``); asserts it ran."""
    from composer_replication.sandbox.sandbox import run_python

    if trainer == "host":
        r = run_python(code, cfg)
        assert r.ok, r.stderr
        return r.stdout
    child = run_in_venv(
        "import sys\nfrom composer_replication.sandbox.sandbox import run_python\n"
        "from composer_replication.config import SandboxConfig\n"
        "assert sys.prefix != sys.base_prefix\n"
        f"r = run_python({code!r}, SandboxConfig.model_validate({cfg.model_dump()!r}))\n"
        "assert r.ok, r.stderr\nsys.stdout.write(r.stdout)\n"
    )
    assert child.returncode == 0, child.stderr[-2000:]
    return child.stdout
