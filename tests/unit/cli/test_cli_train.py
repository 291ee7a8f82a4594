"""``composer-replication train`` run as a user runs it, in its own process: what its output
shows off a terminal (a log file)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[3] / "src"


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> Path:
    from support.tiny_run import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def train_argv(model_dir: Path, out: Path, *extra: str) -> list[str]:
    """The real CLI on the tiny random model: 2 steps, evaluation before and after on 8
    problems in chunks of 4 (each a progress line)."""
    return [
        sys.executable, "-m", "composer_replication.cli", "train", f"model.name={model_dir}",
        f"output_dir={out}", "max_steps=2", "num_threads=1", "generation.num_generations=2",
        "generation.prompts_per_step=2", "generation.max_completion_length=4",
        "env.num_train=8", "eval.n=8", "eval.batch_size=4", "eval.max_new_tokens=4", *extra,
    ]  # fmt: skip


def test_train_piped_to_a_file_prints_the_base_score_then_a_line_per_step(tiny_model_dir, tmp_path):
    """stdout to a file, as with ``> log 2>&1``, nohup or CI: the base score is printed when
    it is known, before training, then one plain line per step with reward, loss, seconds
    and ETA (a live bar printed nothing there until the run ended)."""
    log = tmp_path / "log"
    with log.open("wb") as fh:
        proc = subprocess.run(
            train_argv(tiny_model_dir, tmp_path / "run"), stdout=fh, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(SRC)}, timeout=600,
        )  # fmt: skip
    text = log.read_text()
    assert proc.returncode == 0, text
    lines = text.splitlines()
    steps = [i for i, line in enumerate(lines) if line.startswith("step ")]
    assert [lines[i].split()[1] for i in steps] == ["1/2", "2/2"], text
    step_line = re.compile(
        r"^step \d/2  reward -?\d+\.\d{3}  loss -?\d+\.\d{4}  \d+\.\d s(  ETA .+)?$"
    )
    assert all(step_line.match(lines[i]) for i in steps), text
    assert "ETA" in lines[steps[0]]  # known after the first step
    base = next(i for i, line in enumerate(lines) if line.startswith("held-out base: "))
    trained = next(i for i, line in enumerate(lines) if line.startswith("held-out trained: "))
    assert base < steps[0] and steps[-1] < trained, text
    chunks = [line for line in lines[:base] if line.startswith("eval base  ")]
    assert chunks and chunks[-1].startswith("eval base  8/8  "), text  # the chunk ending it
    assert "\x1b[" not in text  # no terminal control codes in a log


def test_train_starts_with_a_short_header_and_writes_the_full_config(tiny_model_dir, tmp_path):
    """A few lines name the model, env, channels with weights and where the full config
    went (the ~190-line dump it replaced came also before a failure); the run directory keeps
    the full config."""
    out = tmp_path / "run"
    argv = train_argv(tiny_model_dir, out, "max_steps=1", "eval.before_and_after=false",
                      "sdpo.weight=0.5")  # fmt: skip
    proc = subprocess.run(
        argv, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(SRC)},
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    head = proc.stdout.split("step 1/1")[0].splitlines()
    assert len(head) <= 8, proc.stdout
    rows = dict(line.split(None, 1) for line in head[1:] if line.strip())
    assert rows["model"] == f"{tiny_model_dir} (float32)"
    assert rows["env"] == "arithmetic, levels 1,2"
    assert rows["channels"] == "grpo (dapo) + sdpo 0.5"
    assert rows["output"] == f"{out}  (full config: {out / 'config.yaml'})"
    import yaml

    full = yaml.safe_load((out / "config.yaml").read_text())
    assert full["sdpo"]["weight"] == 0.5 and full["model"]["name"] == str(tiny_model_dir)
    assert "learning_rate" in full["optim"] and "learning_rate" not in proc.stdout


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("/nope", "error: model path '/nope' does not exist (model.name and a "),
        ("models/nope", "error: model path 'models/nope' does not exist (model.name and a "),
        ("Org/nope", "error: could not load 'Org/nope' from the Hugging Face Hub ("),
    ],
)
def test_a_bad_model_name_fails_before_anything_loads(ref, message, tmp_path):
    """One line on stderr, exit 2, no header and no run directory, and neither torch nor
    transformers imported: the name is checked right after the config (it used to fail after
    48 s of imports and the config dump, or after 32 s as a hub id). ``models/`` exists here,
    so ``models/nope`` is a path; ``Org/`` does not, so ``Org/nope`` is a hub id, and the hub
    (a closed local port) refuses at once."""
    (tmp_path / "models").mkdir()
    env = {**os.environ, "PYTHONPATH": str(SRC), "HF_ENDPOINT": "http://127.0.0.1:9",
           "HF_HUB_CACHE": str(tmp_path / "hf-cache")}  # fmt: skip
    env.pop("HF_HUB_OFFLINE", None)
    argv = [sys.executable, "-X", "importtime", "-m", "composer_replication.cli", "train",
            f"model.name={ref}", f"output_dir={tmp_path / 'run'}"]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    said = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    assert len(said) == 1 and said[0].startswith(message), said
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if "|" in line}
    assert "composer_replication.config" in imported  # the import log is read right
    assert not {"torch", "transformers", "trl"} & imported
    assert not (tmp_path / "run").exists()


def test_ctrl_c_stops_a_running_train_and_says_what_it_kept(tiny_model_dir, tmp_path):
    """SIGINT during training: exit 130 within seconds (the bound here is generous: the
    machine is shared), one line saying where the steps done are, no traceback, nothing left
    in the process group, and metrics.jsonl holds the steps logged before the signal."""
    from support.cli_process import group_alive, interrupt, read_until, start_cli

    out = tmp_path / "run"
    argv = train_argv(tiny_model_dir, out, "max_steps=500", "eval.before_and_after=false")[3:]
    proc = start_cli(argv)
    head = read_until(proc, lambda lines: lines[-1].startswith("step 1/500"))
    assert head[-1].startswith("step 1/500"), "\n".join(head)
    rest, seconds = interrupt(proc, timeout_s=90)
    assert proc.returncode == 130, rest
    assert "interrupted: stopped after step " in rest and f"{out / 'metrics.jsonl'}" in rest
    assert "Traceback" not in rest
    assert not group_alive(proc.pid)
    rows = (out / "metrics.jsonl").read_text().splitlines()
    assert 1 <= len(rows) < 500
    print(f"train exited {seconds:.1f} s after SIGINT")


def test_a_run_without_evaluation_prints_no_empty_results_table(tmp_path, capsys):
    """``eval.before_and_after=false``: the summary says nothing was evaluated, instead of an
    empty "held-out results" table and "n = None held-out problems"."""
    from composer_replication.cli.train import print_train_summary
    from composer_replication.run.train import RunSummary

    summary = RunSummary(tmp_path, None, None, None, 4.0, 9.0, tmp_path / "final")
    print_train_summary(summary)
    out = " ".join(capsys.readouterr().out.split())
    assert "held-out results" not in out and "None" not in out
    assert out.startswith("no held-out evaluation (eval.before_and_after=false); train 4 s")


def _train_without_running(monkeypatch, args: list[str]):
    """``train ARGS`` through the CLI up to the run (checks and training replaced): the
    config it would run, and the CLI's result."""
    from typer.testing import CliRunner

    from composer_replication.cli import app
    from composer_replication.run import preflight as preflight_module
    from composer_replication.run import train as train_module
    from composer_replication.run.train import RunSummary

    ran = []

    def run(cfg, **kw):
        ran.append(cfg)
        return RunSummary(Path(cfg.output_dir), None, None, None, 0.0, 0.0, Path("final"))

    monkeypatch.setattr(preflight_module, "preflight", lambda cfg: None)
    monkeypatch.setattr(preflight_module, "check_model_sources", lambda cfg: None)
    monkeypatch.setattr(train_module, "run_training", run)
    return ran, CliRunner().invoke(app, ["train", *args])


def test_a_positional_yaml_is_the_run_config(monkeypatch, tmp_path):
    """The acceptance line of issue 54, ``train configs/agent_quickstart.yaml
    rollout.engine=ray ray.num_workers=2 max_steps=3``: the YAML (a path, or a shipped
    config's name) is the config and the rest its overrides."""
    monkeypatch.chdir(tmp_path)
    own = tmp_path / "mine.yml"
    own.write_text("max_steps: 7\noutput_dir: x\n")
    for first, env, steps in (("configs/agent_quickstart.yaml", "calculator", 3),
                              ("agent_quickstart.yaml", "calculator", 3),
                              (str(own), "arithmetic", 7)):  # fmt: skip
        extra = ["max_steps=3"] if steps == 3 else []
        ran, result = _train_without_running(
            monkeypatch, [first, "rollout.engine=ray", "ray.num_workers=2", *extra]
        )
        assert result.exit_code == 0, result.output
        [cfg] = ran
        assert (cfg.env.name, cfg.max_steps, cfg.rollout.engine) == (env, steps, "ray")
        assert cfg.ray.num_workers == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nope.yaml", "max_steps=1"], "error: config file not found: nope.yaml"),
        (["-c", "quickstart.yaml", "agent_quickstart.yaml"],
         "error: two run configs (--config quickstart.yaml, agent_quickstart.yaml): give one"),
        (["quickstart.yaml", "agent_quickstart.yaml"], "error: two run configs"),
    ],
)  # fmt: skip
def test_a_positional_yaml_that_is_missing_or_twice_is_one_line(
    args, message, monkeypatch, tmp_path
):
    monkeypatch.chdir(tmp_path)
    ran, result = _train_without_running(monkeypatch, args)
    assert result.exit_code == 2 and not ran
    assert result.output.strip().startswith(message), result.output
    assert len(result.output.strip().splitlines()) == 1
