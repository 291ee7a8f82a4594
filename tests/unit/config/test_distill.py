"""The ``distill`` section of the run config: teacher shorthands, routing rules and the
refusals that come before any model loads; the shipped example (configs/distill.yaml) and the
evidence configs are parsed with every other shipped config by test_config.py."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from composer_replication.config import (
    BestRoute,
    ColumnRoute,
    ConfigError,
    JsdDistillLoss,
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


def test_a_loss_or_route_given_as_its_type_alone():
    """``distill.route=best`` / ``distill.loss=jsd`` are the type with its defaults (before,
    "Input should be a valid dictionary"); a type that needs more says which field."""
    cfg = load_config(None, ["distill.weight=1", "distill.teachers=[a, b]", "distill.route=best",
                             "distill.loss=jsd"])  # fmt: skip
    assert isinstance(cfg.distill.route, BestRoute)
    assert isinstance(cfg.distill.loss, JsdDistillLoss) and cfg.distill.loss.beta == 0.0
    with pytest.raises(ConfigError, match="distill.route.column.match: Field required"):
        load_config(None, ["distill.weight=1", "distill.teachers=[a, b]", "distill.route=column"])


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
        (
            ["distill.weight=1", "distill.teachers=a", "distill.loss.beta=0.5"],
            "loss.beta is a key of loss.type=jsd, not of reverse_kl (the default when loss.type "
            "is not set): set distill.loss.type=jsd",
        ),
        (
            ["distill.weight=1", "distill.teachers=a", "distill.loss.top_k=8"],
            "loss.top_k is a key of loss.type=jsd, not of reverse_kl",
        ),
        (
            [
                "distill.weight=1",
                "distill.teachers=a",
                "distill.loss.type=jsd",
                "distill.loss.as_advantage=true",
            ],
            "loss.as_advantage is a key of loss.type=reverse_kl, not of jsd: set",
        ),  # fmt: skip
        (["distill.weight=1", "distill.teachers=a", "distill.loss.tail=1"], "unknown key"),
    ],
)
def test_bad_distill_settings_name_the_field(overrides, message):
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    assert message in " ".join(str(info.value).split())


def test_a_copy_of_the_student_only_when_asked():
    cfg = load_config(None, [
        "distill.weight=1",
        "distill.teachers=[{name: me, model: embedded:smollm2-135m-instruct, "
        "allow_student_weights: true}]",
    ])  # fmt: skip
    assert cfg.distill.teachers[0].allow_student_weights


REPO = Path(__file__).parents[3]


def _documented_distill_commands() -> list[list[str]]:
    """Every ``composer-replication train`` line of the README and docs/channels.md that sets
    ``distill``, as its arguments (a trailing ``\\`` joins the next line; ``#`` starts a
    comment)."""
    out = []
    for doc in ("README.md", "docs/channels.md"):
        text = (REPO / doc).read_text().replace("\\\n", " ")
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("composer-replication train") and "distill" in line:
                args = shlex.split(line, comments=True)[2:]
                out.append(args)
    return out


def _config_and_overrides(args: list[str]) -> tuple[str | None, list[str]]:
    config = None
    if args[:1] in (["--config"], ["-c"]):
        config, args = args[1], args[2:]
    return config, args


def test_the_docs_distill_command_lines_parse():
    """The command lines the docs show for distillation are valid configs (the teacher paths
    they name need not exist here: that is checked when a run starts)."""
    commands = _documented_distill_commands()
    assert len(commands) >= 8, commands
    for args in commands:
        config, overrides = _config_and_overrides(args)
        assert all("=" in o for o in overrides), args
        cfg = load_config(config and config.removeprefix("configs/"), overrides)
        assert cfg.distill.weight > 0 and cfg.distill.teachers, args
