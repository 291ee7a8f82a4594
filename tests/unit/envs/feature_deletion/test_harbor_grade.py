"""The exported verifier's reading of the agent's ``/app`` (harbor_grade.py), attacked with
links: ``/app`` crosses from the agent's container to the verifier's as an artifact, links
included, and resolves there, where ``/tests/pristine`` holds the original target file."""

from __future__ import annotations

import hashlib
from pathlib import Path

from composer_replication.envs.feature_deletion.harbor_grade import edited_files, grade

ORIGINAL = "def slugify(s):\n    return s.lower()\n"


def _pristine_and_app(tmp_path: Path) -> tuple[Path, Path]:
    pristine = tmp_path / "tests" / "pristine"
    (pristine / "pkg").mkdir(parents=True)
    (pristine / "pkg" / "core.py").write_text(ORIGINAL)
    (pristine / "tests").mkdir()
    (pristine / "tests" / "test_core.py").write_text("def test_x():\n    assert True\n")
    app = tmp_path / "app"
    (app / "tests").mkdir(parents=True)
    (app / "tests" / "test_core.py").write_text("def test_x():\n    assert True\n")
    return pristine, app


def _spec(**kw) -> dict:
    return {"target": "pkg/core.py", "tests": [], "protected": {}, "config_names": [],
            "wheels": {}, "pytest_args": [], "timeout_s": 30.0, "max_chars": 10_000} | kw  # fmt: skip


def test_a_target_reached_through_a_linked_directory_scores_zero(tmp_path):
    """``/app/pkg`` a link to ``/tests/pristine/pkg``: the target's last component is no link,
    but its text is the original body (a reward without a solution). No test listed: any
    target that is read scores 1, so the reward says whether the linked one was read."""
    pristine, app = _pristine_and_app(tmp_path)
    (tmp_path / "tests" / "wheels").mkdir()
    (app / "pkg").symlink_to(pristine / "pkg", target_is_directory=True)
    verdict = grade(tmp_path / "tests", app, _spec())
    assert verdict["reward"] == 0.0, verdict
    assert "link" in verdict["reason"]
    (app / "pkg").unlink()
    (app / "pkg").mkdir()
    (app / "pkg" / "core.py").write_text("def slugify(s):\n    return s\n")
    assert grade(tmp_path / "tests", app, _spec())["reward"] == 1.0


def test_a_protected_file_reached_through_a_linked_directory_is_edited(tmp_path):
    """``/app/tests`` a link to a directory holding the same bytes: still an edit (the
    workspace's tests are no longer the workspace's)."""
    pristine, app = _pristine_and_app(tmp_path)
    rel = "tests/test_core.py"
    digest = hashlib.sha256((app / rel).read_bytes()).hexdigest()
    assert edited_files(app, {rel: digest}) == []
    (app / "tests" / "test_core.py").unlink()
    (app / "tests").rmdir()
    (app / "tests").symlink_to(pristine / "tests", target_is_directory=True)
    assert edited_files(app, {rel: digest}) == [rel]
