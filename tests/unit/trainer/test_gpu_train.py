"""On a real CUDA GPU (``pytest -m gpu``; skipped with a reason where there is none): the
prefix-cached forward equals the plain one, and a 2-step train of each ``configs/gpu/*.yaml``
with every channel on runs on a model built from the config's shape (no download: 2 layers,
the embedded tokenizer's vocabulary), with transformers generation (no vLLM) on arithmetic; and
2 steps of GRPO + self-distillation + on-policy distillation from a local bf16 teacher on the
same GPU, with the sampled reverse KL and with the full-vocabulary JSD (the chunked kernel).
Truncated completions are kept in the loss: a random model never stops within 16 tokens, and
masking them (DAPO's default) would leave every channel without a token."""

from __future__ import annotations

import pytest
import torch
from support.gpu_models import qwen2_from_config

from composer_replication.config import configs_dir, load_config
from composer_replication.lm.prefix import forward_with_prefix, split_prefixes
from composer_replication.run.train import build_env, build_trainer
from composer_replication.trainer.callbacks import read_metrics

pytestmark = pytest.mark.gpu

GPU_CONFIGS = sorted((configs_dir() / "gpu").glob("*.yaml"))


def test_prefix_cached_forward_equals_plain_forward_on_cuda(tokenizer):
    net = qwen2_from_config("Qwen/Qwen2.5-0.5B-Instruct", len(tokenizer)).model.cuda().eval()
    shared = list(range(10, 40))
    prompts = [shared + [50, 51], shared + [52], shared]
    tails = torch.tensor([[60, 61, 62], [63, 64, 0], [65, 0, 0]], device="cuda")
    tmask = (tails > 0).long()
    batch = split_prefixes(prompts, [0, 0, 0], tails, tmask, pad_id=0)
    with torch.no_grad():
        cached = forward_with_prefix(net, net, batch).last_hidden_state[:, -3:]
        width = max(map(len, prompts))
        ids = torch.zeros(3, width, dtype=torch.long)
        att = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :], att[i, width - len(p) :] = torch.tensor(p), 1
        plain = net(input_ids=torch.cat([ids.cuda(), tails], 1),
                    attention_mask=torch.cat([att.cuda(), tmask], 1)).last_hidden_state[:, -3:]  # fmt: skip
    keep = tmask.bool()
    torch.testing.assert_close(cached[keep], plain[keep], rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("path", GPU_CONFIGS, ids=lambda p: p.stem)
def test_two_steps_of_each_gpu_config_with_every_channel(path, tmp_path, tokenizer):
    cfg = load_config(path, [
        f"output_dir={tmp_path / 'run'}", "max_steps=2", "save_steps=2", "logging.report_to=none",
        "generation.backend=transformers", "generation.prompts_per_step=2",
        "generation.num_generations=4", "generation.max_completion_length=16",
        "optim.gradient_accumulation_steps=1", "eval.before_and_after=false",
        "grpo.mask_truncated_completions=false",  # a random model never stops within 16 tokens
        "env.name=arithmetic", "sdpo.weight=0.5", "replay.weight=0.5", "replay.pairs_per_step=2",
        "replay.dataset=embedded:fixture-replay-pairs",
    ])  # fmt: skip
    model = qwen2_from_config(cfg.model.name, len(tokenizer), dtype=torch.bfloat16)
    if cfg.peft.enabled:
        from composer_replication.lm.models import apply_lora

        model = apply_lora(model, cfg.peft)
    trainer = build_trainer(cfg, model, tokenizer, build_env(cfg))
    assert trainer.args.bf16 and trainer.accelerator.device.type == "cuda"
    trainer.train()
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert len(rows) == 2 and all(r["replay/active"] == 1.0 for r in rows)
    assert all(r["sdpo/active"] == 1.0 for r in rows)
    assert {p.device.type for p in model.parameters()} == {"cuda"}
    assert (tmp_path / "run" / "checkpoint-2").is_dir()


def distill_two_steps(tmp_path, tokenizer, loss: str, dtype=torch.bfloat16) -> list[dict]:
    """2 steps of the 0.5B config's shape with GRPO, self-distillation and on-policy
    distillation from a local teacher of the same shape (another seed) on the student's
    device; ``loss`` ``jsd`` runs the full-vocabulary generalized JSD through the chunked fused
    kernel on the teacher's hidden states. Returns the metrics rows."""
    cfg = load_config(configs_dir() / "gpu" / "qwen2.5-0.5b.yaml", [
        f"output_dir={tmp_path / 'run'}", "max_steps=2", "logging.report_to=none",
        "generation.backend=transformers", "generation.prompts_per_step=2",
        "generation.num_generations=4", "generation.max_completion_length=16",
        "optim.gradient_accumulation_steps=1", "eval.before_and_after=false",
        "grpo.mask_truncated_completions=false",  # a random model never stops within 16 tokens
        "sdpo.weight=0.5", "distill.weight=1.0", f"distill.loss.type={loss}",
        "distill.teachers=[{name: big, model: built-in-test, dtype: bfloat16}]",
    ])  # fmt: skip
    model = qwen2_from_config(cfg.model.name, len(tokenizer), dtype=dtype)
    teacher = qwen2_from_config(cfg.model.name, len(tokenizer), layers=3, dtype=dtype, seed=1)
    trainer = build_trainer(cfg, model, tokenizer, build_env(cfg),
                            channel_kwargs={"distill": {"models": {"big": teacher}}})  # fmt: skip
    trainer.train()
    scorer = trainer.channel("distill").scorers[0]
    assert scorer.model.device == next(model.parameters()).device  # device "same"
    return read_metrics(tmp_path / "run" / "metrics.jsonl")


@pytest.mark.parametrize("loss", ["reverse_kl", "jsd"])
def test_two_steps_with_on_policy_distillation_on_cuda(loss, tmp_path, tokenizer):
    rows = distill_two_steps(tmp_path, tokenizer, loss)
    assert len(rows) == 2
    for r in rows:
        assert r["distill/active"] == 1.0 and r["distill/scored_frac"] == 1.0
        assert r["sdpo/active"] == 1.0
        assert torch.isfinite(torch.tensor([r["distill/loss"], r["loss"], r["grad_norm"]])).all()
