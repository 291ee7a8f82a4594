"""Hint uplift at the failed turn of multi-turn tool rollouts (the calculator agent).

The multi-turn counterpart of :mod:`composer_replication.run.uplift`. Composer's targeted
feedback and our channel 2 put the hint where the verifier blamed the rollout
(``StepResult.info["failed_turn"]``): the teacher sees the hinted prompt, the rollout's own
turns and tool results before that turn, and is asked for that turn. So the gap is measured
there, on the model's own sampled failures:

* ``dlogp_answer``: ``log p(right turn | hinted context) - log p(right turn | context)``, where
  the right turn is the environment's :meth:`reference_turn` after the same history (the
  calculator: the ``calculate`` call of the problem, or the number once a tool result holds
  it), rendered by the chat template with the tool schemas as in training;
* ``dlogp_reply``: the same gap per token on the failed turn itself (what the channel
  distills when ``sdpo.turn_scope=turn``);
* greedy pass from the failed turn on, with and without the hint: the episode is continued
  greedily (tools run, the remaining turn and tool-call budget of the original rollout) and
  the whole conversation graded;
* ``leak``: the hint contains the answer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from composer_replication.channels.hints import HintTemplates, best_success, insert_hint
from composer_replication.envs.base import Environment, StepResult, Task
from composer_replication.envs.tools import bounded_tools, tool_functions
from composer_replication.lm.chat import render_prompt
from composer_replication.rollout import run_agent
from composer_replication.run.uplift import (
    MODEL_HINT_PROMPT,
    Measurement,
    Probe,
    UpliftRow,
    aggregate,
    measure_probe,
    write_report,
)


@dataclass
class TurnFailure:
    """One failed rollout, cut at the turn the verifier blamed."""

    task: Task
    prompt: list[dict[str, Any]]
    """The task's prompt (system prompt, worked exchanges, the question)."""
    history: list[dict[str, Any]]
    """The rollout's messages before the failed assistant turn."""
    turn: dict[str, Any]
    """The failed assistant turn."""
    result: StepResult
    sibling: str | None
    """The final reply of the best successful rollout of the same prompt, if any."""
    turns_left: int
    calls_left: int

    @property
    def reply(self) -> str:
        """The failed turn as text (for model-written hints)."""
        calls = self.turn.get("tool_calls") or []
        names = [str(c.get("function", c).get("name")) for c in calls]
        return (
            str(self.turn.get("content") or "") + " " + " ".join(f"[{n}]" for n in names)
        ).strip()


def split_at_turn(messages: list[dict[str, Any]], k: int) -> tuple[list[dict], dict] | None:
    """(messages before the ``k``-th assistant turn, that turn), or None if there is none."""
    seen = 0
    for i, m in enumerate(messages):
        if m.get("role") == "assistant":
            if seen == k:
                return messages[:i], m
            seen += 1
    return None


def turn_text(tokenizer, context: list[dict], message: dict, tools: Sequence[Any]) -> str:
    """The text the chat template gives ``message`` as the next turn after ``context``."""
    head = render_prompt(tokenizer, context, tools=tools)
    full = render_prompt(tokenizer, [*context, message], tools=tools, add_generation_prompt=False)
    if not full.startswith(head):
        raise ValueError("the chat template is not prefix-preserving: cannot cut a turn out")
    return full[len(head) :]


def sample_turn_failures(
    model, tokenizer, env: Environment, tasks: Sequence[Task], samples: int, temperature: float,
    max_turns: int, max_tool_calls: int, max_new_tokens: int, batch_size: int, progress=None,
) -> tuple[list[TurnFailure], int, int]:  # fmt: skip
    """Sample ``samples`` rollouts per task; return the failures pinned to a turn (with the best
    successful sibling's final reply), the number sampled and the number passed."""
    rows = [env.row(t) for t in tasks for _ in range(samples)]
    reps = [t for t in tasks for _ in range(samples)]
    tools = bounded_tools(env.tools_class(), max_tool_calls)
    rollouts = run_agent(model, tokenizer, rows, tools, max_turns, max_new_tokens, batch_size,
                         progress, temperature)  # fmt: skip
    msgs = [r.messages for r in rollouts]
    results = env.grade_episodes(reps, msgs, [r.instance for r in rollouts])
    failures: list[TurnFailure] = []
    for i, task in enumerate(tasks):
        span = range(i * samples, (i + 1) * samples)
        sibling = best_success([results[j].observation for j in span], [results[j] for j in span])
        for j in span:
            k = results[j].info.get("failed_turn")
            cut = None if results[j].passed or k is None else split_at_turn(msgs[j], int(k))
            if cut is None:
                continue
            history, turn = cut
            used = sum(
                len(m.get("tool_calls") or []) for m in history if m.get("role") == "assistant"
            )
            failures.append(TurnFailure(task, rows[j]["prompt"], history, turn, results[j],
                                        sibling, max_turns - int(k), max_tool_calls - used))  # fmt: skip
    return failures, len(rows), sum(r.passed for r in results)


def continue_greedy(
    model, tokenizer, env: Environment, failures: Sequence[TurnFailure],
    contexts: Sequence[list[dict]], max_new_tokens: int, batch_size: int,
) -> list[bool]:  # fmt: skip
    """Continue each failure's episode greedily from ``contexts`` (its prompt, maybe hinted,
    plus its history) with the turns and tool calls it had left; grade the whole rollout."""
    passed = [False] * len(failures)
    budgets = sorted({(f.turns_left, f.calls_left) for f in failures})
    for turns_left, calls_left in budgets:
        idx = [
            i
            for i, f in enumerate(failures)
            if (f.turns_left, f.calls_left) == (turns_left, calls_left)
        ]
        rows = [{**env.row(failures[i].task), "prompt": contexts[i]} for i in idx]
        tools = bounded_tools(env.tools_class(), max(calls_left, 0))
        outs = run_agent(model, tokenizer, rows, tools, turns_left, max_new_tokens, batch_size)
        results = env.grade_episodes(
            [failures[i].task for i in idx],
            [failures[i].history + o.messages for i, o in zip(idx, outs, strict=True)],
            [o.instance for o in outs],
        )
        for i, r in zip(idx, results, strict=True):
            passed[i] = r.passed
    return passed


def model_turn_hints(model, tokenizer, failures: Sequence[TurnFailure], templates: HintTemplates,
                     batch_size: int) -> list[str]:  # fmt: skip
    """Hints the model writes itself about its failed turn, in the ``model`` template."""
    from composer_replication.evaluation import generate_greedy

    asks = [MODEL_HINT_PROMPT.format(prompt=f.task.prompt, reply=f.reply, feedback=f.result.feedback)
            for f in failures]  # fmt: skip
    texts = generate_greedy(model, tokenizer, asks, 24, batch_size)
    return [templates.model.format(hint=t.strip()) if t.strip() else "" for t in texts]


def measure_turns(
    model, tokenizer, env: Environment, failures: Sequence[TurnFailure], forms: Sequence[str],
    templates: HintTemplates, max_new_tokens: int, batch_size: int, group: str,
    progress: Callable[[str], None] | None = None,
) -> list[Measurement]:  # fmt: skip
    """Every (failure, form) measurement at the failed turn."""
    if not hasattr(env, "reference_turn"):
        raise ValueError(f"environment {env.name!r} has no reference_turn: cannot measure uplift")
    tools = tool_functions(env.tools_class()())
    plain = [f.prompt + f.history for f in failures]

    def greedy_pass(idx: list[int], contexts: list[Any]) -> list[bool]:
        sub = [failures[i] for i in idx]
        return continue_greedy(model, tokenizer, env, sub, contexts, max_new_tokens, batch_size)

    probe = Probe(
        plain=plain,
        answers=[
            turn_text(tokenizer, c, env.reference_turn(f.task, f.history), tools)
            for c, f in zip(plain, failures, strict=True)
        ],  # fmt: skip
        replies=[
            turn_text(tokenizer, c, f.turn, tools) for c, f in zip(plain, failures, strict=True)
        ],
        hinted=lambda i, hint: insert_hint(failures[i].prompt, hint) + failures[i].history,
        greedy_pass=greedy_pass,
        model_hints=lambda: model_turn_hints(model, tokenizer, failures, templates, batch_size),
        tools=tools,
    )
    return measure_probe(
        model, tokenizer, failures, probe, forms, templates, batch_size,
        lambda f: {"level": group, "turn": int(f.result.info["failed_turn"]),
                   "reason": str(f.result.info.get("reason", ""))},
        progress,
    )  # fmt: skip


def run_uplift_calculator(
    model_ref: str, shots: Sequence[int], prompts: int, samples: int, forms: Sequence[str],
    out: Path, temperature: float = 1.0, max_turns: int = 2, max_tool_calls: int = 2,
    max_new_tokens: int = 48, batch_size: int = 32, seed: int = 0,
    templates: HintTemplates | None = None, console=None, max_failures: int = 128,
) -> list[UpliftRow]:  # fmt: skip
    """Measure hint uplift at the failed turn on the calculator agent task, once per number
    of worked exchanges in the prompt (``shots``), and write the report to ``out``."""
    from composer_replication.envs.calculator import CalculatorEnv
    from composer_replication.lm.chat_templates import ensure_tool_template
    from composer_replication.lm.models import load_model, load_tokenizer
    from composer_replication.progress import progress_bar

    envs = {n: CalculatorEnv(shots=n) for n in shots}  # a bad --shots: before the model loads
    torch.manual_seed(seed)
    tokenizer, model = load_tokenizer(model_ref), load_model(model_ref).eval()
    ensure_tool_template(tokenizer)
    templates = templates or HintTemplates()
    ms: list[Measurement] = []
    meta: dict[str, Any] = {"model": model_ref, "env": "calculator", "samples": samples,
                            "temperature": temperature, "max_turns": max_turns,
                            "max_tool_calls": max_tool_calls}  # fmt: skip
    for n_shots, env in envs.items():
        group = f"{n_shots} shot" + ("s" if n_shots != 1 else "")
        tasks = env.tasks("train")[:prompts]
        with progress_bar(console, f"{group}: sampling", len(tasks) * samples) as adv:
            failures, n, won = sample_turn_failures(
                model, tokenizer, env, tasks, samples, temperature, max_turns, max_tool_calls,
                max_new_tokens, batch_size, adv,
            )  # fmt: skip
        meta[group] = {"prompts": len(tasks), "sampled": n, "passed": won,
                       "failed": len(failures), "measured": min(len(failures), max_failures),
                       "reasons": _reason_counts(failures)}  # fmt: skip
        failures = failures[:max_failures]
        with progress_bar(console, f"{group}: hints", len(forms)) as adv:
            ms += measure_turns(
                model, tokenizer, env, failures, forms, templates, max_new_tokens, batch_size,
                group, (lambda f, g=group: adv(1, f"{g}: {f}")) if adv else None,
            )  # fmt: skip
    rows = aggregate(ms)
    write_report(out, ms, rows, meta)
    return rows


def _reason_counts(failures: Sequence[TurnFailure]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for f in failures:
        k = str(f.result.info.get("reason_kind", f.result.info.get("reason", "")))
        counts[k] = counts.get(k, 0) + 1
    return counts
