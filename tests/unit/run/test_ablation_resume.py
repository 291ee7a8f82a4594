"""``ablate`` with ``checkpoint_every``: a run killed after a checkpoint continues from it as
the same run (the steps after the checkpoint match an uninterrupted run's, the periodic
held-out rows are not duplicated, the distill channel's budget goes on), runs finished without
checkpoints are still reused, a run killed in its final evaluation is evaluated, not trained
further, and a checkpoint trained with another config is refused."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.distill import tiny_student_and_teacher
from transformers import TrainerCallback

from composer_replication.config import ConfigError, load_ablation_config
from composer_replication.run import train
from composer_replication.run.ablation import run_ablation
from composer_replication.trainer.callbacks import read_metrics


class Killed(Exception):
    """Stands in for the process being killed right after a checkpoint was written."""


class KillAfterSave(TrainerCallback):
    def __init__(self, step: int):
        self.step = step

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise Killed(f"killed after checkpoint-{self.step}")


def _ablation(tmp_path: Path, out: str, student: Path, teacher: Path, every: int):
    path = tmp_path / f"{out}.yaml"
    path.write_text(yaml.safe_dump({
        "base_config": "quickstart.yaml",
        "base_overrides": [
            f"model.name={student}", "max_steps=3", "num_threads=1", "optim.warmup_steps=0",
            "optim.learning_rate=1e-3", "generation.num_generations=2",
            "generation.prompts_per_step=2", "generation.max_completion_length=4",
            "eval.n=6", "eval.max_new_tokens=4", "env.levels=[1]", "env.num_train=8",
        ],
        "seeds": [0], "eval_every": 1, "eval_n_during": 4, "checkpoint_every": every,
        "output_dir": str(tmp_path / out),
        "arms": [{"name": "grpo+distill", "overrides": [
            "distill.weight=1.0", "distill.max_scored_tokens=100000",
            f"distill.teachers=[{{name: t, model: {teacher}}}]",
        ]}],
    }))  # fmt: skip
    return load_ablation_config(path)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tiny_student_and_teacher(tmp_path_factory.mktemp("resume"))


@pytest.fixture(scope="module")
def plain(tmp_path_factory, models):
    """An experiment finished without resumable checkpoints (``checkpoint_every`` 0): the
    uninterrupted reference run. Tests copy it before changing anything."""
    root = tmp_path_factory.mktemp("plain")
    run_ablation(_ablation(root, "out", *models, every=0), "test")
    return root / "out"


def test_a_killed_run_resumes_from_its_checkpoint_as_the_same_run(
    tmp_path, models, plain, monkeypatch
):
    student, teacher = models
    killed = _ablation(tmp_path, "killed", student, teacher, every=1)
    build = train.build_trainer

    def build_then_kill(*args, **kwargs):
        trainer = build(*args, **kwargs)
        trainer.add_callback(KillAfterSave(2))
        return trainer

    monkeypatch.setattr(train, "build_trainer", build_then_kill)
    with pytest.raises(Killed):
        run_ablation(killed, "test")
    monkeypatch.setattr(train, "build_trainer", build)
    run_dir = tmp_path / "killed" / "grpo+distill" / "seed0"
    assert [p.name for p in run_dir.glob("checkpoint-*")] == ["checkpoint-2"]
    assert [r["step"] for r in read_metrics(run_dir / "heldout.jsonl")] == [0, 1, 2]
    with (run_dir / "heldout.jsonl").open("a") as fh:  # a row past the checkpoint (a kill
        fh.write(json.dumps({"step": 3, "pass_rate": 0.0}) + "\n")  # mid-way) is dropped

    run_ablation(killed, "test")
    ref_dir = plain / "grpo+distill" / "seed0"  # trained alike, saved differently
    a, b = read_metrics(ref_dir / "metrics.jsonl"), read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in b] == [1, 2, 3]
    for key in ("loss", "reward", "grad_norm", "distill/loss", "distill/teacher/t/scored_tokens"):
        assert b[2][key] == pytest.approx(a[2][key], rel=1e-4, abs=1e-6), key
    assert b[2]["time/elapsed_s"] > b[1]["time/elapsed_s"]  # elapsed goes on, not from 0
    heldout = read_metrics(run_dir / "heldout.jsonl")
    assert [r["step"] for r in heldout] == [0, 1, 2, 3]
    assert heldout == read_metrics(ref_dir / "heldout.jsonl")
    final = json.loads((run_dir / "final_eval.json").read_text())
    ref = json.loads((ref_dir / "final_eval.json").read_text())
    assert final["resumed_from"].endswith("checkpoint-2") and "resumed_from" not in ref
    assert final["pass_rate"] == ref["pass_rate"]
    assert not list(run_dir.glob("checkpoint-*"))  # removed once the run is recorded


def test_checkpointing_turned_on_reuses_finished_runs_and_refuses_a_changed_one(
    tmp_path, models, plain, monkeypatch
):
    student, teacher = models
    shutil.copytree(plain, tmp_path / "out")
    run_dir = tmp_path / "out" / "grpo+distill" / "seed0"
    finished = (run_dir / "final_eval.json").read_text()
    after = _ablation(tmp_path, "out", student, teacher, every=1)

    def no_training(*args, **kwargs):
        raise AssertionError("a finished run was trained again")

    build = train.build_trainer
    monkeypatch.setattr(train, "build_trainer", no_training)
    run_ablation(after, "test")  # the saving settings differ; what was trained does not
    assert (run_dir / "final_eval.json").read_text() == finished

    # killed in its final evaluation: training is over (a weights-only checkpoint-3 remains),
    # so the rerun evaluates those weights and trains no further step
    killed = _ablation(tmp_path, "killed", student, teacher, every=0)
    evaluate = train.evaluate_run

    def killed_in_evaluation(cfg, model, tokenizer, env, label, *args, **kwargs):
        if label == "base":  # the untrained model's evaluation, before any arm
            return evaluate(cfg, model, tokenizer, env, label, *args, **kwargs)
        raise Killed("killed in the final evaluation")

    monkeypatch.setattr(train, "build_trainer", build)
    monkeypatch.setattr(train, "evaluate_run", killed_in_evaluation)
    with pytest.raises(Killed):
        run_ablation(killed, "test")
    monkeypatch.setattr(train, "evaluate_run", evaluate)
    killed_dir = tmp_path / "killed" / "grpo+distill" / "seed0"
    last = killed_dir / "checkpoint-3"
    assert (last / "trainer_state.json").is_file() and not (last / "optimizer.pt").exists()
    run_ablation(killed, "test")
    assert [r["step"] for r in read_metrics(killed_dir / "metrics.jsonl")] == [1, 2, 3]
    again = json.loads((killed_dir / "final_eval.json").read_text())
    assert again["resumed_from"].endswith("checkpoint-3")
    assert again["pass_rate"] == json.loads(finished)["pass_rate"]

    (run_dir / "final_eval.json").unlink()  # now an unfinished run with a checkpoint...
    (run_dir / "checkpoint-2").mkdir()
    (run_dir / "checkpoint-2" / "trainer_state.json").write_text('{"global_step": 2}')
    (run_dir / "checkpoint-2" / "optimizer.pt").write_bytes(b"")
    after.arms[0].overrides.append("optim.learning_rate=3e-5")  # ...of another config
    with pytest.raises(ConfigError, match=r"(?s)was trained with another config.*learning_rate"):
        run_ablation(after, "test")


def test_two_processes_on_one_config_take_different_runs(tmp_path, models, plain):
    """Another process holds seed 1's run (its lock, held here by a child process): this one
    reuses seed 0, skips seed 1 and tabulates what is finished (partial); once the lock is
    free a second pass trains seed 1."""
    student, teacher = models
    shutil.copytree(plain, tmp_path / "shared")
    acfg = _ablation(tmp_path, "shared", student, teacher, every=0)
    acfg.seeds = [0, 1]
    acfg.results_md = str(tmp_path / "results.md")
    lock = tmp_path / "shared" / "grpo+distill" / ".seed1.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from filelock import FileLock; "
         f"held = FileLock({str(lock)!r}); held.acquire(); print('held', flush=True); "
         "sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        rows = run_ablation(acfg, "test")
    finally:
        holder.communicate("")  # releases the lock by exiting
    runs = tmp_path / "shared" / "grpo+distill"
    assert not (runs / "seed1" / "final_eval.json").exists()
    seed0 = json.loads((runs / "seed0" / "final_eval.json").read_text())
    assert rows[0]["per_seed"] == [seed0["pass_rate"]]
    assert "(in progress: 1 of 2 runs finished)" in (tmp_path / "results.md").read_text()
    run_ablation(acfg, "test")
    assert (runs / "seed1" / "final_eval.json").is_file()
