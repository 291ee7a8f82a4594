"""The context-budget table of an ``ablate`` report (run/context_report.py)."""

from __future__ import annotations

import json

import pytest

from composer_replication.config import AblationConfig
from composer_replication.run.context_report import context_markdown, reward_by_summaries


def test_reward_by_summaries_averages_the_steps_that_had_such_episodes():
    """Step 1: 0 summaries 0.0, 1 summary 0.5; step 2: 1 summary 1.0; step 3 none logged.
    -> k=0: 0.0 over 1 step, k=1: 0.75 over 2 steps."""
    rows = [
        {"step": 1, "rollout/reward_by_summaries/0": 0.0, "rollout/reward_by_summaries/1": 0.5},
        {"step": 2, "rollout/reward_by_summaries/1": 1.0, "reward": 1.0},
        {"step": 3, "reward": 0.0},
    ]
    assert reward_by_summaries(rows) == {0: (0.0, 1), 1: (pytest.approx(0.75), 2)}


def _result(arm, seed, **extra):
    return {"arm": arm, "seed": seed, "pass_rate": 0.5, **extra}


def test_no_table_when_no_run_used_a_context_strategy():
    assert context_markdown([_result("a", 1), _result("b", 1)], ["a", "b"]) is None


def test_table_means_over_seeds_and_marks_what_an_arm_never_had():
    """Arm s: summaries 1.0 and 2.0 -> 1.50; summary tokens 20 and 30 -> 25.0; cut 0 and 0.5
    -> 25.0%; 1-summary reward 0.5 (3 steps) and 0.7 (2 steps) -> 0.600 over 2 seeds, 5 steps.
    Arm t never summarized: no summary length, no 1-summary reward ("-")."""
    results = [
        _result("s", 1, **{"context/summaries": 1.0, "context/windows": 2.0,
                           "context/summary_tokens": 20.0, "context/summaries_cut": 0.0,
                           "context/tokens_saved": 200.0, "context/ended_at_cap": 0.0,
                           "reward_by_summaries": {"1": [0.5, 3]}}),
        _result("s", 2, **{"context/summaries": 2.0, "context/windows": 3.0,
                           "context/summary_tokens": 30.0, "context/summaries_cut": 0.5,
                           "context/tokens_saved": 300.0, "context/ended_at_cap": 0.1,
                           "reward_by_summaries": {"1": [0.7, 2], "0": [0.0, 1]}}),
        _result("t", 1, **{"context/summaries": 0.0, "context/windows": 1.0,
                           "context/summaries_cut": 0.0, "context/tokens_saved": 0.0,
                           "context/ended_at_cap": 0.0, "reward_by_summaries": {"0": [0.25, 4]}}),
    ]  # fmt: skip
    text = context_markdown(results, ["t", "s"])
    assert text is not None
    lines = text.splitlines()
    header = next(x for x in lines if x.startswith("| arm |"))
    assert header.endswith(
        "| training reward, episodes with 0 summaries | training reward, episodes with 1 "
        "summary |"
    )
    assert "| t | 0.00 | 1.00 | - | 0.0% | 0 | 0.0% | 0.250 (1 seed, 4 steps) | - |" in lines
    assert (
        "| s | 1.50 | 2.50 | 25.0 | 25.0% | 250 | 5.0% | 0.000 (1 seed, 1 step) "
        "| 0.600 (2 seeds, 5 steps) |"
    ) in lines
    assert lines.index(next(x for x in lines if x.startswith("| t |"))) < lines.index(
        next(x for x in lines if x.startswith("| s |"))
    )  # the arms' order, not the results'


def test_ablate_report_reads_the_runs_context_metrics(tmp_path):
    """`ablate --report` over finished runs whose final evaluation and training log carry
    context metrics: the section holds the table, with the reward by summaries read from
    metrics.jsonl (0.4 and 0.8 over 2 steps -> 0.600)."""
    from composer_replication.run.ablation import run_ablation

    out = tmp_path / "out"
    acfg = AblationConfig.model_validate(
        {"seeds": [1], "output_dir": str(out), "section": "ev", "arms": [{"name": "summarize"}]}
    )
    run = out / "summarize" / "seed1"
    run.mkdir(parents=True)
    res = {"arm": "summarize", "seed": 1, "pass_rate": 0.5, "n": 10, "mean_reward": 0.5,
           "wall_s": 60.0, "context/summaries": 1.0, "context/windows": 2.0,
           "context/summary_tokens": 28.0, "context/summaries_cut": 0.0,
           "context/tokens_saved": 239.0, "context/ended_at_cap": 0.0}  # fmt: skip
    (run / "final_eval.json").write_text(json.dumps(res))
    rows = [{"step": i + 1, "reward": r, "rollout/reward_by_summaries/1": r} for i, r in
            enumerate([0.4, 0.8])]  # fmt: skip
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run_ablation(acfg, "ablate --report", train=False)
    text = (out / "results.md").read_text()
    assert "### What each arm did with the context budget" in text
    assert (
        "| summarize | 1.00 | 2.00 | 28.0 | 0.0% | 239 | 0.0% | 0.600 (1 seed, 2 steps) |" in text
    )
