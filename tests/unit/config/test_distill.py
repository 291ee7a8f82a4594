"""The ``distill`` section of the run config: teacher shorthands, routing rules and the
refusals that come before any model loads; the shipped example (configs/distill.yaml) and the
evidence configs are parsed with every other shipped config by test_config.py."""

from __future__ import annotations

import pytest

from composer_replication.config import (
    ColumnRoute,
    ConfigError,
    LocalTeacherConfig,
    RemoteTeacherConfig,
    load_config,
)


def test_teacher_shorthands_local_and_remote():
    cfg = load_config(None, ["distill.weight=1", "distill.teachers=runs/teacher/final"])
    (t,) = cfg.distill.teachers
    assert isinstance(t, LocalTeacherConfig) and t.model == "runs/teacher/final"
    assert t.device == "same" and t.dtype == "float32"
    cfg = load_config(None, [
        "distill.weight=1", "distill.teachers=[a/b, 'http://127.0.0.1:9/v1']",
        "distill.route={type: column, match: {teacher0: ['L1:*'], teacher1: ['*']}}",
    ])  # fmt: skip
    local, remote = cfg.distill.teachers
    assert isinstance(remote, RemoteTeacherConfig) and remote.top_k == 8
    assert isinstance(cfg.distill.route, ColumnRoute) and cfg.distill.route.column == "task_id"


def test_the_shipped_example_names_a_local_teacher():
    cfg = load_config("distill.yaml")
    assert cfg.distill.weight == 1.0 and cfg.distill.teachers[0].model.endswith("final")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["distill.weight=1"], "needs at least one teacher"),
        (["distill.weight=1", "distill.teachers=[a, b]"], "need a routing rule"),
        (["distill.weight=1", "distill.teachers=[a]", "distill.route.type=best"], "at least two"),
        (
            [
                "distill.weight=1",
                "distill.teachers=[a, b]",
                "distill.route={type: column, match: {c: ['*']}}",
            ],
            "unknown teachers ['c']",
        ),
        (
            ["distill.weight=1", "distill.teachers=[{name: x, model: a}, {name: x, model: b}]"],
            "unique",
        ),
        (
            ["distill.weight=1", "distill.teachers=embedded:smollm2-135m-instruct"],
            "the student's own weights",
        ),
        (["distill.weight=1", "distill.teachers=[{name: bad/name, model: a}]"], "name"),
        (
            ["distill.weight=1", "distill.teachers=['http://x/v1']", "distill.teachers.0.top_k=0"],
            "top_k",
        ),
        (["grpo.weight=0"], "trains nothing"),
        (
            [
                "grpo.weight=0",
                "distill.weight=1",
                "distill.teachers=a",
                "distill.loss.as_advantage=true",
            ],
            "grpo.weight must be > 0",
        ),
        (["distill.weight=1", "distill.teachers=a", "distill.loss.beta=0.5"], "unknown key"),
    ],
)
def test_bad_distill_settings_name_the_field(overrides, message):
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    assert message in str(info.value)


def test_a_copy_of_the_student_only_when_asked():
    cfg = load_config(None, [
        "distill.weight=1",
        "distill.teachers=[{name: me, model: embedded:smollm2-135m-instruct, "
        "allow_student_weights: true}]",
    ])  # fmt: skip
    assert cfg.distill.teachers[0].allow_student_weights
