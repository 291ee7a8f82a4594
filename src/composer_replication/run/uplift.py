"""Does the self-teacher know better? Hint uplift of a model on its own failed replies.

Self-distillation (SDPO, Hübotter et al., arXiv:2601.20802; OPSD, Zhao et al.) pulls the policy
toward *itself shown a hint*: it can only teach what the hinted model knows better than the
unhinted one. Before training we measure that gap on the model's own failures, per hint
source and form:

* ``dlogp_answer``: ``log p(answer | prompt + hint) - log p(answer | prompt)``, the sequence
  log-prob of the correct answer (the bare number) with and without the hint; how much more
  likely the hinted teacher makes the right reply.
* ``dlogp_reply``: the same gap per token on the failed reply itself; this is the signal the
  channel distills (negative: the teacher disowns the wrong reply).
* greedy pass rate with the hint vs without it, on the same prompts (paired).
* ``leak``: the fraction of hints whose text contains the answer. Leaked answers are distilled
  as a shortcut rather than a skill (RLSD, arXiv:2604.03128); the final gain tracks the
  initial student/teacher gap (arXiv:2605.30070). Forms that do not contain the answer
  (``direction``, ``digits``, ``wrong``) are measured separately from those that do
  (``verifier``, ``sibling``).

Hint sources: ``feedback`` in each form the environment offers
(``StepResult.info["feedback_forms"]``), ``sibling`` (a successful reply to the same prompt, as
the channel picks it), ``model`` (the model itself writes a hint from the problem, its reply
and the verifier's message). ``wrong`` ("the answer is wrong") is the placebo: the template
without information.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from composer_replication.channels.hints import (
    HintTemplates,
    best_success,
    feedback_in_form,
    insert_hint,
    placebo_hint,
)
from composer_replication.envs.base import Environment, StepResult, Task
from composer_replication.evaluation import clustered_interval, generate_greedy
from composer_replication.lm.chat import as_messages, render_prompt
from composer_replication.lm.models import pad_token_id
from composer_replication.losses import contrast_weights

MODEL_HINT_PROMPT = (
    "Problem: {prompt}\nA student replied: {reply}\nThe checker said: {feedback}\n"
    "Write one short hint for the student. Do not state the answer."
)


@dataclass
class Failure:
    """One failed sampled reply and what its group offers as hints."""

    task: Task
    reply: str
    result: StepResult
    sibling: str | None  # the best successful reply to the same prompt, if any


@dataclass
class Measurement:
    """One (failure, hint form) measurement."""

    task_id: str
    level: Any
    form: str
    hint: str
    leak: bool
    dlogp_answer: float
    dlogp_reply: float
    passed_plain: bool
    passed_hinted: bool
    turn: int = 0
    """Multi-turn rollouts: the assistant turn the verifier blamed (where the hint goes)."""
    reason: str = ""
    """Multi-turn rollouts: the verifier's reason for that turn."""
    dentropy_reply: float = math.nan
    """Teacher minus student entropy (nats), averaged over the failed reply's positions:
    positive where the hint makes the teacher less sure (distilling it flattens the student).
    NaN where not measured (the multi-turn measurement; records written before it existed)."""


@dataclass
class UpliftRow:
    """Aggregate of one (level, form)."""

    level: Any
    form: str
    n: int
    leak: float
    dlogp_answer: float
    dlogp_answer_ci: tuple[float, float]
    dlogp_reply: float
    dlogp_reply_ci: tuple[float, float]
    pass_plain: float
    pass_hinted: float
    pass_delta_ci: tuple[float, float]
    dentropy_reply: float = math.nan
    dentropy_reply_ci: tuple[float, float] = (math.nan, math.nan)
    extra: dict[str, Any] = field(default_factory=dict)


def sample_failures(
    model, tokenizer, env: Environment, tasks: Sequence[Task], samples: int,
    temperature: float, max_new_tokens: int, batch_size: int, progress=None,
) -> tuple[list[Failure], int, int]:  # fmt: skip
    """Sample ``samples`` replies per task at ``temperature``; return the failures (with their
    best successful sibling), the number sampled and the number passed."""
    prompts = [t.prompt for t in tasks for _ in range(samples)]
    replies = generate_greedy(
        model, tokenizer, prompts, max_new_tokens, batch_size, progress, temperature
    )
    failures, passed = [], 0
    for i, task in enumerate(tasks):
        group = replies[i * samples : (i + 1) * samples]
        results = [env.grade(task, r) for r in group]
        sibling = best_success(group, results)  # the channel's pick
        passed += sum(r.passed for r in results)
        failures += [
            Failure(task, r, res, sibling)
            for r, res in zip(group, results, strict=True)
            if not res.passed
        ]
    return failures, len(prompts), passed


def answer_of(task: Task) -> str:
    """The correct reply in the form the task asks for (arithmetic: the bare number)."""
    if "answer" not in task.data:
        raise ValueError(f"task {task.task_id} has no data['answer'] to measure uplift on")
    return str(task.data["answer"])


def leaks(hint: str, answer: str) -> bool:
    """Whether ``hint`` contains ``answer`` as a whole token."""
    return re.search(rf"(?<![\w.-]){re.escape(answer)}(?![\w])", hint) is not None


def hint_text(f: Any, form: str, templates: HintTemplates) -> str | None:
    """The hint of one form for one failure (a :class:`Failure` or anything with its
    ``result`` and ``sibling``; None when that form does not apply)."""
    if form == "sibling":
        return templates.sibling.format(sibling=f.sibling) if f.sibling else None
    return templates.feedback.format(feedback=feedback_in_form(f.result, form).strip())


def model_hints(
    model, tokenizer, failures: Sequence[Failure], templates: HintTemplates,
    max_new_tokens: int, batch_size: int,
) -> list[str]:  # fmt: skip
    """Hints the model writes itself (source ``model``), in the channel's ``model`` template."""
    asks = [
        MODEL_HINT_PROMPT.format(prompt=f.task.prompt, reply=f.reply.strip(), feedback=f.result.feedback)
        for f in failures
    ]  # fmt: skip
    texts = generate_greedy(model, tokenizer, asks, max_new_tokens, batch_size)
    return [templates.model.format(hint=t.strip()) if t.strip() else "" for t in texts]


@dataclass
class ContinuationStats:
    """Per continuation: the sum of its tokens' log-probs, its token count, and the mean
    entropy (nats) of the predictive distribution at its positions."""

    logp: list[float]
    tokens: list[int]
    entropy: list[float]


def _token_rows(tokenizer, contexts: Sequence[Any], tools) -> list[list[int]]:
    return [
        tokenizer(render_prompt(tokenizer, c, tools=tools), add_special_tokens=False)["input_ids"]
        for c in contexts
    ]


def _next_logits(model, rows: list[list[int]], keep: list[int], pad: int) -> list[Tensor]:
    """One forward over right-padded ``rows``; per row, the float32 logits ``[keep[i], V]``
    that predict its last ``keep[i]`` tokens."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, device=next(model.parameters()).device)
    attn = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, : len(r)], attn[i, : len(r)] = torch.tensor(r, device=ids.device), 1
    logits = model(input_ids=ids, attention_mask=attn).logits.float()
    return [
        logits[i, len(r) - 1 - k : len(r) - 1]
        for i, (r, k) in enumerate(zip(rows, keep, strict=True))
    ]


@torch.no_grad()
def continuation_stats(
    model, tokenizer, contexts: Sequence[Sequence[Any]], continuations: Sequence[str],
    batch_size: int, tools: Sequence[Any] | None = None, weights: Sequence[float] = (1.0,),
) -> ContinuationStats:  # fmt: skip
    """Log-prob and entropy of each continuation under a mixture of the model's logits:
    ``z = sum_k weights[k] * logits(contexts[k][i] + continuation)``, renormalized per position.
    ``contexts`` holds one list of chat contexts per term (rendered with ``tools``). One term
    with weight 1 is the model's own distribution; ``[plain, hinted, placebo]`` with
    :func:`~composer_replication.losses.contrast_weights` is the placebo-contrast teacher."""
    if len(contexts) != len(weights):
        raise ValueError(f"{len(contexts)} context lists for {len(weights)} weights")
    pad = pad_token_id(tokenizer)
    out = ContinuationStats([], [], [])
    for s in range(0, len(continuations), batch_size):
        conts = [tokenizer(c, add_special_tokens=False)["input_ids"]
                 for c in continuations[s : s + batch_size]]  # fmt: skip
        mixed: list[Tensor] | None = None
        for ctx, w in zip(contexts, weights, strict=True):
            rows = [p + c for p, c in zip(_token_rows(tokenizer, ctx[s : s + batch_size], tools),
                                          conts, strict=True)]  # fmt: skip
            part = _next_logits(model, rows, [max(len(c), 1) for c in conts], pad)
            mixed = [w * x for x in part] if mixed is None else [m + w * x for m, x in zip(mixed, part, strict=True)]  # fmt: skip
        for z, c in zip(mixed or [], conts, strict=True):
            logp = torch.log_softmax(z, -1)
            picked = logp[
                torch.arange(len(c), device=logp.device), torch.tensor(c, device=logp.device)
            ]
            out.logp.append(float(picked.sum()) if c else 0.0)
            out.tokens.append(len(c))
            out.entropy.append(float(-(logp.exp() * logp).sum(-1).mean()))
    return out


def continuation_logps(
    model, tokenizer, contexts: Sequence[Any], continuations: Sequence[str], batch_size: int,
    tools: Sequence[Any] | None = None,
) -> tuple[list[float], list[int]]:  # fmt: skip
    """Sum of log-probs of each continuation after its chat context (rendered with ``tools``),
    and its token count."""
    st = continuation_stats(model, tokenizer, [contexts], continuations, batch_size, tools)
    return st.logp, st.tokens


class _CachedRows:
    """Left-padded rows run once, then extended one token per step with their KV cache
    (position ids from the attention mask, so padding does not shift positions)."""

    def __init__(self, model, rows: list[list[int]], pad: int):
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), pad, device=next(model.parameters()).device)
        self.mask = torch.zeros_like(ids)
        for i, r in enumerate(rows):
            ids[i, width - len(r) :], self.mask[i, width - len(r) :] = (
                torch.tensor(r, device=ids.device),
                1,
            )
        self.model, self.cache = model, None
        self.pos = (self.mask.cumsum(-1) - 1).clamp(min=0)
        self.logits = self._run(ids, self.pos)

    def _run(self, ids: Tensor, pos: Tensor) -> Tensor:
        out = self.model(input_ids=ids, attention_mask=self.mask, position_ids=pos,
                         cache=self.cache, use_cache=True)  # fmt: skip
        self.cache = out.cache
        return out.logits[:, -1].float()

    def step(self, tokens_B: Tensor) -> None:
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], 1)
        self.pos = self.pos[:, -1:] + 1
        self.logits = self._run(tokens_B[:, None], self.pos)


@torch.no_grad()
def greedy_mixture(
    model, tokenizer, contexts: Sequence[Sequence[Any]], weights: Sequence[float],
    max_new_tokens: int, batch_size: int,
) -> list[str]:  # fmt: skip
    """Greedy replies decoded from the logit mixture of :func:`continuation_stats` (each step
    takes the argmax of ``sum_k weights[k] * logits(contexts[k][i] + reply so far)``), as in
    classifier-free guidance for language models (Sanchez et al., arXiv:2306.17806)."""
    pad = pad_token_id(tokenizer)
    eos = model.generation_config.eos_token_id
    device = next(model.parameters()).device
    stops = torch.tensor(
        eos if isinstance(eos, list) else [eos if eos is not None else pad], device=device
    )
    replies: list[str] = []
    for s in range(0, len(contexts[0]), batch_size):
        terms = [_CachedRows(model, _token_rows(tokenizer, ctx[s : s + batch_size], None), pad)
                 for ctx in contexts]  # fmt: skip
        gen_BT = torch.empty((len(terms[0].mask), 0), dtype=torch.long, device=device)
        done_B = torch.zeros(len(terms[0].mask), dtype=torch.bool, device=device)
        for _ in range(max_new_tokens):
            z_BV = sum(w * t.logits for t, w in zip(terms, weights, strict=True))
            tok_B = z_BV.argmax(-1).masked_fill(done_B, pad)
            gen_BT = torch.cat([gen_BT, tok_B[:, None]], 1)
            done_B |= torch.isin(tok_B, stops)
            if done_B.all():
                break
            for t in terms:
                t.step(tok_B)
        replies += [tokenizer.decode([t for t in g.tolist() if t not in stops.tolist()],
                                     skip_special_tokens=True) for g in gen_BT]  # fmt: skip
    return replies


CONTRAST = "/contrast"
"""Suffix of a form measured as the placebo-contrast teacher: ``verifier/contrast`` is the
student's logits plus the difference between the ``verifier``-hinted and the placebo-hinted
(``wrong``) logits (:func:`composer_replication.losses.contrast_logits`)."""


@dataclass
class Probe:
    """Where uplift is measured: per failure, the unhinted context, the right continuation and
    the failed one after it, and how the setting hints a context and plays it out greedily."""

    plain: list[Any]
    """The student's contexts (chat messages)."""
    answers: list[str]
    """The right continuation after each context (the teacher should make it likelier)."""
    replies: list[str]
    """The failed continuation after each context (what the channel distills on)."""
    hinted: Callable[[int, str], Any]
    """(failure index, hint) -> the teacher's context."""
    greedy_pass: Callable[[list[int], list[Any]], list[bool]]
    """(failure indices, their contexts) -> whether greedy decoding from there passes."""
    model_hints: Callable[[], list[str]]
    """Hints the model writes itself, one per failure (source ``model``)."""
    tools: Sequence[Any] | None = None
    """Tool schemas the contexts are rendered with."""
    greedy_mixture_pass: Callable[[list[int], list[list[Any]], list[float]], list[bool]] | None = (
        None
    )
    """(failure indices, one context list per mixture term, weights) -> whether greedy decoding
    from the logit mixture passes; None where contrast forms are not measured."""


def measure_probe(
    model, tokenizer, failures: Sequence[Any], probe: Probe, forms: Sequence[str],
    templates: HintTemplates, batch_size: int, label: Callable[[Any], dict[str, Any]],
    progress: Callable[[str], None] | None = None, contrast_scale: float = 1.0,
) -> list[Measurement]:  # fmt: skip
    """Every (failure, form) measurement; forms that do not apply to a failure are skipped.
    ``label(failure)`` gives the measurement's ``level`` (and ``turn``, ``reason``). A form
    ``<form>/contrast`` measures the placebo-contrast teacher with scale ``contrast_scale``."""
    model.eval()
    stats = partial(continuation_stats, model, tokenizer, batch_size=batch_size, tools=probe.tools)
    s_ans, s_rep = stats([probe.plain], probe.answers), stats([probe.plain], probe.replies)
    passed_plain = probe.greedy_pass(list(range(len(failures))), probe.plain)
    out: list[Measurement] = []
    for form in forms:
        if progress:
            progress(form)
        base = form.removesuffix(CONTRAST)
        if base == "model":
            hints = probe.model_hints()
        else:
            hints = [hint_text(f, base, templates) for f in failures]
        idx = [i for i, h in enumerate(hints) if h]
        if not idx:
            continue
        terms, weights = [[probe.hinted(i, hints[i]) for i in idx]], [1.0]
        if form.endswith(CONTRAST):
            if probe.greedy_mixture_pass is None:
                raise ValueError(f"form {form!r}: contrast forms are measured on single-turn tasks")
            placebo = [probe.hinted(i, placebo_hint(failures[i].result, templates)) for i in idx]
            terms = [[probe.plain[i] for i in idx], terms[0], placebo]
            weights = list(contrast_weights(contrast_scale))
        t_ans = stats(terms, [probe.answers[i] for i in idx], weights=weights)
        t_rep = stats(terms, [probe.replies[i] for i in idx], weights=weights)
        if len(terms) == 1:
            passed_hinted = probe.greedy_pass(idx, terms[0])
        else:
            passed_hinted = probe.greedy_mixture_pass(idx, terms, weights)
        for j, i in enumerate(idx):
            f, n_rep = failures[i], max(s_rep.tokens[i], 1)
            out.append(
                Measurement(
                    task_id=f.task.task_id, form=form, hint=hints[i],
                    leak=leaks(hints[i], answer_of(f.task)),
                    dlogp_answer=t_ans.logp[j] - s_ans.logp[i],
                    dlogp_reply=(t_rep.logp[j] - s_rep.logp[i]) / n_rep,
                    passed_plain=passed_plain[i], passed_hinted=passed_hinted[j],
                    dentropy_reply=t_rep.entropy[j] - s_rep.entropy[i], **label(f),
                )
            )  # fmt: skip
    return out


def measure(
    model, tokenizer, env: Environment, failures: Sequence[Failure], forms: Sequence[str],
    templates: HintTemplates, max_new_tokens: int, batch_size: int, level_of: Callable[[Task], Any],
    progress: Callable[[str], None] | None = None, contrast_scale: float = 1.0,
) -> list[Measurement]:  # fmt: skip
    """Every (failure, form) measurement on single-turn replies."""
    plain = [as_messages(f.task.prompt) for f in failures]

    def passed(idx: list[int], replies: list[str]) -> list[bool]:
        return [env.grade(failures[i].task, r).passed for i, r in zip(idx, replies, strict=True)]

    def greedy_pass(idx: list[int], contexts: list[Any]) -> list[bool]:
        return passed(idx, generate_greedy(model, tokenizer, contexts, max_new_tokens, batch_size))

    def greedy_mixture_pass(idx: list[int], terms: list[list[Any]], weights: list[float]):
        mixed = greedy_mixture(model, tokenizer, terms, weights, max_new_tokens, batch_size)
        return passed(idx, mixed)

    probe = Probe(
        plain=plain,
        answers=[answer_of(f.task) for f in failures],
        replies=[f.reply for f in failures],
        hinted=lambda i, hint: insert_hint(plain[i], hint),
        greedy_pass=greedy_pass,
        model_hints=lambda: model_hints(model, tokenizer, failures, templates, 24, batch_size),
        greedy_mixture_pass=greedy_mixture_pass,
    )
    return measure_probe(
        model, tokenizer, failures, probe, forms, templates, batch_size,
        lambda f: {"level": level_of(f.task)}, progress, contrast_scale,
    )  # fmt: skip


def aggregate(ms: Sequence[Measurement]) -> list[UpliftRow]:
    """Per (level, form): means with 95% intervals clustered by prompt (the failed replies of
    one prompt are not independent: :func:`evaluation.clustered_interval`), and the paired
    pass-rate difference; ``extra["prompts"]``: the number of prompts (clusters)."""
    rows = []
    keys = sorted({(str(m.level), m.form) for m in ms}, key=lambda k: (k[0], k[1]))
    for level, form in keys:
        g = [m for m in ms if str(m.level) == level and m.form == form]
        tasks = [m.task_id for m in g]

        def ci(xs: list[float], tasks: list[str] = tasks) -> tuple[float, float]:
            return clustered_interval(xs, tasks)

        da, dr = [m.dlogp_answer for m in g], [m.dlogp_reply for m in g]
        dp = [float(m.passed_hinted) - float(m.passed_plain) for m in g]
        dh = [m.dentropy_reply for m in g]
        rows.append(
            UpliftRow(
                g[0].level, form, len(g), _mean([float(m.leak) for m in g]),
                _mean(da), ci(da), _mean(dr), ci(dr),
                _mean([float(m.passed_plain) for m in g]), _mean([float(m.passed_hinted) for m in g]),
                _clip(ci(dp)), _mean(dh), ci(dh), {"prompts": len(set(tasks))},
            )
        )  # fmt: skip
    return rows


def _clip(ci: tuple[float, float]) -> tuple[float, float]:
    """A pass-rate difference's interval within [-1, 1] (NaN kept: no interval)."""
    return (max(-1.0, ci[0]), min(1.0, ci[1])) if ci[0] == ci[0] else ci


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def markdown(rows: Sequence[UpliftRow]) -> str:
    """The uplift table (docs/results.md format); the entropy column only where some row
    measured it."""
    entropy = any(not math.isnan(r.dentropy_reply) for r in rows)
    cols = [
        "level", "hint form", "n (prompts)", "hint contains the answer",
        "Δ log p(answer) [95% CI]", "× p(answer)", "Δ log p per token of the failed reply [95% CI]",
        *(["Δ entropy per token on the failed reply [95% CI]"] if entropy else []),
        "greedy pass: no hint → hint", "paired Δ [95% CI]",
    ]  # fmt: skip
    head = f"| {' | '.join(cols)} |\n|{' --- |' * len(cols)}\n"
    return head + "\n".join(_markdown_row(r, entropy) for r in rows) + "\n"


def _markdown_row(r: UpliftRow, entropy: bool) -> str:
    n = f"{r.n} ({r.extra['prompts']})" if "prompts" in r.extra else str(r.n)
    cells = [
        str(r.level), r.form, n, f"{r.leak:.0%}",
        f"{r.dlogp_answer:+.2f} {_ci(r.dlogp_answer_ci, '+.2f')}",
        f"{math.exp(r.dlogp_answer):.2f}", f"{r.dlogp_reply:+.3f} {_ci(r.dlogp_reply_ci, '+.3f')}",
        *([f"{r.dentropy_reply:+.3f} {_ci(r.dentropy_reply_ci, '+.3f')}"] if entropy else []),
        f"{r.pass_plain:.0%} → {r.pass_hinted:.0%}",
        f"{r.pass_hinted - r.pass_plain:+.0%} {_ci(r.pass_delta_ci, '+.0%')}",
    ]  # fmt: skip
    return f"| {' | '.join(cells)} |"


def _ci(ci: tuple[float, float], spec: str) -> str:
    """``[lo, hi]``, or why there is none (all from one prompt)."""
    if any(math.isnan(x) for x in ci):
        return "[none: one prompt]"
    return f"[{ci[0]:{spec}}, {ci[1]:{spec}}]"


def plot(rows: Sequence[UpliftRow], path: Path) -> Path:
    """Bar chart of Δ log p(answer) per form, one group of bars per level."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = sorted({str(r.level) for r in rows})
    forms = sorted({r.form for r in rows})
    fig, ax = plt.subplots(figsize=(1.6 + 1.4 * len(levels) * len(forms) / 3, 3.6))
    width = 0.8 / max(len(forms), 1)
    for k, form in enumerate(forms):
        xs, ys, err = [], [], []
        for j, lv in enumerate(levels):
            r = next((r for r in rows if str(r.level) == lv and r.form == form), None)
            if r is not None:
                xs.append(j + k * width)
                ys.append(r.dlogp_answer)
                err.append((r.dlogp_answer_ci[1] - r.dlogp_answer_ci[0]) / 2)
        ax.bar(xs, ys, width, yerr=err, label=form, capsize=2)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks([j + width * (len(forms) - 1) / 2 for j in range(len(levels))])
    ax.set_xticklabels([f"level {lv}" if lv.isdigit() else lv for lv in levels])
    ax.set_ylabel("Δ log p(correct answer)\nhinted − unhinted")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def rereport(out: Path) -> list[UpliftRow]:
    """Recompute the rows of a recorded ``out/uplift.json`` with today's :func:`aggregate`
    and rewrite its rows, ``uplift.md`` and ``uplift.png``; the measurements stay as recorded
    (a field they lack is read as not measured). A `ValueError` naming the file if it is not
    an uplift record."""
    path = out / "uplift.json"
    try:
        data = json.loads(path.read_text())
        names = {f.name for f in fields(Measurement)}
        ms = [Measurement(**{k: v for k, v in m.items() if k in names})
              for m in data["measurements"]]  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: not an uplift record ({type(err).__name__}: {err})") from None
    rows = aggregate(ms)
    data["rows"] = [asdict(r) for r in rows]
    path.write_text(json.dumps(data, indent=1, default=str))
    (out / "uplift.md").write_text(markdown(rows))
    plot(rows, out / "uplift.png")
    return rows


def write_report(
    out: Path, ms: Sequence[Measurement], rows: Sequence[UpliftRow], meta: dict
) -> None:
    """``uplift.json`` (every measurement), ``uplift.md`` (the table) and ``uplift.png``."""
    out.mkdir(parents=True, exist_ok=True)
    data = {
        "meta": meta,
        "rows": [asdict(r) for r in rows],
        "measurements": [asdict(m) for m in ms],
    }
    (out / "uplift.json").write_text(json.dumps(data, indent=1, default=str))
    (out / "uplift.md").write_text(markdown(rows))
    plot(rows, out / "uplift.png")


def run_uplift(
    model_ref: str, levels: Sequence[int], prompts: int, samples: int, forms: Sequence[str],
    out: Path, temperature: float = 1.0, max_new_tokens: int = 16, batch_size: int = 32,
    seed: int = 0, templates: HintTemplates | None = None, console=None, max_failures: int = 128,
    contrast_scale: float = 1.0,
) -> list[UpliftRow]:  # fmt: skip
    """Measure hint uplift of ``model_ref`` on arithmetic ``levels`` (the first ``prompts``
    train problems of each level, ``samples`` replies each; at most ``max_failures`` failures per
    level, in task order) and write the report to ``out``."""
    from composer_replication.envs.arithmetic import ArithmeticEnv
    from composer_replication.lm.models import load_model, load_tokenizer
    from composer_replication.progress import progress_bar

    envs = {level: ArithmeticEnv([level]) for level in levels}  # a bad level: before the model
    torch.manual_seed(seed)
    tokenizer, model = load_tokenizer(model_ref), load_model(model_ref).eval()
    templates = templates or HintTemplates()
    ms: list[Measurement] = []
    meta: dict[str, Any] = {"model": model_ref, "samples": samples, "temperature": temperature,
                            "contrast_scale": contrast_scale}  # fmt: skip
    for level, env in envs.items():
        tasks = env.tasks("train")[:prompts]
        with progress_bar(console, f"level {level}: sampling", len(tasks) * samples) as adv:
            failures, n, won = sample_failures(
                model, tokenizer, env, tasks, samples, temperature, max_new_tokens, batch_size, adv
            )
        meta[f"level {level}"] = {
            "prompts": len(tasks), "sampled": n, "passed": won, "failed": len(failures),
            "measured": min(len(failures), max_failures),
        }  # fmt: skip
        failures = failures[:max_failures]
        with progress_bar(console, f"level {level}: hints", len(forms)) as adv:
            ms += measure(
                model, tokenizer, env, failures, forms, templates, max_new_tokens, batch_size,
                lambda t: t.data["level"], (lambda f, lv=level: adv(1, f"level {lv}: {f}")) if adv else None,
                contrast_scale,
            )  # fmt: skip
    rows = aggregate(ms)
    write_report(out, ms, rows, meta)
    return rows
