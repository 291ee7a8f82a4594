"""The verl recipe through verl's own code (runs in the verl venv: tests/support/verl_venv.py,
started by tests/integration/test_verl_env.py). CPU tensors only: no Ray cluster, no GPU."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import verl  # noqa: F401  (must load our plugin through the verl.plugins entry point)

PLUGIN = "composer_replication.recipes.verl.plugin"
LOADED_BY_VERL = PLUGIN in sys.modules  # before this file imports it

from support.verl_fakes import HFScoringClient  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.experimental.teacher_loop.teacher_manager import _pad_teacher_outputs  # noqa: E402
from verl.trainer.config import AlgoConfig  # noqa: E402
from verl.trainer.distillation.losses import (  # noqa: E402
    DISTILLATION_LOSS_REGISTRY,
    distillation_loss,
)
from verl.trainer.ppo.core_algos import (  # noqa: E402
    ADV_ESTIMATOR_REGISTRY,
    POLICY_LOSS_REGISTRY,
    get_policy_loss_fn,
)
from verl.trainer.ppo.ray_trainer import compute_advantage  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.workers.config import (  # noqa: E402
    DistillationConfig,
    DistillationLossConfig,
    FSDPActorConfig,
)
from verl.workers.utils.padding import left_right_2_no_padding  # noqa: E402

from composer_replication.losses import dapo_clip_loss, sampled_reverse_kl_loss  # noqa: E402
from composer_replication.recipes.verl import plugin  # noqa: E402
from composer_replication.recipes.verl.hinted import (  # noqa: E402
    feedback_hint,
    hinted_prompt_ids,
    hinted_teacher_logprobs,
    unhinted_rows,
)

RECIPE = Path(plugin.__file__).parent


def test_import_verl_registers_our_functions_through_the_entry_point():
    assert LOADED_BY_VERL
    assert ADV_ESTIMATOR_REGISTRY["composer_grpo"] is plugin.composer_grpo_advantage
    assert POLICY_LOSS_REGISTRY["composer_dapo"] is plugin.composer_dapo_loss
    assert DISTILLATION_LOSS_REGISTRY["composer_sdpo"] is plugin.composer_sdpo_loss


def _batch(scores: list[float], uids: list[str], resp_len: int = 5) -> DataProto:
    B = len(scores)
    mask = torch.ones(B, resp_len)
    mask[0, 3:] = 0  # a short response: the reward sits on its last real token
    rewards = torch.zeros(B, resp_len)
    last = mask.sum(-1).long() - 1
    rewards[torch.arange(B), last] = torch.tensor(scores)
    return DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": mask},
        non_tensors={"uid": np.array(uids, dtype=object)},
    )


@pytest.mark.parametrize("norm", [True, False])
def test_advantages_equal_verls_grpo_through_its_compute_advantage(norm):
    rng = np.random.default_rng(0)
    uids = [f"p{i % 4}" for i in range(16)]
    rng.shuffle(uids)  # groups are not contiguous
    scores = rng.integers(0, 2, 16).astype(float).tolist()
    scores[:3] = [0.3, 0.7, 1.0]  # shaped rewards too
    cfg = AlgoConfig(norm_adv_by_std_in_grpo=norm)
    ours = compute_advantage(_batch(scores, uids), "composer_grpo", config=cfg)
    theirs = compute_advantage(
        _batch(scores, uids), "grpo", norm_adv_by_std_in_grpo=norm, config=cfg
    )
    a, b = ours.batch["advantages"], theirs.batch["advantages"]
    assert a.abs().sum() > 0
    assert torch.allclose(a, b, atol=1e-6), (a - b).abs().max()
    # hand-worked: group (1, 0) has mean 0.5, unbiased std 0.7071
    two = compute_advantage(_batch([1.0, 0.0], ["g", "g"]), "composer_grpo", config=cfg)
    want = 0.5 / (0.5**0.5 + 1e-6) if norm else 0.5
    assert two.batch["advantages"][1, 0] == pytest.approx(-want, abs=1e-5)


def test_a_group_of_one_is_where_we_differ_from_verl():
    cfg = AlgoConfig()
    ours = compute_advantage(
        _batch([1.0, 1.0, 0.0], ["solo", "g", "g"]), "composer_grpo", config=cfg
    )
    theirs = compute_advantage(_batch([1.0, 1.0, 0.0], ["solo", "g", "g"]), "grpo", config=cfg)
    assert ours.batch["advantages"][0].abs().sum() == 0
    assert theirs.batch["advantages"][0].abs().sum() > 0


def _actor(**kw) -> FSDPActorConfig:
    return FSDPActorConfig(
        strategy="fsdp",
        ppo_micro_batch_size_per_gpu=1,
        rollout_n=4,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        **kw,
    )


def _logps(seed: int, B: int = 4, T: int = 7):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g) * 3
    logp = (old + (torch.rand(B, T, generator=g) - 0.5) * 0.8).requires_grad_()
    adv = torch.randn(B, 1, generator=g).expand(B, T).contiguous()
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 4:] = False
    mask[3, 2:] = False
    return old, logp, adv, mask


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_policy_loss_equals_verls_vanilla_where_dual_clip_is_idle(agg):
    old, logp, adv, mask = _logps(1)
    w = torch.rand(old.shape, generator=torch.Generator().manual_seed(2)) + 0.5
    ours_fn, van_fn = get_policy_loss_fn("composer_dapo"), get_policy_loss_fn("vanilla")
    l1, m1 = ours_fn(old, logp, adv, mask, agg, _actor(), rollout_is_weights=w)
    (g1,) = torch.autograd.grad(l1, logp)
    l2, _ = van_fn(old, logp, adv, mask, agg, _actor(), rollout_is_weights=w)
    (g2,) = torch.autograd.grad(l2, logp)
    assert torch.allclose(l1, l2, atol=1e-6) and torch.allclose(g1, g2, atol=1e-6)
    assert 0 < m1["policy/clip_high_frac"] + m1["policy/clip_low_frac"] < 1  # clipping was live


def test_policy_loss_equals_our_dapo_loss_and_skips_the_dual_clip():
    old, logp, adv, mask = _logps(3)
    l1, _ = get_policy_loss_fn("composer_dapo")(old, logp, adv, mask, "token-mean", _actor())
    l2, _ = dapo_clip_loss(logp, old, adv, mask, 0.2, 0.28)
    assert torch.allclose(l1, l2, atol=1e-6)
    # A < 0 and ratio 5: verl's dual clip caps the loss at 3 |A|; DAPO has no dual clip
    one = torch.ones(1, 1)
    big = (torch.log(5 * one)).requires_grad_()
    ours, _ = get_policy_loss_fn("composer_dapo")(
        0 * one, big, -one, one.bool(), "token-mean", _actor()
    )
    vanilla, _ = get_policy_loss_fn("vanilla")(
        0 * one, big, -one, one.bool(), "token-mean", _actor()
    )
    assert ours.item() == pytest.approx(5.0) and vanilla.item() == pytest.approx(3.0)


class CharTokenizer:
    """Enough of a tokenizer for the hinted prompt: no chat template (messages joined by
    newlines), one id per character."""

    chat_template = None
    pad_token_id = 0

    def __init__(self, vocab: int):
        self.vocab = vocab

    def __call__(self, text: str, add_special_tokens: bool = False):
        return {"input_ids": [1 + ord(c) % (self.vocab - 1) for c in text]}


def _tiny(vocab: int, seed: int):
    from conftest import make_tiny_model

    return make_tiny_model(vocab, seed=seed, max_positions=512).eval()


def _next_token_logps(model, ids_BS: torch.Tensor, attn_BS: torch.Tensor) -> torch.Tensor:
    """Row j = log-prob of token j+1 (verl's layout), last row 0."""
    pos = (attn_BS.cumsum(-1) - 1).clamp_min(0)
    logits = model(input_ids=ids_BS, attention_mask=attn_BS, position_ids=pos).logits.float()
    lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids_BS[:, 1:, None])[..., 0]
    return torch.cat([lp, lp.new_zeros(lp.shape[0], 1)], -1)


def test_sdpo_loss_through_verls_distillation_path_equals_ours_on_hinted_rows():
    V, tok = 97, CharTokenizer(97)
    student, teacher = _tiny(V, 0), _tiny(V, 1)
    messages = [
        [{"role": "user", "content": "What is 7 + 12?"}],
        [{"role": "user", "content": "What is 3 + 4?"}],
    ]
    prompts = [tok("\n".join(m["content"] for m in msgs))["input_ids"] for msgs in messages]
    responses = [[5, 9, 11, 13, 2, 7], [17, 19, 23]]
    hint = feedback_hint(0.0, {"feedback": "expected 19, got 8"})
    client = HFScoringClient(teacher)
    rows = [
        asyncio.run(
            hinted_teacher_logprobs(client, tok, messages[0], hint, prompts[0], responses[0])
        ),
        unhinted_rows(len(prompts[1]), len(responses[1])),  # the passed rollout: no hint
    ]
    Pw, Rw = max(map(len, prompts)), max(map(len, responses))
    ids_BS = torch.zeros(2, Pw + Rw, dtype=torch.long)
    attn_BS = torch.zeros(2, Pw + Rw, dtype=torch.long)
    rmask_BR = torch.zeros(2, Rw, dtype=torch.long)
    t_ids, t_lps = [], []
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        ids_BS[i, Pw - len(p) : Pw] = torch.tensor(p)
        ids_BS[i, Pw : Pw + len(r)] = torch.tensor(r)
        attn_BS[i, Pw - len(p) : Pw + len(r)] = 1
        rmask_BR[i, : len(r)] = 1
        a, b = _pad_teacher_outputs(*rows[i], Pw, Rw, len(p), len(r), pad_token_id=0)
        t_ids.append(a)
        t_lps.append(b)
    with torch.no_grad():
        old_BS = _next_token_logps(student, ids_BS, attn_BS) - 0.05  # a slightly stale behaviour
    old_BR = old_BS[:, Pw - 1 : Pw - 1 + Rw]
    data = TensorDict(
        {
            "prompts": ids_BS[:, :Pw],
            "responses": ids_BS[:, Pw:],
            "input_ids": ids_BS,
            "attention_mask": attn_BS,
            "response_mask": rmask_BR,
            "position_ids": attn_BS.cumsum(-1),
            "teacher_logprobs": torch.cat(t_lps)[..., 0],
            "teacher_ids": torch.cat(t_ids)[..., 0],
            "old_log_probs": old_BR,
        },
        batch_size=[2],
    )
    data = left_right_2_no_padding(data)
    for k, v in {"dp_size": 1, "batch_num_tokens": None, "global_batch_size": None}.items():
        tu.assign_non_tensor_data(data, k, v)
    logp_BS = _next_token_logps(student, ids_BS, attn_BS)
    offsets = torch.tensor([0, *attn_BS.sum(-1).cumsum(0).tolist()])
    flat = logp_BS[attn_BS.bool()]
    model_output = {"log_probs": torch.nested.nested_tensor_from_jagged(flat, offsets=offsets)}
    # enabled=False only skips the teacher-pool checks; the loss path does not read it
    dcfg = DistillationConfig(
        distillation_loss=DistillationLossConfig(
            loss_mode="composer_sdpo", use_policy_gradient=False
        )
    )
    actor = _actor()
    loss, metrics = distillation_loss(actor, dcfg, model_output, data)
    (g_verl,) = torch.autograd.grad(loss, student.model.embed_tokens.weight)

    # ours, by hand: the hinted teacher's response log-probs from a direct forward
    hinted = hinted_prompt_ids(tok, messages[0], hint)
    with torch.no_grad():
        full = torch.tensor([hinted + responses[0]])
        t_row = _next_token_logps(teacher, full, torch.ones_like(full))[0]
    teacher_BR = torch.zeros(2, Rw)
    teacher_BR[0, : len(responses[0])] = t_row[
        len(hinted) - 1 : len(hinted) - 1 + len(responses[0])
    ]
    logp2_BS = _next_token_logps(student, ids_BS, attn_BS)
    logp_BR = logp2_BS[:, Pw - 1 : Pw - 1 + Rw]
    hinted_BR = torch.zeros(2, Rw, dtype=torch.bool)
    hinted_BR[0, : len(responses[0])] = True
    want, _ = sampled_reverse_kl_loss(
        logp_BR, teacher_BR, old_BR, hinted_BR, divisor=rmask_BR.sum()
    )
    (g_ours,) = torch.autograd.grad(want, student.model.embed_tokens.weight)
    assert loss.item() == pytest.approx(want.item(), rel=1e-4, abs=1e-6)
    assert torch.allclose(g_verl, g_ours, atol=1e-6)
    assert g_ours.abs().sum() > 0
    assert metrics["sdpo/hinted_frac"] == pytest.approx(0.5)
    # verl's policy-gradient mode would misuse the surrogate: refused with the key to change
    pg = DistillationConfig(distillation_loss=DistillationLossConfig(loss_mode="composer_sdpo"))
    with pytest.raises(ValueError, match="use_policy_gradient=false"):
        distillation_loss(actor, pg, model_output, data)


def test_hinted_worker_overrides_verls_teacher_hook():
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

    from composer_replication.recipes.verl import agent_loop

    V, tok = 97, CharTokenizer(97)
    worker = object.__new__(agent_loop.HintedAgentLoopWorkerTQ)  # no Ray: the hook only
    worker.distillation_enabled, worker.llm_client, worker.tokenizer = (
        True,
        HFScoringClient(_tiny(V, 2)),
        tok,
    )
    msgs = [{"role": "user", "content": "What is 2 + 2?"}]
    prompt = tok(msgs[0]["content"])["input_ids"]

    def out(score):
        return AgentLoopOutput(
            prompt_ids=prompt,
            response_ids=[5, 6, 7],
            response_mask=[1, 1, 1],
            reward_score=score,
            metrics=AgentLoopMetrics(),
            extra_fields={"reward_extra_info": {"feedback": "expected 4, got 5"}},
        )

    failed, passed = out(0.0), out(1.0)
    for o in (failed, passed):
        asyncio.run(
            worker._compute_teacher_logprobs(o, prompt, [5, 6, 7], False, {"raw_prompt": msgs})
        )
    assert len(worker.llm_client.calls) == 1  # only the failed rollout was rescored
    hint = feedback_hint(0.0, {"feedback": "expected 4, got 5"})
    assert worker.llm_client.calls[0][:-3] == hinted_prompt_ids(tok, msgs, hint)
    lps = failed.extra_fields["teacher_logprobs"]
    assert torch.isfinite(lps).all() and lps[len(prompt) - 1 :].abs().sum() > 0
    assert torch.isnan(passed.extra_fields["teacher_logprobs"]).all()
    assert issubclass(agent_loop.HintedAgentLoopWorkerTQ, agent_loop._WorkerTQ)


def test_the_run_config_composes_against_verls_schema():
    from hydra import compose, initialize_config_dir
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils import omega_conf_to_dataclass
    from verl.utils.config import validate_config
    from verl.utils.import_utils import load_class_from_fqn, load_extern_object

    from composer_replication.recipes.verl import agent_loop, reward

    with initialize_config_dir(config_dir=str(RECIPE), version_base=None):
        cfg = compose(config_name="composer_grpo")
    assert cfg.algorithm.adv_estimator in ADV_ESTIMATOR_REGISTRY
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert get_policy_loss_fn(actor.policy_loss.loss_mode) is plugin.composer_dapo_loss
    assert (actor.clip_ratio_low, actor.clip_ratio_high, actor.loss_agg_mode) == (
        0.2,
        0.28,
        "token-mean",
    )
    dist = omega_conf_to_dataclass(cfg.distillation)
    assert DISTILLATION_LOSS_REGISTRY[dist.distillation_loss.loss_mode] is plugin.composer_sdpo_loss
    assert dist.distillation_loss.use_policy_gradient is False
    manager = load_class_from_fqn(
        cfg.actor_rollout_ref.rollout.agent.agent_loop_manager_class, "AgentLoopManager"
    )
    assert manager is agent_loop.HintedAgentLoopManagerTQ
    fn = load_extern_object(
        cfg.reward.custom_reward_function.path, cfg.reward.custom_reward_function.name
    )
    assert fn is reward.compute_score
    assert fn("composer_replication/arithmetic", "8", "19")["feedback"] == "expected 19, got 8"
    validate_config(
        cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg)
    )
