"""Is the original of a Feature Deletion target visible to the submission? (issue 55)

A submission that finds the function it must rebuild anywhere it can read (an installed copy
of the package, a vendored copy inside a wheel, the standard library's own copy, as
``tomllib`` is ``tomli``, or a duplicate elsewhere in the task's tree) can load and run it
and pass every test without writing it. The sandbox binds only an allowlist
(sandbox/sandbox.py), but that allowlist still holds the standard library, the programs of
``/usr/bin`` and the test tools. So, at generation, everything the sandbox can see is
searched for the target's *normalized body*, and a candidate found there becomes the status
``original_visible`` instead of a task.

What is searched: every regular file under the sandbox's bound trees (less its masks), the
test tools and the source tree itself: Python sources (``.py``, ``.pyw``, scripts with a
``python`` ``#!`` line), and the ``.py`` members of every zip archive (wheels, eggs,
zipapps: by content, whatever the name) and tar archive, one level of nesting deep. ELF files
are skipped after their first four bytes. A file is parsed only if it holds the target's
rarest identifier (a byte search), so the scan reads the trees once per generation. What a
parse found is kept for the process (:data:`SCANNED`, per file, checked against its size and
mtime): a suite's packages scan the same standard library and tools, one scan at a time
(:data:`SCAN_LOCK`), and each later scan reuses the earlier ones' parses (issue 60: 10
packages' scans, each parsing the standard library under one interpreter lock, kept the
sandboxes idle for the run's first quarter of an hour).

The normalized body: the function's statements after its docstring, as ``ast.dump`` without
positions, with the function's own name left out, imported module paths cut to their last
component (a vendored copy imports ``pip._vendor.packaging.version``) and the package's own
name (and its renamed alias) replaced by one placeholder. Bodies of fewer than
:data:`MIN_NODES` nodes are not searched (``return self._x`` is everywhere, and rebuilding
it is no work). NOT found: a copy that was edited (other local names, other statements), a
copy only in bytecode, compressed single files (``.py.gz``) and archives nested deeper.
"""

from __future__ import annotations

import ast
import hashlib
import io
import os
import re
import tarfile
import threading
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from composer_replication.sandbox import pyast

MIN_NODES = 12
"""Bodies with fewer AST nodes are not searched (module docstring)."""
MAX_SOURCE_BYTES = 16 << 20
"""A file or archive member larger than this is not read as Python source."""
SOURCE_SUFFIXES = (".py", ".pyw")
ARCHIVE_SUFFIXES = (".whl", ".zip", ".egg", ".pyz", ".jar", ".tar", ".tgz", ".gz", ".xz", ".bz2")
PLACEHOLDER = "__PKG__"


@dataclass(frozen=True)
class Target:
    """One candidate's normalized body, its search token and where it itself is defined
    (``path:line``, a match there is the candidate, not a copy)."""

    key: str
    body: str
    token: str
    itself: str


class _Normalize(ast.NodeTransformer):
    def __init__(self, aliases: frozenset[str]):
        self.aliases = aliases

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.Name(PLACEHOLDER if node.id in self.aliases else node.id, node.ctx)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.AST:
        module = (node.module or "").rsplit(".", 1)[-1]
        return ast.ImportFrom(module, node.names, 0)

    def visit_alias(self, node: ast.alias) -> ast.AST:
        return ast.alias(node.name.rsplit(".", 1)[-1], node.asname)


def _statements(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.stmt]:
    body = node.body
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        if isinstance(first.value.value, str):
            body = body[1:]
    return body


def normalized_body(node: ast.AST, aliases: frozenset[str] = frozenset()) -> str | None:
    """The normalized body of a function node (module docstring); None if it is too small."""
    stmts = _statements(node)  # type: ignore[arg-type]
    module = ast.Module(body=stmts, type_ignores=[])
    if sum(1 for _ in ast.walk(module)) < MIN_NODES:
        return None
    return ast.dump(_Normalize(aliases).visit(module), include_attributes=False)


def _identifiers(node: ast.AST, aliases: frozenset[str]) -> set[str]:
    names: set[str] = set()
    for sub in ast.walk(ast.Module(body=_statements(node), type_ignores=[])):  # type: ignore[arg-type]
        if isinstance(sub, ast.Name):
            names.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            names.add(sub.attr)
        elif isinstance(sub, ast.arg):
            names.add(sub.arg)
    return {n for n in names - aliases if len(n) >= 3}


def _functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def target_of(root: Path, key: str, file: str, body_start: int, aliases: frozenset[str]):
    """The :class:`Target` of the function of ``root/file`` whose body holds line
    ``body_start``; None if it is too small to search or cannot be found."""
    path = Path(root) / file
    try:
        tree = pyast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None
    inner = [f for f in _functions(tree) if f.lineno < body_start <= (f.end_lineno or 0)]
    if not inner:
        return None
    node = max(inner, key=lambda f: f.lineno)  # the innermost
    body = normalized_body(node, aliases)
    names = _identifiers(node, aliases)
    if body is None or not names:
        return None
    token = max(sorted(names), key=len)  # the longest: the likeliest to be rare
    return Target(key, body, token, f"{os.path.realpath(path)}:{node.lineno}")


def _walk(roots: Iterable[str], masks: Iterable[str]) -> Iterator[str]:
    masked = {os.path.realpath(m) for m in masks}
    seen: set[str] = set()
    for root in sorted({os.path.realpath(r) for r in roots}):
        if any(root == m or root.startswith(m + os.sep) for m in masked):
            continue
        if os.path.isfile(root) and not os.path.islink(root):
            yield root
            continue
        for top, dirs, files in os.walk(root):
            if top in seen:
                dirs[:] = []
                continue
            seen.add(top)
            dirs[:] = sorted(d for d in dirs if os.path.join(top, d) not in masked)
            for f in sorted(files):
                yield os.path.join(top, f)


def _sources(path: str) -> Iterator[tuple[str, bytes]]:
    """(label, bytes) of every Python source in the file at ``path`` (module docstring)."""
    try:
        if os.path.islink(path) or not os.path.isfile(path):
            return
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:
        return
    if head.startswith(b"\x7fELF"):
        return
    shebang = head.startswith(b"#!") and b"python" in head.split(b"\n", 1)[0]
    zipped = _is_zip(path)  # a zipapp is a zip after a `#!` line
    if (path.endswith(SOURCE_SUFFIXES) or shebang) and not zipped and size <= MAX_SOURCE_BYTES:
        with open(path, "rb") as f:
            yield path, f.read()
        return
    if zipped or path.endswith(ARCHIVE_SUFFIXES):
        yield from _archive_sources(path, path, depth=0)


def _is_zip(path: str) -> bool:
    try:
        return zipfile.is_zipfile(path)
    except OSError:
        return False


def _archive_sources(label: str, fileobj, depth: int) -> Iterator[tuple[str, bytes]]:
    try:
        if zipfile.is_zipfile(fileobj):
            with zipfile.ZipFile(fileobj) as zf:
                members = [(i.filename, i.file_size, zf.open) for i in zf.infolist()]
                yield from _members(label, members, depth)
            return
        if isinstance(fileobj, str) and not fileobj.endswith(ARCHIVE_SUFFIXES):
            return
        if not isinstance(fileobj, str):
            fileobj.seek(0)
        kw = {"name": fileobj} if isinstance(fileobj, str) else {"fileobj": fileobj}
        with tarfile.open(**kw) as tf:
            members = [(m.name, m.size, lambda n, tf=tf: tf.extractfile(n))
                       for m in tf.getmembers() if m.isfile()]  # fmt: skip
            yield from _members(label, members, depth)
    except (OSError, zipfile.BadZipFile, tarfile.TarError, EOFError, ValueError):
        return


def _members(label: str, members, depth: int) -> Iterator[tuple[str, bytes]]:
    for name, size, opener in members:
        if size > MAX_SOURCE_BYTES:
            continue
        if name.endswith(SOURCE_SUFFIXES):
            with opener(name) as f:
                yield f"{label}!{name}", f.read()
        elif depth == 0 and name.endswith(ARCHIVE_SUFFIXES):
            with opener(name) as f:
                yield from _archive_sources(f"{label}!{name}", io.BytesIO(f.read()), 1)


def find_visible(
    targets: list[Target],
    roots: Iterable[str],
    masks: Iterable[str] = (),
    aliases: frozenset[str] = frozenset(),
) -> dict[str, str]:
    """{target key: where its original was seen (``path[!member]:line``)} for every target
    whose normalized body a function in the files under ``roots`` (less ``masks``) has,
    other than the target itself; ``aliases``: those the targets were normalized with."""
    if not targets:
        return {}
    by_body: dict[bytes, list[Target]] = {}
    for t in targets:
        by_body.setdefault(_digest(t.body), []).append(t)
    pattern = re.compile(
        rb"\b(?:" + b"|".join(re.escape(t.token.encode()) for t in targets) + rb")\b"
    )
    found: dict[str, str] = {}
    with SCAN_LOCK:
        for path in _walk(roots, masks):
            for where, body in _file_bodies(path, pattern, aliases):
                for t in by_body.get(body, ()):
                    if where != t.itself and t.key not in found:
                        found[t.key] = where
    return found


@dataclass(frozen=True)
class Scanned:
    """What the parse of one file found: its ``(size, mtime_ns)``, each function's ``where``
    and normalized body (without aliases) digest, and every ``Name`` the file uses (a body
    holding an alias is normalized again with it)."""

    stamp: tuple[int, int]
    bodies: tuple[tuple[str, bytes], ...]
    names: frozenset[str]


SCANNED: dict[str, Scanned] = {}
"""The files parsed so far in this process, by path (module docstring)."""
SCAN_LOCK = threading.Lock()
"""One scan at a time, so that a scan reuses what the one before it parsed."""


def _file_bodies(
    path: str, pattern: re.Pattern, aliases: frozenset[str]
) -> list[tuple[str, bytes]]:
    """(where, body digest) of the functions of the file at ``path``: from :data:`SCANNED`
    when the file is unchanged (no token test needed: a copy of a target holds its token),
    else parsed if it holds a token (and kept)."""
    try:
        st = os.lstat(path)
    except OSError:
        return []
    stamp = (st.st_size, st.st_mtime_ns)
    seen = SCANNED.get(path)
    if seen is None or seen.stamp != stamp:
        sources = list(_sources(path))
        if not any(pattern.search(data) for _, data in sources):
            return []
        names: set[str] = set()
        bodies = [b for label, data in sources for b in _bodies(label, data, names)]
        seen = SCANNED[path] = Scanned(stamp, tuple(bodies), frozenset(names))
    if seen.names & aliases:  # rare outside the tree itself: normalize with the aliases
        return [b for label, data in _sources(path) for b in _bodies(label, data, set(), aliases)]
    return list(seen.bodies)


def _digest(body: str) -> bytes:
    return hashlib.blake2b(body.encode(), digest_size=16).digest()


def _bodies(
    label: str, data: bytes, names: set[str], aliases: frozenset[str] = frozenset()
) -> Iterator[tuple[str, bytes]]:
    """(where, digest of the normalized body) of each function of the source ``data``; the
    ``Name`` ids the source uses are added to ``names``."""
    try:
        tree = pyast.parse(data.decode("utf-8"))
    except (SyntaxError, ValueError, UnicodeDecodeError, RecursionError, MemoryError):
        return
    names.update(n.id for n in ast.walk(tree) if isinstance(n, ast.Name))
    for node in _functions(tree):
        body = normalized_body(node, aliases)
        if body is not None:
            yield f"{label}:{node.lineno}", _digest(body)


def originals_visible(root: Path, cands, aliases: frozenset[str], extra: Iterable[str] = ()):
    """{candidate key: where} for the candidates (``candidates.Candidate``) of the tree at
    ``root`` whose original the sandbox can see: its bound trees (less its masks), ``extra``
    trees bound into the runs (the test tools) and the tree itself."""
    from composer_replication.sandbox.sandbox import visible_trees

    targets = [t for c in cands if (t := target_of(root, c.key, c.file, c.body_start, aliases))]
    bound, masks = visible_trees()
    return find_visible(targets, [*bound, *extra, str(root)], masks, aliases)
