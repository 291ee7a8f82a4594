"""Hints for channel 2: turn a failed rollout's verifier feedback, a successful sibling, or a
hint model's text into the context of the self-teacher.

The self-teacher is the policy itself, shown the hint, scoring the *same* completion tokens
(SDPO: Hübotter et al., "Reinforcement Learning via Self-Distillation", 2026; OPSD: Zhao et
al., "Self-Distilled Reasoner: On-Policy Self-Distillation", 2026). Where the hinted teacher
puts less probability than the student on a token, the student learns to avoid it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from composer_replication.envs.base import FEEDBACK_FORMS, StepResult

SOURCES = ("feedback", "sibling", "model")


@dataclass(frozen=True)
class Hint:
    """The hint for one completion: its text and where it came from."""

    text: str
    source: str


class HintModel(Protocol):
    """Anything that writes a hint from (prompt, failed completion, verifier feedback)."""

    def __call__(self, prompt: str, completion: str, feedback: str) -> str: ...


@dataclass(frozen=True)
class HintTemplates:
    """Templates for each source; ``{feedback}``, ``{sibling}``, ``{hint}`` are filled in."""

    feedback: str = (
        "A previous attempt at this was wrong. Feedback on it: {feedback}. Answer correctly."
    )
    sibling: str = "Here is a correct answer to this, for reference:\n{sibling}"
    model: str = "Hint: {hint}"


def build_hints(
    completions: Sequence[str],
    results: Sequence[StepResult],
    group_size: int,
    sources: Sequence[str] = ("feedback", "sibling"),
    templates: HintTemplates | None = None,
    prompts: Sequence[str] | None = None,
    hint_model: HintModel | Callable[[str, str, str], str] | None = None,
    max_chars: int = 2000,
    feedback_form: str = "verifier",
) -> list[Hint | None]:
    """One hint (or None) per completion; only failed completions get one.

    ``feedback_form`` picks the text of a ``feedback`` hint: ``verifier`` is
    ``StepResult.feedback``; another name is looked up in the result's
    ``info["feedback_forms"]`` (environments that offer several forms, e.g. arithmetic's
    ``direction``/``digits``/``wrong``, which do not contain the answer).

    ``completions`` are laid out in groups of ``group_size`` siblings (the same prompt), as in
    a GRPO batch. For each failed completion the first source in ``sources`` that applies wins:
    ``feedback`` needs non-empty verifier feedback; ``sibling`` needs a passed completion in the
    same group (the best-rewarded one is used); ``model`` asks ``hint_model``.
    """
    unknown = [s for s in sources if s not in SOURCES]
    if unknown:
        raise ValueError(f"unknown hint sources {unknown}; known: {list(SOURCES)}")
    if len(completions) != len(results) or len(completions) % group_size:
        raise ValueError(
            f"{len(completions)} completions / {len(results)} results do not form groups of "
            f"{group_size}"
        )
    if "model" in sources and (hint_model is None or prompts is None):
        raise ValueError("hint source 'model' needs hint_model= and prompts=")
    tpl = templates or HintTemplates()
    hints: list[Hint | None] = []
    for i, (completion, result) in enumerate(zip(completions, results, strict=True)):
        if result.passed:
            hints.append(None)
            continue
        group = range(i - i % group_size, i - i % group_size + group_size)
        hints.append(
            _first_hint(
                i,
                group,
                completion,
                replace(result, feedback=feedback_in_form(result, feedback_form)),
                completions,
                results,
                sources,
                tpl,
                prompts,
                hint_model,
                max_chars,
            )
        )
    return hints


def feedback_in_form(result: StepResult, form: str) -> str:
    """The verifier's feedback on ``result`` in ``form``: ``verifier`` is ``result.feedback``;
    another form is looked up in ``result.info["feedback_forms"]`` (ValueError naming the forms
    the environment offers when it is not there)."""
    if form == "verifier":
        return result.feedback
    forms = result.info.get(FEEDBACK_FORMS) or {}
    if form not in forms:
        offered = sorted(forms) or "none (only 'verifier')"
        raise ValueError(
            f"feedback form {form!r} (sdpo.feedback_form): the environment offers {offered}"
        )
    return forms[form]


PLACEBO_FORM = "wrong"
"""The feedback form without information (arithmetic: "the answer is wrong")."""
PLACEBO_FEEDBACK = "the answer is wrong"
"""The placebo's text where the environment offers no ``wrong`` form."""


def placebo_feedback(result: StepResult) -> str:
    """The content-free verdict on ``result``: the environment's ``wrong`` feedback form (the
    calculator names the turn: "turn 1 went wrong"), else :data:`PLACEBO_FEEDBACK`."""
    forms = result.info.get(FEEDBACK_FORMS) or {}
    return forms.get(PLACEBO_FORM) or PLACEBO_FEEDBACK


def placebo_hint(result: StepResult, templates: HintTemplates) -> str:
    """The placebo of the contrast teacher: the feedback template around
    :func:`placebo_feedback`."""
    return templates.feedback.format(feedback=placebo_feedback(result))


def best_success(completions: Sequence[str], results: Sequence[StepResult]) -> str | None:
    """The demonstration of a ``sibling`` hint: among the passed completions of a group, the
    best-rewarded, then the most concise (the first of equals), stripped; None if none passed."""
    winners = [j for j, r in enumerate(results) if r.passed]
    if not winners:
        return None
    best = max(winners, key=lambda j: (results[j].reward, -len(completions[j].strip())))
    return completions[best].strip()


def _first_hint(
    i, group, completion, result, completions, results, sources, tpl, prompts, hint_model, max_chars
) -> Hint | None:
    for source in sources:
        if source == "feedback" and result.feedback.strip():
            return Hint(tpl.feedback.format(feedback=result.feedback.strip())[:max_chars], source)
        if source == "sibling":
            demo = best_success([completions[j] for j in group], [results[j] for j in group])
            if demo is not None:
                return Hint(tpl.sibling.format(sibling=demo)[:max_chars], source)
        if source == "model":
            text = hint_model(prompts[i], completion, result.feedback).strip()
            if text:
                return Hint(tpl.model.format(hint=text)[:max_chars], source)
    return None


def insert_hint(messages: list[dict], hint: str) -> list[dict]:
    """The teacher's context: the conversation with the hint at the turn where the error
    occurred. For single-turn tasks that is the (last) user turn, which gets the hint appended
    after the problem; the completion that follows is unchanged. Returns a new list."""
    if not messages:
        raise ValueError("cannot insert a hint into an empty conversation")
    idx = max((k for k, m in enumerate(messages) if m.get("role") == "user"), default=None)
    if idx is None:
        raise ValueError("the conversation has no user turn to attach the hint to")
    out = [dict(m) for m in messages]
    content = out[idx].get("content", "")
    if not isinstance(content, str):
        raise TypeError("insert_hint supports text content only")
    out[idx]["content"] = f"{content}\n\n{hint}"
    return out


class OpenAIHintModel:
    """A hint model behind any OpenAI-compatible endpoint (a teacher from the pool, a local
    ``composer-replication serve``): asked for one short hint that does not give the answer.
    The openai client's own retries (``max_retries``) are the network edge's retries."""

    SYSTEM = (
        "You help a student fix a failed attempt. Reply with one short hint (one or two "
        "sentences) that points at the mistake. Do not give the final answer."
    )

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str | None = None,
        timeout_s: float = 30.0,
        max_tokens: int = 96,
        max_retries: int = 3,
    ):
        import os

        from openai import OpenAI

        key = os.environ.get(api_key_env, "") if api_key_env else "not-needed"
        if api_key_env and not key:
            raise ValueError(f"hint model: environment variable {api_key_env} is not set")
        self.client = OpenAI(
            base_url=base_url, api_key=key, timeout=timeout_s, max_retries=max_retries
        )
        self.model = model
        self.max_tokens = max_tokens

    def __call__(self, prompt: str, completion: str, feedback: str) -> str:
        user = (
            f"Problem:\n{prompt}\n\nFailed attempt:\n{completion}\n\n"
            f"Verifier feedback: {feedback or '(none)'}\n\nHint:"
        )
        resp = self.client.chat.completions.create(
            model=self.model,
            messages=[
                {"role": "system", "content": self.SYSTEM},
                {"role": "user", "content": user},
            ],
            max_tokens=self.max_tokens,
            temperature=0.0,
        )
        return (resp.choices[0].message.content or "").strip()
