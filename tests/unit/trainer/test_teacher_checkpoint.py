"""A checkpoint written before the teachers renovation (one teacher description for replay and
distillation) resumes with today's code without ``resume_override_channels``: its channel
record (``channels.json``) and the distill channel's counters are the files c96d425 wrote
(tests/fixtures/pre_teachers_checkpoint, README there). The record's form differs from what
today's config writes (fields added since), not its meaning."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from support.tiny_run import save_tiny_model

from composer_replication.config import (
    channel_setting_diffs,
    check_resume_channels,
    load_config,
    recorded_channels,
)
from composer_replication.run.train import run_training
from composer_replication.trainer.callbacks import read_metrics

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "pre_teachers_checkpoint"
OLD_FILES = ("channels.json", "distill_channel.rank0.json")


def test_the_old_record_compares_equal_to_the_same_settings_today():
    cfg = load_config(FIXTURE / "run.yaml", [])
    assert not cfg.resume_override_channels
    as_written = channel_setting_diffs(recorded_channels(FIXTURE), cfg.channel_settings())
    assert as_written  # e.g. distill.teachers: the fields a teacher has gained since
    assert check_resume_channels(FIXTURE, cfg.channel_settings(), override=False) == []


def test_a_checkpoint_written_before_the_renovation_resumes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # run.yaml names the models `student` and `teacher`
    save_tiny_model(Path("student"), seed=0)
    save_tiny_model(Path("teacher"), seed=1)
    shutil.copy(FIXTURE / "run.yaml", "run.yaml")
    run_training(load_config("run.yaml", []))  # a checkpoint-1 with weights and optimizer
    ckpt = Path("out/checkpoint-1")
    for name in OLD_FILES:  # the channel record and counters as c96d425 wrote them
        shutil.copy(FIXTURE / name, ckpt / name)
    run_training(load_config("run.yaml", ["max_steps=2", f"resume_from={ckpt}",
                                          "output_dir=resumed"]))  # fmt: skip
    assert [r["step"] for r in read_metrics("resumed/metrics.jsonl")] == [2]
    old = json.loads((FIXTURE / "distill_channel.rank0.json").read_text())
    now = json.loads(Path("resumed/checkpoint-2/distill_channel.rank0.json").read_text())
    # the counters came back from the old file and went on counting
    assert now["near"]["requests"] == old["near"]["requests"] + 1
    assert now["near"]["scored_tokens"] > old["near"]["scored_tokens"] > 0
    assert now["far"]["failed_requests"] == old["far"]["failed_requests"] + 1
