"""Build the offline GPU kit: a folder that runs issue 35's GPU checks on a machine without
network (docs/gpu.md).

    python bench/gpu_kit/build.py                 # -> .gpu_kit/ (ignored by git), ~15 MB
    python bench/gpu_kit/build.py --out DIR --python-version 3.12

The folder holds:

* ``wheels/``: this project's wheel and, as wheels for the target Python and platform
  (``pip download --only-binary=:all: --python-version 3.12 --platform manylinux..._x86_64``),
  every dependency the target image lacks: the project's requirements and the ``bench``
  extra's liger-kernel, then their requirements (markers evaluated for the target), minus the
  packages listed in ``image_packages.txt``. Each is pinned to the version installed here when
  that version satisfies the requirement (the versions our suite runs with), else left to pip.
* ``tokenizer/``: the embedded SmolLM2's tokenizer files (the model itself is built from a
  config on the machine, ``bench/config_models.py``).
* ``run.sh``: the entry script (a copy of ``bench/gpu_kit/run.sh``), ``manifest.json``.

It then checks that the kit plus the git checkout fit the device tool's 64 MiB.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import tomllib
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
LIMIT_BYTES = 64 * 2**20
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34, 35, 39)]
PLATFORMS += ["manylinux2014_x86_64", "manylinux1_x86_64"]
EXTRAS = ("bench",)


def image_packages(path: Path = HERE / "image_packages.txt") -> set[str]:
    """Canonical names of the packages the target image already has."""
    lines = path.read_text().splitlines()
    return {canonicalize_name(x) for x in lines if x.strip() and not x.startswith("#")}


def project_requirements(pyproject: Path = REPO / "pyproject.toml") -> list[Requirement]:
    """``[project].dependencies`` plus the :data:`EXTRAS` (self-references dropped)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in EXTRAS:
        reqs += project["optional-dependencies"].get(extra, [])
    name = canonicalize_name(project["name"])
    return [r for r in map(Requirement, reqs) if canonicalize_name(r.name) != name]


def target_env(python_version: str) -> dict[str, str]:
    """Marker environment of the target: CPython ``python_version`` on Linux x86_64."""
    return {
        "python_version": python_version,
        "python_full_version": python_version + ".0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "os_name": "posix",
        "extra": "",
    }


def applies(req: Requirement, env: dict[str, str]) -> bool:
    return req.marker is None or Marker(str(req.marker)).evaluate(env)


def pin(req: Requirement) -> str:
    """``name==<version installed here>`` when that satisfies ``req``, else ``req`` itself."""
    try:
        have = md.version(req.name)
    except md.PackageNotFoundError:
        return f"{req.name}{req.specifier}"
    if req.specifier.contains(Version(have), prereleases=True):
        return f"{req.name}=={have}"
    return f"{req.name}{req.specifier}"


def wheel_requirements(wheel: Path) -> list[Requirement]:
    """``Requires-Dist`` lines of a wheel's METADATA."""
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(meta).decode()
    return [Requirement(line.split(":", 1)[1]) for line in text.splitlines() if line.startswith("Requires-Dist:")]  # fmt: skip


def download(specs: list[str], dest: Path, python_version: str) -> None:
    """Wheels (no dependencies) for the target, one pip call for all ``specs``."""
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    cmd += ["--python-version", python_version, "--implementation", "cp", "-d", str(dest)]
    for plat in PLATFORMS:
        cmd += ["--platform", plat]
    subprocess.run([*cmd, *specs], check=True)


def wheel_name(wheel: Path) -> str:
    """Canonical project name of a wheel file (``Name-1.0-py3-none-any.whl``)."""
    return canonicalize_name(wheel.name.split("-")[0])


def collect_wheels(dest: Path, python_version: str, present: set[str]) -> dict[str, str]:
    """Download the missing closure of our requirements, one level of requirements per pip
    call; returns {name: wheel file}."""
    env = target_env(python_version)
    level = [r for r in project_requirements() if applies(r, env)]
    got: dict[str, str] = {}
    while level:
        todo: dict[str, Requirement] = {}
        for req in level:
            name = canonicalize_name(req.name)
            if name not in present and name not in got:
                todo.setdefault(name, req)
        if not todo:
            break
        download([pin(r) for r in todo.values()], dest, python_version)
        wheels = {wheel_name(w): w for w in dest.glob("*.whl")}
        level = []
        for name in todo:
            if name not in wheels:
                raise RuntimeError(f"pip downloaded no wheel for {name}")
            got[name] = wheels[name].name
            level += [r for r in wheel_requirements(wheels[name]) if applies(r, env)]
    return got


def build_project_wheel(dest: Path) -> str:
    """This project's wheel (no build isolation: the build needs no network). setuptools
    builds in ``build/``, whose stale files (modules since moved) would enter the wheel:
    it goes first."""
    shutil.rmtree(REPO / "build", ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
        subprocess.run([*cmd, "-w", tmp, str(REPO)], check=True)
        (wheel,) = Path(tmp).glob("*.whl")
        shutil.copy2(wheel, dest / wheel.name)
        return wheel.name


def copy_tokenizer(dest: Path) -> None:
    sys.path.insert(0, str(REPO / "bench"))
    from config_models import copy_tokenizer as copy
    from config_models import default_tokenizer_dir

    copy(default_tokenizer_dir(), dest)


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def checkout_bytes() -> int:
    """Tracked plus untracked-not-ignored files: what the device tool sends with the kit."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout
    files = [REPO / f for f in out.decode().split("\0") if f]
    return sum(f.stat().st_size for f in files if f.is_file() and not f.is_symlink())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--out", type=Path, default=REPO / ".gpu_kit")
    ap.add_argument("--python-version", default="3.12")
    args = ap.parse_args()
    if args.out.exists():
        shutil.rmtree(args.out)
    wheels = args.out / "wheels"
    wheels.mkdir(parents=True)
    deps = collect_wheels(wheels, args.python_version, image_packages())
    ours = build_project_wheel(wheels)
    copy_tokenizer(args.out / "tokenizer")
    shutil.copy2(HERE / "run.sh", args.out / "run.sh")
    git = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    manifest = {
        "python_version": args.python_version,
        "platforms": PLATFORMS,
        "project_wheel": ours,
        "dependency_wheels": deps,
        "commit": git.stdout.strip(),
    }
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    kit, repo = tree_bytes(args.out), checkout_bytes()
    print(f"kit {args.out}: {kit / 2**20:.1f} MiB, {len(deps)} dependency wheels + {ours}")
    print(f"kit + checkout: {(kit + repo) / 2**20:.1f} MiB (device tool limit 64 MiB)")
    if kit + repo > LIMIT_BYTES:
        sys.exit("too large for the device tool: drop wheels or ignore large files")


if __name__ == "__main__":
    main()
