"""Export Feature Deletion task sets as Harbor task directories (``composer-replication tasks
export --format harbor OUT``), the format TRL (``trl.experimental.harbor.HarborSpec``),
SkyRL, rLLM and prime-rl read (harborframework.com; ``harbor init`` writes the same
``task.toml`` schema, 1.4).

``OUT/tasks/<name>/`` per task:

* ``instruction.md``: the task's prompt as our environment poses it, and where the
  repository is.
* ``task.toml``: ``[task]`` name/version/description, ``[metadata]`` (provenance: package,
  version, tree sha256, target file and symbol, deleted span sha256, the wheels' sha256,
  license files; ``difficulty_level`` where an estimates file gives the task's pass rate),
  ``[verifier]`` in a **separate** environment (Harbor's default, and ``harbor lint``'s
  ``shared-verifier`` rule), ``[agent]`` as the non-root user ``agent``, ``[environment]``
  without network; ``artifacts = ["/app"]``: the workspace is what crosses to the verifier.
* ``environment/``: the agent's image: ``Dockerfile``, ``app/`` (the repository at the
  task's state, made by workspace.py exactly as an episode's workspace, without its
  ``.git``) and ``wheels/`` (the pinned pytest, so the agent can run the visible tests).
* ``tests/``: the verifier's image: ``Dockerfile``, ``test.sh``, ``grade.py``
  (harbor_grade.py) and its ``grade.json``, ``pristine/`` (the original repository: the
  full test files, hidden tests included) and ``wheels/`` (pytest and its pure-Python
  dependencies at the versions our grader uses, sha256 recorded).
* ``solution/solve.sh``: the oracle, which writes the original target file back.
* ``licenses/``: the source package's license files and those of every wheel.

What survives the export and what does not: docs/feature_deletion.md.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from composer_replication.config import TaskGenConfig
from composer_replication.config.base import UserError
from composer_replication.envs.feature_deletion.generate import load_tasks, read_manifest
from composer_replication.envs.feature_deletion.grade import MAX_ADDED_CHARS
from composer_replication.envs.feature_deletion.source import SourceTree, prepare_source
from composer_replication.envs.feature_deletion.workspace import (
    CONFIG_FILES,
    IGNORED,
    make_workspace,
    protected_kind,
)
from composer_replication.lm.models import cache_dir, fill_once
from composer_replication.sandbox.pytest_suite import pytest_args

SCHEMA_VERSION = "1.4"
APP = "/app"
"""The workspace in the agent's container (its ``WORKDIR``) and, collected as an artifact,
in the verifier's."""
DEFAULT_ORG = "composer-replication"
LICENSE_NAMES = re.compile(r"^(LICEN[CS]E|COPYING|NOTICE|COPYRIGHT)([._-].*)?$", re.IGNORECASE)
EASY_AT, HARD_AT = 0.7, 0.3
"""Pass-rate bounds of ``difficulty_level``: ``easy`` at or above 0.7, ``hard`` at or below
0.3, ``medium`` between."""


class HarborExportError(UserError, RuntimeError):
    """A task set, an estimates file or a wheel the export cannot use."""


class Estimate(BaseModel):
    """One line of an estimates file: a task's pass rate measured during a run."""

    model_config = ConfigDict(extra="forbid")
    task_id: str = Field(min_length=1)
    """The task (``tasks.jsonl``'s ``task_id``)."""
    pass_rate: float = Field(ge=0.0, le=1.0)
    """Share of the task's graded episodes that scored 1."""
    attempts: int = Field(ge=1)
    """Graded episodes the rate comes from."""


def read_estimates(path: Path) -> dict[str, Estimate]:
    """A JSON-lines file of :class:`Estimate` (one task a line); a one-line error naming the
    file, line and field otherwise."""
    out = {}
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            est = Estimate.model_validate_json(line)
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(x) for x in err["loc"]) or "line"
            raise HarborExportError(f"{path}:{n}: {where}: {err['msg']}") from None
        out[est.task_id] = est
    return out


def difficulty_level(pass_rate: float) -> str:
    """Harbor's difficulty words (``harbor.models.difficulty``) for a pass rate."""
    return "easy" if pass_rate >= EASY_AT else "hard" if pass_rate <= HARD_AT else "medium"


def task_dir_name(task_id: str) -> str:
    """A directory and Harbor package name for ``task_id`` (``textkit-local:textkit/core.py::
    slugify`` -> ``textkit-local--textkit-core.py--slugify-<8 hex>``): characters Harbor's
    ``org/name`` pattern allows, and a hash of the id so that two ids never share a name."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", task_id.replace("::", "--").replace(":", "--"))
    slug = slug.strip("-.")[:80] or "task"
    return f"{slug}-{hashlib.sha256(task_id.encode()).hexdigest()[:8]}"


# ---- the grader's pytest, as wheels ---------------------------------------------------------


def grader_pins() -> list[str]:
    """``pytest==<the version our grader runs>`` and each of its dependencies for this
    interpreter at the installed version (sandbox/pytest_suite.py binds the same copy)."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pins: dict[str, str] = {}
    todo = ["pytest"]
    while todo:
        name = canonicalize_name(todo.pop())
        if name in pins:
            continue
        pins[name] = f"{name}=={metadata.version(name)}"
        for text in metadata.requires(name) or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return sorted(pins.values())


def grader_wheels(requirements: tuple[str, ...] = (), wheel_dir: Path | None = None) -> list[Path]:
    """Pure-Python wheels of :func:`grader_pins` plus a suite's test requirements: from
    ``wheel_dir`` (offline), else downloaded once with ``pip download --only-binary :all:``
    into the cache (``<cache>/feature_deletion/wheels/<key>``)."""
    pins = grader_pins()
    if wheel_dir is not None:
        if requirements:
            raise HarborExportError("test requirements need downloaded wheels: drop --wheels")
        return [_wheel_for(pin, Path(wheel_dir)) for pin in pins]
    key = hashlib.sha256("\n".join([*pins, "--", *requirements, sys.version]).encode())
    dest = cache_dir() / "feature_deletion" / "wheels" / key.hexdigest()[:16]
    fill_once(dest, dest / ".complete", lambda: _download(pins, requirements, dest))
    return sorted(dest.glob("*.whl"))


def _download(pins: list[str], requirements: tuple[str, ...], dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    base = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
            "--only-binary", ":all:", "--dest", str(dest)]  # fmt: skip
    for extra in (["--no-deps", *pins], list(requirements)):
        if not extra:
            continue
        res = subprocess.run(base + extra, capture_output=True, text=True, timeout=600)
        if res.returncode:
            tail = " / ".join((res.stderr or res.stdout).strip().splitlines()[-3:])
            raise HarborExportError(f"pip could not download the wheels {extra}: {tail}")
    for whl in dest.glob("*.whl"):
        if not whl.name.endswith("-none-any.whl"):
            raise HarborExportError(f"{whl.name} is not a pure-Python wheel: the export "
                                    "bundles only wheels any Linux image can use")  # fmt: skip
    (dest / ".complete").write_text("\n".join(pins) + "\n")


def _wheel_for(pin: str, wheel_dir: Path) -> Path:
    name, version = pin.split("==")
    stem = re.sub(r"[-_.]+", "_", name).lower()
    for whl in sorted(wheel_dir.glob("*.whl")):
        parts = whl.name.split("-")
        if re.sub(r"[-_.]+", "_", parts[0]).lower() == stem and parts[1] == version:
            return whl
    raise HarborExportError(f"{wheel_dir} has no wheel of {pin} (pip download --no-deps "
                            f"--only-binary :all: -d {wheel_dir} {pin})")  # fmt: skip


def sha256_file(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# ---- the export -----------------------------------------------------------------------------


@dataclass
class ExportSummary:
    """What :func:`export_harbor` wrote."""

    out: Path
    tasks: list[str] = field(default_factory=list)
    """Task directory names, in order."""
    with_difficulty: int = 0
    missing_licenses: list[str] = field(default_factory=list)
    """Source packages in which no license file was found."""


@dataclass(frozen=True)
class ExportOptions:
    """How tasks are exported (the CLI's options)."""

    org: str = DEFAULT_ORG
    base_image: str = ""
    """The images' ``FROM`` (default ``python:<this interpreter's major.minor>-slim``; pin it
    to a digest for reproducible builds)."""
    agent_timeout_s: float = 600.0
    verifier_timeout_s: float | None = None
    """Default: the task set's suite timeout plus a minute for unpacking and copying."""
    wheel_dir: Path | None = None


def task_set_dirs(root: Path) -> list[Path]:
    """``root`` if it is one task set (``tasks.jsonl``), else its task-set subdirectories."""
    root = Path(root)
    if (root / "tasks.jsonl").is_file():
        return [root]
    sets = sorted(p.parent for p in root.glob("*/tasks.jsonl"))
    if not sets:
        raise HarborExportError(f"{root} holds no task set (no tasks.jsonl in it or below it)")
    return sets


def source_of(set_dir: Path) -> SourceTree:
    """The source tree a task set was generated from (its manifest's spec and settings),
    refused if it is no longer the tree the manifest's sha256 names."""
    manifest = read_manifest(Path(set_dir) / "manifest.json")
    src = manifest.get("source", {})
    settings = {k: v for k, v in manifest.get("settings", {}).items()
                if k in TaskGenConfig.model_fields}  # fmt: skip
    try:
        tree = prepare_source(src.get("spec") or "", TaskGenConfig(**settings))
    except (UserError, ValidationError) as e:
        raise HarborExportError(f"{set_dir}: cannot open its source: {e}") from None
    if tree.digest != src.get("sha256"):
        raise HarborExportError(f"{set_dir}: its source {src.get('spec')!r} changed since the "
                                "task set was generated (sha256 differs)")  # fmt: skip
    return tree


def export_harbor(
    task_dir: Path,
    out: Path,
    options: ExportOptions | None = None,
    estimates: dict[str, Estimate] | None = None,
    progress: Callable[[str], None] | None = None,
) -> ExportSummary:
    """Write every task of the task set(s) under ``task_dir`` to ``out/tasks/<name>/``
    (module docstring); a task directory already there is replaced."""
    opts = options or ExportOptions()
    summary = ExportSummary(Path(out))
    for set_dir in task_set_dirs(task_dir):
        manifest = read_manifest(set_dir / "manifest.json")
        tree = source_of(set_dir)
        tasks = load_tasks(set_dir)
        licenses = license_files(tree.root)
        if not licenses:
            summary.missing_licenses.append(tree.label)
        suite_s = manifest.get("settings", {}).get("suite_timeout_s", 120.0)
        timeout = opts.verifier_timeout_s or suite_s + 60.0
        for task in tasks:
            wheels = grader_wheels(tuple(task.get("test_requirements", ())), opts.wheel_dir)
            est = (estimates or {}).get(task["task_id"])
            name = export_task(task, tree, Path(out) / "tasks", opts, wheels, licenses,
                               timeout, est)  # fmt: skip
            summary.tasks.append(name)
            summary.with_difficulty += est is not None
            if progress is not None:
                progress(name)
    return summary


def export_task(task: dict, tree: SourceTree, out: Path, opts: ExportOptions, wheels: list[Path],
                licenses: list[Path], timeout_s: float, est: Estimate | None) -> str:  # fmt: skip
    """One task's directory, written beside its final place and renamed into it."""
    name = task_dir_name(task["task_id"])
    target_path(tree, task)  # a record naming a file outside its tree exports nothing
    grading_tests(task)
    final = Path(out) / name
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=final.parent))
    try:
        app = _write_environment(tmp / "environment", tree, task, opts, wheels)
        spec = _write_tests(tmp / "tests", tree, task, opts, wheels, app, timeout_s)
        _write_solution(tmp / "solution", tree, task)
        copied = _write_licenses(tmp / "licenses", tree, licenses, wheels)
        (tmp / "instruction.md").write_text(instruction(task), encoding="utf-8")
        doc = task_toml(task, tree, name, opts, spec, copied, timeout_s, est)
        (tmp / "task.toml").write_text(doc, encoding="utf-8")
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return name


def target_path(tree: SourceTree, task: dict) -> Path:
    """The task's target file in ``tree``: a regular file inside it, else a
    `HarborExportError` (a task record is data: its path must not reach outside the tree,
    nor into the oracle's shell script unquoted)."""
    root = tree.root.resolve()
    path = (root / task["file"]).resolve()
    if not path.is_relative_to(root) or not path.is_file() or (root / task["file"]).is_symlink():
        raise HarborExportError(f"task {task['task_id']!r}: its file {task['file']!r} is not a "
                                f"regular file inside {root}")  # fmt: skip
    return path


def grading_tests(task: dict) -> list[str]:
    """The test ids the verifier passes to pytest (targets, then the tests that passed): at
    least one target, each a test id, never an option (``-p plugin``, ``-c /app/pytest.ini``
    would let the verifier's pytest load what the agent wrote), else a `HarborExportError`."""
    tests = [*task["failing_tests"], *task["passing_tests"]]
    bad = [t for t in tests if not isinstance(t, str) or not t or t.startswith("-")
           or any(c in t for c in "\0\n\r")]  # fmt: skip
    if bad or not task["failing_tests"]:
        why = f"test id {bad[0]!r} is no test id" if bad else "it has no target test"
        raise HarborExportError(f"task {task['task_id']!r}: {why}")
    return tests


def instruction(task: dict) -> str:
    """The prompt our environment poses (env.PROMPT), and the container's conventions."""
    from composer_replication.envs.feature_deletion.env import PROMPT

    visible = ", ".join(f"`{t}`" for t in task["visible_tests"][:2])
    prompt = PROMPT.format(symbol=task["symbol"], file=task["file"], visible=visible)
    return (
        f"{prompt}\n\nThe repository is in `{APP}`; run the tests with `python -m pytest` "
        f"there. Only `{task['file']}` is graded, against the repository's own tests (some "
        "of them are not in your copy); a change to a test file or to the test "
        "configuration scores 0.\n"
    )


def _base_image(opts: ExportOptions) -> str:
    return opts.base_image or f"python:{sys.version_info.major}.{sys.version_info.minor}-slim"


def _link_or_copy(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)


def _write_environment(env: Path, tree: SourceTree, task: dict, opts: ExportOptions,
                       wheels: list[Path]) -> Path:  # fmt: skip
    """The agent's image: the workspace (workspace.make_workspace, its ``.git`` left out:
    a repository nested in the exported tree would be a submodule to whoever commits it),
    the wheels, and the Dockerfile."""
    with tempfile.TemporaryDirectory(prefix="cr-fd-export-") as tmp:
        ws = make_workspace(tree.root, task, Path(tmp) / "repo")
        shutil.copytree(ws, env / "app", ignore=IGNORED, symlinks=False)
    for whl in wheels:
        _link_or_copy(whl, env / "wheels" / whl.name)
    (env / "Dockerfile").write_text(
        f"FROM {_base_image(opts)}\n\n"
        "# pytest and its dependencies, the versions the grader uses (offline: no network)\n"
        "COPY wheels/ /opt/feature-deletion/wheels/\n"
        "RUN python -m pip install --no-index --no-deps /opt/feature-deletion/wheels/*.whl"
        " && useradd --create-home --uid 1000 agent"
        f" && mkdir -p {APP} && chown agent:agent {APP}\n\n"
        f"WORKDIR {APP}\n"
        f"COPY --chown=agent:agent app/ {APP}/\n"
        "USER agent\n"
    )
    return env / "app"


def protected_digests(app: Path, task: dict) -> dict[str, str]:
    """sha256 of the workspace's tests and configuration (workspace.protected_kind), which a
    submission must leave as they are."""
    out = {}
    for path in sorted(p for p in app.rglob("*") if p.is_file()):
        rel = path.relative_to(app).as_posix()
        if rel != task["file"] and protected_kind(rel, task):
            out[rel] = sha256_file(path)
    return out


def _write_tests(tests: Path, tree: SourceTree, task: dict, opts: ExportOptions,
                 wheels: list[Path], app: Path, timeout_s: float) -> dict:  # fmt: skip
    """The verifier's image and inputs (module docstring); returns ``grade.json``."""
    shutil.copytree(tree.root, tests / "pristine", ignore=IGNORED, symlinks=False)
    for whl in wheels:
        _link_or_copy(whl, tests / "wheels" / whl.name)
    original = target_path(tree, task).read_text(encoding="utf-8")
    spec = {
        "target": task["file"],
        "tests": grading_tests(task),
        "protected": protected_digests(app, task),
        "config_names": sorted(CONFIG_FILES),
        "wheels": {w.name: sha256_file(w) for w in wheels},
        "pytest_args": pytest_args(None),
        "timeout_s": timeout_s - 30.0,
        "max_chars": len(original) + MAX_ADDED_CHARS,
    }
    (tests / "grade.json").write_text(json.dumps(spec, indent=1, sort_keys=True) + "\n")
    shutil.copyfile(Path(__file__).with_name("harbor_grade.py"), tests / "grade.py")
    _script(tests / "test.sh", (
        "# Feature Deletion verifier (composer-replication): grades only the target file,\n"
        "# in a fresh copy of /tests/pristine, with the pinned pytest of /tests/wheels.\n"
        "mkdir -p /logs/verifier\n"
        "echo 0 > /logs/verifier/reward.txt\n"
        f"python3 -I -S -B /tests/grade.py /tests {APP} /logs/verifier\n"
    ))  # fmt: skip
    (tests / "Dockerfile").write_text(
        f"FROM {_base_image(opts)}\n\n"
        "# the pristine repository, the grader and its wheels; nothing of the agent's image\n"
        "COPY . /tests/\n"
        "RUN chmod -R a-w /tests\n\n"
        f"WORKDIR {APP}\n"
    )
    return spec


def _script(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/bash\nset -u\n" + body)
    path.chmod(0o755)


def _write_solution(solution: Path, tree: SourceTree, task: dict) -> None:
    """``solve.sh``: the original target file (its deleted body included), written back."""
    data = base64.encodebytes(target_path(tree, task).read_bytes()).decode()
    dest = shlex.quote(f"{APP}/{task['file']}")
    _script(solution / "solve.sh", (
        "# The oracle: the target file as it was before the feature was deleted.\n"
        f"base64 -d > {dest} <<'B64'\n{data}B64\n"
    ))  # fmt: skip


def license_files(root: Path) -> list[Path]:
    """The tree's license files: ``LICENSE``/``LICENCE``/``COPYING``/``NOTICE``/``COPYRIGHT``
    (any suffix) at its root or in a ``LICENSES``/``licenses`` folder; links left out."""

    def regular(p: Path) -> bool:  # a link may name a host file: never copied
        return p.is_file() and not p.is_symlink()

    found = [p for p in Path(root).iterdir() if regular(p) and LICENSE_NAMES.match(p.name)]
    for folder in ("LICENSES", "licenses"):
        if (Path(root) / folder).is_dir() and not (Path(root) / folder).is_symlink():
            found += [p for p in (Path(root) / folder).rglob("*") if regular(p)]
    return sorted(found)


def _write_licenses(dest: Path, tree: SourceTree, licenses: list[Path],
                    wheels: list[Path]) -> list[str]:  # fmt: skip
    """Copy the source's license files to ``licenses/<name>/`` and each wheel's
    (``*.dist-info/licenses/*`` or ``*.dist-info/LICENSE*``) to ``licenses/<wheel>/``;
    returns the copied paths (relative to the task)."""
    import zipfile

    copied = []
    for path in licenses:
        rel = Path("licenses") / tree.name / path.relative_to(tree.root)
        (dest.parent / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest.parent / rel)
        copied.append(rel.as_posix())
    for whl in wheels:
        stem = "-".join(whl.name.split("-")[:2])
        with zipfile.ZipFile(whl) as zf:
            for member, inside in wheel_license_members(zf):
                rel = Path("licenses") / stem / inside
                (dest.parent / rel).parent.mkdir(parents=True, exist_ok=True)
                (dest.parent / rel).write_bytes(zf.read(member))
                copied.append(rel.as_posix())
    return copied


def wheel_license_members(zf) -> list[tuple[str, Path]]:
    """A wheel's license files (``*.dist-info/licenses/*``, ``*.dist-info/LICENSE*``) and the
    path each takes under its ``licenses/<wheel>/`` folder; a member named with ``..``, an
    empty part or a backslash is left out (an archive's names are data: none may lead out)."""
    out = []
    for member in zf.namelist():
        parts = member.split("/")
        if len(parts) < 2 or not parts[0].endswith(".dist-info") or member.endswith("/"):
            continue
        if any(p in ("", ".", "..") or "\\" in p for p in parts):
            continue
        if parts[1] == "licenses" or LICENSE_NAMES.match(parts[-1]):
            out.append((member, Path(*parts[1:])))
    return out


def task_toml(task: dict, tree: SourceTree, name: str, opts: ExportOptions, spec: dict,
              licenses: list[str], timeout_s: float, est: Estimate | None) -> str:  # fmt: skip
    """``task.toml`` in the layout ``harbor init`` writes (schema 1.4)."""
    metadata = {
        "category": "software_engineering",
        "task_id": task["task_id"],
        "source_package": tree.name,
        "source_version": tree.version,
        "source_sha256": tree.digest,
        "target_file": task["file"],
        "target_symbol": task["symbol"],
        "deleted_body_sha256": task.get("body_sha256", ""),
        "target_tests": len(task["failing_tests"]),
        "hidden_tests": len(task.get("hidden_tests", [])),
        "generator_version": task.get("generator_version", 0),
        "wheels_sha256": spec["wheels"],
        "license_files": licenses,
    }
    if est is not None:
        metadata |= {"difficulty_level": difficulty_level(est.pass_rate),
                     "difficulty": difficulty_level(est.pass_rate),
                     "pass_rate": est.pass_rate, "pass_rate_attempts": est.attempts}  # fmt: skip
    desc = f"Rebuild `{task['symbol']}` in {task['file']} ({tree.label}; Feature Deletion)"
    sections = [
        ("", {"schema_version": SCHEMA_VERSION, "artifacts": [APP]}),
        ("task", {"name": f"{opts.org}/{name}", "version": "1.0.0", "description": desc,
                  "authors": [], "keywords": ["feature-deletion", "python", tree.name]}),
        ("metadata", metadata),
        ("verifier", {"timeout_sec": float(timeout_s), "environment_mode": "separate",
                      "collect": []}),
        ("verifier.env", {}),
        ("agent", {"timeout_sec": float(opts.agent_timeout_s), "user": "agent"}),
        ("environment", {"network_mode": "no-network", "build_timeout_sec": 600.0,
                         "os": "linux", "mcp_servers": []}),
        ("environment.env", {}),
        ("solution.env", {}),
    ]  # fmt: skip
    return "\n".join(_toml_table(header, values) for header, values in sections)


def _toml_table(header: str, values: dict) -> str:
    lines = [f"[{header}]"] if header else []
    nested = []
    for key, value in values.items():
        if isinstance(value, dict) and value:
            nested.append(_toml_table(f"{header}.{key}" if header else key, value))
        else:
            lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
    return "\n".join(lines) + "\n" + "".join("\n" + n for n in nested)


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else _toml_string(key)


def _toml_string(text: str) -> str:
    """A TOML basic string: JSON's escapes without ``ensure_ascii`` (which writes a character
    outside the Basic Multilingual Plane as a surrogate pair, no TOML escape), DEL escaped
    (TOML refuses it raw); a lone surrogate (no UTF-8 text) is refused."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise HarborExportError(f"{text!r} is not UTF-8 text: no TOML string") from None
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _toml_value(value) -> str:
    """A TOML value (:func:`_toml_string` for strings; JSON's numbers are TOML's)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, (int, float)):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}"
                               for k, v in value.items()) + "}"  # fmt: skip
    raise TypeError(f"no TOML form for {type(value).__name__}")
