"""Channels 2 and 3 in the trainer on a tiny random model: what the teacher forward really ran
(the hint, the problem, the same completion); reference log-probs are real forwards of the
initial model; pairs per optimizer step; TAID fed with the step's objective; resume refuses
changed channel settings; a channel that never fired is reported."""

from __future__ import annotations

import json

import pytest
import torch

from composer_replication.channels import SelfDistillChannel
from composer_replication.channels.replay import (
    PreferenceDataError,
    collate,
    load_pairs,
    response_logps,
)
from composer_replication.config import SdpoConfig, load_config
from composer_replication.envs.arithmetic import grade_answer
from composer_replication.lm.models import backbone
from composer_replication.run.train import build_env, build_trainer
from composer_replication.trainer.callbacks import read_metrics


@pytest.fixture
def pairs_file(tmp_path):
    path = tmp_path / "pairs.jsonl"
    with path.open("w") as fh:
        for i in range(5):
            fh.write(
                json.dumps(
                    {
                        "prompt": [{"role": "user", "content": f"What is {i} + 2?"}],
                        "chosen": [{"role": "assistant", "content": str(i + 2)}],
                        "rejected": [
                            {
                                "role": "assistant",
                                "content": "",
                                "tool_calls": [
                                    {
                                        "id": "c",
                                        "type": "function",
                                        "function": {
                                            "name": "calc",
                                            "arguments": json.dumps({"x": i}),
                                        },
                                    }
                                ],
                            }
                        ],
                    }
                )
                + "\n"
            )
    return path


def _cfg(tmp_path, *extra):
    return load_config(
        None,
        [
            f"output_dir={tmp_path / 'run'}",
            "max_steps=1",
            "optim.warmup_steps=0",  # the quickstart warms up 8 steps: lr 0 at step 1
            "generation.num_generations=4",
            "generation.prompts_per_step=2",
            "generation.max_completion_length=5",
            "env.num_train=8",
            "env.levels=[3]",
            *extra,
        ],
    )


def _record_forwards(net):
    """Forward pre-hook on ``net`` recording every call's (input_ids, attention_mask)."""
    calls = []

    def hook(_module, args, kwargs):
        calls.append((kwargs["input_ids"].clone(), kwargs["attention_mask"].clone()))

    return calls, net.register_forward_pre_hook(hook, with_kwargs=True)


def test_teacher_forward_runs_hint_problem_and_the_same_completion(tmp_path, tokenizer, tiny_model):
    """Record what the teacher's forward really received (the prefix-cache path: the group's
    shared prompt, then each hinted row's rest + completion) and read it back as text: each
    hinted row's sequence holds the problem, the verifier's feedback naming the right answer,
    and ends with exactly the tokens the student generated and was graded on."""
    cfg = _cfg(tmp_path, "alpha_sdpo=0.5", "sdpo.hint_sources=[feedback]")
    env = build_env(cfg)
    trainer = build_trainer(cfg, tiny_model, tokenizer, env)
    rows = [trainer.train_dataset[i] for i in range(2)]
    trainer.model.train()
    batch = trainer._generate_and_score_completions([r for r in rows for _ in range(4)])
    hinted = batch["sdpo_hinted"].nonzero().squeeze(1)
    assert hinted.numel() > 0
    calls, handle = _record_forwards(backbone(tiny_model))
    try:
        trainer.channel("sdpo").teacher_states(tiny_model, batch, hinted)
    finally:
        handle.remove()
    assert len(calls) == 2  # group prefixes once, then the per-row suffixes against the cache
    (pre_ids, pre_mask), (suf_ids, suf_mask) = calls
    assert suf_ids.shape[0] == hinted.numel()  # hinted rows only
    prefixes = [ids[m.bool()].tolist() for ids, m in zip(pre_ids, pre_mask, strict=True)]
    tasks = {t.task_id: t for t in env.tasks("train")}
    for k, i in enumerate(hinted.tolist()):
        suffix = suf_ids[k][suf_mask[k][: suf_ids.shape[1]].bool()].tolist()
        completion = batch["completion_ids"][i][batch["completion_mask"][i].bool()].tolist()
        assert suffix[-len(completion) :] == completion
        row = rows[i // 4]
        task = tasks[row["task_id"]]
        texts = [tokenizer.decode(p + suffix) for p in prefixes]
        seen = [t for t in texts if env.user_message(task) in t]
        assert len(seen) == 1, texts  # exactly one group prefix belongs to this row's problem
        answer = task.data["answer"]
        assert f"Feedback on it: expected {answer}," in seen[0]
        student = tokenizer.decode(batch["prompt_ids"][i][batch["prompt_mask"][i].bool()])
        assert "Feedback on it" not in student


def test_sdpo_channel_loss_and_gradient(tmp_path, tokenizer, tiny_model):
    """All rollouts fail on 2-digit + 2-digit for a random model: GRPO's advantages are all 0,
    so any gradient comes from channel 2."""
    cfg = _cfg(tmp_path, "alpha_sdpo=1.0")
    trainer = build_trainer(cfg, tiny_model, tokenizer, build_env(cfg))
    trainer.train()
    row = read_metrics(tmp_path / "run" / "metrics.jsonl")[-1]
    assert row["frac_reward_zero_std"] == 1.0 and row["policy/loss"] == 0.0
    assert row["sdpo/active"] == 1.0 and row["sdpo/hinted_frac"] == 1.0
    assert row["sdpo/loss"] > 0 and row["sdpo/num_tokens"] > 0
    assert row["grad_norm"] > 0


def test_reference_logps_equal_an_explicit_forward_of_the_initial_model(
    tmp_path, tokenizer, tiny_model, pairs_file
):
    initial = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    cfg = _cfg(
        tmp_path, "beta_replay=0.2", f"replay.dataset={pairs_file}", "optim.learning_rate=1e-2"
    )
    trainer = build_trainer(cfg, tiny_model, tokenizer, build_env(cfg))
    trainer.train()  # one step at a large lr: the policy moves, the cached reference must not
    moved = any(not torch.equal(initial[k], v) for k, v in tiny_model.state_dict().items())
    assert moved
    from conftest import make_tiny_model

    ref_model = make_tiny_model(len(tokenizer))
    ref_model.load_state_dict(initial)
    ref_model.eval()
    ch = trainer.channel("replay")
    with torch.no_grad():
        lp = response_logps(ref_model, collate(ch.pairs, ch.pad_id, "cpu"), "sum")
    n = len(ch.pairs)
    assert torch.allclose(ch.ref[:, 0], lp[:n], atol=1e-4)
    assert torch.allclose(ch.ref[:, 1], lp[n:], atol=1e-4)
    assert not torch.allclose(ch.ref[:, 0], torch.full_like(ch.ref[:, 0], ch.ref[0, 0]))
    row = read_metrics(tmp_path / "run" / "metrics.jsonl")[-1]
    assert row["replay/num_pairs"] == 2 and row["replay/loss"] > 0


def test_taid_scheduler_advances_with_training(tmp_path, tokenizer, tiny_model):
    cfg = _cfg(tmp_path, "alpha_sdpo=1.0", "sdpo.loss=taid", "max_steps=3")
    trainer = build_trainer(cfg, tiny_model, tokenizer, build_env(cfg))
    t0 = trainer.channel("sdpo").taid.t
    trainer.train()
    assert trainer.channel("sdpo").taid.t > t0
    ts = [r["sdpo/t"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")]
    assert ts == sorted(ts) and ts[-1] > ts[0]


def test_ema_teacher_tracks_the_policy(tmp_path, tokenizer, tiny_model):
    cfg = _cfg(
        tmp_path,
        "alpha_sdpo=1.0",
        "sdpo.teacher=ema",
        "sdpo.ema_decay=0.5",
        "optim.learning_rate=1e-2",
    )
    trainer = build_trainer(cfg, tiny_model, tokenizer, build_env(cfg))
    before = [p.clone() for p in trainer.channel("sdpo").frozen.parameters()]
    trainer.train()
    after = list(trainer.channel("sdpo").frozen.parameters())
    live = list(tiny_model.parameters())
    changed = [
        i for i, (a, b) in enumerate(zip(before, after, strict=True)) if not torch.equal(a, b)
    ]
    assert changed
    i = changed[0]
    assert torch.allclose(after[i], 0.5 * before[i] + 0.5 * live[i].detach(), atol=1e-6)
    # the checkpoint carries the EMA teacher, and a resumed trainer gets it back
    ckpt = tmp_path / "run" / "checkpoint-1"
    assert (ckpt / "sdpo_teacher.pt").is_file()
    from conftest import make_tiny_model

    fresh = build_trainer(cfg, make_tiny_model(len(tokenizer), seed=5), tokenizer, build_env(cfg))
    fresh.channel("sdpo").load(str(ckpt))
    assert all(
        torch.equal(a, b)
        for a, b in zip(fresh.channel("sdpo").frozen.parameters(), after, strict=True)
    )


def test_replay_needs_a_dataset_and_bad_lines_are_named(tmp_path):
    with pytest.raises(Exception, match="replay: .*weight > 0 needs dataset"):
        load_config(None, ["beta_replay=0.1", "replay.dataset=null"])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "q", "chosen": "a", "rejected": "b"}\n{"prompt": "q"}\n')
    with pytest.raises(PreferenceDataError, match=r"bad.jsonl:2: missing field 'chosen'"):
        load_pairs(bad, 10)
    with pytest.raises(PreferenceDataError, match="not found"):
        load_pairs(tmp_path / "nope.jsonl", 10)


def test_sdpo_without_a_grading_reward_is_refused(tmp_path, tokenizer, tiny_model):
    from composer_replication.run.train import build_grpo_args
    from composer_replication.trainer.data import build_prompt_dataset
    from composer_replication.trainer.trainer import ComposerReplicationTrainer

    env = build_env(_cfg(tmp_path))
    with pytest.raises(ValueError, match=r"\['sdpo'\] need a reward .*last_results"):
        ComposerReplicationTrainer(
            model=tiny_model,
            reward_funcs=[lambda completions, **k: [0.0] * len(completions)],
            args=build_grpo_args(_cfg(tmp_path)),
            processing_class=tokenizer,
            train_dataset=build_prompt_dataset(env, "train", 8, 0, True),
            channels=[SelfDistillChannel(SdpoConfig(weight=0.1))],
        )


def test_grade_answer_is_what_hints_quote():
    assert grade_answer("8", 19).feedback == "expected 19, got 8"
