"""Red-team pass on the Feature Deletion agent's tools (env.py): inputs a policy can write that
used to stop a training run, leak disk, or hand it a tool it should not have. Every tool but
``run_tests`` runs in the trainer's process, so each test asserts that the attack gets an error
RESULT (a string the policy reads) and leaves the trainer, the host and the workspace sound.
A test fails while its attack works."""

from __future__ import annotations

import atexit
import glob
import os
import tempfile
import time
from pathlib import Path

import pytest
from support.textkit import textkit_env

from composer_replication.envs.feature_deletion import env as fd_env
from composer_replication.envs.feature_deletion.env import MAX_PATH_DEPTH
from composer_replication.envs.tools import bounded_tools, call_tool, tool_methods

FIXTURE = Path(__file__).parents[3] / "fixtures" / "feature_deletion" / "textkit"
TOOLS = {"list_files", "read_file", "search", "write_file", "replace_in_file", "run_tests",
         "submit"}  # fmt: skip


@pytest.fixture(scope="module")
def env(textkit_tasks):
    return textkit_env(textkit_tasks)


def _task(env, symbol="slugify"):
    return next(t for s in ("train", "heldout") for t in env.tasks(s) if t.data["symbol"] == symbol)


@pytest.fixture
def tools(env):
    t = bounded_tools(env.tools_class(), 1000)()
    t.reset(**env.row(_task(env)))
    yield t
    t.episode.close()


def _is_error_text(out) -> bool:
    """A result the tokenizer takes (UTF-8 text) that tells the policy it failed."""
    return isinstance(out, str) and out.encode("utf-8") is not None and out.startswith("error")


def test_the_policy_is_offered_exactly_the_documented_tools(env):
    """``close`` was public, so TRL offered it: a policy calling it deleted its workspace."""
    assert set(tool_methods(bounded_tools(env.tools_class(), 5))) == TOOLS


@pytest.mark.parametrize("name,args", [
    ("read_file", {"path": "\udc80"}),
    ("list_files", {"path": "\udc80"}),
    ("search", {"pattern": "x", "path": "\ud800/a"}),
    ("write_file", {"path": "notes\udc80.txt", "content": "x"}),
    ("replace_in_file", {"path": "\udc80", "old": "a", "new": "b"}),
    ("run_tests", {"target": "tests/test_\udc80.py"}),
])  # fmt: skip
def test_a_lone_surrogate_in_a_path_is_an_error_the_tokenizer_can_take(tools, name, args):
    """TRL's SmolLM2 parsing turns the policy's ASCII ``"\\udc80"`` into a lone surrogate; the
    tool echoed it, and TRL's tokenizer raised TypeError outside its per-tool try."""
    out, failed = call_tool(tools, {"name": name, "arguments": args})
    assert failed and _is_error_text(out), out
    assert not any(
        "\udc80" in n or "\ud800" in n for n in os.listdir(tools.workspace)
    )  # nothing with a non-UTF-8 name was created


def test_results_from_a_tree_with_an_unencodable_name_are_still_text(tools):
    """A name that is not UTF-8 on disk (a source tree can ship one) shows escaped."""
    os.mkdir(os.path.join(os.fsencode(tools.workspace), b"bad\xff"))
    Path(os.fsdecode(os.path.join(os.fsencode(tools.workspace), b"bad\xff", b"a.py"))).write_text(
        "needle\n"
    )
    for out in (tools.list_files("."), tools.search("needle")):
        assert "bad" in out and out.encode("utf-8")


def test_deep_directories_are_refused_and_grading_survives(env, tools):
    """~1000 levels of ``-/`` (about 1.5k policy tokens) made os.walk, copytree and rmtree
    raise RecursionError in the trainer: grading raised out of the reward function."""
    ok = tools.write_file("-/" * MAX_PATH_DEPTH + "f.py", "")
    assert ok.startswith("wrote"), ok
    for depth in (MAX_PATH_DEPTH + 1, 500, 1000):
        out = tools.write_file("-/" * depth + "f.py", "")
        assert _is_error_text(out) and ("deep" in out or "longer" in out), out[:200]
    assert tools.list_files(".").count("f.py") == 1
    [result] = env.grade_episodes([_task(env)], [[]], [tools])
    assert (
        result.reward == 0.0
        and "edited_other:" + "-/" * MAX_PATH_DEPTH + "f.py" in (result.info["flags"])
    )


def test_a_grading_failure_is_a_flagged_zero_not_a_dead_run(env, tools, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(fd_env, "grade_workspace", broken)
    [result] = env.grade_episodes([_task(env)], [[]], [tools])
    assert result.reward == 0.0 and not result.passed
    assert "grading_failed:RecursionError" in result.info["flags"]
    assert "grading" in caplog.text and tools.workspace is not None
    assert not tools.workspace.exists()  # removed all the same


def test_a_failed_test_run_leaves_no_copy_behind(tools, monkeypatch):
    """``staged_copy`` raised half-way (RecursionError on a deep tree) before run_tests' try:
    each call left a ~2 MB copy in /var/tmp that nothing removed."""
    from composer_replication.envs.feature_deletion import source

    def failing_copytree(src, dst, **kwargs):
        Path(dst, "partial.txt").write_text("x")
        raise RecursionError("maximum recursion depth exceeded")

    pattern = os.path.join(tempfile.gettempdir(), "..", "*", "cr-fd-run-*")
    before = set(glob.glob("/var/tmp/cr-fd-run-*") + glob.glob(pattern))
    monkeypatch.setattr(source.shutil, "copytree", failing_copytree)
    with pytest.raises(RecursionError):  # not an OSError: TRL's per-tool try reports it
        tools.run_tests()
    assert set(glob.glob("/var/tmp/cr-fd-run-*") + glob.glob(pattern)) == before


def test_a_hanging_workspace_costs_the_episode_test_budget_once(env, tools, monkeypatch):
    """A body that never returns made every ``run_tests`` call wait the whole suite timeout
    (120 s by default): ten calls held a rollout batch for 20 minutes. Now an episode's runs
    share ``tests_budget_s``; once it is spent the tool answers at once."""
    monkeypatch.setattr(env, "tests_budget_s", 4.0)
    out = tools.replace_in_file(
        "textkit/core.py", fd_env.STUB_LINE, "    while True:\n        pass"
    )
    assert out.startswith("edited"), out
    t0 = time.monotonic()
    first = tools.run_tests()
    assert first.startswith("the test run "), first  # timed out / did not finish
    assert time.monotonic() - t0 < env.generation.suite_timeout_s  # cut to the budget
    assert tools.test_seconds >= 3.0
    spent = tools.test_seconds
    second = tools.run_tests()
    assert _is_error_text(second) and "spent" in second and "submit" in second
    assert tools.test_seconds == spent  # nothing ran
    tools.reset(**env.row(_task(env)))  # a new episode has the whole budget again
    assert tools.test_seconds == 0.0


@pytest.mark.parametrize("name,args", [
    ("write_file", {"path": ".", "content": "x"}),
    ("write_file", {"path": "", "content": "x"}),
    ("write_file", {"path": "textkit", "content": "x"}),
    ("write_file", {"path": "textkit/core.py/x.py", "content": "x"}),
    ("write_file", {"path": "a\x00b", "content": "x"}),
    ("read_file", {"path": "x" * 300}),
    ("list_files", {"path": "a/" * 300}),
    ("run_tests", {"target": "."}),
    ("run_tests", {"target": "::x"}),
])  # fmt: skip
def test_file_system_failures_are_error_results(tools, name, args):
    """These raised IndexError, IsADirectoryError, FileExistsError, ValueError or
    ENAMETOOLONG out of the tool (TRL reports an exception, but evaluation and OpenEnv
    clients got a stack trace's worth of text)."""
    out = getattr(tools, name)(**args)
    assert _is_error_text(out), out


def test_content_that_is_not_utf8_leaves_the_file_untouched(tools):
    before = (tools.workspace / "textkit/core.py").read_bytes()
    for out in (
        tools.write_file("textkit/core.py", "x = '\ud800'\n"),
        tools.replace_in_file("textkit/core.py", "def slugify", "def \ud800"),
    ):
        assert _is_error_text(out) and "UTF-8" in out
    assert (tools.workspace / "textkit/core.py").read_bytes() == before


def test_error_results_are_cut_like_any_other_output(env, tools):
    out = tools.read_file("x" * 100_000)
    assert _is_error_text(out) and len(out) <= env.max_output_chars + 40


def test_episodes_do_not_pile_up_exit_handlers(env):
    t = env.tools_class()()
    t.reset(**env.row(_task(env)))
    handlers = atexit._ncallbacks()
    for _ in range(3):
        t.reset(**env.row(_task(env)))
    assert atexit._ncallbacks() == handlers
    assert len(fd_env._LIVE_WORKSPACES & {str(t.workspace.parent)}) == 1
    t.episode.close()
    assert not t.episode.live and not t.workspace.exists()


# ---- issue 37: run_tests targets and write sizes ----------------------------------------------


@pytest.mark.parametrize(
    "target",
    [
        "-p",
        "-ptests/test_core.py",
        "-o",
        "--rootdir=/",
        "-c/etc/passwd",
        "--co",
        "tests/../-p",
        "tests/../../etc/passwd",
        "../tests/test_core.py",
        "/etc/passwd",
        "tests//test_core.py",
        "./tests/test_core.py",
        "tests/-x/test_core.py",
        "tests/test_nothing_here.py",
        "textkit/core.py",
        "tests/test_core.py::a\nb",
        "tests",
    ],
)
def test_run_tests_takes_only_test_files_and_ids_never_options(tools, monkeypatch, target):
    """A target reaches pytest's command line: an option (``-p`` loads a plugin, ``-o`` and
    ``-c`` change the configuration, ``--rootdir`` moves the root), a path out of the
    workspace or a file that is no test is an error result, and no run starts."""
    monkeypatch.setattr(fd_env, "run_suite", lambda *a, **k: pytest.fail("a run started"))
    out = tools.run_tests(target)
    assert _is_error_text(out), out


def test_run_tests_still_takes_a_test_file_and_a_test_id(tools, monkeypatch):
    seen = []
    monkeypatch.setattr(fd_env, "run_suite", lambda box, repo, tests, **k: seen.append(tests))
    for target in ("tests/test_core.py", "tests/test_core.py::test_slugify"):
        try:
            tools.run_tests(target)
        except AttributeError:  # the stub returns no report; the call got through
            pass
    assert seen == [["tests/test_core.py"], ["tests/test_core.py::test_slugify"]]


def test_writes_are_capped_per_file_and_per_episode(tools):
    big = "x" * (fd_env.MAX_WRITE_BYTES + 1)
    assert _is_error_text(tools.write_file("big.py", big))
    assert not (tools.workspace / "big.py").exists()
    assert _is_error_text(tools.replace_in_file("textkit/core.py", "def ", big))
    chunk = "y" * fd_env.MAX_WRITE_BYTES
    results = [tools.write_file(f"c{i}.txt", chunk) for i in range(20)]
    assert sum(not _is_error_text(r) for r in results) == 16
    assert all(_is_error_text(r) for r in results[16:])
