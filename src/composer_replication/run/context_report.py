"""The context-budget part of an ``ablate`` report: per arm, what its episodes did with the
budget (``rollout.context``, docs/summarization.md). Read from each finished run's final
evaluation (``context/*`` in ``final_eval.json``, :func:`composer_replication.rollout.context_stats`)
and its training log (``rollout/reward_by_summaries/<k>`` in ``metrics.jsonl``, the trainer's
``_log_context_metrics``). An ablation whose runs used no context strategy gets no table."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from composer_replication.run.paired import mean_known

CONTEXT_COLUMNS = (
    ("context/summaries", "summaries per episode", "{:.2f}"),
    ("context/windows", "windows per episode", "{:.2f}"),
    ("context/summary_tokens", "summary tokens", "{:.1f}"),
    ("context/summaries_cut", "summaries cut at their limit", "{:.1%}"),
    ("context/tokens_saved", "context tokens dropped per episode", "{:.0f}"),
    ("context/ended_at_cap", "episodes ended at the cap", "{:.1%}"),
)
"""The final evaluation's ``context/*`` keys the table shows: key, column, format."""

REWARD_BY_SUMMARIES = "rollout/reward_by_summaries/"
"""The training log's prefix of the mean reward of a step's episodes with ``k`` summaries."""


def reward_by_summaries(metrics_rows: list[dict[str, Any]]) -> dict[int, tuple[float, int]]:
    """Per number of summaries ``k``: the mean over a run's training steps of the step's mean
    reward of its episodes with ``k`` summaries, and the number of steps that had any."""
    by_k: dict[int, list[float]] = {}
    for row in metrics_rows:
        for key, value in row.items():
            if key.startswith(REWARD_BY_SUMMARIES):
                by_k.setdefault(int(key.removeprefix(REWARD_BY_SUMMARIES)), []).append(value)
    return {k: (statistics.fmean(v), len(v)) for k, v in sorted(by_k.items())}


def context_signal(run_dir: Path) -> dict[str, Any]:
    """A finished run's training reward by number of summaries (``reward_by_summaries``:
    {"k": [mean over steps, steps]}, string keys as JSON keeps them), from its
    ``metrics.jsonl``; empty when it logged none."""
    from composer_replication.trainer.callbacks import METRICS_FILE, read_metrics

    by_k = reward_by_summaries(list(read_metrics(run_dir / METRICS_FILE)))
    return {"reward_by_summaries": {str(k): list(v) for k, v in by_k.items()}} if by_k else {}


def _reward_cell(results: list[dict[str, Any]], k: int) -> str:
    """The mean over an arm's seeds of ``k`` summaries' training reward, with the seeds and
    steps it is over; "-" when no episode of the arm wrote ``k`` summaries."""
    per_seed = [r["reward_by_summaries"][str(k)] for r in results
                if str(k) in r.get("reward_by_summaries", {})]  # fmt: skip
    if not per_seed:
        return "-"
    mean = statistics.fmean(v for v, _ in per_seed)
    steps = sum(n for _, n in per_seed)
    return f"{mean:.3f} ({_count(len(per_seed), 'seed')}, {_count(steps, 'step')})"


def _count(n: int, one: str, many: str | None = None) -> str:
    """``n`` and the word in its number ("1 seed", "2 seeds", "0 summaries")."""
    return f"{n} {one}" if n == 1 else f"{n} {many or one + 's'}"


def context_markdown(results: list[dict[str, Any]], arms: list[str]) -> str | None:
    """The report's table of context metrics per arm (the mean over its seeds), or None when no
    run evaluated with a context strategy. ``results``: finished runs as ``ablation.load_result``
    reads them."""
    if not any("context/summaries" in r for r in results):
        return None
    ks = sorted({int(k) for r in results for k in r.get("reward_by_summaries", {})})
    head = [c for _, c, _ in CONTEXT_COLUMNS] + [
        f"training reward, episodes with {_count(k, 'summary', 'summaries')}" for k in ks
    ]
    lines = [
        "### What each arm did with the context budget",
        "",
        "The final held-out evaluation's context metrics (`context/*` in final_eval.json), mean "
        "over seeds; the training reward of episodes by their number of summaries "
        "(`rollout/reward_by_summaries/<k>` in metrics.jsonl): the mean over seeds of each "
        "run's mean over the steps that had such episodes.",
        "",
        "| arm | " + " | ".join(head) + " |",
        "| --- |" + " --- |" * len(head),
    ]
    for arm in arms:
        rs = [r for r in results if r["arm"] == arm]
        cells = []
        for key, _, fmt in CONTEXT_COLUMNS:
            value = mean_known(r.get(key) for r in rs)
            cells.append("-" if value is None else fmt.format(value))
        cells += [_reward_cell(rs, k) for k in ks]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
