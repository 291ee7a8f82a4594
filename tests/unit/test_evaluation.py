import pytest

from composer_replication.evaluation import (
    EvalResult,
    clustered_interval,
    mean_interval,
    paired_difference,
    wilson_interval,
)


def test_wilson_interval_hand_worked():
    """p = 20/100, z = 1.96: centre = (0.2 + 1.96^2/200) / (1 + 1.96^2/100) = 0.2192/1.0384
    = 0.2111; half = 1.96 * sqrt(0.0016 + 0.000096) / 1.0384 = 0.0777 -> [0.1334, 0.2888]."""
    lo, hi = wilson_interval(20, 100)
    assert lo == pytest.approx(0.1334, abs=1e-3)
    assert hi == pytest.approx(0.2888, abs=1e-3)
    assert wilson_interval(0, 10)[0] == 0.0
    assert wilson_interval(10, 10)[1] == pytest.approx(1.0)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 10, 49, 50, 100, 200, 1000])
def test_wilson_interval_contains_the_rate_at_0_and_1(n):
    """At p = 0 the exact lower bound is 0 (centre = half), at p = 1 the upper is 1; floating
    point put the lower bound 5.6e-17 above 0 for n = 3 (a negative error bar for matplotlib).
    The bounds hold p for every count, the degenerate ones included."""
    assert wilson_interval(0, n)[0] == 0.0
    assert wilson_interval(n, n)[1] == 1.0
    for k in range(n + 1) if n <= 200 else (0, 1, n - 1, n):
        lo, hi = wilson_interval(k, n)
        assert 0.0 <= lo <= k / n <= hi <= 1.0


def test_mean_interval_hand_worked():
    """values 0,1,0,1: mean .5, sample sd .5774, se .2887, half 1.96*.2887 = .5658."""
    lo, hi = mean_interval([0, 1, 0, 1])
    assert (lo, hi) == pytest.approx((0.5 - 0.5658, 0.5 + 0.5658), abs=1e-3)


def test_clustered_interval_counts_prompts_not_replies():
    """Six replies from three prompts, each prompt's replies equal: 1, 1 | 2, 2 | 6, 6 (mean 3).
    Summed residuals per prompt -4, -2, 6: se = sqrt(3/2 * (16 + 4 + 36)) / 6 = 1.5275,
    half = t(0.975, 2) 4.303 * 1.5275 = 6.573, as the t-interval over the 3 prompt means
    (sd 2.6458 / sqrt 3 = 1.5275). Taking the six as independent would give 1.96 * 2.3664 /
    sqrt 6 = 1.894, 3.5 times narrower."""
    values, prompts = [1.0, 1.0, 2.0, 2.0, 6.0, 6.0], ["a", "a", "b", "b", "c", "c"]
    lo, hi = clustered_interval(values, prompts)
    assert (lo, hi) == pytest.approx((3 - 6.573, 3 + 6.573), abs=1e-3)
    # one reply per prompt: the ordinary t-interval (4.303 * 1.5275 for the 3 prompt means)
    assert clustered_interval([1.0, 2.0, 6.0], ["a", "b", "c"]) == pytest.approx((lo, hi))


def test_clustered_interval_from_one_prompt_is_none():
    """Five replies of one prompt say nothing about other prompts: no interval (not the
    zero-width one that five equal values give when taken as independent)."""
    lo, hi = clustered_interval([6.15] * 5, ["p"] * 5)
    assert lo != lo and hi != hi  # nan


def _result(passed):
    return EvalResult(
        "e", "heldout", [str(i) for i in range(len(passed))], passed, [float(p) for p in passed]
    )


def test_paired_difference():
    base = _result([False, False, True, False])
    trained = _result([True, True, True, False])
    d = paired_difference(base, trained)
    assert d["delta_pass_rate"] == pytest.approx(0.5)
    assert d["ci95_low"] < 0.5 < d["ci95_high"]
    with pytest.raises(ValueError, match="same problems"):
        paired_difference(base, _result([True]))
