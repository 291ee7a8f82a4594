"""The pre-registered per-step analysis of ``ablate --report`` (issue 38): held-out pass@1 at a
fixed early step, the final score, steps to a threshold and the score at fixed training wall
time, each paired against the reference arm seed by seed with a 95% t-interval and the decision
rule; on run directories written by the trainer's own writers with hand-chosen numbers."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError
from support.ablation_runs import write_finished_run

from composer_replication.config import AblationConfig
from composer_replication.run.ablation import run_ablation
from composer_replication.run.paired import (
    HELPS,
    HURTS,
    NO_DIFFERENCE,
    RunCurve,
    compare,
    decide,
    metric_rows,
    t95,
    t_interval,
)

STEPS = [0, 5, 10, 15, 20]
# held-out pass@1 at steps 0, 5, 10, 15, 20 for seeds 1..5
SCORES = {
    "grpo": [
        (0.2, 0.3, 0.50, 0.70, 0.85),
        (0.2, 0.3, 0.40, 0.70, 0.90),
        (0.2, 0.4, 0.55, 0.75, 0.82),
        (0.2, 0.3, 0.45, 0.60, 0.81),
        (0.2, 0.3, 0.50, 0.70, 0.75),  # never reaches 80%
    ],
    "distill": [
        (0.2, 0.5, 0.60, 0.80, 0.85),  # exactly 0.80 at step 15: reached (>=)
        (0.2, 0.5, 0.60, 0.85, 0.82),
        (0.2, 0.6, 0.70, 0.81, 0.83),
        (0.2, 0.4, 0.55, 0.80, 0.80),
        (0.2, 0.5, 0.70, 0.75, 0.78),  # never
    ],
    "mix": [
        (0.2, 0.4, 0.60, 0.70, 0.90),
        (0.2, 0.2, 0.30, 0.60, 0.80),
        (0.2, 0.4, 0.60, 0.70, 0.85),
        (0.2, 0.3, 0.40, 0.65, 0.85),
        (0.2, 0.3, 0.50, 0.60, 0.70),  # never
    ],
}
# seconds per training step, per seed (20 steps each)
STEP_S = {
    "grpo": (1.0, 1.1, 0.9, 1.5, 0.8),  # totals 20, 22, 18, 30, 16: median 20, mean 21.2
    "distill": (2.0,) * 5,
    "mix": (1.4,) * 5,
}
# the machine's load logged at each step, per seed (None: a run logged before it was recorded)
LOAD = {
    "grpo": (2.0, 2.0, 2.5, 3.0, 2.0),  # median over 100 steps: 2.0
    "distill": (3.0, 3.0, 4.0, None, None),  # 60 steps: median 3.0, 3 of 5 runs
    "mix": (None,) * 5,
}
FINAL = {
    "grpo": (0.90,) * 5,
    "distill": (0.80, 0.82, 0.78, 0.80, 0.80),
    "mix": (0.90, 0.92, 0.88, 0.91, 0.89),
}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """15 finished runs and the report on them (built once: the tests only read it)."""
    tmp_path = tmp_path_factory.mktemp("ablation")
    out = tmp_path / "out"
    for arm, per_seed in SCORES.items():
        for i, scores in enumerate(per_seed):
            run = out / arm / f"seed{i + 1}"
            run.mkdir(parents=True)
            write_finished_run(run, arm, i + 1, dict(zip(STEPS, scores, strict=True)),
                               [STEP_S[arm][i]] * 20, FINAL[arm][i], every=5,
                               load=LOAD[arm][i])  # fmt: skip
    acfg = AblationConfig.model_validate({
        "seeds": [1, 2, 3, 4, 5], "output_dir": str(out), "section": "ev", "eval_every": 5,
        "results_md": str(tmp_path / "docs" / "results.md"), "reference_arm": "grpo",
        "arms": [{"name": "grpo"}, {"name": "distill"}, {"name": "mix"}],
        "report": {"primary_step": 10},
    })  # fmt: skip
    run_ablation(acfg, "composer-replication ablate --report", train=False)
    return tmp_path


def _row(md: str, metric: str, arm: str) -> str:
    (line,) = [x for x in md.splitlines() if x.startswith(f"| {metric}") and f" | {arm} | " in x]
    return line


def test_primary_step_paired_interval_and_verdict(finished):
    """Step 10, distill minus grpo per seed: +0.10, +0.20, +0.15, +0.10, +0.20 -> mean 0.15,
    sd 0.05, half-width 2.776 * 0.05 / sqrt(5) = 0.0621 -> [+8.8%, +21.2%]: helps.
    mix: +0.10, -0.10, +0.05, -0.05, 0 -> mean 0, sd 0.0791, half-width 0.0981: no difference."""
    md = (finished / "docs" / "results.md").read_text()
    primary = "held-out pass@1 at step 10 (primary)"
    assert _row(md, primary, "distill") == (
        f"| {primary} | distill | 63.0% | 60.0%, 60.0%, 70.0%, 55.0%, 70.0% | +10.0%, +20.0%, "
        "+15.0%, +10.0%, +20.0% | +15.0% [+8.8%, +21.2%] | helps (half-width 6.2 points) |"
    )
    assert _row(md, primary, "mix").endswith(
        "| +0.0% [-9.8%, +9.8%] | no difference detected (half-width 9.8 points) |"
    )
    assert _row(md, primary, "grpo").endswith(
        "| 50.0%, 40.0%, 55.0%, 45.0%, 50.0% | - | - | reference |"
    )
    saved = json.loads((finished / "out" / "step_analysis.json").read_text())
    (dist,) = [m for m in saved["metrics"] if m["label"] == primary]
    assert dist["paired"]["distill"]["high"] - 0.15 == pytest.approx(0.062075, abs=1e-5)


def test_final_score_uses_the_final_evaluation(finished):
    """Final (final_eval.json), distill minus grpo: -0.10, -0.08, -0.12, -0.10, -0.10 -> mean
    -0.10, sd 0.01414, half-width 0.01756: hurts (the periodic step-20 scores would not)."""
    md = (finished / "docs" / "results.md").read_text()
    row = _row(md, "final held-out pass@1", "distill")
    assert row.endswith("| -10.0% [-11.8%, -8.2%] | hurts (half-width 1.8 points) |")


def test_steps_to_threshold_counts_a_never_reached_run_one_interval_past_the_end(finished):
    """Steps to 80%: grpo 20, 20, 20, 20, never (25) -> 21.0; distill 15 (0.80 counts), 15, 15,
    15, never (25) -> 17.0; differences -5, -5, -5, -5, 0 -> mean -4, sd 2.236, half-width
    2.776: [-6.8, -1.2], fewer steps: helps. mix all 20 but seed 5 never: differences 0."""
    md = (finished / "docs" / "results.md").read_text()
    label = "steps to 80% held-out"
    assert " | grpo | 21.0 (never: 1 of 5) | 20, 20, 20, 20, never (25) | - | - | reference |" in (
        _row(md, label, "grpo")
    )
    assert _row(md, label, "distill").endswith(
        "| distill | 17.0 (never: 1 of 5) | 15, 15, 15, 15, never (25) | -5.0, -5.0, -5.0, "
        "-5.0, +0.0 | -4.0 [-6.8, -1.2] | helps (half-width 2.8 steps) |"
    )
    assert _row(md, label, "mix").endswith(
        "| +0.0 [+0.0, +0.0] | no difference detected (half-width 0: every seed's difference "
        "is the same, no spread seen) |"
    )


def test_a_zero_width_helps_says_that_no_spread_was_seen():
    """Two seeds, each +68 points: the t-interval is [+68, +68] and the pre-registered rule
    says "helps"; the cell keeps that verdict but says the zero width is no spread seen, not
    certainty (before: "helps (half-width 0.0 points)")."""
    from composer_replication.run.paired import decide, verdict_cell

    assert verdict_cell(decide([0.68, 0.68]), "rate") == (
        "helps (half-width 0: every seed's difference is the same, no spread seen)"
    )
    assert verdict_cell(decide([0.68, 0.60]), "rate") == "helps (half-width 50.8 points)"


def test_fixed_wall_time_cuts_each_run_at_the_reference_median(finished):
    """T = median of grpo's summed step times (20, 22, 18, 30, 16) = 20 s (the mean would be
    21.2). At T grpo stops at steps 20 (cumulative 20 <= 20), 15, 20, 10, 20; distill (2 s a
    step) at 10; mix (1.4 s) at 10 (step 15 would be 21 s). mix minus grpo: -0.25, -0.40,
    -0.22, -0.05, -0.25 -> mean -0.234, half-width 0.1547: hurts. At T/2 = 10 s distill stops
    at step 5 (cumulative exactly 10): minus grpo (steps 10, 5, 10, 5, 10) 0, +0.2, +0.05,
    +0.1, 0 -> mean +0.07, half-width 0.1039: no difference."""
    md = (finished / "docs" / "results.md").read_text()
    assert "= 20 s;" in md
    at_t = "held-out pass@1 at training wall time T = 20 s"
    assert _row(md, at_t, "grpo").endswith(
        "| 85.0% (step 20), 70.0% (step 15), 82.0% (step 20), 45.0% (step 10), 75.0% (step 20) "
        "| - | - | reference |"
    )
    assert _row(md, at_t, "mix").endswith(
        "| 60.0% (step 10), 30.0% (step 10), 60.0% (step 10), 40.0% (step 10), 50.0% (step 10) "
        "| -25.0%, -40.0%, -22.0%, -5.0%, -25.0% | -23.4% [-38.9%, -7.9%] "
        "| hurts (half-width 15.5 points) |"
    )
    half = "held-out pass@1 at training wall time 0.5 T = 10 s"
    assert _row(md, half, "distill").endswith(
        "| +0.0%, +20.0%, +5.0%, +10.0%, +0.0% | +7.0% [-3.4%, +17.4%] "
        "| no difference detected (half-width 10.4 points) |"
    )
    saved = json.loads((finished / "out" / "step_analysis.json").read_text())
    assert saved["budget_s"] == pytest.approx(20.0)


def test_the_machine_load_is_reported_next_to_the_wall_time_rows(finished):
    md = (finished / "docs" / "results.md").read_text()
    assert (
        "(the 1-minute load average at each step, `time/load_1m`; median over an arm's logged "
        "steps): `grpo` 2.0 (5 of 5 runs), `distill` 3.0 (3 of 5 runs), `mix` not logged."
    ) in md


def test_difference_curve_at_every_evaluated_step_and_its_plot(finished):
    """At step 0 every arm equals grpo (same base model); at step 10 distill's row is the
    primary metric's; the plot sits next to the held-out curves plot."""
    md = (finished / "docs" / "results.md").read_text()
    section = md[md.index("#### Paired difference") :]
    rows = [x for x in section.splitlines() if x.startswith("| ") and x[2].isdigit()]
    assert [int(x.split("|")[1]) for x in rows] == STEPS
    assert rows[0] == (
        "| 0 | +0.0% [+0.0%, +0.0%] no difference detected "
        "| +0.0% [+0.0%, +0.0%] no difference detected |"
    )
    assert rows[2].startswith("| 10 | +15.0% [+8.8%, +21.2%] helps |")
    assert "![paired difference vs step](ev_difference_vs_step.png)" in md
    docs = finished / "docs"
    assert (docs / "ev_difference_vs_step.png").stat().st_size > 5000
    assert (docs / "ev_heldout_vs_step.png").is_file()
    assert md.index("ev_heldout_vs_step.png") < md.index("### Per step") < md.index("ev:end")
    run_md = (finished / "out" / "results.md").read_text()
    assert "![paired difference vs step](difference_vs_step.png)" in run_md


def test_decision_rule_direction_and_one_seed():
    """Above 0 helps a score and hurts a step count; an interval touching 0 decides nothing;
    one seed has no interval."""
    assert decide([0.1, 0.2, 0.15]).verdict == HELPS
    assert decide([0.1, 0.2, 0.15], higher_is_better=False).verdict == HURTS
    assert decide([-3.0, -4.0, -5.0], higher_is_better=False).verdict == HELPS
    assert decide([0.0, 0.2]).verdict == NO_DIFFERENCE  # 12.706 * 0.1414 / 1.414 = 1.27
    one = decide([0.3])
    assert one.verdict is None and one.mean == 0.3 and one.half_width == 0.0
    assert decide([]) is None


def test_t_interval_uses_student_t_past_nine_degrees_of_freedom():
    """11 seeds of values 0, 1, 0, 1, ..., 0 (mean 5/11, sample sd 0.5222): the half-width is
    t(0.975, 10) = 2.2281 times 0.5222 / sqrt(11) = 0.1575, i.e. 0.3508, not the normal
    quantile's 1.96 * 0.1575 = 0.3086. Reference quantiles: df 10 2.2281, 20 2.0860,
    30 2.0423, 100 1.9840 (scipy.stats.t.ppf(0.975, df))."""
    for df, exact in ((10, 2.2281), (20, 2.0860), (30, 2.0423), (100, 1.9840)):
        assert t95(df) == pytest.approx(exact, abs=1e-4)
    assert t95(4) == 2.776
    mean, low, high = t_interval([float(i % 2) for i in range(11)])
    assert mean == pytest.approx(5 / 11)
    assert high - mean == pytest.approx(0.3508, abs=1e-4)
    assert mean - low == pytest.approx(high - mean)


def test_a_run_without_step_time_has_no_score_at_a_wall_time(tmp_path):
    """TRL's SDPOTrainer (the peer arm) logs no ``step_time``: its training time is unknown at
    every step, so it has no score at any wall-time budget (not its untrained step-0 score
    as if no time had passed)."""
    rows = [{"step": s, "loss": 0.1} for s in (1, 2, 3, 4)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "heldout.jsonl").write_text(
        "".join(json.dumps({"step": s, "pass_rate": 0.2 + s / 10}) + "\n" for s in (0, 2, 4))
    )
    curve = RunCurve.read(tmp_path)
    assert curve.total_s() is None and curve.seconds_at(0) is None
    assert curve.at_time(1e9) is None


def test_per_seed_differences_sit_under_their_seed():
    """The reference has no value for seed 2 (a run of it unfinished, or cut by a wall-time
    budget): b's row lists seeds 1, 2, 3 and its differences +30.0%, -, +20.0% (0.5 - 0.2,
    none, 0.6 - 0.4); the interval is over the two paired seeds."""
    m = compare("score", {"ref": {3: 0.4, 1: 0.2}, "b": {3: 0.6, 2: 0.9, 1: 0.5}}, "ref")
    assert m.paired["b"].diffs == pytest.approx([0.3, 0.2])
    ref_row, b_row = metric_rows(m, "ref")
    assert "| 20.0%, 40.0% | - |" in ref_row
    assert "| 50.0%, 90.0%, 60.0% | +30.0%, -, +20.0% |" in b_row


def test_a_row_logged_for_several_steps_counts_once_per_step(tmp_path):
    """Rows at steps 2 (mean step_time 1.0) and 4 (3.0): 2 s through step 2, 8 s through 4;
    a held-out row at step 3 is at 2 s; past the last logged step the time is unknown."""
    (tmp_path / "metrics.jsonl").write_text(
        json.dumps({"step": 2, "step_time": 1.0})
        + "\n"
        + json.dumps({"step": 4, "step_time": 3.0})
        + "\n"
    )
    (tmp_path / "heldout.jsonl").write_text(
        "".join(json.dumps({"step": s, "pass_rate": s / 10}) + "\n" for s in (0, 3, 4, 6))
    )
    curve = RunCurve.read(tmp_path)
    assert curve.total_s() == 8.0
    assert [curve.seconds_at(s) for s in (0, 3, 4, 6)] == [0.0, 2.0, 8.0, None]
    assert curve.at_time(7.9) == (0.3, 3) and curve.at_time(8.0) == (0.4, 4)


def test_report_config_is_checked():
    arms = [{"name": "a"}]
    with pytest.raises(ValidationError, match="not a multiple of eval_every=5"):
        AblationConfig(arms=arms, eval_every=5, report={"primary_step": 4})
    with pytest.raises(ValidationError, match=r"wall_fractions must lie in \(0, 1\]"):
        AblationConfig(arms=arms, report={"primary_step": 0, "wall_fractions": [1.5]})
    with pytest.raises(ValidationError, match="Extra inputs"):
        AblationConfig(arms=arms, report={"primary_step": 0, "threshhold": 0.8})


def test_a_pre_registered_pair_of_two_arms_is_reported_with_the_same_rule(finished, tmp_path):
    """``report.pairs: [[mix, distill]]``: final mix minus distill per seed +0.10, +0.10,
    +0.10, +0.11, +0.09 -> mean 0.10, sd 0.00707, half-width 2.776 * 0.00707 / sqrt(5) =
    0.0088 -> [+9.1%, +10.9%]: helps; the rows against the reference arm are unchanged."""
    acfg = AblationConfig.model_validate({
        "seeds": [1, 2, 3, 4, 5], "output_dir": str(finished / "out"), "section": "ev",
        "eval_every": 5, "results_md": str(tmp_path / "results.md"), "reference_arm": "grpo",
        "arms": [{"name": "grpo"}, {"name": "distill"}, {"name": "mix"}],
        "report": {"primary_step": 10, "pairs": [["mix", "distill"]]},
    })  # fmt: skip
    run_ablation(acfg, "composer-replication ablate --report", train=False)
    md = (tmp_path / "results.md").read_text()
    label = "final held-out pass@1 (final evaluation), mix against distill"
    assert _row(md, label, "mix").endswith(
        "| +10.0%, +10.0%, +10.0%, +11.0%, +9.0% | +10.0% [+9.1%, +10.9%] "
        "| helps (half-width 0.9 points) |"
    )
    assert _row(md, label, "distill").endswith("| - | - | reference |")
    assert "also paired (rows named so, the same rule): `mix` against `distill`." in md
    before = (finished / "docs" / "results.md").read_text()
    final = "final held-out pass@1 (final evaluation) |"  # not the pair's rows
    assert _row(md, final, "distill") == _row(before, final, "distill")


def test_a_pair_must_name_two_arms():
    with pytest.raises(ValueError, match="report.pairs names 'masked', not an arm"):
        AblationConfig.model_validate({
            "seeds": [1], "output_dir": "/tmp/x", "section": "ev", "eval_every": 5,
            "arms": [{"name": "a"}, {"name": "b"}],
            "report": {"primary_step": 10, "pairs": [["a", "masked"]]},
        })  # fmt: skip
