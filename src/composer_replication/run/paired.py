"""Paired comparisons of ablation arms over seeds, and the per-step analysis of their held-out
curves (issue 38's pre-registration, docs/results.md).

Every figure is, per seed, an arm's value minus the reference arm's on the same seed (same
prompts, same first rollouts), summarized by the mean over seeds with a two-sided 95% Student-t
interval (``mean +- t(0.975, n-1) * sd / sqrt(n)``). The decision rule (issue 17's): "helps" if
the interval lies on the better side of 0, "hurts" if on the worse side, otherwise "no
difference detected"; the interval's half-width is the effect the experiment could have seen.
Intervals are not adjusted for the number of arms compared.

The curve metrics read a finished run's periodic held-out scores (``heldout.jsonl``) and its
per-step training time (TRL's ``step_time`` in ``metrics.jsonl``: the time spent in
``training_step``, generation included; the periodic evaluations run in a callback after it
and do not count).
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from composer_replication.config import StepReport
from composer_replication.evaluation import t95

HELPS, HURTS, NO_DIFFERENCE = "helps", "hurts", "no difference detected"
"""The decision rule's verdicts."""

STEP_TIME_KEY = "step_time"
"""A step's training seconds in metrics.jsonl (logged by TRL's GRPOTrainer)."""


def mean_known(values: Iterable[float | None]) -> float | None:
    """The mean of the values that are not None (None when none is known)."""
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None


def t_interval(vals: list[float]) -> tuple[float, float, float]:
    """Mean and two-sided 95% Student-t interval over seeds (half-width 0 for one value)."""
    mean = statistics.fmean(vals)
    half = 0.0
    if len(vals) > 1:
        half = t95(len(vals) - 1) * statistics.stdev(vals) / math.sqrt(len(vals))
    return mean, mean - half, mean + half


def with_interval(value: float, ci: tuple[float, float], n: int, sign: str = "") -> str:
    """``value [lo, hi]`` as percentages; one seed has no interval (``value (1 seed)``)."""
    if n < 2:
        return f"{value:{sign}.1%} (1 seed)"
    return f"{value:{sign}.1%} [{ci[0]:{sign}.1%}, {ci[1]:{sign}.1%}]"


def paired_differences(values: Mapping[int, float], reference: Mapping[int, float]) -> list[float]:
    """``values`` minus ``reference`` for every seed both have, in seed order."""
    return [values[s] - reference[s] for s in sorted(values) if s in reference]


@dataclass(frozen=True)
class Paired:
    """An arm against the reference over seeds: the per-seed differences, their mean and
    95% t-interval, and the verdict (None with one seed: no interval)."""

    diffs: list[float]
    mean: float
    low: float
    high: float
    verdict: str | None

    @property
    def half_width(self) -> float:
        return self.high - self.mean


def decide(diffs: list[float], higher_is_better: bool = True) -> Paired | None:
    """The decision rule on per-seed differences (None when there are none)."""
    if not diffs:
        return None
    mean, low, high = t_interval(diffs)
    verdict = None
    if len(diffs) > 1:
        verdict = NO_DIFFERENCE
        if low > 0:
            verdict = HELPS if higher_is_better else HURTS
        elif high < 0:
            verdict = HURTS if higher_is_better else HELPS
    return Paired(diffs, mean, low, high, verdict)


@dataclass(frozen=True)
class RunCurve:
    """A finished run's periodic held-out pass@1 by evaluated step, and its cumulative training
    seconds through each logged step (empty when the run logged no ``step_time``)."""

    scores: dict[int, float]
    train_s: dict[int, float]
    load: tuple[float, ...] = ()
    """The machine's 1-minute load average at each logged step (``time/load_1m``; empty for
    runs logged before it was recorded)."""

    @classmethod
    def read(cls, run_dir: str | Path) -> RunCurve:
        """From a run directory's heldout.jsonl and metrics.jsonl. A row logged for several
        steps (``logging_steps`` > 1, TRL logs their mean) counts once per step it covers."""
        from composer_replication.trainer.callbacks import (
            HELDOUT_FILE,
            LOAD_KEY,
            METRICS_FILE,
            read_metrics,
        )

        run_dir = Path(run_dir)
        rows = read_metrics(run_dir / HELDOUT_FILE)
        scores = {int(r["step"]): float(r["pass_rate"]) for r in rows}
        logged = read_metrics(run_dir / METRICS_FILE)
        timed = sorted((int(r["step"]), float(r[STEP_TIME_KEY])) for r in logged
                       if STEP_TIME_KEY in r)  # fmt: skip
        load = tuple(float(r[LOAD_KEY]) for r in logged if LOAD_KEY in r)
        train_s, total, prev = {}, 0.0, 0
        for step, secs in timed:
            total += secs * (step - prev)
            train_s[step], prev = total, step
        return cls(scores, train_s, load)

    def total_s(self) -> float | None:
        """Training seconds to the last logged step (None: no ``step_time`` logged)."""
        return self.train_s[max(self.train_s)] if self.train_s else None

    def seconds_at(self, step: int) -> float | None:
        """Cumulative training seconds through ``step`` (0 at step 0; None past the last
        logged step, or when nothing was logged: a run without ``step_time``, such as TRL's
        SDPOTrainer peer, has no training time at any step, step 0 included)."""
        logged = sorted(self.train_s)
        if not logged:
            return None
        if step == 0:
            return 0.0
        if step > logged[-1]:
            return None
        i = bisect.bisect_right(logged, step)
        return self.train_s[logged[i - 1]] if i else 0.0

    def steps_to(self, threshold: float, every: int) -> tuple[int, bool]:
        """The first evaluated step whose score is >= ``threshold`` and True; else one
        interval past the last evaluated step and False."""
        for step in sorted(self.scores):
            if self.scores[step] >= threshold:
                return step, True
        return max(self.scores) + every, False

    def at_time(self, budget_s: float) -> tuple[float, int] | None:
        """(score, step) at the last evaluated step whose cumulative training seconds are
        <= ``budget_s``; None when no evaluated step has a known time within it."""
        within = [
            s for s in self.scores if (t := self.seconds_at(s)) is not None and t <= budget_s + 1e-9
        ]
        return (self.scores[max(within)], max(within)) if within else None


Unit = Literal["rate", "steps"]


@dataclass
class Metric:
    """One co-reported metric: per arm and seed its value (and a note such as "never" or
    "step 15"), and each arm's paired comparison against the reference."""

    label: str
    unit: Unit
    higher_is_better: bool
    values: dict[str, dict[int, float]]
    notes: dict[str, dict[int, str]] = field(default_factory=dict)
    paired: dict[str, Paired | None] = field(default_factory=dict)
    ref: str | None = None
    """The arm the others are paired against, when not the analysis's reference arm."""


def compare(
    label: str,
    values: dict[str, dict[int, float]],
    ref: str,
    unit: Unit = "rate",
    higher_is_better: bool = True,
    notes: dict[str, dict[int, str]] | None = None,
) -> Metric:
    """Every arm but ``ref`` paired against ``ref`` seed by seed, with the decision rule."""
    base = values.get(ref, {})
    paired = {
        arm: decide(paired_differences(v, base), higher_is_better)
        for arm, v in values.items()
        if arm != ref
    }
    return Metric(label, unit, higher_is_better, values, notes or {}, paired)


Curves = dict[str, dict[int, RunCurve]]
"""Finished runs' curves by arm, then seed."""


@dataclass
class StepAnalysis:
    """The per-step analysis of an ablation: the co-reported metrics (the primary one first),
    the paired difference at every evaluated step per arm, and the wall-time budget."""

    ref: str
    metrics: list[Metric]
    curve: dict[str, list[tuple[int, Paired]]]
    budget_s: float | None
    load: dict[str, tuple[float | None, int, int]] = field(default_factory=dict)
    """Per arm: the median load over its runs' logged steps (None: none logged), the runs
    that logged it, and the runs."""


def step_analysis(
    curves: Curves, finals: dict[str, dict[int, float]], ref: str, report: StepReport, every: int
) -> StepAnalysis:
    """Every metric of ``report`` from the finished runs' curves and final pass rates."""
    k = report.primary_step
    at_k = {a: {s: c.scores[k] for s, c in by.items() if k in c.scores} for a, by in curves.items()}
    primary, final = (
        f"held-out pass@1 at step {k} (primary)",
        "final held-out pass@1 (final evaluation)",
    )
    metrics = [
        compare(primary, at_k, ref),
        compare(final, finals, ref),
        steps_to_metric(curves, ref, report.threshold, every),
    ]
    for arm, against in report.pairs:
        for label, values in ((primary, at_k), (final, finals)):
            pair = {against: values.get(against, {}), arm: values.get(arm, {})}
            metrics.append(
                replace(compare(f"{label}, {arm} against {against}", pair, against), ref=against)
            )
    budget = wall_budget(curves.get(ref, {}))
    if budget is not None:
        metrics += [at_time_metric(curves, ref, f, budget) for f in report.wall_fractions]
    return StepAnalysis(ref, metrics, difference_curve(curves, ref), budget, load_by_arm(curves))


def load_by_arm(curves: Curves) -> dict[str, tuple[float | None, int, int]]:
    """Per arm: median load over every logged step of its runs, runs that logged it, runs."""
    out = {}
    for arm, by_seed in curves.items():
        values = [x for c in by_seed.values() for x in c.load]
        logged = sum(bool(c.load) for c in by_seed.values())
        out[arm] = (statistics.median(values) if values else None, logged, len(by_seed))
    return out


def load_sentence(load: Mapping[str, tuple[float | None, int, int]]) -> str:
    """How busy the machine was while each arm trained (the wall-time rows depend on it)."""
    parts = [
        f"`{arm}` {med:.1f} ({n} of {total} runs)" if med is not None else f"`{arm}` not logged"
        for arm, (med, n, total) in load.items()
    ]
    if not any(med is not None for med, _, _ in load.values()):
        return "No run logged the machine's load (`time/load_1m`, recorded from 2026-11-27 on)."
    return (
        "Machine load while training (the 1-minute load average at each step, "
        "`time/load_1m`; median over an arm's logged steps): " + ", ".join(parts) + "."
    )


def steps_to_metric(curves: Curves, ref: str, threshold: float, every: int) -> Metric:
    """Steps to ``threshold`` per run (fewer is better); "never" notes the runs that did not
    get there, counted one interval past their last evaluated step."""
    values: dict[str, dict[int, float]] = {}
    notes: dict[str, dict[int, str]] = {}
    for arm, by_seed in curves.items():
        for seed, curve in by_seed.items():
            step, reached = curve.steps_to(threshold, every)
            values.setdefault(arm, {})[seed] = float(step)
            notes.setdefault(arm, {})[seed] = str(step) if reached else f"never ({step})"
    label = (
        f"steps to {threshold:.0%} held-out (never = one interval of {every} past the last "
        "evaluated step; fewer is better)"
    )
    return compare(label, values, ref, "steps", higher_is_better=False, notes=notes)


def wall_budget(ref_curves: Mapping[int, RunCurve]) -> float | None:
    """``T``: the median over the reference arm's seeds of their training seconds to the last
    step (None when none of them logged ``step_time``)."""
    totals = [t for c in ref_curves.values() if (t := c.total_s()) is not None]
    return statistics.median(totals) if totals else None


def at_time_metric(curves: Curves, ref: str, fraction: float, budget_s: float) -> Metric:
    """Each run's periodic held-out score at ``fraction * budget_s`` training seconds, noting
    the evaluated step it comes from."""
    cut = fraction * budget_s
    values: dict[str, dict[int, float]] = {}
    notes: dict[str, dict[int, str]] = {}
    for arm, by_seed in curves.items():
        for seed, curve in by_seed.items():
            if (hit := curve.at_time(cut)) is not None:
                values.setdefault(arm, {})[seed] = hit[0]
                notes.setdefault(arm, {})[seed] = f"{hit[0]:.1%} (step {hit[1]})"
    name = "T" if fraction == 1.0 else f"{fraction:g} T"
    label = f"held-out pass@1 at training wall time {name} = {cut:.0f} s"
    return compare(label, values, ref, notes=notes)


def difference_curve(curves: Curves, ref: str) -> dict[str, list[tuple[int, Paired]]]:
    """Per arm but ``ref``: (step, paired difference) at every step both evaluated."""
    out: dict[str, list[tuple[int, Paired]]] = {}
    base = curves.get(ref, {})
    steps = sorted({s for by in curves.values() for c in by.values() for s in c.scores})
    for arm, by_seed in curves.items():
        if arm == ref:
            continue
        for step in steps:
            mine = {seed: c.scores[step] for seed, c in by_seed.items() if step in c.scores}
            theirs = {seed: c.scores[step] for seed, c in base.items() if step in c.scores}
            if (p := decide(paired_differences(mine, theirs))) is not None:
                out.setdefault(arm, []).append((step, p))
    return out


def _fmt(value: float, unit: Unit, sign: str = "") -> str:
    """A rate as a percentage, a step count with one decimal (a float sum's -1e-17 is +0)."""
    value = round(value, 9) + 0.0
    return f"{value:{sign}.1%}" if unit == "rate" else f"{value:{sign}.1f}"


def paired_cell(p: Paired | None, unit: Unit) -> str:
    """``mean [lo, hi]`` of the differences (``mean (1 seed)`` without an interval)."""
    if p is None:
        return "-"
    if len(p.diffs) < 2:
        return f"{_fmt(p.mean, unit, '+')} (1 seed)"
    return f"{_fmt(p.mean, unit, '+')} [{_fmt(p.low, unit, '+')}, {_fmt(p.high, unit, '+')}]"


def verdict_cell(p: Paired | None, unit: Unit) -> str:
    """The verdict with the half-width (the effect the experiment could have seen)."""
    if p is None:
        return "-"
    if p.verdict is None:
        return "- (1 seed: no interval)"
    half = f"{100 * p.half_width:.1f} points" if unit == "rate" else f"{p.half_width:.1f} steps"
    if p.half_width == 0:  # the rule's verdict stands, but a zero width is no evidence
        return f"{p.verdict} (half-width 0: every seed's difference is the same, no spread seen)"
    return f"{p.verdict} (half-width {half})"


def metric_rows(m: Metric, ref: str) -> list[str]:
    """One Markdown table row per arm of a metric (paired against ``m.ref`` if it has one)."""
    ref = m.ref or ref
    lines = []
    for arm, by_seed in m.values.items():
        if not by_seed:
            continue
        notes = m.notes.get(arm, {})
        per_seed = ", ".join(notes.get(s) or _fmt(by_seed[s], m.unit) for s in sorted(by_seed))
        mean = _fmt(statistics.fmean(by_seed.values()), m.unit)
        if m.unit == "steps":
            never = sum(n.startswith("never") for n in notes.values())
            mean += f" (never: {never} of {len(by_seed)})"
        p = m.paired.get(arm)
        diffs = _per_seed_diffs(by_seed, m.values.get(ref, {}), m.unit) if p else "-"
        verdict = "reference" if arm == ref else verdict_cell(p, m.unit)
        lines.append(
            f"| {m.label} | {arm} | {mean} | {per_seed} | {diffs} | {paired_cell(p, m.unit)} "
            f"| {verdict} |"
        )
    return lines


def _per_seed_diffs(mine: Mapping[int, float], ref: Mapping[int, float], unit: Unit) -> str:
    """Per seed of ``mine`` in seed order, its value minus the reference's ("-" where the
    reference has none), so each difference sits under its seed in the "per seed" column."""
    return ", ".join(_fmt(mine[s] - ref[s], unit, "+") if s in ref else "-" for s in sorted(mine))


def curve_rows(an: StepAnalysis) -> list[str]:
    """The difference at every evaluated step: one row per step, one column per arm."""
    arms = list(an.curve)
    steps = sorted({s for pts in an.curve.values() for s, _ in pts})
    lines = [
        "| step | " + " | ".join(f"{a} minus {an.ref}, mean [95% t-CI]" for a in arms) + " |",
        "| --- |" + " --- |" * len(arms),
    ]
    for step in steps:
        cells = []
        for arm in arms:
            p = dict(an.curve[arm]).get(step)
            cells.append(paired_cell(p, "rate") + (f" {p.verdict}" if p and p.verdict else ""))
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return lines


def analysis_markdown(an: StepAnalysis, plot: Path) -> str:
    """The per-step analysis as a Markdown subsection (``plot``: the difference curve PNG,
    relative to the Markdown file)."""
    others = len({a for m in an.metrics if m.ref is None for a in m.values if a != an.ref})
    pairs = sorted({f"`{a}` against `{m.ref}`" for m in an.metrics if m.ref
                    for a, by_seed in m.values.items() if a != m.ref and by_seed})  # fmt: skip
    wall = (
        f"Wall time: `T` = median over `{an.ref}`'s seeds of the summed per-step `step_time` "
        f"(metrics.jsonl; periodic evaluations do not count) = {an.budget_s:.0f} s; a run's "
        "score at a budget is its periodic held-out score at the last evaluated step whose "
        "cumulative step time is within it (the step is given per seed)."
        if an.budget_s is not None
        else f"No run of `{an.ref}` logged `step_time`: the fixed-wall-time rows are left out."
    )
    lines = [
        "### Per step, steps to a threshold, fixed wall time",
        "",
        f"Per seed, each arm minus `{an.ref}` on the same seed; the mean over seeds with a 95% "
        'Student-t interval. Decision rule: "helps" if the interval lies on the better side of '
        '0 (above for pass@1, below for steps), "hurts" if on the worse side, otherwise "no '
        'difference detected"; the half-width is the effect this experiment could have seen. '
        f"{others} arm{'s' * (others != 1)} compared with `{an.ref}`, with unadjusted 95% "
        "intervals"
        + (f"; also paired (rows named so, the same rule): {', '.join(pairs)}" if pairs else "")
        + ". Scores "
        "are the periodic held-out evaluations (heldout.jsonl), the final row excepted "
        "(final_eval.json). " + wall + " " + load_sentence(an.load),
        "",
        f"| metric | arm | mean over seeds | per seed | minus {an.ref}, per seed | minus "
        f"{an.ref}, mean [95% t-CI] | verdict (half-width: the detectable effect) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for m in an.metrics:
        lines += metric_rows(m, an.ref)
    lines += ["", "#### Paired difference in held-out pass@1 at every evaluated step", ""]
    lines += curve_rows(an)
    lines += ["", f"![paired difference vs step]({plot.as_posix()})"]
    return "\n".join(lines)


def plot_differences(an: StepAnalysis, out: Path) -> Path:
    """Held-out pass@1 minus the reference vs step, mean over seeds with its 95% t-interval
    shaded, one line per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.axhline(0.0, color="gray", lw=1)
    for arm, pts in an.curve.items():
        steps = [s for s, _ in pts]
        line = ax.plot(steps, [100 * p.mean for _, p in pts], marker="o", label=arm)
        ax.fill_between(steps, [100 * p.low for _, p in pts], [100 * p.high for _, p in pts],
                        color=line[0].get_color(), alpha=0.15)  # fmt: skip
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(f"held-out pass@1 minus {an.ref} (points; 95% t-CI)")
    ax.grid(alpha=0.3)
    if an.curve:
        ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
