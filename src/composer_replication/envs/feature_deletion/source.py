"""Source trees for Feature Deletion: a local directory, or a PyPI sdist (``name==version``)
fetched at generation time into the cache (never committed): the index's file, checked
against the index's sha256, unpacked and never built (nothing of it runs on the host).

The tree is extracted without bytecode (``__pycache__``, ``.pyc``/``.pyo`` are dropped), with
archive members that would land outside the target (absolute paths, ``..``, links) refused.
Its digest covers every file's path and content, so a task set knows exactly what it was
generated from.
"""

from __future__ import annotations

import hashlib
import html.parser
import json
import os
import re
import shutil
import tarfile
import tempfile
import urllib.parse
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

from composer_replication.config.base import UserError
from composer_replication.envs.feature_deletion.paths import escaping_links
from composer_replication.lm.models import cache_dir, fill_once

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9][A-Za-z0-9.+!_-]*)$")
BYTECODE = ("__pycache__", "*.pyc", "*.pyo")


class SourceError(UserError, RuntimeError):
    """A source spec that cannot be fetched or unpacked."""


@dataclass(frozen=True)
class SourceTree:
    """An unpacked tree: ``name`` and ``version`` (``local`` for a directory), its ``root``
    and the sha256 over its files (:func:`tree_digest`)."""

    name: str
    version: str
    root: Path
    digest: str

    @property
    def label(self) -> str:
        return f"{self.name}-{self.version}"


def tree_digest(root: Path) -> str:
    """sha256 over the sorted (relative path, content) of every regular file under ``root``
    (except our ``.complete`` marker, which holds this digest)."""
    h = hashlib.sha256()
    files = (p for p in root.rglob("*") if p.is_file() and not p.is_symlink())
    for path in sorted(p for p in files if p.relative_to(root).as_posix() != ".complete"):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def resolve_source(spec: str, cache: Path | None = None) -> SourceTree:
    """A local directory (used in place) or ``name==version`` (sdist from the package index,
    unpacked once under ``<cache>/feature_deletion/src``)."""
    path = Path(spec).expanduser()
    if path.is_dir():
        root = path.resolve()
        if links := escaping_links(root):
            raise SourceError(f"{root}: the symbolic link {links[0]} leads outside the tree "
                              "(a workspace would hold that file of the host); remove it")  # fmt: skip
        return SourceTree(root.name, "local", root, tree_digest(root))
    m = _PIN.match(spec)
    if m is None:
        raise SourceError(f"{spec!r} is neither a directory nor a pinned package (`toolz==1.2.0`)")
    name, version = m.groups()
    base = (cache or cache_dir()) / "feature_deletion" / "src"
    root = base / f"{name}-{version}"
    fill_once(root, root / ".complete", lambda: _fetch_sdist(name, version, base, root))
    return SourceTree(name, version, root, (root / ".complete").read_text().strip())


INDEX_URL = "https://pypi.org/simple"
"""The package index sdists come from (``PIP_INDEX_URL`` overrides it, as for pip)."""
MAX_SDIST_BYTES = 256 << 20
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"


def _fetch_sdist(name: str, version: str, base: Path, root: Path) -> None:
    """Download the sdist of ``name==version`` as the index lists it (PEP 691 JSON, or the
    PEP 503 HTML page), check its sha256 against the index's, and unpack it. Nothing of it is
    built or run: ``pip download --no-binary :all:`` prepared the sdist's metadata, which runs
    its build backend (``setup.py``, an in-tree backend) on the host (issue 55)."""
    base.mkdir(parents=True, exist_ok=True)
    url, sha256 = _sdist_link(name, version)
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        filename = url.rsplit("/", 1)[-1].split("#", 1)[0]
        archive = Path(tmp) / filename
        _download(url, archive, sha256)
        unpacked = Path(tmp) / "unpacked"
        extract(archive, unpacked)
        tops = [p for p in unpacked.iterdir()]
        top = tops[0] if len(tops) == 1 and tops[0].is_dir() else unpacked
        _drop_bytecode(top)
        if root.exists():
            shutil.rmtree(root)
        shutil.move(str(top), root)
    (root / ".complete").write_text(tree_digest(root) + "\n")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _sdist_link(name: str, version: str) -> tuple[str, str]:
    """(url, sha256) of the sdist of ``name==version`` on the index."""
    index = os.environ.get("PIP_INDEX_URL") or INDEX_URL
    page = f"{index.rstrip('/')}/{_canonical(name)}/"
    req = urllib.request.Request(page, headers={"Accept": f"{SIMPLE_JSON}, text/html;q=0.1"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            kind, body = resp.headers.get("Content-Type", ""), resp.read(32 << 20)
    except (OSError, ValueError) as e:
        raise SourceError(f"cannot read the index page of {name} ({page}): {e}") from None
    files = _json_files(body) if "json" in kind else _html_files(body.decode("utf-8", "replace"))
    for filename, url, sha256 in files:
        if filename.endswith((".tar.gz", ".zip")):
            stem = filename.removesuffix(".tar.gz").removesuffix(".zip")
            dist, _, ver = stem.rpartition("-")
            if _canonical(dist) == _canonical(name) and _same_version(ver, version):
                if not sha256:
                    raise SourceError(f"the index gives no sha256 for {filename}: not fetched")
                return urllib.parse.urljoin(page, url), sha256
    raise SourceError(f"the index ({page}) lists no sdist of {name}=={version}")


def _same_version(a: str, b: str) -> bool:
    try:
        from packaging.version import InvalidVersion, Version
    except ImportError:  # pragma: no cover - packaging comes with pytest and transformers
        return a == b
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def _json_files(body: bytes) -> list[tuple[str, str, str]]:
    try:
        files = json.loads(body).get("files", [])
        return [(f["filename"], f["url"], (f.get("hashes") or {}).get("sha256", ""))
                for f in files if not f.get("yanked")]  # fmt: skip
    except (ValueError, AttributeError, KeyError, TypeError):
        raise SourceError("the package index answered with malformed JSON") from None


class _Anchors(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.files: list[tuple[str, str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href")
        if tag == "a" and href and "data-yanked" not in dict(attrs):
            url, _, frag = href.partition("#")
            sha = frag.removeprefix("sha256=") if frag.startswith("sha256=") else ""
            self.files.append((url.rsplit("/", 1)[-1], url, sha))


def _html_files(text: str) -> list[tuple[str, str, str]]:
    parser = _Anchors()
    parser.feed(text)
    return parser.files


def _download(url: str, dest: Path, sha256: str) -> None:
    """``url`` into ``dest`` (at most :data:`MAX_SDIST_BYTES`), refused unless its sha256 is
    ``sha256``."""
    h, size = hashlib.sha256(), 0
    try:
        with urllib.request.urlopen(url, timeout=120) as resp, dest.open("wb") as out:
            while chunk := resp.read(1 << 20):
                size += len(chunk)
                if size > MAX_SDIST_BYTES:
                    raise SourceError(f"{url}: larger than {MAX_SDIST_BYTES >> 20} MiB")
                h.update(chunk)
                out.write(chunk)
    except (OSError, ValueError) as e:
        raise SourceError(f"cannot download {url}: {e}") from None
    if h.hexdigest() != sha256.lower():
        raise SourceError(f"{url}: sha256 {h.hexdigest()} is not the index's {sha256}")


def extract(archive: Path, dest: Path) -> None:
    """Unpack a .tar.gz or .zip sdist into ``dest``, refusing members outside it and links."""
    dest.mkdir(parents=True)
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                _check_member(info.filename, dest)
            zf.extractall(dest)
        return
    with tarfile.open(archive) as tf:
        for member in tf.getmembers():
            _check_member(member.name, dest)
            if not (member.isfile() or member.isdir()):
                raise SourceError(f"{archive.name}: {member.name} is a link or device")
        tf.extractall(dest, filter="data")


def _check_member(name: str, dest: Path) -> None:
    target = (dest / name).resolve()
    if not str(target).startswith(str(dest.resolve()) + os.sep) and target != dest.resolve():
        raise SourceError(f"archive member {name!r} would land outside the target")


def _drop_bytecode(root: Path) -> None:
    for path in list(root.rglob("__pycache__")):
        shutil.rmtree(path, ignore_errors=True)
    for pattern in ("*.pyc", "*.pyo"):
        for path in root.rglob(pattern):
            path.unlink()


def staged_copy(
    root: Path,
    overrides: dict[str, str] | None = None,
    prefix: str = "cr-fd-",
    leave_out: tuple[str, ...] = (),
    only: tuple[str, ...] | None = None,
):
    """A sandbox-bindable copy of ``root`` (no bytecode, no ``.git``) with ``overrides``
    (relative path -> text) written over it; world-readable; the caller removes it.
    ``leave_out``: relative paths not copied, and directories they leave empty (split
    grading's served tree leaves out :func:`suite_files`: the submission must not read the
    tests it is graded by). ``only``: copy just these relative paths (split grading's served
    tree: the package's import closure, testcode.py)."""
    from composer_replication.sandbox.sandbox import bindable_dir, world_readable

    dest = Path(bindable_dir(prefix))
    ignore = shutil.ignore_patterns(*BYTECODE, ".git", ".complete")
    try:
        if only is None:
            shutil.copytree(root, dest, ignore=ignore, dirs_exist_ok=True, symlinks=False)
        for rel in only or ():
            src = Path(root) / rel
            if src.is_file() and not src.is_symlink():
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dest / rel)
        if leave_out:
            _remove(dest, leave_out)
        for rel, text in (overrides or {}).items():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_text(text, encoding="utf-8")
        world_readable(dest)
    except BaseException:  # a partial copy is removed, not left in /var/tmp
        shutil.rmtree(dest, ignore_errors=True)
        raise
    return dest


TEST_CONFIG = {"conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "noxfile.py"}


def suite_files(tree: Path) -> list[str]:
    """Relative paths of the test code (``candidates.is_test_path``: test modules, files under
    test directories) and pytest configuration files of ``tree``."""
    from composer_replication.envs.feature_deletion.candidates import is_test_path

    out = []
    for path in sorted(Path(tree).rglob("*")):
        rel = path.relative_to(tree).as_posix()
        if path.is_file() and (is_test_path(rel) or path.name in TEST_CONFIG):
            out.append(rel)
    return out


def _remove(tree: Path, files: tuple[str, ...]) -> None:
    """Delete ``files`` (relative) under ``tree``, then the directories left empty."""
    for rel in files:
        (tree / rel).unlink(missing_ok=True)
    for path in sorted(tree.rglob("*"), reverse=True):
        if path.is_dir() and not any(path.iterdir()):
            path.rmdir()


def prepare_source(spec: str, cfg, cache: Path | None = None) -> SourceTree:
    """:func:`resolve_source`, then the rename of ``cfg.rename_package`` if asked."""
    tree = resolve_source(spec, cache)
    return renamed(tree, cache) if cfg.rename_package else tree


def top_package(tree: SourceTree) -> str:
    """The tree's main importable package: the top-level directory with an ``__init__.py``
    named like the distribution (``-``/``.`` as ``_``), else the only such directory."""
    pkgs = sorted(p.name for p in tree.root.iterdir()
                  if (p / "__init__.py").is_file() and p.name not in ("tests", "test"))  # fmt: skip
    want = re.sub(r"[-.]", "_", tree.name).lower()
    if want in pkgs:
        return want
    if len(pkgs) == 1:
        return pkgs[0]
    raise SourceError(f"{tree.label}: cannot tell the main package among {pkgs}")


def renamed(tree: SourceTree, cache: Path | None = None) -> SourceTree:
    """A copy of ``tree`` whose main package is called ``pkg_<6 hex of the tree's digest>``:
    the directory and every word-boundary mention in text files are rewritten (so neither
    the module path nor the identifiers match what a model may have memorized upstream)."""
    old = top_package(tree)
    new = f"pkg_{tree.digest[:6]}"
    base = (cache or cache_dir()) / "feature_deletion" / "src"
    root = base / f"{tree.label}-as-{new}"
    fill_once(root, root / ".complete", lambda: _write_renamed(tree.root, root, old, new))
    return SourceTree(tree.name, f"{tree.version}-as-{new}", root,
                      (root / ".complete").read_text().strip())  # fmt: skip


def _write_renamed(src: Path, root: Path, old: str, new: str) -> None:
    """Copy ``src`` to ``root`` with the package ``old`` renamed ``new`` (its directory and
    every word-boundary mention in text files), then mark the copy complete."""
    if root.exists():
        shutil.rmtree(root)
    shutil.copytree(src, root, ignore=shutil.ignore_patterns(*BYTECODE, ".complete"))
    word = re.compile(rf"\b{re.escape(old)}\b")
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.suffix in (".py", ".cfg", ".toml", ".ini", ".txt", ".rst"):
            text = path.read_text(encoding="utf-8", errors="replace")
            path.write_text(word.sub(new, text), encoding="utf-8")
    (root / old).rename(root / new)
    (root / ".complete").write_text(tree_digest(root) + "\n")
