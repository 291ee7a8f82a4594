"""ComposerReplicationTrainer on a tiny random model: bit-exactness with GRPOTrainer when the
extra channels are off, dynamic sampling's group bookkeeping, metrics and resume plumbing."""

from __future__ import annotations

import copy
import fnmatch

import pytest
import torch
from support.generation import forward_logprobs, record_generators
from trl import GRPOTrainer

from composer_replication.config import load_config
from composer_replication.envs import get_env
from composer_replication.run.train import build_grpo_args, build_trainer
from composer_replication.trainer.callbacks import MetricsJsonlCallback, plot_metrics, read_metrics
from composer_replication.trainer.data import build_prompt_dataset
from composer_replication.trainer.rewards import EnvReward
from composer_replication.trainer.trainer import (
    ComposerReplicationTrainer,
    informative_groups,
    merge_groups,
    reduce_over_processes,
)


def _cfg(tmp_path, *extra):
    return load_config(
        None,
        [
            f"output_dir={tmp_path}",
            "max_steps=1",
            "generation.num_generations=4",
            "generation.prompts_per_step=2",
            "generation.max_completion_length=6",
            "env.num_train=16",
            *extra,
        ],
    )


def _batch(vocab: int, seed: int = 0):
    """A hand-built scored batch: 2 groups x 4 completions, ragged masks, mixed advantages."""
    g = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(0, vocab, (8, 5), generator=g)
    prompt_mask = torch.ones(8, 5, dtype=torch.long)
    prompt_mask[:4, :2] = 0  # left padding on the first group
    completion_ids = torch.randint(0, vocab, (8, 6), generator=g)
    completion_mask = torch.ones(8, 6, dtype=torch.long)
    completion_mask[1, 3:] = 0
    completion_mask[6, 1:] = 0
    advantages = torch.tensor([1.2, -0.4, -0.4, -0.4, 0.9, 0.9, -0.9, -0.9])
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": advantages,
        "num_items_in_batch": completion_mask.sum(),
    }


def _loss_and_grads(trainer, model, inputs):
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop in real training
    model.train()
    model.zero_grad()
    loss = trainer._compute_loss(model, inputs)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


def test_weights_zero_is_bit_identical_to_grpo(tmp_path, tokenizer, tiny_model):
    cfg = _cfg(tmp_path)
    env = get_env("arithmetic", levels=[1])
    ds = build_prompt_dataset(env, "train", 16, 0, conversational=True)
    args = build_grpo_args(cfg)
    ours_model = tiny_model
    peer_model = copy.deepcopy(tiny_model)
    from composer_replication.channels import build_channels
    from composer_replication.config import load_config

    # every channel built at weight 0 (distill with a teacher named): none is enabled
    off = build_channels(load_config(None, ["distill.teachers=a-teacher"]))
    ours = ComposerReplicationTrainer(
        model=ours_model,
        reward_funcs=[EnvReward(env)],
        args=args,
        train_dataset=ds,
        processing_class=tokenizer,
        channels=off,
        shared_prefix=False,  # bit for bit: TRL's own padded forwards
    )
    assert len(off) == 3 and ours.channels == []
    peer = GRPOTrainer(
        model=peer_model,
        reward_funcs=[EnvReward(env)],
        args=args,
        train_dataset=ds,
        processing_class=tokenizer,
    )
    inputs = _batch(len(tokenizer))
    loss_a, grads_a = _loss_and_grads(ours, ours_model, inputs)
    loss_b, grads_b = _loss_and_grads(peer, peer_model, inputs)
    assert loss_a.item() != 0.0  # a real loss, not a degenerate zero
    assert torch.equal(loss_a, loss_b)
    assert len(grads_a) == len(grads_b) > 0
    assert all(torch.equal(a, b) for a, b in zip(grads_a, grads_b, strict=True))


def test_informative_groups():
    adv = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0, -1.0, 0.0, 0.0, 1e-9, -1e-9, 0.0, 0.0])
    assert informative_groups(adv, 4) == [1]


def test_merge_groups_repads_and_recounts():
    a = _batch(100, seed=0)
    b = _batch(100, seed=1)
    b["completion_ids"] = torch.cat([b["completion_ids"], torch.ones(8, 2, dtype=torch.long)], 1)
    b["completion_mask"] = torch.cat([b["completion_mask"], torch.ones(8, 2, dtype=torch.long)], 1)
    merged = merge_groups([a, b], [(0, 1), (1, 0)], group_size=4)
    assert merged["completion_ids"].shape == (8, 8)
    assert torch.equal(merged["completion_ids"][:4, :6], a["completion_ids"][4:])
    assert merged["completion_mask"][:4, 6:].sum() == 0  # right padding for a's shorter rows
    assert torch.equal(merged["completion_ids"][4:], b["completion_ids"][:4])
    assert torch.equal(merged["advantages"], torch.cat([a["advantages"][4:], b["advantages"][:4]]))
    assert merged["num_items_in_batch"] == merged["completion_mask"].sum()


def test_dynamic_sampling_refills_tied_groups(tmp_path, tokenizer, tiny_model):
    """A scripted reward makes every group of the first round tie (all 0) and alternates 0/1 in
    the refill round: the step must refill once and keep only informative groups."""
    cfg = _cfg(
        tmp_path, "grpo.dynamic_sampling.enabled=true", "grpo.dynamic_sampling.max_refills=2"
    )
    env = get_env("arithmetic", levels=[1])
    trainer = build_trainer(cfg, tiny_model, tokenizer, env)
    calls = []

    def tied_then_mixed(prompts, completions, **kw):
        calls.append(len(completions))
        if len(calls) == 1:
            return [0.0] * len(completions)  # every group ties
        return [float(i % 2) for i in range(len(completions))]

    tied_then_mixed.__name__ = "scripted"
    trainer.reward_funcs = [tied_then_mixed]
    trainer.reward_func_names = ["scripted"]
    rows = [trainer.train_dataset[i] for i in range(2)]
    inputs = [r for r in rows for _ in range(4)]
    trainer.model.train()
    batch = trainer._generate_and_score_completions(inputs)
    assert len(calls) == 2  # one refill round was enough
    assert batch["advantages"].shape == (8,)
    assert informative_groups(batch["advantages"], 4) == [0, 1]
    assert trainer._metrics["train"]["dynamic_sampling/refills"] == [1.0]


def test_metrics_callback_truncates_on_resume(tmp_path):
    import orjson

    path = tmp_path / "metrics.jsonl"
    path.write_bytes(
        b"".join(orjson.dumps({"step": s, "reward": s / 10}) + b"\n" for s in (1, 2, 3))
    )
    cb = MetricsJsonlCallback(tmp_path)

    from transformers import TrainerState

    cb.on_train_begin(None, TrainerState(global_step=2), None)
    assert [r["step"] for r in read_metrics(path)] == [1, 2]
    cb.on_log(None, TrainerState(global_step=3), None, logs={"reward": 0.5, "loss": 0.1})
    assert read_metrics(path)[-1]["reward"] == 0.5
    png = plot_metrics(path)
    assert png is not None and png.stat().st_size > 1000


def test_only_rank_zero_writes_metrics(tmp_path):
    from transformers import TrainerState

    cb = MetricsJsonlCallback(tmp_path)
    other = TrainerState(global_step=1, is_world_process_zero=False)
    cb.on_train_begin(None, other, None)
    cb.on_log(None, other, None, logs={"reward": 0.5})
    assert not (tmp_path / "metrics.jsonl").exists()


def _grouped_batch(vocab: int):
    """:func:`_batch` with GRPO's layout: the 4 rows of a group share their prompt (the first
    group's is 3 tokens shorter, so it is left-padded)."""
    batch = _batch(vocab, seed=1)
    g = torch.Generator().manual_seed(2)
    prompt_ids = torch.randint(1, vocab, (2, 12), generator=g).repeat_interleave(4, dim=0)
    prompt_mask = torch.ones(8, 12, dtype=torch.long)
    prompt_mask[:4, :3] = 0
    batch.update(prompt_ids=prompt_ids.masked_fill(prompt_mask == 0, 0), prompt_mask=prompt_mask)
    return batch


def _pair(tmp_path, tokenizer, tiny_model):
    cfg = _cfg(tmp_path)
    env = get_env("arithmetic", levels=[1])
    kw = dict(
        reward_funcs=[EnvReward(env)],
        args=build_grpo_args(cfg),
        train_dataset=build_prompt_dataset(env, "train", 16, 0, conversational=True),
        processing_class=tokenizer,
    )
    ours = ComposerReplicationTrainer(model=tiny_model, shared_prefix=True, **kw)
    peer = GRPOTrainer(model=copy.deepcopy(tiny_model), **kw)
    return ours, peer


def test_shared_prefix_loss_and_grads_match_grpo(tmp_path, tokenizer, tiny_model):
    """``shared_prefix``: each group's prompt runs once; loss and gradients equal TRL's padded
    forward up to float rounding."""
    ours, peer = _pair(tmp_path, tokenizer, tiny_model)
    inputs = _grouped_batch(len(tokenizer))
    calls = []
    real = ours._get_per_token_logps_and_entropies
    ours._get_per_token_logps_and_entropies = lambda *a, **k: calls.append(1) or real(*a, **k)
    loss_a, grads_a = _loss_and_grads(ours, ours.model, inputs)
    loss_b, grads_b = _loss_and_grads(peer, peer.model, inputs)
    assert calls and loss_b.item() != 0.0
    torch.testing.assert_close(loss_a, loss_b, rtol=1e-5, atol=1e-6)
    assert len(grads_a) == len(grads_b) > 0
    for a, b in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-6)


def test_shared_prefix_generation_draws_what_grpo_draws(
    tmp_path, tokenizer, tiny_model, monkeypatch
):
    """Through the trainer's generator (lm/generator.py): the same completions as TRL's own
    generation, and with them the generation's log-probs, equal to a fresh forward's
    ``log_softmax(logits / T)`` (TRL's tool loop calls this for every turn)."""
    import composer_replication.lm.generator as generator_mod

    calls = []
    real = generator_mod.generate_with_prefix
    monkeypatch.setattr(
        generator_mod, "generate_with_prefix", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    ours, peer = _pair(tmp_path, tokenizer, tiny_model)
    shared = tokenizer("<|im_start|>system\nYou are a calculator.<|im_end|>\n")["input_ids"]
    prompts = [shared + tokenizer(f"What is {n}?")["input_ids"] for n in (7, 123, 45678)]
    prompts = [p for p in prompts for _ in range(2)]
    out, logprobs = [], []
    for trainer in (ours, peer):
        torch.manual_seed(3)
        ids, lps = trainer._generate_single_turn(prompts, None, {}, 2)
        out.append(ids)
        logprobs.append(lps)
    assert calls and out[0] == out[1] and logprobs[1] is None  # TRL's path records none
    for prompt, ids, lps in zip(prompts, out[0], logprobs[0], strict=True):
        want = forward_logprobs(ours.model, prompt, ids, ours.temperature)
        torch.testing.assert_close(torch.tensor(lps), want, atol=1e-5, rtol=1e-5)
    assert len({tuple(x) for x in out[0]}) > 1 and max(map(len, out[0])) > 1


def test_training_ends_with_the_generator_stopped_and_the_trainer_collectable(
    tmp_path, tokenizer, tiny_model, monkeypatch
):
    """The generator's worker thread stops when ``train`` ends: a waiting worker kept the
    generator, the model and the trainer alive, so each run of one ``ablate`` process added a
    model and its optimizer state to the process (issue 61's study was killed for memory)."""
    import gc
    import weakref

    from composer_replication.lm.generator import Sampling

    used = record_generators(monkeypatch)
    trainer = build_trainer(_cfg(tmp_path), tiny_model, tokenizer, get_env("arithmetic"))
    trainer.train()
    assert len(used) == 1 and used[0].batches > 0  # the steps generated through it
    with pytest.raises(RuntimeError, match="closed"):
        used[0].submit([1], Sampling())
    used.clear()  # a generator refers to its trainer
    alive = weakref.ref(trainer)
    del trainer
    gc.collect()
    assert alive() is None

    # a run that fails mid-step closes it too (without waiting for the worker)
    trainer = build_trainer(_cfg(tmp_path), tiny_model, tokenizer, get_env("arithmetic"))

    def broken(prompts, completions, **kw):
        raise ValueError("the reward failed")

    broken.__name__ = "broken"
    trainer.reward_funcs, trainer.reward_func_names = [broken], ["broken"]
    with pytest.raises(ValueError, match="the reward failed"):
        trainer.train()
    assert len(used) == 1 and used[0].batches > 0  # it generated before the reward failed
    with pytest.raises(RuntimeError, match="closed"):
        used[0].submit([1], Sampling())


def test_loss_metrics_are_the_step_loss_under_gradient_accumulation(
    tmp_path, tokenizer, tiny_model
):
    """With G micro-batches per step, TRL returns each micro-batch's loss divided by G (their
    sum is the step's loss) and averages the logged values over the micro-batches, so the
    logged ``*/loss`` must be the returned loss times G: the same batch logs the same
    ``policy/loss`` and ``total/loss`` at G = 1 and at G = 2 (the returned loss halves)."""
    cfg = _cfg(tmp_path, "grpo.weight=0.5")
    env = get_env("arithmetic", levels=[1])
    trainer = build_trainer(cfg, tiny_model, tokenizer, env)
    inputs = _batch(len(tokenizer))
    tiny_model.train()
    logged, returned = {}, {}
    for accum in (1, 2):
        trainer._metrics["train"].clear()
        trainer.current_gradient_accumulation_steps = accum
        returned[accum] = trainer._compute_loss(tiny_model, inputs).item()
        logged[accum] = {k: v[0] for k, v in trainer._metrics["train"].items() if "/loss" in k}
    assert abs(returned[2] - returned[1] / 2) < 1e-6 and returned[1] != 0.0
    assert set(logged[1]) == {"policy/loss", "total/loss"}
    for key, value in logged[1].items():
        assert abs(logged[2][key] - value) < 1e-6, key
    assert abs(logged[1]["total/loss"] - returned[1]) < 1e-6


def test_running_counters_are_summed_over_processes_and_rates_averaged():
    """Two processes, micro-batches since the last log. A teacher's running cost is
    each process's own spend so far: the run's is the latest of each, summed (0.3 + 0.5 = 0.8,
    not their mean 0.4 nor a mean over micro-batches). A per-token figure is the mean of the
    processes' means ((1 + 3) / 2 = 2 and 4: 3)."""
    from composer_replication.channels.distill import DistillChannel

    cost, kl = "distill/teacher/t/cost_usd", "distill/reverse_kl"
    per_rank = [{cost: [0.1, 0.3], kl: [1.0, 3.0]}, {cost: [0.2, 0.5], kl: [4.0]}]

    def running(key):
        return any(
            fnmatch.fnmatchcase(key, "distill/" + p) for p in DistillChannel.running_counters
        )

    merged = reduce_over_processes(per_rank, running)
    assert merged[cost] == pytest.approx(0.8)
    assert merged[kl] == pytest.approx(3.0)
    # one process: the latest running value, the plain mean of the rest (NaN left out)
    alone = reduce_over_processes([{cost: [0.1, 0.3], kl: [1.0, float("nan"), 3.0]}], running)
    assert alone == pytest.approx({cost: 0.3, kl: 2.0})


def test_step_counts_are_the_steps_totals_over_micro_batches_and_processes():
    """``*/num_tokens`` and a teacher's ``rows`` were means over micro-batches and processes:
    with 2 processes x 2 micro-batches of 10 tokens the step's 40 tokens read 10. Each
    micro-batch's count is logged times ``grad_accum`` (as its loss share is), and the
    processes' means are summed: 40."""
    from composer_replication.channels.distill import DistillChannel
    from composer_replication.trainer.trainer import _logged

    tokens, rows, kl = "distill/num_tokens", "distill/teacher/t/rows", "distill/reverse_kl"

    def counted(key):
        return any(fnmatch.fnmatchcase(key, "distill/" + p) for p in DistillChannel.step_counts)

    assert counted(tokens) and counted(rows) and not counted(kl)
    per_rank = [
        {k: [_logged(k, v, 2, counted(k)) for v in vals] for k, vals in rank.items()}
        for rank in (
            {tokens: [10.0, 10.0], rows: [3.0, 1.0], kl: [1.0, 3.0]},
            {tokens: [12.0, 8.0], rows: [2.0, 2.0], kl: [2.0, 2.0]},
        )
    ]
    merged = reduce_over_processes(per_rank, lambda key: False, counted)
    assert merged == pytest.approx({tokens: 40.0, rows: 8.0, kl: 2.0})
    # one process, one micro-batch a step, two steps since the last log: the mean step
    alone = reduce_over_processes([{tokens: [10.0, 30.0]}], lambda key: False, counted)
    assert alone == pytest.approx({tokens: 20.0})


def test_counts_add_up_over_processes_in_training_only(monkeypatch):
    """Review 22: in evaluation every process scores the same fixed replay pairs, so a sum over
    2 processes read twice the pairs evaluated; evaluation keeps the mean."""
    import types

    import accelerate.utils

    from composer_replication.trainer.trainer import ComposerReplicationTrainer

    monkeypatch.setattr(accelerate.utils, "gather_object", lambda objs: objs * 2)
    for mode, want in (("train", 8.0), ("eval", 4.0)):
        stub = types.SimpleNamespace(
            _metrics={mode: {"replay/num_pairs": [4.0], "replay/accuracy": [0.5]}},
            accelerator=types.SimpleNamespace(num_processes=2),
            _prefixes=lambda: {"replay"},
            _is_running=lambda key: False,
            _is_count=lambda key: key == "replay/num_pairs",
        )
        ComposerReplicationTrainer._reduce_own_metrics(stub, mode)
        assert stub._metrics[mode] == {"replay/num_pairs": [want], "replay/accuracy": [0.5]}
