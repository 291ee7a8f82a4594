"""feature_deletion served over OpenEnv (127.0.0.1) and stepped through the generic adapter:
the workspace lives on the server, tools edit it there, and the server grades it."""

from __future__ import annotations

from pathlib import Path

from support.openenv_server import served

from composer_replication.config import TaskGenConfig
from composer_replication.envs import get_env
from composer_replication.envs.feature_deletion.candidates import STUB, original_body
from composer_replication.envs.feature_deletion.workspace import candidate_of
from composer_replication.envs.openenv.adapter import openenv_tools_class

FIXTURE = Path(__file__).parents[3] / "fixtures" / "feature_deletion" / "textkit"


def test_feature_deletion_over_openenv(tmp_path):
    env = get_env("feature_deletion", sources=[str(FIXTURE)], task_dir=tmp_path,
                  generation=TaskGenConfig(workers=2, suite_timeout_s=30))  # fmt: skip
    task = next(t for s in ("train", "heldout") for t in env.tasks(s)
                if t.data["symbol"] == "parse_int")  # fmt: skip
    body = original_body((FIXTURE / task.data["file"]).read_text(), candidate_of(task.data))
    with served(env, max_tool_calls=8) as url:
        cls = openenv_tools_class(url)
        good, bad = cls(), cls()
        try:
            for tools in (good, bad):
                tools.reset(**env.row(task))
            assert "1 not passed" in good.run_tests()
            assert good.replace_in_file(path=task.data["file"], old=task.data["indent"] + STUB,
                                        new=body).startswith("edited")  # fmt: skip
            assert good.run_tests().startswith("1 passed")
            assert "outside the repository" in bad.read_file(path="/etc/hostname")
            v_good = good.episode.verdict([])
            v_bad = bad.episode.verdict([])
            assert v_good.passed and v_good.reward == 1.0
            assert not v_bad.passed and v_bad.reward == 0.0
            assert v_bad.info["flags"] == ["outside_workspace:/etc/hostname"]
            assert "0 of 1 target tests pass" in v_bad.feedback
        finally:
            good.episode.close()
            bad.episode.close()
