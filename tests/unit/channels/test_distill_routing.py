"""The distill channel's ``best`` routing rule and its budget, on one scored generation round
of tiny random models (no optimizer step): the rule picks, per row, the teacher whose mean
log-prob of the student's own tokens is highest; rows past ``max_scored_tokens`` are reported
over budget, never scored as 0; what was spent survives a checkpoint."""

from __future__ import annotations

import json

import pytest
import torch
from support.distill import socket_closed_port, tiny_student_and_teacher, train_overrides

from composer_replication.channels.distill import EMPTY, SCORED, Row
from composer_replication.config import ConfigError, load_config
from composer_replication.envs.base import machine_failed
from composer_replication.lm.models import load_model
from composer_replication.run.train import build_env, build_trainer
from composer_replication.sandbox.infra import GRADER_KILLED, InfraFailure


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tiny_student_and_teacher(tmp_path_factory.mktemp("route"))


def _trainer(tmp_path, tokenizer, student, teachers: dict, *extra):
    names = ", ".join(f"{{name: {n}, model: x{i}}}" for i, n in enumerate(teachers))
    cfg = load_config(None, train_overrides(
        tmp_path / "run", f"model.name={student}", "max_steps=1", "distill.weight=1",
        f"distill.teachers=[{names}]", *extra,
    ))  # fmt: skip
    student_m = load_model(str(student))
    return build_trainer(cfg, student_m, tokenizer, build_env(cfg),
                         channel_kwargs={"distill": {"models": teachers}})  # fmt: skip


def _round(tmp_path, tokenizer, student, teachers: dict, *extra):
    trainer = _trainer(tmp_path, tokenizer, student, teachers, *extra)
    rows = [trainer.train_dataset[i] for i in range(2)]
    trainer.model.train()
    return trainer, trainer._generate_and_score_completions([r for r in rows for _ in range(2)])


def _mean_logps(model, batch) -> torch.Tensor:
    """Per row, the mean log-prob ``model`` gives the completion tokens (a plain forward)."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    att = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    k = batch["completion_ids"].shape[1]
    with torch.no_grad():
        lp = torch.log_softmax(model(input_ids=ids, attention_mask=att).logits[:, -k - 1 : -1], -1)
    lp = lp.gather(2, batch["completion_ids"][..., None]).squeeze(2)
    m = batch["completion_mask"].float()
    return (lp * m).sum(1) / m.sum(1)


def test_best_route_picks_the_teacher_nearest_the_student_per_row(tmp_path, models, tokenizer):
    student, teacher = models
    near = load_model(str(student))  # the student's own weights: the nearest possible teacher
    with torch.no_grad():  # ...made slightly different so neither dominates by construction
        for p in near.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    far = load_model(str(teacher))
    trainer, batch = _round(tmp_path, tokenizer, student, {"near": near, "far": far},
                            "distill.route.type=best")  # fmt: skip
    want = torch.stack([_mean_logps(near, batch), _mean_logps(far, batch)]).argmax(0)
    assert batch["distill_teacher"].tolist() == want.tolist()
    assert (batch["distill_status"] == 0).all()
    stats = [s.stats for s in trainer.channel("distill").scorers]
    assert [s.scored_rows for s in stats] == [4, 4]  # best-of: every teacher scores every row


def test_best_route_counts_a_dead_teachers_failures_against_it(tmp_path, models, tokenizer):
    """``best`` with a live local teacher and one whose server is gone: every row goes to the
    live one (scored, nothing reported failed for the row), and the dead one's
    ``failed_rows`` counts the 4 rows it could not score. Before, it read 0: its failures
    showed nowhere in the metrics, as if it had merely never been the nearest."""
    student, teacher = models
    with socket_closed_port() as port:
        cfg = load_config(None, train_overrides(
            tmp_path / "run", f"model.name={student}", "max_steps=1", "distill.weight=1",
            "distill.route.type=best",
            f"distill.teachers=[{{name: live, model: x0}}, {{name: gone, base_url: "
            f"'http://127.0.0.1:{port}/v1', max_retries: 0, check_tokenizer: false}}]",
        ))  # fmt: skip
        trainer = build_trainer(cfg, load_model(str(student)), tokenizer, build_env(cfg),
                                channel_kwargs={"distill": {"models": {"live": load_model(
                                    str(teacher))}}})  # fmt: skip
        rows = [trainer.train_dataset[i] for i in range(2)]
        trainer.model.train()
        batch = trainer._generate_and_score_completions([r for r in rows for _ in range(2)])
    metrics = trainer.channel("distill")._row_metrics(batch)
    assert batch["distill_teacher"].tolist() == [0, 0, 0, 0]
    assert metrics["scored_frac"] == 1.0 and metrics["failed_frac"] == 0.0
    assert metrics["teacher/live/rows"] == 4.0 and metrics["teacher/live/failed_rows"] == 0.0
    assert metrics["teacher/gone/rows"] == 0.0 and metrics["teacher/gone/failed_rows"] == 4.0
    report = trainer.channel("distill").idle_report()  # what the run prints and eval.json keeps
    assert report == (
        "channel 'distill': teacher 'gone' could not score any of the 4 rows it was asked for "
        "(distill/teacher/gone/failed_rows; the first failure's reason is in the log)."
    )


def test_rows_past_the_token_budget_are_reported_over_budget(tmp_path, models, tokenizer):
    student, teacher = models
    probe, batch = _round(tmp_path / "probe", tokenizer, student, {"t": load_model(str(teacher))})
    sizes = [int(p.sum() + c.sum()) for p, c in zip(batch["prompt_mask"], batch["completion_mask"],
                                                     strict=True)]  # fmt: skip
    budget = sizes[0] + sizes[1]  # two rows' worth (the same draw: the same seed and prompts)
    trainer, batch = _round(tmp_path, tokenizer, student, {"t": load_model(str(teacher))},
                            f"distill.max_scored_tokens={budget}")  # fmt: skip
    sizes = [int(p.sum() + c.sum()) for p, c in zip(batch["prompt_mask"], batch["completion_mask"],
                                                     strict=True)]  # fmt: skip
    fits = [sum(sizes[: r + 1]) <= budget for r in range(4)]  # the rows that fit, in order
    assert 0 < sum(fits) < 4  # row 0 always fits (a prompt + <= 4 tokens), all 4 never do
    assert batch["distill_status"].tolist() == [0 if f else 3 for f in fits]  # 3: over budget
    metrics = trainer.channel("distill")._row_metrics(batch)
    assert metrics["over_budget_frac"] == 1 - sum(fits) / 4
    assert metrics["teacher/t/rows"] == sum(fits)


def test_the_spent_budget_survives_a_checkpoint(tmp_path, models, tokenizer):
    """A resumed run keeps counting where the checkpoint stopped: restored from the channel's
    saved state, it refuses the rows the uninterrupted run refuses; a fresh channel (what a
    resume without the saved counters would be) would score them again."""
    student, teacher = models
    t = load_model(str(teacher))
    _, batch = _round(tmp_path / "probe", tokenizer, student, {"t": t})
    sizes = [int(p.sum() + c.sum()) for p, c in zip(batch["prompt_mask"], batch["completion_mask"],
                                                     strict=True)]  # fmt: skip
    budget = f"distill.max_scored_tokens={sizes[0] + sizes[1]}"
    ran, _ = _round(tmp_path / "ran", tokenizer, student, {"t": t}, budget)
    ckpt = tmp_path / "checkpoint-1"
    ckpt.mkdir()
    ran.channel("distill").save(str(ckpt))
    resumed = _trainer(tmp_path / "resumed", tokenizer, student, {"t": t}, budget)
    resumed.channel("distill").load(str(ckpt))
    fresh = _trainer(tmp_path / "fresh", tokenizer, student, {"t": t}, budget)

    def admitted(trainer):
        rows = [Row([0] * size, 0, 1, routed=[0]) for size in sizes[:4]]
        trainer.channel("distill")._within_budget(rows)
        return [r for r, row in enumerate(rows) if 0 in row.asked]

    assert ran.channel("distill").scorers[0].stats.scored_tokens == sizes[0] + sizes[1]
    assert resumed.channel("distill").scorers[0].stats == ran.channel("distill").scorers[0].stats
    assert admitted(resumed) == admitted(ran) == []
    assert admitted(fresh) == [0, 1]
    with pytest.raises(ConfigError, match="distill_channel.rank0.json: missing"):
        fresh.channel("distill").load(str(tmp_path))
    # two processes: each scores against half the budget and checkpoints its own counters
    fresh.channel("distill").world = 2
    half = [r for r in range(4) if sum(sizes[: r + 1]) <= (sizes[0] + sizes[1]) / 2]
    assert admitted(fresh) == half and half != [0, 1]
    fresh.channel("distill").rank = 1
    fresh.channel("distill").save(str(ckpt))
    assert (ckpt / "distill_channel.rank1.json").is_file()


def test_a_resume_by_another_number_of_processes_shares_the_spent_budget(tmp_path):
    """Saved by 2 processes, resumed by 1, 2 or 3: with as many, each takes its own counters
    back; otherwise the sum is shared equally (integers split exactly), so the run as a whole
    keeps what it spent against the budget instead of dropping a process's spending."""
    from types import SimpleNamespace

    from composer_replication.channels import DistillChannel
    from composer_replication.teachers.scoring import ScoreStats

    cfg = load_config(None, ["distill.weight=1", "distill.teachers=runs/t/final"]).distill
    saved = [ScoreStats(requests=3, scored_tokens=101, cost_usd=0.5),
             ScoreStats(requests=2, scored_tokens=50, cost_usd=0.25)]  # fmt: skip
    for rank, stats in enumerate(saved):
        ch = DistillChannel(cfg)
        ch.rank, ch.world = rank, 2
        ch.scorers = [SimpleNamespace(spec=SimpleNamespace(name="t"), stats=stats)]
        ch.save(str(tmp_path))

    def resumed(world: int) -> list[ScoreStats]:
        out = []
        for rank in range(world):
            ch = DistillChannel(cfg)
            ch.rank, ch.world = rank, world
            ch.scorers = [SimpleNamespace(spec=SimpleNamespace(name="t"), stats=ScoreStats())]
            ch.load(str(tmp_path))
            out.append(ch.scorers[0].stats)
        return out

    assert resumed(2) == saved
    assert resumed(1) == [ScoreStats(requests=5, scored_tokens=151, cost_usd=0.75)]
    three = resumed(3)
    assert [s.scored_tokens for s in three] == [51, 50, 50]
    assert sum(s.requests for s in three) == 5
    assert sum(s.cost_usd for s in three) == pytest.approx(0.75)


def test_a_resume_loads_only_the_channels_the_checkpoint_recorded(
    tmp_path, models, tokenizer, monkeypatch
):
    """The trainer's resume (HF's own loading stubbed out): a checkpoint trained without the
    distill channel, resumed with it added (``resume_override_channels``), starts the channel
    fresh; one that recorded it but lost its counter file is refused, naming the file."""
    import transformers

    from composer_replication.config import CHANNELS_FILE

    student, teacher = models
    monkeypatch.setattr(transformers.Trainer, "train", lambda self, *a, **kw: "trained")
    trainer = _trainer(tmp_path, tokenizer, student, {"t": load_model(str(teacher))},
                       "resume_override_channels=true")  # fmt: skip
    ckpt = tmp_path / "checkpoint-1"
    ckpt.mkdir()
    (ckpt / CHANNELS_FILE).write_text("{}")
    assert trainer.train(resume_from_checkpoint=str(ckpt)) == "trained"
    assert trainer.channel("distill").scorers[0].stats.requests == 0
    settings = {"distill": trainer.channel("distill").settings()}
    (ckpt / CHANNELS_FILE).write_text(json.dumps(settings))
    with pytest.raises(ConfigError, match=r"distill_channel\.rank0\.json: missing"):
        trainer.train(resume_from_checkpoint=str(ckpt))


def test_rows_the_machine_failed_are_sent_to_no_teacher(tmp_path, models, tokenizer):
    """The first group's two gradings failed on the machine (trainer/masking.py masks them):
    no teacher is asked to score them (``EMPTY``: nothing to score), the other group's rows
    are scored as before."""
    student, teacher = models
    trainer = _trainer(tmp_path, tokenizer, student, {"t": load_model(str(teacher))})
    env = trainer.reward_funcs[0].env
    graded = env.grade_batch

    def first_group_lost(tasks, completions):
        out = graded(tasks, completions)
        lost = machine_failed("", InfraFailure(GRADER_KILLED, "planted"))
        return [lost, lost, *out[2:]]

    env.grade_batch = first_group_lost
    rows = [trainer.train_dataset[i] for i in range(2)]
    trainer.model.train()
    batch = trainer._generate_and_score_completions([r for r in rows for _ in range(2)])
    assert batch["infra_masked"].tolist() == [True, True, False, False]
    assert batch["distill_status"].tolist() == [EMPTY, EMPTY, SCORED, SCORED]
