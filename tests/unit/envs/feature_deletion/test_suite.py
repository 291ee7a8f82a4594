"""A task suite in one command (`tasks generate SPECS_FILE`), on local sources: the specs
file's errors, one package per line generated in one process over one cache and one pool
of sandbox slots, and a package that cannot be used reported with its reason."""

from __future__ import annotations

import json
import shutil

import pytest
from support.textkit import TEXTKIT
from typer.testing import CliRunner

from composer_replication.cli import app
from composer_replication.envs.feature_deletion.suite import SuiteError, read_specs
from composer_replication.sandbox.sandbox import SLOTS


def test_specs_file_lines_comments_and_errors(tmp_path):
    specs = tmp_path / "suite.txt"
    specs.write_text(f"# pure-Python packages\ntoolz==1.2.0  # functional\n\n{TEXTKIT}\n")
    assert read_specs(specs) == ["toolz==1.2.0", str(TEXTKIT)]
    for text, why in (("toolz>=1\n", r":1: 'toolz>=1' is neither a directory nor a pinned"),
                      ("a==1\n# c\na==1\n", r":3: 'a==1' repeats line 1"),
                      (f"{tmp_path}/missing\n", r":1: .* is neither a directory"),
                      ("# only comments\n", r": no source listed")):  # fmt: skip
        specs.write_text(text)
        with pytest.raises(SuiteError, match=rf"^{specs}{why}"):
            read_specs(specs)


def test_the_shipped_suite_parses_as_pinned_packages():
    """configs/suites/*.txt (issue 60's suite): every line a pinned package, at least 8 of
    them, none repeated (read_specs refuses repeats with the line)."""
    from composer_replication.config import configs_dir

    shipped = sorted((configs_dir() / "suites").glob("*.txt"))
    assert [p.name for p in shipped] == ["pure_python.txt"]
    specs = read_specs(shipped[0])
    assert len(specs) >= 8 and all("==" in s for s in specs), specs


def test_packages_asking_for_the_test_tools_at_once_share_one_copy():
    """A suite's packages start together and each asks for the test tools: one copy is
    built and every package gets it (issue 60's run built 12, each compiling pytest)."""
    from concurrent.futures import ThreadPoolExecutor

    from composer_replication.sandbox.pytest_suite import pytest_tools

    pytest_tools.cache_clear()
    with ThreadPoolExecutor(4) as pool:
        paths = set(pool.map(lambda _: pytest_tools(), range(4)))
    assert len(paths) == 1, paths


def _failing_package(root):
    (root / "brokenpkg").mkdir(parents=True)
    (root / "brokenpkg" / "__init__.py").write_text("def answer():\n    return 41\n")
    (root / "tests").mkdir()
    (root / "tests" / "test_answer.py").write_text(
        "from brokenpkg import answer\n\n\ndef test_answer():\n    assert answer() == 42\n"
    )
    return root


def _uncollected_package(root):
    """titlecase 2.4.1's layout: the tests in ``pkg/tests.py``, which pytest's default
    ``python_files`` does not collect."""
    (root / "tkpkg").mkdir(parents=True)
    (root / "tkpkg" / "__init__.py").write_text("def answer():\n    return 42\n")
    (root / "tkpkg" / "tests.py").write_text(
        "from tkpkg import answer\n\n\ndef test_answer():\n    assert answer() == 42\n"
    )
    return root


def test_a_suite_pytest_does_not_collect_is_refused_with_that_reason(tmp_path):
    from composer_replication.config import TaskGenConfig
    from composer_replication.envs.feature_deletion.generate import TaskSetError, generate_tasks
    from composer_replication.envs.feature_deletion.source import resolve_source

    tree = resolve_source(str(_uncollected_package(tmp_path / "tk")))
    with pytest.raises(TaskSetError, match=r"pytest collected no test .*tests\.py"):
        generate_tasks(tree, tmp_path / "out", TaskGenConfig(workers=1, suite_timeout_s=30))


def _shadowing_package(root):
    (root / "pluggy").mkdir(parents=True)
    (root / "pluggy" / "__init__.py").write_text("def hook():\n    return 1\n")
    (root / "test_hook.py").write_text(
        "from pluggy import hook\n\n\ndef test():\n    assert hook()\n"
    )
    return root


def test_a_suite_reuses_the_cache_and_reports_each_package(textkit_tasks, tmp_path):
    """The textkit set of this session copied into --out (same settings): the suite run
    reuses every candidate run of it; a package whose untouched suite fails and one that
    shadows the test tools are refused with their reasons; the table and suite.json hold the
    per-package counts; the sandbox slots are the --workers pool during the run only."""
    out = tmp_path / "suite"
    shutil.copytree(textkit_tasks, out)
    broken = _failing_package(tmp_path / "broken")
    shadow = _shadowing_package(tmp_path / "shadow")
    specs = tmp_path / "suite.txt"
    specs.write_text(f"{TEXTKIT}\n{broken}  # its only test fails\n{shadow}\n")
    before = SLOTS.limit
    args = ["tasks", "generate", str(specs), "--out", str(out), "--workers", "2",
            "--suite-timeout-s", "30"]  # fmt: skip
    result = CliRunner().invoke(app, args, terminal_width=200)
    assert result.exit_code == 0, result.output
    assert SLOTS.limit == before
    rows = {r["spec"]: r for r in json.loads((out / "suite.json").read_text())}
    records = [
        json.loads(x) for x in (out / "textkit-local" / "tasks.jsonl").read_text().splitlines()
    ]
    textkit = rows[str(TEXTKIT)]
    assert (textkit["label"], textkit["error"], textkit["tasks"]) == ("textkit-local", "", 9)
    assert textkit["hidden_targets"] == sum(bool(r["hidden_tests"]) for r in records) > 0
    assert textkit["candidates"] == 9 + sum(textkit["refused"].values()) == textkit["reused"]
    assert "no test of the untouched suite passes" in rows[str(broken)]["error"]
    assert "1 collected, none passed in both runs" in rows[str(broken)]["error"]
    assert "is also in the sandbox's test tools" in rows[str(shadow)]["error"]
    assert rows[str(shadow)]["tasks"] == 0
    said = "".join(result.output.split())  # rich wraps long paths and titles at any width
    assert "(3sources)" in said and f"per-packagesummary:{out / 'suite.json'}" in said
    lines = result.output.splitlines()  # a line per package as its work is known and ends
    n, hidden = textkit["candidates"], textkit["hidden_targets"]
    assert f"textkit-local: baseline passed, {n} candidates (after " in result.output
    done = [x for x in lines if x.startswith("textkit-local: done in ")]
    assert len(done) == 1 and done[0].endswith(f": 9 tasks ({hidden} with hidden targets) of {n} "
                                               "candidates"), done  # fmt: skip
    for name in (broken.name, shadow.name):
        assert sum(x.startswith(f"{name}-local: refused after ") for x in lines) == 1, lines


def test_a_time_limit_stops_new_runs_and_a_rerun_goes_on(textkit_tasks, tmp_path):
    """``time_limit_s`` (``--time-limit-s``): with two candidates' runs missing from the
    copied textkit set and a limit already passed, the suite starts no run (runs.jsonl keeps
    its lines), writes the task set of the candidates tried and reports the two as left (the
    manifest still matches: the limit is not part of the set's identity); a re-run without a
    limit runs exactly those two and ends with the whole set."""
    out = tmp_path / "suite"
    shutil.copytree(textkit_tasks, out)
    runs = out / "textkit-local" / "runs.jsonl"
    whole = (out / "textkit-local" / "tasks.jsonl").read_text()
    rows = runs.read_text().splitlines()
    dropped = [i for i, x in enumerate(rows) if json.loads(x)["status"] == "task"][:2]
    runs.write_text("".join(x + "\n" for i, x in enumerate(rows) if i not in dropped))
    specs = tmp_path / "suite.txt"
    specs.write_text(f"{TEXTKIT}\n")
    args = ["tasks", "generate", str(specs), "--out", str(out), "--workers", "2",
            "--suite-timeout-s", "30"]  # fmt: skip
    result = CliRunner().invoke(app, [*args, "--time-limit-s", "0.001"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert len(runs.read_text().splitlines()) == len(rows) - 2
    (row,) = json.loads((out / "suite.json").read_text())
    assert (row["left"], row["tasks"]) == (2, 7)
    assert "(2 not tried: the time limit passed)" in result.output
    assert "2 candidates not tried: the time limit passed" in " ".join(result.output.split())
    result = CliRunner().invoke(app, args, terminal_width=200)
    assert result.exit_code == 0, result.output
    (row,) = json.loads((out / "suite.json").read_text())
    assert (row["left"], row["tasks"], row["reused"]) == (0, 9, len(rows) - 2)
    assert len(runs.read_text().splitlines()) == len(rows)

    def records(text: str) -> list[dict]:  # a run's own time differs from run to run
        return [{k: v for k, v in json.loads(x).items() if k != "suite_seconds"}
                for x in text.splitlines()]  # fmt: skip

    assert records((out / "textkit-local" / "tasks.jsonl").read_text()) == records(whole)
