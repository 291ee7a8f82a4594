"""Hint-uplift measurement: the pieces by hand, and the whole report on a tiny model."""

from __future__ import annotations

import json
import math

import pytest
import torch
from typer.testing import CliRunner

from composer_replication.channels.hints import HintTemplates, insert_hint
from composer_replication.envs.arithmetic import ArithmeticEnv, feedback_forms, grade_answer
from composer_replication.run.uplift import (
    Failure,
    Measurement,
    aggregate,
    continuation_logps,
    continuation_stats,
    greedy_mixture,
    hint_text,
    leaks,
    markdown,
)


def test_feedback_forms_do_not_leak_except_the_verifier():
    forms = feedback_forms(41, 31, "expected 41, got 31")
    assert forms["verifier"] == "expected 41, got 31"
    assert forms["direction"] == "31 is too small"
    assert forms["digits"] == "the tens digit of 31 is wrong"
    assert [k for k, v in forms.items() if leaks(v, "41")] == ["verifier"]
    assert feedback_forms(41, 14, "x")["digits"] == "the tens and ones digits of 14 are wrong"
    assert feedback_forms(7, None, "x")["direction"] == "the reply has no number"


def test_leaks_matches_whole_numbers_only():
    assert leaks("expected 19, got 8", "19")
    assert not leaks("the 119th try", "19") and not leaks("1.19", "19")


def test_hint_text_per_form():
    env = ArithmeticEnv([1])
    task = env.tasks("train")[0]
    wrong = str(int(task.data["answer"]) + 1)
    f = Failure(task, wrong, env.grade(task, wrong), sibling=str(task.data["answer"]))
    t = HintTemplates()
    assert "expected" in hint_text(f, "verifier", t)
    assert "too large" in hint_text(f, "direction", t)
    assert hint_text(f, "sibling", t).endswith(str(task.data["answer"]))
    assert hint_text(Failure(task, wrong, f.result, None), "sibling", t) is None
    with pytest.raises(ValueError, match="offers"):
        hint_text(f, "oracle", t)


def test_continuation_logps_equal_a_direct_forward(tokenizer, tiny_model):
    from composer_replication.lm.chat import render_prompt

    ctx = insert_hint([{"role": "user", "content": "What is 2 + 2?"}], "Hint: think")
    (s,), (n,) = continuation_logps(tiny_model, tokenizer, [ctx], ["4 ok"], 8)
    p = tokenizer(render_prompt(tokenizer, ctx), add_special_tokens=False)["input_ids"]
    c = tokenizer("4 ok", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logp = torch.log_softmax(tiny_model(torch.tensor([p + c])).logits[0], -1)
    want = sum(float(logp[len(p) - 1 + i, t]) for i, t in enumerate(c))
    assert n == len(c) and s == pytest.approx(want, abs=1e-4)


def test_mixture_stats_by_hand(tokenizer, tiny_model):
    """The logit mixture ``z = logits(a) + 2 * (logits(b) - logits(c))`` over the continuation,
    its log-prob and mean entropy, against a direct forward; with ``b == c`` the placebo
    contrast cancels and the stats are the plain model's."""
    from composer_replication.lm.chat import render_prompt

    q = [{"role": "user", "content": "What is 2 + 2?"}]
    a, b, c = q, insert_hint(q, "It is 4."), insert_hint(q, "The answer is wrong.")
    cont = "4 ok"
    got = continuation_stats(tiny_model, tokenizer, [[a], [b], [c]], [cont], 4, weights=[1, 2, -2])
    ids = tokenizer(cont, add_special_tokens=False)["input_ids"]

    def logits(ctx):
        p = tokenizer(render_prompt(tokenizer, ctx), add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            out = tiny_model(torch.tensor([p + ids])).logits[0].float()
        return out[len(p) - 1 : len(p) - 1 + len(ids)]

    logp = torch.log_softmax(logits(a) + 2 * (logits(b) - logits(c)), -1)
    want = float(logp[torch.arange(len(ids)), torch.tensor(ids)].sum())
    ent = float(-(logp.exp() * logp).sum(-1).mean())
    assert got.tokens == [len(ids)] and got.logp[0] == pytest.approx(want, abs=1e-3)
    assert got.entropy[0] == pytest.approx(ent, abs=1e-4)
    same = continuation_stats(tiny_model, tokenizer, [[a], [b], [b]], [cont], 4, weights=[1, 1, -1])
    plain = continuation_stats(tiny_model, tokenizer, [[a]], [cont], 4)
    assert same.logp[0] == pytest.approx(plain.logp[0], abs=1e-3)
    assert same.entropy[0] == pytest.approx(plain.entropy[0], abs=1e-3)


def test_greedy_mixture_decodes_the_mixed_argmax(tokenizer, tiny_model):
    """With the hint and the placebo equal, contrast decoding is plain greedy decoding; the
    reply follows the mixed logits' argmax token by token."""
    from composer_replication.evaluation import generate_greedy

    qs = [[{"role": "user", "content": t}] for t in ("What is 1 + 2?", "Say what 15 + 27 is.")]
    hinted = [insert_hint(q, "Add two." * (k + 1)) for k, q in enumerate(qs)]
    plain = generate_greedy(tiny_model, tokenizer, qs, 5, 1)
    # batched: rows of unequal length, left-padded, with a KV cache
    same = greedy_mixture(tiny_model, tokenizer, [qs, hinted, hinted], [1.0, 1.0, -1.0], 5, 2)
    assert same == plain
    mixed = greedy_mixture(tiny_model, tokenizer, [qs, hinted], [1.0, 3.0], 1, 2)
    from composer_replication.lm.chat import render_prompt

    def last(ctx):
        p = tokenizer(render_prompt(tokenizer, ctx), add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            return tiny_model(torch.tensor([p])).logits[0, -1].float()

    first = [int((last(q) + 3 * last(h)).argmax()) for q, h in zip(qs, hinted, strict=True)]
    assert mixed == [tokenizer.decode([t], skip_special_tokens=True) for t in first]
    # three tokens of a mixture against full forwards without a cache, token by token
    want = []
    for q, h in zip(qs, hinted, strict=True):
        rows = [tokenizer(render_prompt(tokenizer, c), add_special_tokens=False)["input_ids"]
                for c in (q, h)]  # fmt: skip
        for _ in range(3):
            with torch.no_grad():
                z = sum(
                    w * tiny_model(torch.tensor([r])).logits[0, -1]
                    for r, w in zip(rows, (1.0, -1.0), strict=True)
                )
            rows = [r + [int(z.argmax())] for r in rows]
        want.append(tokenizer.decode(rows[0][-3:], skip_special_tokens=True))
    assert greedy_mixture(tiny_model, tokenizer, [qs, hinted], [1.0, -1.0], 3, 2) == want
    assert len(set(want[0])) > 1  # not one repeated token: the mixture changes the reply


def test_aggregate_hand_worked():
    ms = [
        Measurement("a", 1, "direction", "h", False, 1.0, -0.2, False, True),
        Measurement("b", 1, "direction", "h", False, 3.0, -0.4, True, True),
        Measurement("c", 1, "verifier", "h 7", True, 5.0, -1.0, False, False),
    ]
    rows = {r.form: r for r in aggregate(ms)}
    d = rows["direction"]
    assert (d.n, d.leak, d.dlogp_answer, d.pass_plain, d.pass_hinted) == (2, 0.0, 2.0, 0.5, 1.0)
    assert d.dlogp_reply == pytest.approx(-0.3)
    assert rows["verifier"].leak == 1.0
    table = markdown(aggregate(ms))
    assert "| 1 | direction | 2 (2) | 0% | +2.00" in table and f"{math.exp(2.0):.2f}" in table
    assert "| 1 | verifier | 1 (1) | 100% | +5.00 [none: one prompt]" in table


def test_aggregate_intervals_are_over_prompts():
    """Four failed replies of prompt a and four of b, a placebo hint (one Δ log p(answer) per
    prompt: 1.0 for a, 3.0 for b): mean 2.0, and the interval is the t-interval over the two
    prompts, 2 +- 12.706 * 1.0 = [-10.71, +14.71], not 2 +- 1.96 * 1.069 / sqrt 8 = +-0.74 as
    if the eight were independent."""
    ms = [
        Measurement(t, 1, "wrong", "h", False, a, -0.1, False, False)
        for t, a in (("a", 1.0), ("b", 3.0))
        for _ in range(4)
    ]
    (row,) = aggregate(ms)
    assert row.dlogp_answer == 2.0 and row.extra["prompts"] == 2
    assert row.dlogp_answer_ci == pytest.approx((2 - 12.706, 2 + 12.706))


def test_cli_writes_the_report_on_a_tiny_model(tmp_path, tokenizer, tiny_model):
    from composer_replication.cli import app

    model_dir = tmp_path / "tiny"
    tiny_model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    out = tmp_path / "uplift"
    args = ["hints", "uplift", "--out", str(out), "--model", str(model_dir), "--level", "1",
            "--prompts", "2", "--samples", "2", "--form", "direction", "--form", "wrong",
            "--max-new-tokens", "3"]  # fmt: skip
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    data = json.loads((out / "uplift.json").read_text())
    assert {m["form"] for m in data["measurements"]} == {"direction", "wrong"}
    assert data["meta"]["level 1"]["sampled"] == 4
    assert (out / "uplift.png").stat().st_size > 0 and "| 1 | direction |" in (
        out / "uplift.md"
    ).read_text()
    bad = CliRunner().invoke(app, ["hints", "uplift", "--form", "oracle", "--out", str(out)])
    assert bad.exit_code == 2 and "unknown --form" in bad.output


def test_grade_answer_carries_the_forms():
    r = grade_answer("8", 19)
    assert r.info["feedback_forms"]["direction"] == "8 is too small"


def test_hints_report_recomputes_a_record_without_a_model(tmp_path, monkeypatch):
    """A record written before the prompt-clustered intervals (and before the entropy field):
    `hints report` rewrites its rows, table and plot with today's statistics and leaves the
    measurements as recorded; the entropy column is left out, not shown as 0, since no
    measurement has it. Not a record: one line naming the file, exit 2."""
    from composer_replication.cli import app
    from composer_replication.lm import models

    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("a model loaded"))
    raw = [
        {"task_id": t, "level": 7, "form": "wrong", "hint": "h", "leak": False,
         "dlogp_answer": a, "dlogp_reply": -0.1, "passed_plain": False, "passed_hinted": False}
        for t, a in (("a", 1.0), ("b", 3.0)) for _ in range(4)
    ]  # fmt: skip
    out = tmp_path / "rec"
    out.mkdir()
    (out / "uplift.json").write_text(
        json.dumps({"meta": {"x": 1}, "rows": [], "measurements": raw})
    )
    r = CliRunner().invoke(app, ["hints", "report", str(out)])
    assert r.exit_code == 0, r.output
    table = (out / "uplift.md").read_text()
    assert "| 7 | wrong | 8 (2) | 0% | +2.00 [-10.71, +14.71] |" in table
    assert "entropy" not in table and "nan" not in table
    data = json.loads((out / "uplift.json").read_text())
    assert data["measurements"] == raw and data["meta"] == {"x": 1}
    assert data["rows"][0]["dlogp_answer_ci"] == pytest.approx([2 - 12.706, 2 + 12.706])
    assert (out / "uplift.png").stat().st_size > 0
    (out / "uplift.json").write_text("{not json")
    bad = CliRunner().invoke(app, ["hints", "report", str(out)])
    assert bad.exit_code == 2 and len(bad.output.strip().splitlines()) == 1
    assert f"{out / 'uplift.json'}: not an uplift record" in " ".join(bad.output.split())
