"""``diloco_command`` on a small Typer app (the lead registers it on the real one)."""

from __future__ import annotations

import signal

import pytest
import typer
from typer.testing import CliRunner

from composer_replication.cli.diloco import diloco_command

app = typer.Typer()
app.command("diloco", context_settings={"allow_extra_args": True})(diloco_command)


@app.command()
def _other() -> None:  # a second command so `diloco` stays a subcommand
    pass


def test_bad_override_names_the_key_and_starts_nothing():
    res = CliRunner().invoke(app, ["diloco", "--replicas", "2", "diloco.sync_every=0"])
    assert res.exit_code == 2
    assert "diloco.sync_every" in res.output


def test_bad_replica_ids():
    res = CliRunner().invoke(app, ["diloco", "--replicas", "2", "--replica-ids", "0,x"])
    assert res.exit_code == 2 and "--replica-ids" in res.output


def test_replica_id_out_of_range():
    res = CliRunner().invoke(app, ["diloco", "--replicas", "2", "--replica-ids", "3"])
    assert res.exit_code == 2 and "out of range" in res.output


def test_help_lists_options():
    res = CliRunner().invoke(app, ["diloco", "--help"])
    assert res.exit_code == 0
    for opt in (
        "--replicas",
        "--config",
        "--lighthouse",
        "--replica-ids",
        "--min-replicas",
        "--executor",
    ):
        assert opt in res.output


def test_executor_launch_needs_the_object_store_backend():
    res = CliRunner().invoke(app, ["diloco", "--replicas", "2", "--executor", "local"])
    assert res.exit_code == 2 and "diloco.backend=object_store" in res.output


def test_unknown_executor():
    res = CliRunner().invoke(app, ["diloco", "--executor", "modal"])
    assert res.exit_code == 2 and "only 'local'" in res.output


def test_object_store_refuses_a_store_left_from_another_run(tmp_path):
    (tmp_path / "round-00000000").mkdir()
    args = ["diloco", "diloco.backend=object_store", f"diloco.store_uri=file://{tmp_path}"]
    for extra in ([], ["--executor", "local"]):
        res = CliRunner().invoke(app, [*args, *extra])
        assert res.exit_code == 2 and "already holds rounds [0]" in res.output


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_stops_a_launch_and_every_replica(tmp_path, sig):
    """SIGINT to a running ``composer-replication diloco --replicas 2`` (torchft backend, the
    lighthouse in the launcher): the launcher stops its replicas (each in a process group of
    its own: SIGTERM, SIGKILL after a grace period), exits 130 with one line saying where
    their output is, and nothing of the launch is left running. SIGTERM (``timeout``, a job
    scheduler) does the same: before, it ended the launcher at once and left both replicas
    training, orphaned."""
    from support.cli_process import children, group_alive, interrupt, read_until, start_cli
    from support.tiny_run import save_tiny_model

    model = save_tiny_model(tmp_path / "tiny")
    proc = start_cli([
        "diloco", "--replicas", "2", f"model.name={model}", f"output_dir={tmp_path / 'run'}",
        "max_steps=500", "num_threads=1", "generation.num_generations=2",
        "generation.prompts_per_step=2", "generation.max_completion_length=4", "env.num_train=16",
        "eval.before_and_after=false", "diloco.sync_every=2", "diloco.timeout_s=300",
    ])  # fmt: skip
    said = read_until(proc, lambda lines: {"[r0]", "[r1]"} <= {x[:4] for x in lines})
    assert {"[r0]", "[r1]"} <= {x[:4] for x in said}, "\n".join(said)  # both replicas run
    replicas = children(proc.pid)
    assert len(replicas) == 2
    rest, seconds = interrupt(proc, timeout_s=90, sig=sig)
    assert proc.returncode == 130, rest
    assert "interrupted: replicas stopped; what they wrote is in " in rest
    assert "Traceback" not in rest
    assert not group_alive(proc.pid) and not any(group_alive(r) for r in replicas)
    print(f"diloco launch exited {seconds:.1f} s after {sig.name}")


def test_a_replica_only_rule_is_checked_before_any_replica_starts(tmp_path):
    """diloco.backend=object_store without a store_uri passed the launcher (it read the config
    with diloco.enabled off) and failed in every replica, exit 1."""
    res = CliRunner().invoke(
        app, ["diloco", "--executor", "local", "diloco.backend=object_store",
              f"output_dir={tmp_path / 'run'}"],
    )  # fmt: skip
    assert res.exit_code == 2, res.output
    assert "diloco.backend=object_store needs diloco.store_uri" in res.output
    assert "[diloco]" not in res.output  # the launcher never started
    assert not (tmp_path / "run").exists()


def test_a_local_store_that_is_a_file_is_refused_before_any_replica(tmp_path):
    (tmp_path / "store").write_text("not a directory\n")
    res = CliRunner().invoke(
        app, ["diloco", "--executor", "local", "diloco.backend=object_store",
              f"diloco.store_uri={tmp_path / 'store'}", f"output_dir={tmp_path / 'run'}"],
    )  # fmt: skip
    assert res.exit_code == 2, res.output
    assert f"diloco.store_uri {tmp_path / 'store'}: it exists and is not a directory" in (
        " ".join(res.output.split())
    )


def _replica_run(run, replica: int, *overrides: str) -> None:
    """``replica-r`` as a replica leaves it: its config.yaml, as the launcher configured it."""
    from composer_replication.config import dump_config, load_config
    from composer_replication.diloco.replica import replica_overrides

    cfg = load_config(None, [f"output_dir={run}", "diloco.replicas=2", "diloco.enabled=true"])
    rep = replica_overrides(cfg, replica, 2, "http://127.0.0.1:40001", 1)
    saved = load_config(None, [f"output_dir={run}", *overrides, *rep])
    (run / f"replica-{replica}").mkdir(parents=True)
    (run / f"replica-{replica}" / "config.yaml").write_text(dump_config(saved))


def test_a_replica_directory_of_another_config_is_refused_before_any_replica(tmp_path):
    """Before, the launcher started every replica and each failed alone with the same error."""
    run = tmp_path / "run"
    _replica_run(run, 1, "max_steps=7")
    res = CliRunner().invoke(app, ["diloco", "--replicas", "2", f"output_dir={run}"])
    assert res.exit_code == 2, res.output
    flat = " ".join(res.output.split())
    assert f"output_dir {run / 'replica-1'} holds a run trained with another config" in flat
    assert "max_steps: 7 -> 40" in flat
    assert "[diloco]" not in res.output  # no lighthouse, no replica


def test_a_rerun_of_the_same_replicas_is_not_refused_for_its_lighthouse_or_threads(tmp_path):
    """The launcher starts its lighthouse on a free port and splits the cores anew at each
    launch: a replica's config.yaml from the last launch differs there, yet it is the same
    experiment (a refusal here would stop every re-run of a DiLoCo command)."""
    from composer_replication.config import load_config
    from composer_replication.diloco.replica import replica_overrides
    from composer_replication.run.preflight import check_fresh_run_dir, check_replica_dirs

    run = tmp_path / "run"
    for r in (0, 1):
        _replica_run(run, r)
    cfg = load_config(None, [f"output_dir={run}", "diloco.replicas=2", "diloco.enabled=true"])
    check_replica_dirs(None, [f"output_dir={run}"], cfg, range(2))
    again = replica_overrides(cfg, 0, 2, "http://127.0.0.1:40999", 2)  # another port, threads
    check_fresh_run_dir(load_config(None, [f"output_dir={run}", *again]))


def test_a_rerun_over_an_object_store_may_use_a_fresh_store_prefix(tmp_path):
    """The launcher refuses a store prefix that holds an earlier run's rounds ("give each run a
    fresh prefix"), so the same object-store experiment run again into its directory comes with
    another ``diloco.store_uri``: like the lighthouse, a meeting point of this launch, not
    another config (refused, no re-run could follow the launcher's own advice)."""
    from composer_replication.config import load_config
    from composer_replication.run.preflight import check_replica_dirs

    run = tmp_path / "run"
    store = ["diloco.backend=object_store"]
    for r in (0, 1):
        _replica_run(run, r, *store, f"diloco.store_uri=file://{tmp_path}/store-1")
    again = [f"output_dir={run}", *store, f"diloco.store_uri=file://{tmp_path}/store-2"]
    cfg = load_config(None, [*again, "diloco.replicas=2", "diloco.enabled=true"])
    check_replica_dirs(None, again, cfg, range(2))
