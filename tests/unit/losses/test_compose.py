import pytest
import torch

from composer_replication.losses import (
    ChannelTerm,
    ReplayInputs,
    SdpoInputs,
    compose_loss,
    dpo_loss,
    generalized_jsd_loss,
    preference_loss,
    self_distill_loss,
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


def _term(prefix, weight, inputs_loss):
    loss, metrics = inputs_loss
    return ChannelTerm(prefix, weight, loss, metrics)


def test_no_terms_is_bit_exact():
    """No channel: total *is* the policy loss tensor, and only policy/total metrics exist."""
    policy = torch.tensor(1.25, requires_grad=True)
    total, m = compose_loss(policy, [], {"clip_ratio": torch.tensor(0.1)})
    assert total is policy
    assert m["policy/loss"].item() == 1.25 and m["policy/clip_ratio"].item() == pytest.approx(0.1)
    assert set(m) == {"policy/loss", "policy/clip_ratio", "total/loss"}


def test_missing_inputs_raise_naming_the_channel():
    r = _replay()
    r.ref_chosen_logps = None
    with pytest.raises(ValueError, match="channel 'replay'.*ref_chosen_logps"):
        preference_loss(r)
    with pytest.raises(ValueError, match="channel 'sdpo'.*taid_t"):
        self_distill_loss(_sdpo(kind="taid"))
    with pytest.raises(ValueError, match="channel 'sdpo'"):
        self_distill_loss(SdpoInputs(mask=torch.ones(1, dtype=torch.bool)))


def test_total_is_weighted_sum_with_own_masks_and_prefixes():
    """total = policy + 0.5 * JSD(own mask, own divisor) + 2.0 * DPO(own pairs)."""
    policy = torch.tensor(1.0, requires_grad=True)
    sd, rp = _sdpo(beta=0.3), _replay(beta=0.2)
    terms = [_term("sdpo/", 0.5, self_distill_loss(sd)), _term("replay/", 2.0, preference_loss(rp))]
    total, m = compose_loss(policy, terms)
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
    assert m["sdpo/weight"] == 0.5 and m["replay/weight"] == 2.0
    assert m["total/loss"].item() == pytest.approx(total.item())
    total.backward()
    assert policy.grad.item() == 1.0
    assert sd.student_logits.grad[~sd.mask].abs().max().item() == 0.0


def test_hand_worked_sum():
    """policy 1.0 + 0.5 * 0.2 + 3.0 * 0.1 = 1.4; metrics keep the unweighted values."""
    total, m = compose_loss(
        torch.tensor(1.0),
        [
            ChannelTerm("a/", 0.5, torch.tensor(0.2), {"n": 4.0}),
            ChannelTerm("b/", 3.0, torch.tensor(0.1)),
        ],
    )
    assert total.item() == pytest.approx(1.4)
    assert m["a/loss"].item() == pytest.approx(0.2) and m["a/n"] == 4.0
    assert m["b/loss"].item() == pytest.approx(0.1) and m["b/weight"] == 3.0


def test_sdpo_divisor_is_the_channels_own():
    sd = _sdpo(divisor=100.0)
    loss, _ = self_distill_loss(sd)
    summed, _ = generalized_jsd_loss(sd.student_logits, sd.teacher_logits, sd.mask, reduction="sum")
    assert loss.item() == pytest.approx(summed.item() / 100.0, rel=1e-6)


@pytest.mark.parametrize("kind", ["taid", "entropy_opd"])
def test_other_sdpo_kinds(kind):
    loss, m = self_distill_loss(_sdpo(kind=kind, taid_t=0.5))
    assert loss.item() > 0 and m["num_tokens"].item() == 7


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
    la, _ = self_distill_loss(a)
    lb, _ = self_distill_loss(b)
    assert la.item() == pytest.approx(lb.item(), rel=1e-5)
    bad = SdpoInputs(
        mask=mask,
        student_hidden=h,
        student_head_weight=w,
        teacher_hidden=th,
        teacher_head_weight=tw,
        top_k=3,
    )
    with pytest.raises(ValueError, match="chunked"):
        self_distill_loss(bad)


def test_simpo_replay_and_empty_channel():
    """SimPO, beta 2, gamma 1, chosen -0.5, rejected -1.0: -log sigmoid(2*0.5 - 1) = log 2."""
    rp = ReplayInputs(torch.tensor([-0.5]), torch.tensor([-1.0]), kind="simpo", beta=2.0, gamma=1.0)
    loss, _ = preference_loss(rp)
    assert loss.item() == pytest.approx(0.693147, abs=1e-6)
    sd = _sdpo()
    sd.mask = torch.zeros_like(sd.mask)
    loss, m = self_distill_loss(sd)
    assert loss.item() == 0.0 and m["num_tokens"].item() == 0


def test_bad_arguments():
    with pytest.raises(ValueError, match="scalar"):
        compose_loss(torch.zeros(2))
    with pytest.raises(ValueError, match="weight must be >= 0"):
        compose_loss(torch.tensor(0.0), [ChannelTerm("a/", -1.0, torch.tensor(0.0))])
    with pytest.raises(ValueError, match="unique"):
        compose_loss(
            torch.tensor(0.0),
            [ChannelTerm("a/", 1.0, torch.tensor(0.0)), ChannelTerm("a/", 1.0, torch.tensor(0.0))],
        )
    with pytest.raises(ValueError, match="unique"):
        compose_loss(torch.tensor(0.0), [ChannelTerm("policy/", 1.0, torch.tensor(0.0))])
