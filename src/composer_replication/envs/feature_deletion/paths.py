"""Every path a task record names stays inside its tree (issue 55: task records are an
unchecked input; task suites are shared).

A record names files of the source tree: ``file``, ``test_files``, ``hidden_data``,
``served``, the file part of ``kept_fixtures`` keys and of every test id. Before, an absolute
``hidden_data`` replaced the workspace root in ``make_workspace`` and a planted entry deleted
a host file at reset; a ``file`` or test id with ``..`` read and wrote outside it. Now a path
must be relative, posix, without ``..``, ``.git`` or empty parts, NUL or backslash, and (with
the tree at hand) resolve inside the tree, symlinks followed; otherwise the record is refused
at load, naming its line and field (:func:`record_path_problem`), and the workspace refuses
it again before it writes or deletes anything (:func:`inside`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

PATH_FIELDS = ("file", "test_files", "hidden_data", "served")
"""Fields holding one path or a list of them."""
TEST_ID_FIELDS = ("failing_tests", "visible_tests", "hidden_tests", "passing_tests",
                  "strong_tests")  # fmt: skip
"""Fields holding test ids (``file::name``): their file part is a path."""
MAX_PATH_CHARS = 1024


def path_problem(rel: object) -> str | None:
    """Why ``rel`` is not a usable relative path of a tree (lexically), or None."""
    if not isinstance(rel, str):
        return f"is a {type(rel).__name__}, not a path"
    if not rel or len(rel) > MAX_PATH_CHARS:
        return "is empty or too long"
    if "\0" in rel or "\\" in rel:
        return "holds a NUL or a backslash"
    if rel.startswith("/"):
        return "is absolute"
    parts = rel.split("/")
    if ".." in parts:
        return "climbs out with '..'"
    if ".git" in parts:
        return "names a .git entry"
    if any(p in ("", ".") for p in parts):
        return "has an empty or '.' part"
    return None


def inside(root: Path, rel: str) -> Path:
    """``root/rel`` if ``rel`` is a lexically clean path that resolves inside ``root``
    (symlinks followed), else ``ValueError`` naming it."""
    problem = path_problem(rel)
    if problem is None:
        base = Path(os.path.realpath(root))
        real = Path(os.path.realpath(base / PurePosixPath(rel)))
        if real != base and base not in real.parents:
            problem = "leaves the tree through a symbolic link"
    if problem is not None:
        raise ValueError(f"path {rel!r} {problem}")
    return Path(root) / rel


def record_paths(record: dict) -> Iterator[tuple[str, object]]:
    """(field, path) for every path a task record names."""
    for key in PATH_FIELDS:
        value = record.get(key)
        for rel in value if isinstance(value, list) else [value] if key in record else []:
            yield key, rel
    for key in TEST_ID_FIELDS:
        for test in record.get(key) or ():
            yield key, test.partition("::")[0] if isinstance(test, str) else test
    for key in record.get("kept_fixtures") or {}:
        yield "kept_fixtures", key.partition("::")[0]


def record_path_problem(record: dict, root: Path | None = None) -> str | None:
    """``field 'x': path '...' is absolute`` for the first bad path of ``record`` (``root``:
    also check that each resolves inside that tree), or None."""
    for key, rel in record_paths(record):
        try:
            if root is not None:
                inside(root, rel)  # type: ignore[arg-type]
            elif (problem := path_problem(rel)) is not None:
                raise ValueError(f"path {rel!r} {problem}")
        except ValueError as e:
            return f"field {key!r}: {e}"
    return None


def escaping_links(root: Path) -> list[str]:
    """Relative paths of the symbolic links under ``root`` that resolve outside it (or
    nowhere): a copy of the tree would carry a host file's content into a workspace."""
    base = Path(os.path.realpath(root))
    out = []
    for dirpath, dirs, files in os.walk(base):
        for name in [*dirs, *files]:
            path = Path(dirpath) / name
            if path.is_symlink():
                real = Path(os.path.realpath(path))
                if (real != base and base not in real.parents) or not real.exists():
                    out.append(path.relative_to(base).as_posix())
    return sorted(out)


def manifest_path_problem(manifest: dict) -> str | None:
    """The first bad path of a manifest's recorded test code (``baseline.testcode``: the
    generator copies its paths into the tasks it writes), or None."""
    code = (manifest.get("baseline") or {}).get("testcode") or {}
    if not isinstance(code, dict):
        return "field 'baseline.testcode' is not an object"
    for key in ("test_files", "test_dirs", "helpers", "test_data", "served", "data_by_test",
                "fixtures_by_test"):  # fmt: skip
        for rel in code.get(key) or ():
            part = rel.partition("::")[0] if isinstance(rel, str) else rel
            if (problem := path_problem(part)) is not None:
                return f"field 'baseline.testcode.{key}': path {part!r} {problem}"
    return None
