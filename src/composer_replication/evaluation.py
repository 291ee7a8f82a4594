"""Held-out evaluation: greedy decoding on a fixed set of problems, pass rate and mean reward
with 95% confidence intervals, and a paired comparison of two models on the same problems.

Intervals: Wilson score interval for a pass rate; normal interval for a mean reward; for the
difference of two models on the same problems, the paired normal interval on per-problem
differences (equivalent to McNemar's setting for 0/1 outcomes).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from composer_replication.envs.base import Environment, Task

Z95 = 1.959963984540054

# two-sided 95% Student-t quantiles by degrees of freedom
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def t95(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom: the table up to 9,
    beyond it the Cornish-Fisher expansion in ``1/df`` (Abramowitz & Stegun 26.7.5; within
    1e-4 of the exact quantile from 10 on, and tending to the normal 1.96)."""
    if df in _T95:
        return _T95[df]
    z, v = Z95, float(df)
    terms = (
        (z**3 + z) / 4,
        (5 * z**5 + 16 * z**3 + 3 * z) / 96,
        (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384,
        (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160,
    )
    return z + sum(c / v**k for k, c in enumerate(terms, 1))


@dataclass
class EvalResult:
    """Per-problem outcomes and their summary."""

    env: str
    split: str
    task_ids: list[str]
    passed: list[bool]
    rewards: list[float]
    completions: list[str] = field(default_factory=list)
    temperature: float = 0.0
    """0 = greedy; else one sample per problem at this temperature."""
    tool_stats: dict[str, float] | None = None
    """Tool environments: mean turns and tool calls per rollout, failed-call fraction, and
    ``calls/<name>``: calls per rollout of each tool (``envs.tools.tool_call_counts``)."""

    @property
    def n(self) -> int:
        return len(self.passed)

    @property
    def pass_rate(self) -> float:
        return sum(self.passed) / max(self.n, 1)

    @property
    def mean_reward(self) -> float:
        return sum(self.rewards) / max(self.n, 1)

    def pass_ci(self) -> tuple[float, float]:
        return wilson_interval(sum(self.passed), self.n)

    def reward_ci(self) -> tuple[float, float]:
        return mean_interval(self.rewards)

    def episodes(self, tag: str) -> list[dict[str, object]]:
        """One record per problem: ``tag`` (which model), task, outcome and the completion
        (for a tool environment, its one-line transcript: text, ``Name(arguments)`` calls and
        ``-> result`` lines)."""
        return [
            {"tag": tag, "task_id": t, "passed": ok, "reward": r, "completion": c}
            for t, ok, r, c in zip(
                self.task_ids, self.passed, self.rewards, self.completions, strict=True
            )
        ]

    def summary(self) -> dict[str, float | int | str]:
        lo, hi = self.pass_ci()
        rlo, rhi = self.reward_ci()
        return {
            "env": self.env,
            "split": self.split,
            "n": self.n,
            "pass_rate": self.pass_rate,
            "pass_ci95_low": lo,
            "pass_ci95_high": hi,
            "mean_reward": self.mean_reward,
            "reward_ci95_low": rlo,
            "reward_ci95_high": rhi,
            "decoding": "greedy" if self.temperature <= 0 else f"sampled T={self.temperature:g}",
            **(self.tool_stats or {}),
        }


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (Wilson 1927): centre
    ``(p + z^2/2n) / (1 + z^2/n)``, half-width ``z sqrt(p(1-p)/n + z^2/4n^2) / (1 + z^2/n)``.

    The interval always contains ``p``: at ``p = 0`` (or 1) centre and half-width are equal in
    exact arithmetic, but in floating point ``centre - half`` can come out a few 1e-17 above 0
    (below 1), so the bounds are clamped to ``[0, p]`` and ``[p, 1]`` (error bars drawn from
    them are never negative)."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (min(p, max(0.0, centre - half)), max(p, min(1.0, centre + half)))


def mean_interval(values: list[float], z: float = Z95) -> tuple[float, float]:
    """Normal-approximation interval for a mean."""
    n = len(values)
    if n < 2:
        m = values[0] if values else 0.0
        return (m, m)
    m = sum(values) / n
    var = sum((v - m) ** 2 for v in values) / (n - 1)
    half = z * math.sqrt(var / n)
    return (m - half, m + half)


def clustered_interval(
    values: Sequence[float], clusters: Sequence[Hashable]
) -> tuple[float, float]:
    """95% interval for the mean of ``values`` that come in clusters (the failed replies of one
    prompt share the prompt, and a hint that does not depend on the reply gives them all one
    value): the cluster-robust standard error ``sqrt(k / (k - 1) * sum_c (sum_{i in c}
    (x_i - mean))^2) / n`` over ``k`` clusters with Student t at ``k - 1`` degrees of freedom.
    One value per cluster gives the ordinary t-interval. ``(nan, nan)`` with fewer than two
    clusters: the data cannot tell how much the mean would vary."""
    n, sums = len(values), {}
    if n == 0:
        return (math.nan, math.nan)
    mean = sum(values) / n
    for v, c in zip(values, clusters, strict=True):
        sums[c] = sums.get(c, 0.0) + (v - mean)
    k = len(sums)
    if k < 2:
        return (math.nan, math.nan)
    se = math.sqrt(k / (k - 1) * sum(r * r for r in sums.values())) / n
    half = t95(k - 1) * se
    return (mean - half, mean + half)


def paired_difference(base: EvalResult, trained: EvalResult) -> dict[str, float]:
    """Pass-rate difference (trained - base) on the same problems, with a paired 95% CI."""
    if base.task_ids != trained.task_ids:
        raise ValueError("paired comparison needs both results on the same problems, in order")
    diffs = [float(b) - float(a) for a, b in zip(base.passed, trained.passed, strict=True)]
    lo, hi = mean_interval(diffs)
    return {"delta_pass_rate": sum(diffs) / max(len(diffs), 1), "ci95_low": lo, "ci95_high": hi}


def select_tasks(env: Environment, split: str, n: int) -> list[Task]:
    """The first ``n`` tasks of a split in its fixed order (all of them if fewer)."""
    return env.tasks(split)[:n]


def generate_greedy(
    model,
    tokenizer,
    prompts: list[str],
    max_new_tokens: int,
    batch_size: int,
    progress=None,
    temperature: float = 0.0,
    shared_prefix: bool = True,
) -> list[str]:
    """Greedy completions for chat prompts, batched by the generator (lm/generator.py;
    sampled at ``temperature`` > 0, top-p 1, no top-k); the prompt tokens a batch shares are
    run once unless ``shared_prefix`` is off."""
    from composer_replication.lm.chat import render_prompt
    from composer_replication.lm.generator import Generator, Sampling
    from composer_replication.lm.models import pad_token_id

    completions: list[str] = []
    model.eval()
    sampling = Sampling(temperature=temperature, max_new_tokens=max_new_tokens)
    with Generator(model, pad_token_id(tokenizer), tokenizer.eos_token_id,
                   shared_prefix=shared_prefix, max_batch=batch_size) as generator:  # fmt: skip
        for start in range(0, len(prompts), batch_size):
            texts = [render_prompt(tokenizer, p) for p in prompts[start : start + batch_size]]
            ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
            outs = generator.generate(ids, sampling)
            completions.extend(tokenizer.batch_decode([o.ids for o in outs],
                                                      skip_special_tokens=True))  # fmt: skip
            if progress is not None:
                progress(len(texts))
    return completions


def evaluate(
    model,
    tokenizer,
    env: Environment,
    split: str = "heldout",
    n: int = 200,
    max_new_tokens: int = 16,
    batch_size: int = 32,
    progress=None,
    max_turns: int = 3,
    max_tool_calls: int = 4,
    temperature: float = 0.0,
    seed: int = 1234,
    shared_prefix: bool = True,
    context: Any = None,
    generator: Any = None,
) -> EvalResult:
    """Pass@1 and mean reward of ``model`` on the first ``n`` tasks of ``split``: greedy, or
    one sample per task at ``temperature`` > 0 (torch seeded with ``seed`` first).

    A tool environment runs multi-turn episodes the same way (``rollout.run_agent``: at most
    ``max_turns`` turns and ``max_tool_calls`` tool calls, ``max_new_tokens`` per turn) and
    reports turns and tool calls per rollout in ``tool_stats``. ``shared_prefix``: the run's
    ``generation.shared_prefix`` (prompt tokens a batch shares run once).

    ``context``: the run's ``rollout.context`` (config/env.py ``ContextConfig``). With a
    strategy, a tool environment's episodes run the loop training runs (``rollout.ContextLoop``
    through ``rollout.ToolLoop``: same budget, same summaries; ``max_new_tokens`` is the
    per-turn cap of the budget), and ``tool_stats`` adds ``context/*`` (``rollout.context_stats``:
    summaries and windows per rollout, summary length, ...); docs/summarization.md.
    ``generator``: a tool environment's turns are handed to it (lm/generator.py's interface;
    default: one over ``model``)."""
    tasks = select_tasks(env, split, n)
    if temperature > 0:
        import torch

        torch.manual_seed(seed)
    if env.tools:
        return _evaluate_agent(model, tokenizer, env, split, tasks, max_new_tokens, batch_size,
                               progress, max_turns, max_tool_calls, temperature,
                               shared_prefix, context, generator)  # fmt: skip
    completions = generate_greedy(
        model, tokenizer, [t.prompt for t in tasks], max_new_tokens, batch_size, progress,
        temperature, shared_prefix,
    )  # fmt: skip
    results = env.grade_batch(tasks, completions)
    return _result(env, split, tasks, results, completions, temperature)


def _result(env, split, tasks, results, completions, temperature, tool_stats=None) -> EvalResult:
    return EvalResult(
        env=env.name,
        split=split,
        task_ids=[t.task_id for t in tasks],
        passed=[r.passed for r in results],
        rewards=[r.reward for r in results],
        completions=completions,
        temperature=temperature,
        tool_stats=tool_stats,
    )


def _evaluate_agent(model, tokenizer, env, split, tasks, max_new_tokens, batch_size, progress,
                    max_turns, max_tool_calls, temperature, shared_prefix=True,
                    context=None, generator=None) -> EvalResult:  # fmt: skip
    from composer_replication.envs.tools import bounded_tools, tool_call_counts, tool_methods
    from composer_replication.lm.chat_templates import ensure_tool_template
    from composer_replication.rollout import RolloutStats, context_stats, run_agent

    ensure_tool_template(tokenizer)
    tools = bounded_tools(env.tools_class(), max_tool_calls)
    rows = [env.row(t) for t in tasks]
    rollouts = run_agent(model, tokenizer, rows, tools, max_turns, max_new_tokens, batch_size,
                         progress, temperature, shared_prefix, generator, context)  # fmt: skip
    results = env.grade_episodes(tasks, [r.messages for r in rollouts],
                                 [r.instance for r in rollouts])  # fmt: skip
    st = RolloutStats.of(rollouts)
    stats = {
        "turns_per_rollout": st.turns,
        "tool_calls_per_rollout": st.tool_calls,
        "tool_error_frac": st.tool_error_frac,
    }
    counts = tool_call_counts([r.messages for r in rollouts], tool_methods(env.tools_class()))
    stats.update({f"calls/{name}": n for name, n in counts.items()})
    episodes = [r.context for r in rollouts if r.context is not None]
    if episodes:
        stats.update({f"context/{k}": v for k, v in context_stats(episodes).items()})
    texts = [_transcript(r.messages) for r in rollouts]
    return _result(env, split, tasks, results, texts, temperature, stats)


def _transcript(messages: list[dict]) -> str:
    """A one-line view of a rollout: text, ``calculate(...)`` calls and ``-> result``s."""
    parts = []
    for m in messages:
        if m.get("context_window"):  # a new window (rollout.ContextLoop): what it starts from
            w = m["context_window"]
            said = "" if w.get("summary") is None else f"; summary: {w['summary']!r}"
            parts.append(f"[window {w['window']}{said}]")
            if w.get("observation") is not None:  # the environment's turn after the summary
                parts.append(f"-> {w['observation']}")
        if m.get("role") == "tool":
            parts.append(f"-> {m.get('content', '')}")
            continue
        if m.get("content"):
            parts.append(str(m["content"]))
        for c in m.get("tool_calls") or []:
            fn = c.get("function", c)
            parts.append(f"{fn.get('name')}({fn.get('arguments')})")
    return " | ".join(parts)
