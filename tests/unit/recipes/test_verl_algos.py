"""The verl recipe's verl-free pieces: group advantages and the hinted self-teacher rows."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch
from conftest import make_tiny_model
from support.verl_fakes import HFScoringClient

from composer_replication.recipes.verl.algos import group_advantages
from composer_replication.recipes.verl.hinted import (
    TeacherMismatch,
    feedback_hint,
    hinted_prompt_ids,
    hinted_teacher_logprobs,
    unhinted_rows,
)


def test_group_advantages_hand_worked():
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), ["a"] * 4, "group", eps=0.0)
    assert torch.allclose(adv, torch.tensor([1.5, -0.5, -0.5, -0.5]))
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), ["a"] * 4, "none")
    assert torch.allclose(adv, torch.tensor([0.75, -0.25, -0.25, -0.25]))


def test_group_advantages_groups_by_index_not_position():
    scores = torch.tensor([1.0, 5.0, 0.0, 3.0])
    adv = group_advantages(scores, ["x", "y", "x", "y"], "none")
    assert torch.allclose(adv, torch.tensor([0.5, 1.0, -0.5, -1.0]))
    # batch scaling divides by the std of all four scores
    adv_b = group_advantages(scores, ["x", "y", "x", "y"], "batch", eps=0.0)
    assert torch.allclose(adv_b, adv / scores.std())


def test_group_of_one_gets_zero_and_bad_input_is_refused():
    adv = group_advantages(torch.tensor([2.0, 1.0, 0.0]), ["solo", "g", "g"])
    assert adv[0] == 0 and adv[1] > 0 > adv[2]
    with pytest.raises(ValueError, match="one index per row"):
        group_advantages(torch.zeros(3), ["a", "b"])
    with pytest.raises(ValueError, match="scale="):
        group_advantages(torch.zeros(2), ["a", "a"], "std")  # type: ignore[arg-type]


def test_feedback_hint_only_for_failed_rollouts_with_feedback():
    assert feedback_hint(1.0, {"feedback": "correct"}) is None
    assert feedback_hint(0.0, {}) is None
    assert feedback_hint(None, {"feedback": "x"}) is None
    hint = feedback_hint(0.0, {"feedback": "expected 19, got 8"})
    assert "expected 19, got 8" in hint


@pytest.fixture(scope="module")
def tiny(tokenizer):
    return make_tiny_model(len(tokenizer), seed=3).eval()


def _run(coro):
    return asyncio.run(coro)


def test_hinted_rows_equal_a_direct_forward_of_the_hinted_sequence(tokenizer, tiny):
    messages = [{"role": "user", "content": "What is 7 + 12?"}]
    prompt_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    prompt_ids = list(prompt_ids["input_ids"] if hasattr(prompt_ids, "keys") else prompt_ids)
    response = tokenizer("19 is my answer", add_special_tokens=False)["input_ids"]
    hint = feedback_hint(0.0, {"feedback": "expected 19, got 8"})
    client = HFScoringClient(tiny)
    ids, lps = _run(
        hinted_teacher_logprobs(client, tokenizer, messages, hint, prompt_ids, response)
    )
    p, r = len(prompt_ids), len(response)
    assert ids.shape == lps.shape == (p + r, 1)
    hinted = hinted_prompt_ids(tokenizer, messages, hint)
    assert client.calls == [hinted + response]  # the server saw the hint, then the response
    with torch.no_grad():
        full = torch.tensor([hinted + response])
        logp = torch.log_softmax(tiny(full).logits.float(), -1)[0]
    want = logp[len(hinted) - 1 : -1].gather(-1, torch.tensor(response)[:, None])[:, 0]
    assert torch.allclose(lps[p - 1 : p - 1 + r, 0], want, atol=1e-5)
    assert ids[p - 1 : p - 1 + r, 0].tolist() == response
    assert (lps[: p - 1] == 0).all() and lps[-1, 0] == 0
    # without the hint the teacher scores differently (the hint is really in the context)
    with torch.no_grad():
        full = torch.tensor([prompt_ids + response])
        logp2 = torch.log_softmax(tiny(full).logits.float(), -1)[0]
    plain = logp2[p - 1 : -1].gather(-1, torch.tensor(response)[:, None])[:, 0]
    assert not torch.allclose(plain, want, atol=1e-3)


@pytest.mark.parametrize(
    "lie, match",
    [("short", "ids / .* log-probs for a"), ("shifted", "scores token"), ("nan", "non-finite")],
)
def test_a_lying_scoring_server_is_refused(tokenizer, tiny, lie, match):
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    prompt_ids = tokenizer("What is 2 + 2?", add_special_tokens=False)["input_ids"]
    response = tokenizer("5 surely", add_special_tokens=False)["input_ids"]
    with pytest.raises(TeacherMismatch, match=match):
        _run(
            hinted_teacher_logprobs(
                HFScoringClient(tiny, lie=lie), tokenizer, messages, "hint", prompt_ids, response
            )
        )


def test_unhinted_rows_are_nan():
    ids, lps = unhinted_rows(3, 2)
    assert ids.shape == (5, 1) and all(math.isnan(x) for x in lps[:, 0].tolist())


def test_data_writer_and_reward_round_trip(tmp_path):
    import pandas as pd

    from composer_replication.recipes.verl.data import write
    from composer_replication.recipes.verl.reward import compute_score

    paths = write(tmp_path, [1])
    train, test = pd.read_parquet(paths["train"]), pd.read_parquet(paths["test"])
    assert len(train) > len(test) > 0
    assert not set(train.extra_info.map(lambda e: e["task_id"])) & set(
        test.extra_info.map(lambda e: e["task_id"])
    )
    row = train.iloc[0]
    truth = row.reward_model["ground_truth"]
    good = compute_score(row.data_source, truth, truth, dict(row.extra_info))
    bad = compute_score(row.data_source, str(int(truth) + 1), truth, dict(row.extra_info))
    assert (good["score"], bad["score"]) == (1.0, 0.0)
    assert bad["feedback"] == f"expected {truth}, got {int(truth) + 1}"
    with pytest.raises(ValueError, match="unknown data_source"):
        compute_score("gsm8k", "1", "1")
