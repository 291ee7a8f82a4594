"""The channel life cycle in the trainer, on a tiny random model: config aliases, pairs per
optimizer step, TAID's schedule input, resume refusing changed channel settings (before any
model loads), and the report of a channel that never fired."""

from __future__ import annotations

import json

import pytest

import composer_replication.channels.replay as replay_mod
import composer_replication.channels.self_distill as sd_mod
import composer_replication.run.train as run_mod
from composer_replication.config import ChannelSettingsError, load_config
from composer_replication.run.preflight import check_resume
from composer_replication.run.train import build_env, build_trainer
from composer_replication.trainer.callbacks import read_metrics


@pytest.fixture
def pairs_file(tmp_path):
    path = tmp_path / "pairs.jsonl"
    rows = [
        {"prompt": f"What is {i} + 2?", "chosen": str(i + 2), "rejected": str(i + 3)}
        for i in range(6)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _cfg(tmp_path, *extra):
    return load_config(
        None,
        [
            f"output_dir={tmp_path / 'run'}",
            "max_steps=1",
            "optim.warmup_steps=0",
            "generation.num_generations=4",
            "generation.prompts_per_step=2",
            "generation.max_completion_length=4",
            "env.num_train=8",
            "env.levels=[3]",
            *extra,
        ],
    )


def _train(cfg, tokenizer, model, resume=None):
    trainer = build_trainer(cfg, model, tokenizer, build_env(cfg))
    trainer.train(resume_from_checkpoint=resume)
    return trainer, read_metrics(f"{cfg.output_dir}/metrics.jsonl")


def test_aliases_and_sections_give_one_config_and_the_same_metrics(tmp_path, tokenizer, pairs_file):
    from conftest import make_tiny_model

    old = _cfg(tmp_path / "a", "alpha_sdpo=0.1", "beta_replay=0.05", f"replay.dataset={pairs_file}")
    new = _cfg(
        tmp_path / "a", "sdpo.weight=0.1", "replay.weight=0.05", f"replay.dataset={pairs_file}"
    )
    assert old == new and old.sdpo.weight == 0.1 and old.replay.weight == 0.05
    keys = []
    for name, cfg in (("a", old), ("b", new)):
        cfg = cfg.model_copy(update={"output_dir": str(tmp_path / name)})
        _, rows = _train(cfg, tokenizer, make_tiny_model(len(tokenizer)))
        keys.append(set(rows[-1]))
    assert keys[0] == keys[1]
    assert {"sdpo/loss", "sdpo/weight", "replay/loss", "replay/weight"} <= keys[0]


def test_replay_draws_pairs_per_optimizer_step(
    tmp_path, tokenizer, tiny_model, pairs_file, monkeypatch
):
    """pairs_per_step=3 with 2 micro-batches per step: 3 pairs a step (dealt 1 + 2), each scored
    with the model in train mode; the loss divisor is the step's 3 pairs."""
    seen = []
    real = replay_mod.pair_logps

    def spy(model, pairs, pad_id, reduction, shared_prefix=True):
        if not hasattr(spy, "in_setup"):
            seen.append((len(pairs), model.training))
        return real(model, pairs, pad_id, reduction, shared_prefix)

    cfg = _cfg(
        tmp_path,
        "replay.weight=0.5",
        f"replay.dataset={pairs_file}",
        "replay.pairs_per_step=3",
        "optim.gradient_accumulation_steps=2",
        "max_steps=2",
    )
    spy.in_setup = True  # the DPO reference pass in setup is not a training draw
    monkeypatch.setattr(replay_mod, "pair_logps", spy)
    trainer = build_trainer(cfg, tiny_model, tokenizer, build_env(cfg))
    del spy.in_setup
    trainer.train()
    assert [n for n, _ in seen] == [1, 2, 1, 2]
    assert all(training for _, training in seen)
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["replay/num_pairs"] for r in rows] == [3.0, 3.0]  # the step's 3 pairs (2 + 1)


def test_taid_schedule_gets_the_steps_token_weighted_objective(
    tmp_path, tokenizer, tiny_model, monkeypatch
):
    """TAID's update takes the step's objective (upstream's cross-entropy), weighted by tokens
    over all micro-batches of the step, not the last micro-batch's KL."""
    calls, updates = [], []
    real = sd_mod.self_distill_loss

    def spy_loss(inputs):
        loss, m = real(inputs)
        calls.append((float(m["cross_entropy"]), float(m["num_tokens"])))
        return loss, m

    monkeypatch.setattr(sd_mod, "self_distill_loss", spy_loss)
    cfg = _cfg(
        tmp_path,
        "sdpo.weight=1.0",
        "sdpo.loss.type=taid",
        "sdpo.loss.t_start=0.2",
        "optim.gradient_accumulation_steps=2",
        "max_steps=2",
    )
    trainer = build_trainer(cfg, tiny_model, tokenizer, build_env(cfg))
    taid = trainer.channel("sdpo").taid
    real_update = taid.update_t
    monkeypatch.setattr(taid, "update_t", lambda v, s: updates.append(v) or real_update(v, s))
    trainer.train()
    assert taid.t_start == 0.2
    assert len(calls) == 4 and len(updates) == 2
    for step, value in enumerate(updates):
        part = calls[2 * step : 2 * step + 2]
        expected = sum(ce * n for ce, n in part) / sum(n for _, n in part)
        assert value == pytest.approx(expected, rel=1e-6)
        assert value != pytest.approx(part[-1][0], rel=1e-9) or part[0] == part[1]


def test_resume_refuses_other_channel_settings_before_loading_a_model(
    tmp_path, tokenizer, tiny_model, monkeypatch
):
    cfg = _cfg(tmp_path, "sdpo.weight=0.5")
    _train(cfg, tokenizer, tiny_model)
    ckpt = tmp_path / "run" / "checkpoint-1"
    assert json.loads((ckpt / "channels.json").read_text())["sdpo"]["weight"] == 0.5
    changed = _cfg(tmp_path, "alpha_sdpo=0.3", "sdpo.loss.type=taid", "resume_from=latest")
    monkeypatch.setattr(run_mod, "prepare", lambda cfg: pytest.fail("a model was loaded"))
    with pytest.raises(ChannelSettingsError) as err:
        run_mod.run_training(changed)
    msg = str(err.value)
    assert "sdpo.weight: checkpoint 0.5, config 0.3" in msg
    assert "sdpo.loss:" in msg and "resume_override_channels=true" in msg
    off = _cfg(tmp_path, "resume_from=latest")  # channel switched off
    with pytest.raises(ChannelSettingsError, match="sdpo: enabled in the checkpoint only"):
        check_resume(off)
    same = _cfg(tmp_path, "sdpo.weight=0.5", "resume_from=latest")
    assert check_resume(same) == str(ckpt)
    forced = changed.model_copy(update={"resume_override_channels": True})
    assert check_resume(forced) == str(ckpt)
    # the trainer itself checks too, for users who build it without run_training
    from conftest import make_tiny_model

    trainer = build_trainer(changed, make_tiny_model(len(tokenizer)), tokenizer, build_env(changed))
    with pytest.raises(ChannelSettingsError):
        trainer.train(resume_from_checkpoint=str(ckpt))


def test_a_channel_that_never_fired_is_reported(tmp_path, tokenizer, tiny_model):
    """Only sibling hints, and a random model solves nothing: no row gets a hint on any step."""
    cfg = _cfg(tmp_path, "sdpo.weight=1.0", "sdpo.hint_sources=[sibling]", "max_steps=2")
    trainer, rows = _train(cfg, tokenizer, tiny_model)
    assert [r["sdpo/active"] for r in rows] == [0.0, 0.0]
    assert len(trainer.channel_reports) == 1
    report = trainer.channel_reports[0]
    assert "'sdpo'" in report and "inactive on all 2 training steps" in report
    fired = _cfg(tmp_path / "b", "sdpo.weight=1.0", "sdpo.hint_sources=[feedback]")
    trainer, rows = _train(fired, tokenizer, tiny_model)
    assert rows[-1]["sdpo/active"] == 1.0 and trainer.channel_reports == []


def test_dpo_loss_is_log2_before_the_first_update(tmp_path, tokenizer, tiny_model, pairs_file):
    """At step 1 the policy still has the initial weights, so every pair's policy log-ratio
    equals the reference one: DPO's loss is -log sigmoid(0) = log 2 = 0.693147. This holds only
    if the policy scores pairs (in train mode, gradient checkpointing on) exactly as the
    reference pass did (eval mode) -- prompt included."""
    cfg = _cfg(
        tmp_path, "replay.weight=1.0", f"replay.dataset={pairs_file}", "replay.pairs_per_step=4"
    )
    _, rows = _train(cfg, tokenizer, tiny_model)
    assert rows[0]["replay/num_pairs"] == 4
    assert rows[0]["replay/loss"] == pytest.approx(0.693147, abs=1e-5)
