"""Issue 55, classes 2 and 3 at the workspace: a task source or a task record is hostile.

* Git configuration brought by the tree (``.gitconfig``, ``.config/git/config``, an
  ``include.path``, an ``init.templateDir``) set hooks and an fsmonitor command that ran on
  the host at every reset, when ``HOME`` was the workspace. Each variant must run nothing.
* A record's paths (``file``, ``test_files``, ``hidden_data``, ``served``, the file part of
  test ids and ``kept_fixtures`` keys): absolute, ``..`` or through a link out of the tree,
  each is refused at load with its line and field, and ``make_workspace`` touches nothing
  outside its directory. Before, an absolute ``hidden_data`` deleted a host file at reset.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from composer_replication.envs.feature_deletion.candidates import find_candidates
from composer_replication.envs.feature_deletion.generate import (
    GENERATOR_VERSION,
    TaskSetError,
    load_tasks,
)
from composer_replication.envs.feature_deletion.source import SourceError, resolve_source
from composer_replication.envs.feature_deletion.workspace import make_workspace

CODE = "def double(x):\n    '''Twice x.'''\n    y = x + x\n    return y\n"
TEST = "from pkg.m import double\n\n\ndef test_double():\n    assert double(2) == 4\n"


def _tree(root: Path) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "m.py").write_text(CODE)
    (root / "tests").mkdir()
    (root / "tests" / "test_m.py").write_text(TEST)
    return root


def _record(root: Path, **changes) -> dict:
    cand = find_candidates(root)[0]
    record = {**cand.to_dict(), "task_id": "t", "failing_tests": ["tests/test_m.py::test_double"],
              "visible_tests": ["tests/test_m.py::test_double"], "passing_tests": [],
              "hidden_tests": [], "served": ["pkg/m.py"], "test_files": ["tests/test_m.py"]}  # fmt: skip
    return {**record, **changes}


def _script(path: Path, marker: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho ran >> {marker}\nexit 0\n")
    path.chmod(0o755)


def _plant(root: Path, dest: Path, marker: Path, variant: str) -> None:
    """Git configuration in the tree that runs ``marker``-writing scripts (paths as they will
    be in the workspace ``dest``)."""
    for hook in ("pre-commit", "post-commit", "commit-msg", "post-checkout"):
        _script(root / "hooks" / hook, marker)
        _script(root / "tmpl" / "hooks" / hook, marker)
    _script(root / "fsmon.sh", marker)
    evil = f"[core]\n\thooksPath = {dest}/hooks\n\tfsmonitor = {dest}/fsmon.sh\n"
    if variant == "home_gitconfig":
        (root / ".gitconfig").write_text(evil)
    elif variant == "xdg_config":
        (root / ".config" / "git").mkdir(parents=True)
        (root / ".config" / "git" / "config").write_text(evil)
    elif variant == "include_path":
        (root / "inc.cfg").write_text(evil)
        (root / ".gitconfig").write_text(f"[include]\n\tpath = {dest}/inc.cfg\n")
    elif variant == "template_dir":
        (root / ".gitconfig").write_text(f"[init]\n\ttemplateDir = {dest}/tmpl\n")


@pytest.mark.parametrize("variant", ["home_gitconfig", "xdg_config", "include_path",
                                     "template_dir"])  # fmt: skip
def test_git_configuration_in_the_tree_runs_nothing_on_the_host(tmp_path, variant):
    root = _tree(tmp_path / "src")
    dest, marker = tmp_path / "ws" / "repo", tmp_path / "ran"
    _plant(root, dest, marker, variant)
    make_workspace(root, _record(root), dest)
    assert not marker.exists(), f"{variant}: a script of the tree ran: {marker.read_text()!r}"
    log = subprocess.run(["git", "log", "--oneline"], cwd=dest, capture_output=True, text=True,
                         env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)})  # fmt: skip
    assert log.returncode == 0 and len(log.stdout.splitlines()) == 1, log


def _hostile(victim: Path) -> list[tuple[str, object]]:
    rel = "../" + victim.name  # from the workspace dest = <tmp>/ws/repo: <tmp>/ws/<victim>
    return [
        ("hidden_data", [str(victim)]),
        ("hidden_data", [rel]),
        ("file", rel),
        ("test_files", [f"tests/../../{victim.name}"]),
        ("hidden_tests", [f"{rel}::test_a"]),
        ("served", [str(victim)]),
        ("kept_fixtures", {f"{rel}::Cls": []}),
        ("failing_tests", [f"{victim}::test_a"]),
        ("hidden_data", [".git/config"]),
    ]


@pytest.mark.parametrize("n", range(9))
def test_a_record_path_outside_its_tree_is_refused_and_touches_nothing(tmp_path, n):
    root = _tree(tmp_path / "src")
    victim = tmp_path / "ws" / "victim.py"
    victim.parent.mkdir()
    victim.write_text("def test_a():\n    assert True\n")
    field, value = _hostile(victim)[n]
    record = _record(root, **{field: value})
    (tmp_path / "set").mkdir()
    (tmp_path / "set" / "manifest.json").write_text(json.dumps({"generator_version":
                                                                GENERATOR_VERSION}))  # fmt: skip
    tasks = tmp_path / "set" / "tasks.jsonl"
    tasks.write_text(json.dumps(_record(root)) + "\n" + json.dumps(record) + "\n")
    try:
        make_workspace(root, record, tmp_path / "ws" / "repo")
    except (ValueError, OSError):
        pass
    assert victim.read_text() == "def test_a():\n    assert True\n", (field, value)
    with pytest.raises(TaskSetError, match=rf"^{tasks}:2: not a task: field '{field}': path "):
        load_tasks(tmp_path / "set")
    with pytest.raises(ValueError, match="path"):
        make_workspace(root, record, tmp_path / "ws2")


def test_a_link_out_of_the_tree_is_refused_as_a_source_and_in_a_record(tmp_path):
    """A local source with a link leading out (a copy would carry the host's file into the
    workspace) is refused; a record whose path goes through such a link (the tree changed
    after generation) is refused at load against the tree."""
    root = _tree(tmp_path / "src")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("host secret")
    (root / "pkg" / "data").symlink_to(outside)
    with pytest.raises(SourceError, match="symbolic link pkg/data leads outside the tree"):
        resolve_source(str(root))
    (tmp_path / "set").mkdir()
    (tmp_path / "set" / "manifest.json").write_text(json.dumps({"generator_version":
                                                                GENERATOR_VERSION}))  # fmt: skip
    record = _record(root, hidden_data=["pkg/data/secret.txt"])
    (tmp_path / "set" / "tasks.jsonl").write_text(json.dumps(record) + "\n")
    assert load_tasks(tmp_path / "set")  # lexically clean
    with pytest.raises(TaskSetError, match=":1: not a task: field 'hidden_data': .* link"):
        load_tasks(tmp_path / "set", root)
