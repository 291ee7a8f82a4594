"""The distillation channel end to end on tiny random models that share the embedded
tokenizer (student seed 0, teachers other seeds): ``composer-replication train
distill.weight=... distill.teachers=...`` with a local teacher, and with ``composer-replication
serve`` as a remote teacher over 127.0.0.1 (vLLM's top-k ``prompt_logprobs``), each 2 steps
with every extra channel non-zero; two teachers routed by task each score only their rows; a
teacher that fails leaves its rows reported unscored; a teacher with another tokenizer is
refused before any model loads. Every step's row in ``metrics.jsonl`` has the teachers'
scoring seconds (``distill/teacher_forward_s``).

The random student never answers right, so GRPO's advantages (and ``policy/loss``) are 0
here: the extra channels are the whole update, which is what these tests look at."""

from __future__ import annotations

import pytest
import torch
from support.distill import (
    ServeProcess,
    other_tokenizer_model,
    socket_closed_port,
    tiny_student_and_teacher,
    train_one_step,
    train_overrides,
)
from typer.testing import CliRunner

from composer_replication.cli import app
from composer_replication.config import load_config
from composer_replication.lm.models import backbone, load_model
from composer_replication.run.train import build_env, build_trainer
from composer_replication.trainer.callbacks import read_metrics

ALL_CHANNELS = ("alpha_sdpo=0.5", "sdpo.hint_sources=[feedback]", "beta_replay=0.5")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tiny_student_and_teacher(tmp_path_factory.mktemp("distill"))


def _train_cli(out, student, *extra):
    args = ["train", *train_overrides(out, f"model.name={student}", *ALL_CHANNELS, *extra)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = read_metrics(f"{out}/metrics.jsonl")
    assert len(rows) == 2
    for row in rows:
        for ch in ("distill", "sdpo", "replay"):
            assert row[f"{ch}/active"] == 1.0 and row[f"{ch}/loss"] > 0, (ch, row)
        assert row["distill/scored_frac"] == 1.0 and row["distill/failed_frac"] == 0.0
        # the teachers' share of the step, in seconds: measured, and part of the step's time
        assert 0.0 < row["distill/teacher_forward_s"] < row["step_time"], row
    return rows


def test_train_with_a_local_teacher_every_channel_nonzero(tmp_path, models):
    student, teacher = models
    rows = _train_cli(tmp_path / "run", student, "distill.weight=0.5",
                      f"distill.teachers={teacher}", "distill.loss.type=jsd")  # fmt: skip
    assert all(r["distill/teacher/teacher0/rows"] == 4.0 for r in rows)
    assert rows[0]["distill/divergence_per_token"] > 0


def test_train_with_serve_as_a_remote_teacher_top_k_prompt_logprobs(tmp_path, models, tokenizer):
    """One ``serve`` process: what it answers over HTTP (top-k with ranks, the sampled token
    always included) is what the same model computes in process, and a run distills from it."""
    student, teacher = models
    with ServeProcess(teacher) as srv:
        _same_scores_over_http(srv.base_url, teacher, tokenizer)
        teachers = f"[{{name: served, base_url: '{srv.base_url}', model: teacher, top_k: 5}}]"
        rows = _train_cli(tmp_path / "run", student, "distill.weight=0.5",
                          f"distill.teachers={teachers}", "distill.loss.type=jsd")  # fmt: skip
    for row in rows:
        assert row["distill/teacher/served/rows"] == 4.0
        assert row["distill/teacher/served/failed_rows"] == 0.0
    assert rows[-1]["distill/teacher/served/requests"] >= 2  # batched: 4 rows a request, 2 steps


def _same_scores_over_http(base_url, teacher, tokenizer) -> None:
    import asyncio

    from composer_replication.config import LocalTeacherConfig, RemoteTeacherConfig
    from composer_replication.teachers.scoring import LocalScorer, RemoteScorer

    seqs = [tokenizer("What is 2 + 3? The answer is 5.")["input_ids"], [1, 2, 3, 4, 5, 6]]
    plens = [4, 2]
    local = LocalScorer(LocalTeacherConfig(name="t", model=str(teacher)), "cpu")
    want = local.score(seqs, plens, 3, 0)
    remote = RemoteScorer(RemoteTeacherConfig(name="t", base_url=base_url, top_k=3))
    got = asyncio.run(remote.ascore(seqs, plens, 3, 0))
    for w, g in zip(want, got, strict=True):
        assert g.top_ids == w.top_ids
        close = {"atol": 1e-4, "rtol": 0}
        torch.testing.assert_close(torch.tensor(g.actual), torch.tensor(w.actual), **close)
        torch.testing.assert_close(torch.tensor(g.top_logps), torch.tensor(w.top_logps), **close)


def test_two_teachers_routed_by_task_each_score_only_their_rows(tmp_path, models, tokenizer):
    """Level-1 problems go to teacher ``one``, level-2 ones to ``two``: each teacher's forward
    sees exactly its rows' problems, and the metrics count its rows."""
    student, teacher = models
    cfg = load_config(None, train_overrides(
        tmp_path / "run", f"model.name={student}", "env.levels=[1,2]", "max_steps=1",
        "generation.prompts_per_step=4", "env.num_train=64", "distill.weight=1",
        f"distill.teachers=[{{name: one, model: {teacher}}}, {{name: two, model: {teacher}}}]",
        "distill.route={type: column, column: task_id, match: {one: ['L1:*'], two: ['L2:*']}}",
    ))  # fmt: skip
    one, two = load_model(str(teacher)), load_model(str(teacher))
    seen = {"one": [], "two": []}
    for name, m in (("one", one), ("two", two)):
        backbone(m).register_forward_pre_hook(
            lambda _m, _a, kw, name=name: seen[name].extend(kw["input_ids"].tolist()),
            with_kwargs=True,
        )
    env = build_env(cfg)
    trainer = build_trainer(cfg, load_model(str(student)), tokenizer, env,
                            channel_kwargs={"distill": {"models": {"one": one, "two": two}}})  # fmt: skip
    dataset = [trainer.train_dataset[i] for i in range(len(trainer.train_dataset))]
    rows = [r for r in dataset if r["task_id"][:2] == "L1"][:2]
    rows += [r for r in dataset if r["task_id"][:2] == "L2"][:2]
    assert len(rows) == 4, "the draw needs two problems of each level"
    trainer.model.train()
    batch = trainer._generate_and_score_completions([r for r in rows for _ in range(2)])
    levels = [r["task_id"][:2] for r in rows for _ in range(2)]
    assert batch["distill_teacher"].tolist() == [0 if lv == "L1" else 1 for lv in levels]
    tasks = {t.task_id: t for t in env.tasks("train")}
    for name, level in (("one", "L1"), ("two", "L2")):
        texts = [tokenizer.decode(ids) for ids in seen[name]]
        mine = [env.user_message(tasks[r["task_id"]]) for r in rows if r["task_id"][:2] == level]
        others = [env.user_message(tasks[r["task_id"]]) for r in rows if r["task_id"][:2] != level]
        assert len(mine) == 2 and len(texts) == 4  # its 4 rows (2 problems x 2), nobody else's
        assert all(any(m in t for m in mine) for t in texts)
        assert not any(o in t for o in others for t in texts)
    metrics = trainer.channel("distill")._row_metrics(batch)
    assert metrics["teacher/one/rows"] == 4.0 and metrics["teacher/two/rows"] == 4.0


def test_a_failing_teacher_leaves_its_rows_reported_unscored(tmp_path, models, tokenizer):
    """Nothing listens at the teacher's address: every row is reported failed, the channel
    inactive (an exact 0, never a silent one), and the end-of-run report names it."""
    student, _ = models
    with socket_closed_port() as port:
        cfg = load_config(None, train_overrides(
            tmp_path / "run", f"model.name={student}", "max_steps=1", "distill.weight=1",
            f"distill.teachers=[{{name: gone, base_url: 'http://127.0.0.1:{port}/v1', "
            "max_retries: 0, check_tokenizer: false}]",
        ))  # fmt: skip
        trainer = build_trainer(cfg, load_model(str(student)), tokenizer, build_env(cfg))
        trainer.train()
    row = read_metrics(f"{cfg.output_dir}/metrics.jsonl")[0]
    assert row["distill/active"] == 0.0 and row["distill/num_tokens"] == 0.0
    assert row["distill/failed_frac"] == 1.0 and row["distill/teacher/gone/failed_rows"] == 4.0
    assert any("'distill'" in r for r in trainer.channel_reports)


def test_a_teacher_with_another_tokenizer_is_refused_before_any_model_loads(
    tmp_path, models, monkeypatch
):
    student, _ = models
    other = other_tokenizer_model(tmp_path)
    loaded = []
    monkeypatch.setattr(
        "composer_replication.lm.models.load_model", lambda *a, **k: loaded.append(a)
    )
    args = ["train", *train_overrides(tmp_path / "run", f"model.name={student}",
                                      "distill.weight=1", f"distill.teachers={other}")]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert "does not use the student's tokenizer" in " ".join(result.output.split())
    assert "cross-tokenizer distillation is not supported" in " ".join(result.output.split())
    assert loaded == [] and not (tmp_path / "run").exists()
    assert "full config" not in result.output  # refused before the run header


def test_an_unset_api_key_is_one_line_before_any_model_loads(tmp_path, models, monkeypatch):
    """``api_key_env`` names a variable that is not set (the tokenizer check off, so nothing
    else asks the server first): the run stops with that line, nothing loaded or written."""
    student, _ = models
    loaded = []
    monkeypatch.setattr(
        "composer_replication.lm.models.load_model", lambda *a, **k: loaded.append(a)
    )
    monkeypatch.delenv("CR_TEST_TEACHER_KEY", raising=False)
    teachers = ("[{name: paid, base_url: 'http://127.0.0.1:9/v1', check_tokenizer: false, "
                "api_key_env: CR_TEST_TEACHER_KEY}]")  # fmt: skip
    args = ["train", *train_overrides(tmp_path / "run", f"model.name={student}",
                                      "distill.weight=1", f"distill.teachers={teachers}")]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "CR_TEST_TEACHER_KEY is not set" in " ".join(result.output.split())
    assert loaded == [] and not (tmp_path / "run").exists()


def test_distillation_alone_policy_weight_zero(tmp_path, models, tokenizer):
    """``grpo.weight=0``: the step's loss is the distillation term alone (the policy loss is
    still computed and logged unweighted)."""
    student, teacher = models
    _, row = train_one_step(tmp_path / "run", tokenizer, student, "grpo.weight=0",
                            "distill.weight=1", f"distill.teachers={teacher}")  # fmt: skip
    assert row["policy/weight"] == 0.0 and row["distill/active"] == 1.0
    assert row["total/loss"] == pytest.approx(row["distill/loss"], abs=1e-7)
    assert row["distill/loss"] != 0.0


def test_as_advantage_folds_the_teacher_into_grpo_advantages(tmp_path, models, tokenizer):
    """``distill.loss.as_advantage``: the advantages TRL's loss reads become ``[B, K]`` = GRPO's
    own (all 0 here: every reply wrong) + ``weight * (log q(y) - log p(y))`` on the scored
    tokens, ``p`` the policy TRL's loss takes as old (here its own forward: the first use of
    the batch), and the policy loss trains it (non-zero although no reply was rewarded); the
    channel's own term is an exact 0."""
    student, teacher = models
    cfg = load_config(None, train_overrides(
        tmp_path / "run", f"model.name={student}", "max_steps=1", "distill.weight=0.5",
        f"distill.teachers={teacher}", "distill.loss.as_advantage=true",
    ))  # fmt: skip
    trainer = build_trainer(cfg, load_model(str(student)), tokenizer, build_env(cfg))
    channel = trainer.channel("distill")
    seen = []

    def spy(batch, logps_BK):
        before = batch["advantages"].clone()
        real(batch, logps_BK)
        seen.append((dict(batch), before))

    real, channel.see_policy_logps = channel.see_policy_logps, spy
    trainer.train()
    ((batch, before),) = seen  # one micro-batch, one loss: one fold
    student_m, teacher_m = load_model(str(student)), load_model(str(teacher))  # the weights then
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    att = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    k = batch["completion_ids"].shape[1]
    with torch.no_grad():
        lp = [torch.log_softmax(m(input_ids=ids, attention_mask=att).logits[:, -k - 1 : -1], -1)
              .gather(2, batch["completion_ids"][..., None]).squeeze(2) for m in (student_m, teacher_m)]  # fmt: skip
    mask = batch["completion_mask"].bool()
    want = 0.5 * (lp[1] - lp[0])
    assert before.dim() == 1 and (before == 0).all()  # GRPO's own, untouched until the loss
    assert batch["advantages"].shape == mask.shape
    torch.testing.assert_close(batch["advantages"][mask], want[mask], atol=2e-4, rtol=0)
    assert (batch["advantages"][~mask] == 0).all()
    row = read_metrics(f"{cfg.output_dir}/metrics.jsonl")[0]
    assert row["reward"] == 0.0 and row["policy/loss"] != 0.0
    assert row["distill/loss"] == 0.0 and row["distill/active"] == 1.0
