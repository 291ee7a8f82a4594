"""An episode's recorded turns joined into one training sequence.

An agent re-sends the whole conversation on every request, re-rendered by the chat template.
Turn ``k+1`` extends the sequence when its prompt ids start with turn ``k``'s prompt ids
followed by its completion ids (a prefix-preserving template, a harness that does not edit
its history, and a completion that re-tokenizes to the same ids). Then the sequence is::

    prompt_ids     = turn 1's prompt
    completion_ids = turn 1's completion + (turn 2's prompt - the sequence so far)
                     + turn 2's completion + ...

with ``env_mask`` 1 on the policy's tokens and 0 on what the harness inserted between turns
(tool results, its own notes), and log-probs 0 there (TRL's ``env_mask`` from a
``rollout_func``, used like its ``tool_mask``). The first turn that does not extend the
sequence ends it: it and every later turn are dropped and counted (``dropped_turns``,
``dropped_tokens``: their completion tokens), as is a turn that would pass
``max_completion_tokens``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol


class RecordedTurn(Protocol):
    """A turn as the proxy records it (agents/proxy.py's ``Turn``)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]


@dataclass
class Joined:
    """One training sample of an episode."""

    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    turns: int = 0
    """Turns in the sequence."""
    dropped_turns: int = 0
    dropped_tokens: int = 0
    diverged: bool = False
    """A turn did not extend the sequence (not only the length cap)."""


def join_turns(turns: Sequence[RecordedTurn], max_completion_tokens: int) -> Joined | None:
    """The sequence of ``turns`` (module docstring), or None for an episode with no turn."""
    if not turns:
        return None
    first = turns[0]
    out = Joined(prompt_ids=list(first.prompt_ids))
    for i, turn in enumerate(turns):
        so_far = out.prompt_ids + out.completion_ids
        inserted = list(turn.prompt_ids[len(so_far) :]) if i else []
        extends = i == 0 or turn.prompt_ids[: len(so_far)] == so_far
        fits = len(out.completion_ids) + len(inserted) + len(turn.completion_ids) <= (
            max_completion_tokens
        )
        if not (extends and fits) or (i and not out.turns):
            out.diverged = out.diverged or not extends
            out.dropped_turns = len(turns) - i
            out.dropped_tokens = sum(len(t.completion_ids) for t in turns[i:])
            break
        out.completion_ids += inserted + list(turn.completion_ids)
        out.logprobs += [0.0] * len(inserted) + list(turn.logprobs)
        out.env_mask += [0] * len(inserted) + [1] * len(turn.completion_ids)
        out.turns += 1
    return out
