import pytest
import torch

from composer_replication.losses import (
    ReplayInputs,
    SdpoInputs,
    compose_loss,
    dpo_loss,
    generalized_jsd_loss,
)


def _sdpo(**kw):
    s = torch.randn(2, 5, 11, requires_grad=True)
    t = torch.randn(2, 5, 11)
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 1, 1, 1, 1]], dtype=torch.bool)
    return SdpoInputs(mask=mask, student_logits=s, teacher_logits=t, **kw)


def _replay(**kw):
    return ReplayInputs(
        policy_chosen_logps=torch.randn(3, requires_grad=True),
        policy_rejected_logps=torch.randn(3, requires_grad=True),
        ref_chosen_logps=torch.randn(3),
        ref_rejected_logps=torch.randn(3),
        **kw,
    )


def test_weight_zero_is_bit_exact_and_not_computed():
    """alpha=beta=0: total *is* the policy loss tensor; broken channel inputs are never read."""
    policy = torch.tensor(1.25, requires_grad=True)
    broken = SdpoInputs(
        mask=torch.ones(1), student_logits=torch.ones(3), teacher_logits=torch.ones(4)
    )
    total, m = compose_loss(policy, {"clip_ratio": torch.tensor(0.1)}, sdpo=broken, replay=None)
    assert total is policy
    assert m["policy/loss"].item() == 1.25 and m["policy/clip_ratio"].item() == pytest.approx(0.1)
    assert not any(k.startswith(("sdpo/", "replay/")) for k in m)


def test_missing_inputs_raise_naming_the_channel():
    policy = torch.tensor(0.0)
    with pytest.raises(ValueError, match="channel 'sdpo'"):
        compose_loss(policy, alpha_sdpo=0.1)
    with pytest.raises(ValueError, match="channel 'replay'"):
        compose_loss(policy, beta_replay=0.1)
    r = _replay()
    r.ref_chosen_logps = None
    with pytest.raises(ValueError, match="channel 'replay'.*ref_chosen_logps"):
        compose_loss(policy, replay=r, beta_replay=0.1)
    with pytest.raises(ValueError, match="channel 'sdpo'.*taid_t"):
        compose_loss(policy, sdpo=_sdpo(kind="taid"), alpha_sdpo=0.1)


def test_total_is_weighted_sum_with_own_masks_and_prefixes():
    """total = policy + alpha * JSD(own mask, own divisor) + beta * DPO(own pairs)."""
    policy = torch.tensor(1.0, requires_grad=True)
    sd, rp = _sdpo(beta=0.3), _replay(beta=0.2)
    total, m = compose_loss(policy, sdpo=sd, replay=rp, alpha_sdpo=0.5, beta_replay=2.0)
    jsd, _ = generalized_jsd_loss(sd.student_logits, sd.teacher_logits, sd.mask, beta=0.3)
    dpo, _ = dpo_loss(
        rp.policy_chosen_logps,
        rp.policy_rejected_logps,
        rp.ref_chosen_logps,
        rp.ref_rejected_logps,
        beta=0.2,
    )
    assert total.item() == pytest.approx(1.0 + 0.5 * jsd.item() + 2.0 * dpo.item(), rel=1e-6)
    assert m["sdpo/loss"].item() == pytest.approx(jsd.item(), rel=1e-6)
    assert m["sdpo/num_tokens"].item() == 7
    assert m["replay/num_pairs"].item() == 3
    assert m["sdpo/weight"].item() == 0.5 and m["replay/weight"].item() == 2.0
    assert m["total/loss"].item() == pytest.approx(total.item())
    total.backward()
    assert policy.grad.item() == 1.0
    assert sd.student_logits.grad[~sd.mask].abs().max().item() == 0.0


def test_sdpo_divisor_is_the_channels_own():
    sd = _sdpo(divisor=100.0)
    _, m = compose_loss(torch.tensor(0.0), sdpo=sd, alpha_sdpo=1.0)
    summed, _ = generalized_jsd_loss(sd.student_logits, sd.teacher_logits, sd.mask, reduction="sum")
    assert m["sdpo/loss"].item() == pytest.approx(summed.item() / 100.0, rel=1e-6)


@pytest.mark.parametrize("kind", ["taid", "entropy_opd"])
def test_other_sdpo_kinds(kind):
    sd = _sdpo(kind=kind, taid_t=0.5)
    total, m = compose_loss(torch.tensor(0.0), sdpo=sd, alpha_sdpo=1.0)
    assert total.item() > 0 and m["sdpo/num_tokens"].item() == 7


def test_chunked_hidden_state_path_matches_logits_path():
    h = torch.randn(2, 5, 8, requires_grad=True)
    w = torch.randn(11, 8, requires_grad=True)
    th, tw = torch.randn(2, 5, 8), torch.randn(11, 8)
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 1, 1, 1, 1]], dtype=torch.bool)
    a = SdpoInputs(
        mask=mask,
        student_hidden=h,
        student_head_weight=w,
        teacher_hidden=th,
        teacher_head_weight=tw,
    )
    b = SdpoInputs(mask=mask, student_logits=h @ w.t(), teacher_logits=th @ tw.t())
    ta, _ = compose_loss(torch.tensor(0.0), sdpo=a, alpha_sdpo=0.7)
    tb, _ = compose_loss(torch.tensor(0.0), sdpo=b, alpha_sdpo=0.7)
    assert ta.item() == pytest.approx(tb.item(), rel=1e-5)
    bad = SdpoInputs(
        mask=mask,
        student_hidden=h,
        student_head_weight=w,
        teacher_hidden=th,
        teacher_head_weight=tw,
        top_k=3,
    )
    with pytest.raises(ValueError, match="chunked"):
        compose_loss(torch.tensor(0.0), sdpo=bad, alpha_sdpo=0.7)


def test_simpo_replay_and_empty_channel():
    rp = ReplayInputs(torch.tensor([-0.5]), torch.tensor([-1.0]), kind="simpo", beta=2.0, gamma=1.0)
    total, m = compose_loss(torch.tensor(0.0), replay=rp, beta_replay=1.0)
    assert total.item() == pytest.approx(0.693147, abs=1e-6)
    sd = _sdpo()
    sd.mask = torch.zeros_like(sd.mask)
    total, m = compose_loss(torch.tensor(0.0), sdpo=sd, alpha_sdpo=1.0)
    assert total.item() == 0.0 and m["sdpo/num_tokens"].item() == 0


def test_bad_arguments():
    with pytest.raises(ValueError, match="scalar"):
        compose_loss(torch.zeros(2))
    with pytest.raises(ValueError, match="alpha_sdpo"):
        compose_loss(torch.tensor(0.0), alpha_sdpo=-1.0)
