"""What the distill channel does with teacher answers it cannot use, and with a local teacher
whose head is padded to another size (tiny random models, one scored generation round or one
step): a server naming token ids outside the student's vocabulary fails those rows (reported,
the reason logged once per teacher and kind), never an index error inside the loss; a teacher
with more head rows than the student (Qwen2.5-7B's 152064 against 0.5B's 151936, the same
tokenizer) scores and trains over the rows both heads have, and a student head padded past the
teacher's never hands the teacher an id it cannot read."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from fastapi import FastAPI
from support.distill import tiny_student_and_teacher, train_one_step, train_overrides
from support.scripted_openai import ServerThread

from composer_replication.channels.distill import FAILED
from composer_replication.config import ConfigError, load_config
from composer_replication.lm.models import head_weight, load_model
from composer_replication.run.train import build_env, build_trainer


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tiny_student_and_teacher(tmp_path_factory.mktemp("answers"))


def _server(extra_id: int) -> FastAPI:
    """vLLM's protocol; every position also reports ``extra_id`` in its top-k."""
    app = FastAPI()

    @app.post("/v1/completions")
    async def completions(req: dict):
        def entry(t: int) -> dict:
            return {str(t): {"logprob": -1.0, "rank": 1}, str(extra_id): {"logprob": -2.0}}

        return {"choices": [{"index": i, "text": "", "prompt_logprobs": [None] + [
            entry(t) for t in p[1:]]} for i, p in enumerate(req["prompt"])]}  # fmt: skip

    return app


def test_token_ids_outside_the_vocabulary_fail_their_rows(tmp_path, models, tokenizer, caplog):
    student, _ = models
    vocab = len(tokenizer)
    with ServerThread(_server(vocab + 5)) as srv:
        cfg = load_config(None, train_overrides(
            tmp_path / "run", f"model.name={student}", "max_steps=1", "distill.weight=1",
            "distill.loss.type=jsd",
            f"distill.teachers=[{{name: wide, base_url: '{srv.base_url}', model: m, top_k: 2, "
            "check_tokenizer: false}]",
        ))  # fmt: skip
        trainer = build_trainer(cfg, load_model(str(student)), tokenizer, build_env(cfg))
        assert head_weight(trainer.model).shape[0] == vocab
        rows = [trainer.train_dataset[i] for i in range(2)]
        with caplog.at_level(logging.WARNING, "composer_replication.channels.distill"):
            for _ in range(2):  # two rounds: the reason is logged once
                batch = trainer._generate_and_score_completions([r for r in rows for _ in "ab"])
    assert (batch["distill_status"] == FAILED).all()
    stats = trainer.channel("distill").scorers[0].stats
    assert stats.failed_rows == 8 and stats.scored_rows == 0
    said = [r.getMessage() for r in caplog.records if "could not score" in r.getMessage()]
    assert len(said) == 1 and f"token id {vocab + 5} is outside" in said[0], said


def _padded(root, tokenizer, rows: int, seed: int = 3, loud: bool = False):
    """A tiny model over the same tokenizer whose head has ``rows`` rows; ``loud``: its rows
    past the tokenizer scaled up so they hold most of its probability (the worst padding)."""
    from conftest import make_tiny_model

    out = root / f"padded{rows}-{seed}"
    model = make_tiny_model(rows, seed=seed)
    if loud:
        with torch.no_grad():
            head_weight(model)[len(tokenizer) :] *= 50.0
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.mark.parametrize("loss", ["jsd", "jsd_top_k", "reverse_kl"])
def test_a_teacher_head_padded_past_the_students_scores_over_the_shared_rows(
    tmp_path, models, tokenizer, loss
):
    """Even padding that holds most of the teacher's mass never fails a row: the teacher is
    scored over the student's rows only (full-vocabulary JSD, its top-k, the sampled token)."""
    student, _ = models
    teacher = _padded(tmp_path, tokenizer, len(tokenizer) + 64, loud=True)
    kind = {"jsd": ["distill.loss.type=jsd"], "reverse_kl": ["distill.loss.type=reverse_kl"],
            "jsd_top_k": ["distill.loss.type=jsd", "distill.loss.top_k=4"]}[loss]  # fmt: skip
    _, row = train_one_step(tmp_path / "run", tokenizer, student, "distill.weight=1", *kind,
                            f"distill.teachers={teacher}")  # fmt: skip
    assert row["distill/active"] == 1.0 and row["distill/scored_frac"] == 1.0, row
    assert math.isfinite(row["distill/loss"]) and row["distill/loss"] != 0.0


def test_a_student_head_padded_past_the_teachers_trains_the_full_vocabulary_loss(
    tmp_path, tokenizer
):
    student = _padded(tmp_path, tokenizer, len(tokenizer) + 64, seed=0)
    teacher = _padded(tmp_path, tokenizer, len(tokenizer), seed=1)
    _, row = train_one_step(tmp_path / "run", tokenizer, student, "distill.weight=1",
                            "distill.loss.type=jsd", f"distill.teachers={teacher}")  # fmt: skip
    assert row["distill/active"] == 1.0 and row["distill/divergence_per_token"] > 0


def test_an_id_past_the_teachers_embedding_fails_its_row_only(tmp_path, tokenizer):
    """What a student head padded past the teacher's can sample: the row is malformed, read
    as padding (on a GPU an out-of-range index is a device assert that ends the process)."""
    from composer_replication.config import LocalTeacherConfig
    from composer_replication.teachers.edge import TeacherError
    from composer_replication.teachers.scoring import LocalScorer, RowScores

    teacher = _padded(tmp_path, tokenizer, len(tokenizer), seed=1)
    scorer = LocalScorer(LocalTeacherConfig(name="t", model=str(teacher)), "cpu")
    seqs = [[5, 6, 7, 8], [5, 6, len(tokenizer) + 3, 8]]
    rows = scorer.score(seqs, [2, 2], top_k=2, pad_id=0)
    assert isinstance(rows[0], RowScores) and len(rows[0].actual) == 2
    assert isinstance(rows[1], TeacherError) and rows[1].kind == "malformed"
    assert scorer.last_hidden.shape[0] == 2  # row order kept for the full-vocabulary loss
    assert scorer.stats.scored_rows == 1 and scorer.stats.failed_rows == 1


def test_a_head_smaller_than_the_tokenizer_is_refused_at_setup(tmp_path, models, tokenizer):
    student, _ = models
    teacher = _padded(tmp_path, tokenizer, len(tokenizer) - 8)
    cfg = load_config(None, train_overrides(
        tmp_path / "run", f"model.name={student}", "max_steps=1", "distill.weight=1",
        "distill.loss.type=jsd", f"distill.teachers={teacher}",
    ))  # fmt: skip
    with pytest.raises(ConfigError, match=r"cover the tokenizer's \d+ ids"):
        build_trainer(cfg, load_model(str(student)), tokenizer, build_env(cfg))


def test_a_head_smaller_than_the_tokenizer_is_refused_before_any_model_loads(
    tmp_path, models, tokenizer, monkeypatch
):
    """The same refusal, from the configs' vocab_size, before a weight is read (it used to
    come only when the channel was built, after both models had loaded); a top-k loss, which
    needs no shared head, is not refused."""
    from typer.testing import CliRunner

    from composer_replication.cli import app

    student, _ = models
    teacher = _padded(tmp_path, tokenizer, len(tokenizer) - 8)
    loaded = []
    monkeypatch.setattr(
        "composer_replication.lm.models.load_model", lambda *a, **k: loaded.append(a)
    )
    args = ["train", *train_overrides(tmp_path / "run", f"model.name={student}",
                                      "distill.weight=1", "distill.loss.type=jsd",
                                      f"distill.teachers={teacher}")]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "cover the tokenizer's" in " ".join(result.output.split())
    assert loaded == [] and not (tmp_path / "run").exists()
    from composer_replication.teachers.scoring import check_same_tokenizer

    cfg = load_config(None, train_overrides(tmp_path / "r2", f"model.name={student}",
                                            "distill.weight=1", f"distill.teachers={teacher}"))  # fmt: skip
    check_same_tokenizer(str(student), cfg.distill.teachers, full_vocab=False)  # no error
