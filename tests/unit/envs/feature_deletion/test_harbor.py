"""`tasks export --format harbor` on the textkit task set: the layout Harbor and TRL read, and
Harbor's trial contract (oracle, then the verifier writing the reward) run under our sandbox
(tests/support/harbor_contract.py); Harbor's own lint and task loader run in a Python 3.12
venv (tests/support/harbor_venv.py), TRL's ``HarborSpec`` in this environment."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

import pytest
import tomllib
from support.harbor_contract import trial
from support.textkit import TEXTKIT, original_line, textkit_env, textkit_records
from typer.testing import CliRunner

from composer_replication.cli import app
from composer_replication.envs.feature_deletion.harbor import (
    HarborExportError,
    difficulty_level,
    grader_pins,
    grader_wheels,
    license_files,
    read_estimates,
    task_dir_name,
)
from composer_replication.envs.feature_deletion.workspace import make_workspace

SLUGIFY = "textkit-local:textkit/core.py::slugify"
ORDINAL = "textkit-local:textkit/numbers.py::ordinal"
FORCE_PASS = """import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"
    report.longrepr = None
"""
"""A conftest that reports every test passed: where pytest runs on the workspace, a
do-nothing submission with it would score 1."""


@pytest.fixture(scope="module")
def exported(textkit_tasks, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("harbor")
    estimates = out / "estimates.jsonl"
    estimates.write_text(
        json.dumps({"task_id": SLUGIFY, "pass_rate": 0.875, "attempts": 8})
        + "\n"
        + json.dumps({"task_id": ORDINAL, "pass_rate": 0.1, "attempts": 10})
        + "\n"
    )
    args = ["tasks", "export", str(out / "suite"), "--format", "harbor", "--tasks",
            str(textkit_tasks), "--estimates", str(estimates)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "exported 9 tasks" in said and "(2 with difficulty_level)" in said
    assert "warning: textkit-local: no license file found" in said
    return out / "suite"


def _task(exported: Path, task_id: str) -> Path:
    return exported / "tasks" / task_dir_name(task_id)


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and ".git" not in p.relative_to(root).parts}  # fmt: skip


def test_each_task_is_a_harbor_task_directory(exported, textkit_tasks, tmp_path):
    records = textkit_records(textkit_tasks)
    env = textkit_env(textkit_tasks)
    assert sorted(p.name for p in (exported / "tasks").iterdir()) == sorted(
        task_dir_name(r["task_id"]) for r in records
    )
    pytest_version = metadata.version("pytest")
    for record in records:
        d = _task(exported, record["task_id"])
        cfg = tomllib.loads((d / "task.toml").read_text())
        meta = cfg["metadata"]
        assert cfg["schema_version"] == "1.4" and cfg["artifacts"] == ["/app"]
        assert cfg["task"]["name"] == f"composer-replication/{d.name}"
        assert cfg["verifier"]["environment_mode"] == "separate"
        assert cfg["environment"]["network_mode"] == "no-network"
        assert cfg["agent"]["user"] == "agent"
        assert (meta["task_id"], meta["target_file"], meta["target_symbol"]) == (
            record["task_id"], record["file"], record["symbol"])  # fmt: skip
        assert meta["source_sha256"] == record["source"]["sha256"]
        assert meta["hidden_tests"] == len(record["hidden_tests"])
        # the instruction is the prompt our environment poses, then the container's conventions
        instruction = (d / "instruction.md").read_text()
        assert instruction.startswith(
            env.task_by_id(record["task_id"]).prompt + "\n\nThe repository is in `/app`"
        )
        # the agent's repository is our episode workspace, byte for byte (without its .git)
        ws = make_workspace(TEXTKIT, record, tmp_path / d.name)
        assert _tree(d / "environment" / "app") == _tree(ws)
        # the verifier holds the original tree (hidden tests included) and the pinned wheels
        assert _tree(d / "tests" / "pristine") == _tree(TEXTKIT)
        for sub in ("tests", "environment"):
            wheels = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
                      for p in (d / sub / "wheels").glob("*.whl")}  # fmt: skip
            assert wheels == meta["wheels_sha256"]
        assert f"pytest-{pytest_version}-py3-none-any.whl" in meta["wheels_sha256"]
        assert f"licenses/pytest-{pytest_version}/licenses/LICENSE" in meta["license_files"]
        assert all((d / f).is_file() for f in meta["license_files"])
        for hidden in record["hidden_tests"]:
            path, _, name = hidden.partition("::")
            assert f"def {name}(" not in (d / "environment" / "app" / path).read_text()
            assert f"def {name}(" in (d / "tests" / "pristine" / path).read_text()


def test_the_original_body_is_only_in_the_solution_and_the_verifier(exported, textkit_tasks):
    env = textkit_env(textkit_tasks)
    for record in textkit_records(textkit_tasks):
        d = _task(exported, record["task_id"])
        line = original_line(env.task_by_id(record["task_id"]))
        agent_side = [*(d / "environment").rglob("*"), d / "instruction.md", d / "task.toml"]
        assert not any(line in p.read_text(errors="replace") for p in agent_side if p.is_file())
        solve = (d / "solution" / "solve.sh").read_text()
        encoded = re.search(r"<<'B64'\n(.*)B64\n", solve, re.S).group(1)
        assert base64.b64decode(encoded) == (TEXTKIT / record["file"]).read_bytes()
        assert line in (d / "tests" / "pristine" / record["file"]).read_text()


def test_difficulty_level_comes_from_the_estimates(exported, textkit_tasks):
    levels = {}
    for record in textkit_records(textkit_tasks):
        meta = tomllib.loads((_task(exported, record["task_id"]) / "task.toml").read_text())
        levels[record["task_id"]] = meta["metadata"].get("difficulty_level")
    assert levels.pop(SLUGIFY) == "easy" and levels.pop(ORDINAL) == "hard"
    assert set(levels.values()) == {None}  # no estimate, no key
    assert [difficulty_level(r) for r in (0.0, 0.3, 0.31, 0.69, 0.7, 1.0)] == [
        "hard", "hard", "medium", "medium", "easy", "easy"]  # fmt: skip


def test_oracle_scores_one_and_no_solution_scores_zero_on_every_task(exported):
    """Harbor's contract per task, in the sandbox: ``solution/solve.sh`` then ``tests/test.sh``
    writes 1; ``tests/test.sh`` on the image as built (the feature deleted) writes 0."""
    dirs = sorted((exported / "tasks").iterdir())

    def both(d: Path) -> tuple[float, float, str]:
        solved, nothing = trial(d, "bash /solution/solve.sh"), trial(d)
        return solved.reward, nothing.reward, f"{d.name}: {solved.verdict} / {nothing.verdict}"

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(both, dirs))
    assert [(s, n) for s, n, _ in results] == [(1.0, 0.0)] * len(dirs), [r[2] for r in results]


def test_a_planted_conftest_changes_no_reward(exported):
    """conftest.py files that report every test passed, at the root, in tests/ and in the
    package: where pytest runs on the workspace they pass the deleted function (the witness
    run, our pytest on the agent's PYTHONPATH); the verifier grades only the target file in
    a fresh pristine copy, so the reward stays 0 without a solution and 1 with the
    oracle's."""
    from composer_replication.sandbox.pytest_suite import pytest_tools

    d = _task(exported, SLUGIFY)
    plant = " && ".join(f"printf '%s' \"$FORCE\" > {where}/conftest.py"
                        for where in (".", "tests", "textkit"))  # fmt: skip
    plant = f"FORCE={_quoted(FORCE_PASS)} && {plant}"
    witness = "python -m pytest -q -p no:cacheprovider tests/test_core.py::test_slugify"
    attacked = trial(d, f"{plant} && {witness}", python_path=(pytest_tools(),))
    assert "1 passed" in attacked.agent_output  # the attack works where pytest runs on /app
    assert attacked.reward == 0.0, attacked.verdict
    assert attacked.verdict["added"] == ["conftest.py", "tests/conftest.py", "textkit/conftest.py"]
    solved = trial(d, f"bash /solution/solve.sh && {plant}")
    assert solved.reward == 1.0, solved.verdict


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def test_an_edited_test_or_configuration_scores_zero(exported):
    """The oracle's body with a visible test weakened and the pytest configuration removed:
    0, and the verdict names both files."""
    d = _task(exported, SLUGIFY)
    weaken = "sed -i 's/assert /assert True or /' tests/test_core.py && rm pyproject.toml"
    edited = trial(d, f"bash /solution/solve.sh && {weaken}")
    assert edited.reward == 0.0
    assert edited.verdict["edited"] == ["pyproject.toml", "tests/test_core.py"]
    assert edited.verdict["reason"] == "tests or configuration were edited"


def test_harbor_lint_and_task_loader_accept_the_export(exported, tmp_path):
    """Harbor 0.25's own checks, in its Python 3.12 venv: ``harbor lint`` finds nothing (its
    default rules, and every rule but the image digest pin), and ``Task`` loads each task
    with the instruction, the separate verifier built from ``tests/`` and the metadata."""
    from support.harbor_venv import ensure_harbor_venv, harbor_cli

    python = ensure_harbor_venv()
    dirs = [str(p) for p in sorted((exported / "tasks").iterdir())]
    shared = tmp_path / "shared-verifier"  # a witness that lint reads our files: the
    shutil.copytree(dirs[0], shared)  # same task with the verifier in the agent's container
    toml = (shared / "task.toml").read_text()
    (shared / "task.toml").write_text(toml.replace('environment_mode = "separate"\n', ""))
    rules = ["--select", "ALL", "--ignore", "unpinned-image"]  # the defaults and root-agent
    lint = subprocess.run([str(harbor_cli(python)), "lint", "--json", *rules, *dirs,
                           str(shared)], capture_output=True, text=True, timeout=300)  # fmt: skip
    findings = json.loads(lint.stdout)
    assert [(Path(f["path"]).parent, f["rule"]) for f in findings] == [
        (shared, "shared-verifier")], lint.stdout + lint.stderr  # fmt: skip
    loader = """
import json, sys
from harbor.models.task.task import Task
from harbor.models.task.verifier_mode import resolve_verifier_environment_definition
out = []
for d in sys.argv[1:]:
    t = Task(d)
    v = resolve_verifier_environment_definition(t.config, t.paths)
    out.append({"dir": d, "name": t.name, "instruction": t.instruction,
                "mode": t.config.verifier.environment_mode.value,
                "verifier_dir": str(v.directory), "bundled": v.bundled_tests,
                "network": t.config.environment.network_mode.value,
                "difficulty": t.config.metadata.get("difficulty_level")})
print(json.dumps(out))
"""
    res = subprocess.run([str(python), "-c", loader, *dirs], capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    for task in json.loads(res.stdout):
        d = Path(task["dir"])
        assert task["name"] == f"composer-replication/{d.name}"
        assert task["instruction"] == (d / "instruction.md").read_text()
        assert (task["mode"], task["bundled"], task["network"]) == ("separate", True, "no-network")
        assert Path(task["verifier_dir"]) == (d / "tests").resolve()
    assert sorted(str(t["difficulty"]) for t in json.loads(res.stdout)).count("None") == 7


def test_trl_harborspec_reads_the_export(exported):
    """TRL 1.16's HarborSpec, in this environment: one row per task, its directory, and the
    difficulty_level of the tasks an estimate covered."""
    from trl.experimental.harbor import HarborSpec

    rows = HarborSpec(str(exported)).train_dataset
    dirs = sorted(str(p) for p in (exported / "tasks").iterdir())
    assert len(rows) == 9 and sorted(rows["task_dir"]) == dirs
    levels = dict(zip(rows["task_dir"], rows["difficulty_level"], strict=True))
    assert levels[str(_task(exported, SLUGIFY))] == "easy"
    assert levels[str(_task(exported, ORDINAL))] == "hard"


def test_bad_estimates_name_the_line_and_the_field(tmp_path):
    path = tmp_path / "est.jsonl"
    good = json.dumps({"task_id": "a", "pass_rate": 0.5, "attempts": 4})
    for bad, field in ((json.dumps({"task_id": "b", "pass_rate": 1.5, "attempts": 4}),
                        "pass_rate"),
                       (json.dumps({"task_id": "b", "pass_rate": 0.5}), "attempts"),
                       (json.dumps({"task_id": "b", "pass_rate": 0.5, "attempts": 1,
                                    "extra": 1}), "extra"),
                       ("not json", "line")):  # fmt: skip
        path.write_text(good + "\n\n" + bad + "\n")
        with pytest.raises(HarborExportError, match=rf"^{re.escape(str(path))}:3: {field}"):
            read_estimates(path)
    path.write_text(good + "\n")
    assert read_estimates(path)["a"].attempts == 4


def test_license_files_of_a_source(tmp_path):
    for name in ("LICENSE", "COPYING.txt", "NOTICE", "licence.md", "README.md", "LICENSEE.py"):
        (tmp_path / name).write_text(name)
    (tmp_path / "LICENSES").mkdir()
    (tmp_path / "LICENSES" / "MIT.txt").write_text("mit")
    found = [p.relative_to(tmp_path).as_posix() for p in license_files(tmp_path)]
    assert found == ["COPYING.txt", "LICENSE", "LICENSES/MIT.txt", "NOTICE", "licence.md"]


def test_task_dir_names_are_harbor_names_and_distinct():
    ids = ["pkg-1.0:a/b.py::f", "pkg-1.0:a/b.py::F", "pkg-1.0:a-b.py::f", "x:" + "y" * 300]
    names = [task_dir_name(i) for i in ids]
    assert len(set(names)) == len(ids)
    assert all(re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9._-]*", n) and len(n) <= 89 for n in names)


def test_the_wheels_are_the_graders_pytest_and_can_come_from_a_directory(tmp_path):
    """The pins are the installed pytest and its dependencies (what sandbox/pytest_suite.py
    binds); ``--wheels DIR`` serves them offline and names the first one missing."""
    pins = grader_pins()
    for dist in ("pytest", "pluggy", "iniconfig"):
        assert f"{dist}=={metadata.version(dist)}" in pins
    cached = grader_wheels()
    assert len(cached) == len(pins) and all(w.name.endswith("-none-any.whl") for w in cached)
    offline = tmp_path / "wheels"
    offline.mkdir()
    for w in cached:
        shutil.copyfile(w, offline / w.name)
    assert [w.name for w in grader_wheels(wheel_dir=offline)] == sorted(w.name for w in cached)
    (offline / cached[0].name).unlink()
    with pytest.raises(HarborExportError, match=rf"{offline} has no wheel of "):
        grader_wheels(wheel_dir=offline)


def test_a_task_record_naming_a_file_outside_its_tree_is_refused(tmp_path):
    """A task record is data: ``file`` must name a regular file inside the source tree before
    anything is read or written into the oracle's script."""
    from composer_replication.envs.feature_deletion.harbor import target_path
    from composer_replication.envs.feature_deletion.source import SourceTree

    root = tmp_path / "pkg"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "core.py").write_text("x = 1\n")
    (tmp_path / "secret.py").write_text("token\n")
    (root / "pkg" / "link.py").symlink_to(root / "pkg" / "core.py")
    tree = SourceTree("pkg", "local", root, "0" * 64)
    assert target_path(tree, {"task_id": "t", "file": "pkg/core.py"}) == root / "pkg" / "core.py"
    for bad in ("../secret.py", "/etc/passwd", "pkg", "pkg/link.py", "pkg/missing.py"):
        with pytest.raises(HarborExportError, match="is not a regular file inside"):
            target_path(tree, {"task_id": "t", "file": bad})


def test_links_in_a_local_source_bring_no_host_file_into_the_export(tmp_path):
    """A local source directory is data: a ``LICENSE`` linked to a host file, a linked
    ``LICENSES`` folder, a module and a package folder linked out of the tree must not put
    the host's bytes into ``licenses/``, ``environment/app`` or ``tests/pristine`` (all
    copied with workspace.IGNORED); tree_digest already leaves links out."""
    from composer_replication.envs.feature_deletion.workspace import IGNORED

    host = tmp_path / "host"
    (host / "dir").mkdir(parents=True)
    (host / "id_rsa").write_text("HOST-SECRET\n")
    (host / "dir" / "key.py").write_text("HOST-SECRET = 1\n")
    root = tmp_path / "src"
    shutil.copytree(TEXTKIT, root)
    (root / "LICENSE").symlink_to(host / "id_rsa")
    (root / "LICENSES").symlink_to(host / "dir", target_is_directory=True)
    (root / "textkit" / "keys.py").symlink_to(host / "id_rsa")
    (root / "textkit" / "vendored").symlink_to(host / "dir", target_is_directory=True)
    assert license_files(root) == []
    shutil.copytree(root, tmp_path / "copy", ignore=IGNORED, symlinks=False)
    copied = _tree(tmp_path / "copy")
    assert copied == _tree(TEXTKIT), sorted(set(copied) - set(_tree(TEXTKIT)))


def test_task_toml_reads_back_names_outside_the_basic_plane(tmp_path):
    """A source file or symbol named with a character outside the Basic Multilingual Plane
    (``😀``): JSON's ASCII escape writes it as a surrogate pair, which TOML refuses (Harbor
    could not load the task); task.toml must read back to the same values."""
    from composer_replication.envs.feature_deletion.harbor import ExportOptions, task_toml
    from composer_replication.envs.feature_deletion.source import SourceTree

    tree = SourceTree("pkg\U0001f600", "local", tmp_path, "0" * 64)
    task = {"task_id": "pkg:m\U0001f600.py::f\U00010437", "file": "m\U0001f600.py",
            "symbol": "f\U00010437", "failing_tests": ["t::a"], "passing_tests": []}  # fmt: skip
    doc = task_toml(task, tree, "n", ExportOptions(), {"wheels": {}}, [], 60.0, None)
    meta = tomllib.loads(doc)["metadata"]
    assert (meta["target_file"], meta["target_symbol"]) == (task["file"], task["symbol"])
    assert meta["source_package"] == tree.name


def test_a_wheels_license_member_outside_its_folder_is_refused(tmp_path):
    """A wheel is an archive: a license member named with ``..`` must not be written outside
    the task's ``licenses/<wheel>/`` (a wheel from ``--wheels DIR`` is the user's file)."""
    import zipfile

    from composer_replication.envs.feature_deletion.harbor import wheel_license_members

    whl = tmp_path / "evil-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        zf.writestr("evil-1.0.dist-info/licenses/LICENSE", "MIT")
        zf.writestr("evil-1.0.dist-info/licenses/../../../../escaped.txt", "x")
        zf.writestr("evil-1.0.dist-info/LICENSE/../../x/LICENSE", "x")
    with zipfile.ZipFile(whl) as zf:
        got = wheel_license_members(zf)
    assert got == [("evil-1.0.dist-info/licenses/LICENSE", Path("licenses/LICENSE"))]


def test_a_task_record_whose_tests_are_options_or_none_is_refused():
    """The verifier passes the record's test ids to pytest: an id that is an option
    (``-p``/``-c /app/pytest.ini`` would load what the agent wrote) or a record with no target
    test (every submission would score 1) exports nothing."""
    from composer_replication.envs.feature_deletion.harbor import grading_tests

    ok = {"task_id": "t", "failing_tests": ["tests/t.py::a"], "passing_tests": ["tests/t.py::b"]}
    assert grading_tests(ok) == ["tests/t.py::a", "tests/t.py::b"]
    for bad in (
        {"failing_tests": []},
        {"passing_tests": ["-c", "/app/pytest.ini"]},
        {"failing_tests": ["-pevil"]},
        {"passing_tests": ["a\nb"]},
        {"passing_tests": [3]},
    ):
        with pytest.raises(HarborExportError, match="task 't': "):
            grading_tests(ok | bad)
