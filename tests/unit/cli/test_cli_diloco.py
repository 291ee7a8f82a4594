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
