"""Issue 55, class 1 at generation: a deletion whose original the sandbox can see (the
standard library's copy, a member of an archive, a duplicate in the tree) is not a task.
The whole-generation test fails on the old generator (the copy became a task) and passes
now; the search's own tests cover archives, masks, aliases and the target itself."""

from __future__ import annotations

import inspect
import io
import tarfile
import textwrap
import zipfile
from pathlib import Path

from composer_replication.config import TaskGenConfig
from composer_replication.envs.feature_deletion.candidates import find_candidates
from composer_replication.envs.feature_deletion.generate import generate_tasks, read_runs
from composer_replication.envs.feature_deletion.source import resolve_source
from composer_replication.envs.feature_deletion.visible import find_visible, target_of

REGEXES = (
    "import re\n\n"
    "_whitespace_only_re = re.compile('^[ \\t]+$', re.MULTILINE)\n"
    "_leading_whitespace_re = re.compile('(^[ \\t]*)(?:[^ \\t\\n])', re.MULTILINE)\n\n\n"
)
TESTS = (
    "import pytest\nfrom dedentkit import shout, strip_margin\n\n\n"
    "@pytest.mark.parametrize('text, want', [\n"
    "    ('  a\\n  b\\n', 'a\\nb\\n'), ('    x\\n  y\\n', '  x\\ny\\n'),\n"
    "    ('\\ta\\n\\tb', 'a\\nb'), ('  a\\n\\n  b', 'a\\n\\nb'), ('a\\n b', 'a\\n b'),\n"
    "])\n"
    "def test_strip_margin(text, want):\n    assert strip_margin(text) == want\n\n\n"
    "@pytest.mark.parametrize('n', range(6))\n"
    "def test_shout(n):\n    assert shout('a' * n) == 'A' * n + '!'\n"
)


def _copy_of_dedent(root: Path) -> Path:
    """A package whose one candidate is textwrap.dedent renamed, and its tests (half of
    them of a one-line function, so that deleting the copy is not too broad)."""
    body = inspect.getsource(textwrap.dedent).replace("def dedent(", "def strip_margin(")
    (root / "dedentkit").mkdir(parents=True)
    shout = "\n\ndef shout(text): return text.upper() + '!'\n"  # one line: no candidate
    (root / "dedentkit" / "__init__.py").write_text(REGEXES + body + shout)
    (root / "tests").mkdir()
    (root / "tests" / "test_dedentkit.py").write_text(TESTS)
    return root


def test_a_deletion_whose_original_is_in_the_standard_library_is_not_a_task(tmp_path):
    """The submission could ``import textwrap`` and return ``textwrap.dedent(text)``: the
    generator records ``original_visible`` with where it saw it, and makes no task."""
    source = resolve_source(str(_copy_of_dedent(tmp_path / "dedentkit-0")))
    cfg = TaskGenConfig(workers=1, suite_timeout_s=30)
    summary = generate_tasks(source, tmp_path / "out", cfg, spec="dedentkit")
    runs = read_runs(summary.out_dir / "runs.jsonl")
    assert summary.by_status == {"original_visible": 1}, summary.by_status
    row = runs["dedentkit/__init__.py::strip_margin"]
    assert row["visible_at"].split(":")[0].endswith("/textwrap.py"), row
    assert summary.tasks == 0


def _target(root: Path, aliases=frozenset()):
    cands = find_candidates(root)
    assert len(cands) == 1
    c = cands[0]
    return c, target_of(root, c.key, c.file, c.body_start, aliases)


FUNC = (
    "def pick(items, keyfunc):\n"
    "    '''Doc.'''\n"
    "    best, best_key = None, None\n"
    "    for item in items:\n"
    "        k = keyfunc(item)\n"
    "        if best_key is None or k > best_key:\n"
    "            best, best_key = item, k\n"
    "    return best\n"
)


def test_archive_members_nested_archives_and_scripts_are_searched(tmp_path):
    """The original as a wheel member, inside a wheel inside a zip, as a tar member, in a
    zipapp named like nothing (a ``#!`` line before the zip), and as a script: each found.
    Reformatted and with another name and docstring it is still the same body."""
    root = tmp_path / "src"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "m.py").write_text(FUNC)
    _, target = _target(root)
    copy = FUNC.replace("def pick", "def other_name").replace("'''Doc.'''", "'''Other.'''")
    copy = copy.replace("best, best_key = None, None", "best,best_key=(None,None)")

    def zipped(name: str, data: bytes) -> bytes:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as zf:
            zf.writestr(name, data)
        return buf.getvalue()

    places = {
        "a.whl": zipped("vendor/m.py", copy.encode()),
        "b.zip": zipped("inner/x-1-py3-none-any.whl", zipped("x/m.py", copy.encode())),
        "c": b"#!/usr/bin/env python3\n" + zipped("__main__.py", copy.encode()),
        "d": b"#!/usr/bin/python3\n" + copy.encode(),
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        info = tarfile.TarInfo("pkg-1/pkg/m.py")
        info.size = len(copy.encode())
        tf.addfile(info, io.BytesIO(copy.encode()))
    places["e.tar.gz"] = buf.getvalue()
    for name, data in places.items():
        seen = tmp_path / f"seen-{name}"
        seen.mkdir()
        (seen / name).write_bytes(data)
        assert target.key in find_visible([target], [str(seen)]), name


def test_masks_the_target_itself_aliases_and_duplicates_in_the_tree(tmp_path):
    """The tree alone: only the target, not found. A duplicate elsewhere in the tree (the
    workspace shows it): found. A masked directory: not searched. A renamed package's body
    still matches the installed original that spells the old name."""
    root = tmp_path / "src"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "m.py").write_text(FUNC)
    c, target = _target(root)
    assert find_visible([target], [str(root)]) == {}  # originals_visible adds the sandbox's
    masked = tmp_path / "masked"
    masked.mkdir()
    (masked / "copy.py").write_text(FUNC)
    assert find_visible([target], [str(root), str(tmp_path / "masked")], [str(masked)]) == {}
    (root / "pkg" / "compat.py").write_text(FUNC)
    assert find_visible([target], [str(root)])[c.key].endswith("pkg/compat.py:1")

    uses = FUNC.replace("k = keyfunc(item)", "k = pkg_abc123.key(keyfunc, item)")
    renamed = tmp_path / "renamed"
    (renamed / "pkg_abc123").mkdir(parents=True)
    (renamed / "pkg_abc123" / "m.py").write_text(uses)
    installed = tmp_path / "installed"
    installed.mkdir()
    (installed / "m.py").write_text(uses.replace("pkg_abc123.", "toolz."))
    c, target = _target(renamed, frozenset({"pkg_abc123", "toolz"}))
    got = find_visible([target], [str(installed)], aliases=frozenset({"pkg_abc123", "toolz"}))
    assert c.key in got


def test_a_later_scan_reuses_the_parses_of_an_earlier_one(tmp_path, monkeypatch):
    """Issue 60: each package of a suite parsed the same standard library again (ten scans
    under one interpreter lock kept the sandboxes idle). A file parsed once is not parsed
    again while unchanged, whatever the later scan looks for; a changed file is; the findings
    are those of a fresh scan, a body that spells an alias of the later scan included."""
    from composer_replication.envs.feature_deletion import visible
    from composer_replication.sandbox import pyast

    root = tmp_path / "src"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "m.py").write_text(FUNC)
    c, target = _target(root)
    uses = FUNC.replace("k = keyfunc(item)", "k = toolz.key(keyfunc, item)")
    (tmp_path / "renamed" / "pkg_abc123").mkdir(parents=True)
    (tmp_path / "renamed" / "pkg_abc123" / "m.py").write_text(uses.replace("toolz.", "pkg_abc123."))
    aliases = frozenset({"pkg_abc123", "toolz"})
    c2, renamed = _target(tmp_path / "renamed", aliases)
    seen = tmp_path / "seen"
    seen.mkdir()
    (seen / "copy.py").write_text(FUNC.replace("def pick", "def other"))
    (seen / "installed.py").write_text(uses)
    monkeypatch.setattr(visible, "SCANNED", {})
    parsed = []
    real = pyast.parse
    monkeypatch.setattr(pyast, "parse", lambda text: parsed.append(text) or real(text))

    assert find_visible([target], [str(seen)]) == {c.key: f"{seen / 'copy.py'}:1"}
    assert len(parsed) == 2  # both files hold the token (``best_key``)
    assert find_visible([target], [str(seen)]) == {c.key: f"{seen / 'copy.py'}:1"}
    got = find_visible([renamed], [str(seen)], aliases=aliases)  # another package's scan
    assert got == {c2.key: f"{seen / 'installed.py'}:1"}
    assert len(parsed) == 3  # only installed.py again: it spells the alias ``toolz``
    (seen / "copy.py").write_text(FUNC.replace("best, best_key", "top, top_key"))
    assert find_visible([target], [str(seen)]) == {}  # the edited copy is no copy
    assert len(parsed) == 4
