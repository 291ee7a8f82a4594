"""The channels on packed episodes (``rollout.context``; docs/summarization.md).

An episode that summarized (or truncated) is one row whose completion holds its windows one
after another: window 0's completion, then each later window's prompt (context, tool mask 0)
and completion (:meth:`rollout.ContextEpisode.packed`). A teacher must score each window's
tokens with what the policy saw when it wrote them: that window alone.

- Self-distillation (channels/self_distill.py): the hint goes into *every* window's prompt,
  after the task (each window's prompt repeats the task), so the teacher's packed row is the
  hinted prompt, window 0's completion, then each later window's hinted prompt and its
  completion (:func:`hinted_windows`); its forward is the packed one (lm/packing.py) and
  :func:`hinted_windows`'s index maps each student completion token to the teacher's. The
  summary turns are not graded turns (the verifier's ``failed_turn`` counts assistant turns
  only), so the turn mask skips them (:func:`summary_mask`).
- Distillation (channels/distill.py): each window is scored as its own prompt + completion
  (:func:`window_parts`), by a local teacher and by one behind an API alike, and the answers
  are laid back onto the packed row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from composer_replication.lm.chat import render_prompt


def window_spans(windows: Sequence[Any]) -> list[tuple[int, int]]:
    """Per window (``rollout.Window``), ``[start, end)`` of its completion tokens in the packed
    completion (later windows' prompts sit between the spans)."""
    spans, at = [], 0
    for k, w in enumerate(windows):
        at += len(w.prompt_ids) if k else 0
        spans.append((at, at + len(w.completion_ids)))
        at += len(w.completion_ids)
    return spans


def summary_mask(windows: Sequence[Any], length: int) -> list[bool]:
    """``length`` flags over the packed completion: True on the summary tokens (the last
    ``summary_tokens`` of each window a summary closed)."""
    out = [False] * length
    for w, (start, end) in zip(windows, window_spans(windows), strict=True):
        if w.summary is not None:
            for t in range(max(start, end - w.summary_tokens), min(end, length)):
                out[t] = True
    return out


def hinted_windows(
    tokenizer: Any,
    windows: Sequence[Any],
    hinted_messages: list[dict[str, Any]],
    hinted_prompt_ids: list[int],
    tools: Sequence[Any] | None = None,
) -> tuple[list[int], list[int], list[int]]:
    """The teacher's packed completion when every window's prompt carries the hint, after
    ``hinted_prompt_ids`` (window 0's hinted prompt, rendered from ``hinted_messages``):
    ``(ids, window of each id, index)``; ``index[j]`` is the teacher position of the student's
    packed completion token ``j`` (-1 on the later windows' prompts, which differ). A later
    window's hinted prompt: the hinted messages and the message that opened it (``summarize``,
    rendered as window 0's hinted prompt is), or the hinted prompt and the turns it kept
    (``truncate``)."""
    base = list(windows[0].prompt_ids)
    spans = window_spans(windows)
    ids: list[int] = []
    label: list[int] = []
    index = [-1] * (spans[-1][1] if spans else 0)
    for k, (w, (start, _)) in enumerate(zip(windows, spans, strict=True)):
        if k == 0:
            head: list[int] = []
        elif w.context_message is not None:
            text = render_prompt(tokenizer, [*hinted_messages, w.context_message], tools=tools)
            head = tokenizer(text, add_special_tokens=False)["input_ids"]
        elif list(w.prompt_ids[: len(base)]) == base:
            head = list(hinted_prompt_ids) + list(w.prompt_ids[len(base) :])
        else:
            raise ValueError(f"window {k}'s prompt neither opens with a message nor continues "
                             "window 0's prompt: cannot insert the hint")  # fmt: skip
        ids += head
        for t in range(len(w.completion_ids)):
            index[start + t] = len(ids) + t
        ids += w.completion_ids
        label += [k] * (len(head) + len(w.completion_ids))
    return ids, label, index


def window_parts(
    prompt_ids: list[int], windows: Sequence[Any], length: int
) -> list[tuple[list[int], int, int]]:
    """Each window as its own sequence for a teacher: ``(prompt + completion, prompt length,
    start of the completion in the packed completion)``, cut at the packed completion's
    ``length``; window 0's prompt is the row's (``prompt_ids``)."""
    parts = []
    for k, (w, (start, end)) in enumerate(zip(windows, window_spans(windows), strict=True)):
        n = min(end, length) - start
        if n <= 0:
            continue
        prompt = list(prompt_ids) if k == 0 else list(w.prompt_ids)
        parts.append((prompt + list(w.completion_ids[:n]), len(prompt), start))
    return parts
