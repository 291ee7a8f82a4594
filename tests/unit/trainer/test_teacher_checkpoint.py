"""A checkpoint written before the teachers renovation (one teacher description for replay and
distillation) resumes with today's code without ``resume_override_channels``: its channel
record (``channels.json``) and the distill channel's counters are the files c96d425 wrote
(tests/fixtures/pre_teachers_checkpoint, README there), the only parts of a checkpoint the
renovation touches. The record's form differs from what today's config writes (fields added
since), not its meaning."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

from composer_replication.channels.distill import DistillChannel
from composer_replication.config import (
    channel_setting_diffs,
    check_resume_channels,
    load_config,
    recorded_channels,
)
from composer_replication.run.preflight import check_channel_state
from composer_replication.teachers.scoring import ScoreStats

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "pre_teachers_checkpoint"


def test_the_old_record_compares_equal_to_the_same_settings_today():
    cfg = load_config(FIXTURE / "run.yaml", [])
    assert not cfg.resume_override_channels
    as_written = channel_setting_diffs(recorded_channels(FIXTURE), cfg.channel_settings())
    assert as_written  # e.g. distill.teachers: the fields a teacher has gained since
    assert check_resume_channels(FIXTURE, cfg.channel_settings(), override=False) == []


def test_the_old_distill_counters_load():
    """What a resume does with the checkpoint before any model loads (preflight) and when the
    trainer starts (``train(resume_from_checkpoint)``): the channel record compares equal, the
    per-process state file is found, and the distill channel takes its counters back."""
    cfg = load_config(FIXTURE / "run.yaml", [])
    check_channel_state(str(FIXTURE), cfg.channel_settings())
    channel = DistillChannel(cfg.distill)
    channel.scorers = [SimpleNamespace(spec=t, stats=ScoreStats()) for t in cfg.distill.teachers]
    channel.load(str(FIXTURE))
    old = json.loads((FIXTURE / "distill_channel.rank0.json").read_text())
    assert {s.spec.name: dataclasses.asdict(s.stats) for s in channel.scorers} == old
    assert old["near"]["scored_tokens"] > 0 and old["far"]["failed_requests"] == 1
