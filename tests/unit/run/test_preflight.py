"""`train` checks its inputs before any model loads (run/preflight.py): a bad replay dataset, a
broken Feature Deletion task set and a bad source each end the command with one line and exit
2, and no model or tokenizer is ever asked for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from composer_replication.cli import app
from composer_replication.config import UserError, load_config
from composer_replication.run.preflight import preflight, resolve_resume

FIXTURE = Path(__file__).parents[2] / "fixtures" / "feature_deletion" / "textkit"


def _train(tmp_path: Path, *overrides: str):
    result = CliRunner().invoke(app, ["train", f"output_dir={tmp_path / 'run'}", *overrides])
    return result.exit_code, result.stderr.strip().splitlines(), result.stdout


def test_a_missing_replay_dataset_is_one_line_before_any_model(tmp_path, no_model):
    code, err, out = _train(tmp_path, "replay.weight=0.1", "replay.dataset=/nonexistent")
    assert (code, err) == (2, ["error: preference data not found: /nonexistent"])
    assert "composer-replication train" not in out  # refused before the run's banner
    assert not (tmp_path / "run").exists()


def test_a_malformed_replay_dataset_names_the_line(tmp_path, no_model):
    bad = tmp_path / "pairs.jsonl"
    bad.write_text('{"prompt": "q", "chosen": "a", "rejected": "b"}\n{"prompt": "q"}\n')
    code, err, _ = _train(tmp_path, "replay.weight=0.1", f"replay.dataset={bad}")
    assert (code, err) == (2, [f"error: {bad}:2: missing field 'chosen'"])


def test_a_broken_feature_deletion_task_set_is_one_line_before_any_model(tmp_path, no_model):
    tasks = tmp_path / "tasks" / "textkit-local"
    tasks.mkdir(parents=True)
    (tasks / "tasks.jsonl").write_text("this is not a task\n")
    code, err, _ = _train(
        tmp_path, "env.name=feature_deletion", f"env.task_sources=[{FIXTURE}]",
        f"env.task_dir={tmp_path / 'tasks'}",
    )  # fmt: skip
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"error: {tasks}")  # the task set it cannot use, named


def test_a_bad_source_is_one_line_before_any_model(tmp_path, no_model):
    code, err, _ = _train(
        tmp_path, "env.name=feature_deletion", "env.task_sources=[toolz>=1]",
        f"env.task_dir={tmp_path / 'tasks'}",
    )  # fmt: skip
    assert code == 2 and len(err) == 1 and "neither a directory nor a pinned package" in err[0]


def test_preflight_builds_the_environment_once_and_finds_no_checkpoint(tmp_path):
    cfg = load_config(None, [f"output_dir={tmp_path}", "env.levels=[1]"])
    checked = preflight(cfg)
    assert checked.resume is None and checked.env.name == "arithmetic"
    with pytest.raises(UserError, match="resume_from=latest: no checkpoint-N"):
        preflight(load_config(None, [f"output_dir={tmp_path}", "resume_from=latest"]))


def test_latest_skips_a_checkpoint_whose_save_was_cut_short(tmp_path, caplog):
    """checkpoint-4's save was killed before trainer_state.json (written last) was whole:
    naming it is refused; ``latest`` sets it aside (so the resumed run's checkpoint rotation
    cannot keep it over a good one), says so, and takes checkpoint-2."""

    def ckpt(step: int, state: str | None) -> Path:
        d = tmp_path / f"checkpoint-{step}"
        d.mkdir()
        (d / "optimizer.pt").write_bytes(b"x")
        if state is not None:
            (d / "trainer_state.json").write_text(state)
        return d

    ckpt(2, '{"global_step": 2}')
    cut = ckpt(4, '{"global_st')
    cfg = load_config(None, [f"output_dir={tmp_path}", "resume_from=latest"])
    with pytest.raises(UserError, match="checkpoint-4 is incomplete"):
        resolve_resume(load_config(None, [f"output_dir={tmp_path}", f"resume_from={cut}"]))
    with caplog.at_level("WARNING"):
        assert resolve_resume(cfg) == str(tmp_path / "checkpoint-2")
    assert "checkpoint-4: incomplete" in caplog.text
    assert not cut.exists() and (tmp_path / "incomplete-checkpoint-4").is_dir()  # set aside
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-2"]


def test_a_resume_missing_saved_channel_state_is_one_line_before_any_model(tmp_path):
    """A checkpoint that recorded the distill channel but lacks a process's counter file (its
    budget) is refused by preflight, naming the file: rank 0's, or one below a rank that is
    there; a checkpoint without the channel (added with ``resume_override_channels``) needs
    none: the channel starts fresh."""
    from composer_replication.config import CHANNELS_FILE
    from composer_replication.run.preflight import check_resume

    ckpt = tmp_path / "checkpoint-2"
    ckpt.mkdir()
    (ckpt / "optimizer.pt").write_bytes(b"x")
    (ckpt / "trainer_state.json").write_text('{"global_step": 2}')
    over = [f"output_dir={tmp_path}", "resume_from=latest", "distill.weight=1",
            "distill.teachers=runs/teacher/final"]  # fmt: skip
    cfg = load_config(None, over)
    (ckpt / CHANNELS_FILE).write_text(json.dumps(cfg.channel_settings()))
    with pytest.raises(UserError, match=r"checkpoint-2/distill_channel\.rank0\.json is missing"):
        check_resume(cfg)
    (ckpt / "distill_channel.rank0.json").write_text("{}")
    assert check_resume(cfg) == str(ckpt)
    (ckpt / "distill_channel.rank2.json").write_text("{}")  # rank 1's was lost
    with pytest.raises(UserError, match=r"distill_channel\.rank1\.json is missing"):
        check_resume(cfg)
    (ckpt / CHANNELS_FILE).write_text("{}")  # trained without it: resumed with the override
    added = load_config(None, [*over, "resume_override_channels=true"])
    assert check_resume(added) == str(ckpt)


def _earlier_run(run: Path, *overrides: str) -> None:
    """A run directory as `train` leaves it: its config.yaml and a metrics row."""
    from composer_replication.config import dump_config

    run.mkdir(parents=True)
    (run / "config.yaml").write_text(dump_config(load_config(None, list(overrides))))
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')


def test_a_fresh_run_into_another_configs_run_directory_is_refused(tmp_path, no_model):
    """Before, it overwrote the earlier run's config.yaml, dropped its metrics rows and appended
    its own evaluations to the earlier ones: two experiments silently mixed in one directory."""
    run = tmp_path / "run"
    _earlier_run(run, "optim.learning_rate=2e-5", "max_steps=7")
    code, err, out = _train(tmp_path)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"error: output_dir {run} holds a run trained with another config")
    assert "max_steps: 7 -> 40" in err[0] and "optim.learning_rate: 2e-05 -> 1e-05" in err[0]
    assert "resume_from=latest" in err[0]
    assert (run / "metrics.jsonl").read_text() == '{"step": 1, "loss": 0.5}\n'
    assert "optim:\n  learning_rate: 2.0e-05" in (run / "config.yaml").read_text()


def test_a_fresh_run_into_its_own_configs_directory_is_allowed(tmp_path):
    """The same experiment again (only where it saves may differ): a re-run, as before."""
    run = tmp_path / "run"
    _earlier_run(run, f"output_dir={run}", "save_steps=5", "env.levels=[1]")
    assert preflight(load_config(None, [f"output_dir={run}", "env.levels=[1]"])).resume is None


def test_a_rerun_may_drop_the_resume_override_flags_an_earlier_launch_had(tmp_path):
    """The run was continued with ``resume_from=latest`` and the override flags (passed out of
    habit, or by a launch script), which the resume wrote into config.yaml; the same experiment
    started again with its first command is a re-run, not another config: the flags change
    nothing the run trains (a resume may change them too, `RESUME_MAY_CHANGE`)."""
    run = tmp_path / "run"
    _earlier_run(run, f"output_dir={run}", "resume_override_channels=true",
                 "resume_override_config=true")  # fmt: skip
    assert preflight(load_config(None, [f"output_dir={run}"])).resume is None


def test_a_run_directory_with_an_unreadable_config_is_refused(tmp_path, no_model):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("max_steps: [\n")
    code, err, _ = _train(tmp_path)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"error: output_dir {run} holds a run whose config.yaml")
    assert f"{run / 'config.yaml'}:2:1: not valid YAML" in err[0]


def test_a_local_teachers_missing_model_is_one_line_before_the_run_starts(tmp_path, monkeypatch):
    """Before, it was found only after the run header, once the student's tokenizer had loaded
    (seconds for the embedded GGUF): the teacher's path is now resolved with the student's."""
    import composer_replication.lm.models as models

    def loaded(*args, **kwargs):
        raise AssertionError("a tokenizer was loaded before the model paths were checked")

    monkeypatch.setattr(models, "load_tokenizer", loaded)
    code, err, out = _train(
        tmp_path, "distill.weight=0.1", "distill.teachers=[{type: local, name: t, model: ./nope}]"
    )
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("error: distill.teachers: 't': model path './nope' does not exist")
    assert "composer-replication train" not in out and not (tmp_path / "run").exists()


def test_a_task_dir_that_is_a_file_is_one_line_before_any_model(tmp_path, no_model):
    """Before: a FileExistsError traceback from building the environment."""
    (tmp_path / "taken").write_text("not a directory\n")
    code, err, _ = _train(
        tmp_path, "env.name=feature_deletion", f"env.task_sources=[{FIXTURE}]",
        f"env.task_dir={tmp_path / 'taken'}",
    )  # fmt: skip
    assert (code, err) == (2, [f"error: env.task_dir {tmp_path / 'taken'}: it exists and is not "
                               "a directory"])  # fmt: skip


def _checkpointed_run(run: Path, *overrides: str) -> Path:
    """A run directory with its config.yaml and one whole checkpoint."""
    _earlier_run(run, f"output_dir={run}", *overrides)
    ckpt = run / "checkpoint-2"
    ckpt.mkdir()
    (ckpt / "optimizer.pt").write_bytes(b"x")
    (ckpt / "trainer_state.json").write_text('{"global_step": 2}')
    return ckpt


def test_a_resume_under_another_config_is_refused_naming_the_differences(tmp_path, no_model):
    """Before, only channel settings were compared: a resume with another learning rate, seed
    or task went on silently from the checkpoint. Now the saved config.yaml is compared; what
    may change on a resume (max_steps, threads, eval, where it saves) still may."""
    run = tmp_path / "run"
    _checkpointed_run(run, "optim.learning_rate=2e-5", "seed=3")
    code, err, out = _train(tmp_path, "resume_from=latest", "seed=4", "env.levels=[3]")
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"error: resume: {run / 'checkpoint-2'} was trained with another")
    for diff in ("seed: 3 -> 4", "env.levels: [1, 2] -> [3]", "optim.learning_rate: 2e-05"):
        assert diff in err[0]
    assert "resume_override_config=true" in err[0]
    assert "composer-replication train" not in out  # before the run's banner
    same = [f"output_dir={run}", "resume_from=latest", "optim.learning_rate=2e-5", "seed=3"]
    longer = load_config(None, [*same, "max_steps=80", "num_threads=1", "eval.n=8"])
    assert preflight(longer).resume == str(run / "checkpoint-2")
    forced = load_config(None, [f"output_dir={run}", "resume_from=latest", "seed=4",
                                "resume_override_config=true"])  # fmt: skip
    assert preflight(forced).resume == str(run / "checkpoint-2")


def test_a_resume_whose_saved_config_cannot_be_read_names_the_override(tmp_path, no_model):
    run = tmp_path / "run"
    _checkpointed_run(run)
    (run / "config.yaml").write_text("no_such_section: {a: 1}\n")  # from another version, say
    code, err, _ = _train(tmp_path, "resume_from=latest")
    assert code == 2 and len(err) == 1, err
    assert "cannot be read as a run config" in err[0] and "no_such_section" in err[0]
    assert "resume_override_config=true" in err[0]
    over = [f"output_dir={run}", "resume_from=latest", "resume_override_config=true"]
    assert preflight(load_config(None, over)).resume == str(run / "checkpoint-2")


def test_a_resume_with_a_damaged_metrics_line_is_one_line_before_any_model(tmp_path, no_model):
    """A line in the middle of metrics.jsonl that does not parse (not a row cut short by a
    kill, which is dropped): before, found by the first training callback, after the model
    loaded; now by the preflight, naming file and line."""
    run = tmp_path / "run"
    _checkpointed_run(run)
    (run / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2, "lo\n{"step": 3}\n')
    code, err, out = _train(tmp_path, "resume_from=latest")
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"error: {run / 'metrics.jsonl'}:2: not a JSON object")
    (run / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2, "lo')  # cut by a kill: goes on
    assert preflight(load_config(None, [f"output_dir={run}", "resume_from=latest"])).resume


ROUTE_TEACHERS = (
    "distill.weight=1",
    "distill.teachers=[{name: a, base_url: 'http://127.0.0.1:9/v1', check_tokenizer: false}, "
    "{name: b, base_url: 'http://127.0.0.1:9/v1', check_tokenizer: false}]",
)  # no server: the route is what is checked


def test_a_distill_route_column_the_rows_lack_is_one_line_before_any_model(tmp_path, no_model):
    """Arithmetic's rows carry only ``task_id``: a route on ``level`` would leave every row
    unrouted (reported only after steps had run), so it is refused first, naming the columns."""
    code, err, out = _train(
        tmp_path, *ROUTE_TEACHERS, "distill.route={type: column, column: level, match: {a: ['1']}}"
    )
    assert (code, err) == (
        2,
        ["error: distill.route.column: 'level' is not a column of arithmetic's rows; "
         "its rows have ['task_id']"],
    )  # fmt: skip
    assert "composer-replication train" not in out and not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("env", "column"), [("env.name=arithmetic", "task_id"), ("env.name=calculator", "answer")]
)
def test_a_distill_route_on_a_column_the_rows_have_passes(tmp_path, env, column):
    """``task_id`` is in every prompt dataset; a tool environment's rows add their own columns
    (the calculator's ``answer``), which the route may read."""
    cfg = load_config(None, [
        f"output_dir={tmp_path / 'run'}", env, *ROUTE_TEACHERS,
        f"distill.route={{type: column, column: {column}, match: {{a: ['*']}}}}",
    ])  # fmt: skip
    assert preflight(cfg).env.name == env.split("=")[1]
