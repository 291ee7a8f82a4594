"""A hard dollar ceiling for teacher calls.

Before a call is sent its worst-case cost is *reserved*: prompt tokens bounded from above
(`worst_case_prompt_tokens`) times the input price, plus ``max_tokens`` times the output price.
A reservation is granted only if ``spent + reserved + amount <= budget``; when the call returns,
the reservation is replaced by the cost computed from the returned ``usage``. Because every
in-flight call holds its worst case, the total can never pass the budget, however many calls are
in flight. A call that cannot be reserved waits while other calls are in flight (their unused
reservation may free room); when nothing is in flight and it still does not fit, that call is
refused (its state is skipped and reported) and later, smaller calls that fit still go ahead:
the run stops only when nothing left fits.

Usage a server reports is not trusted (`billed_usage`): billed prompt tokens are the reported
count only when it is a count between a local lower bound (`min_tokens`) and the local upper
bound, else the upper bound; billed completion tokens are the reported count only when it is a
count between the answer's lower bound and ``max_tokens``, else the answer's UTF-8 byte length
(an upper bound on its tokens) capped at ``max_tokens``. A bill therefore never exceeds the
call's reservation, so journaled spend never exceeds the budget whatever the server says, and a
report too low to be true (0 tokens for a page of text) is billed as the worst case instead of
as free; a call whose report was replaced is flagged as misreported.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import Any

import orjson

from composer_replication.config import TeacherConfig
from composer_replication.teachers.chat import TeacherResponse

PER_MESSAGE_OVERHEAD_TOKENS = 8
PER_REQUEST_OVERHEAD_TOKENS = 256
MAX_CHARS_PER_TOKEN = 8
"""Characters one token covers at most, on average over a text, for the lower bound: real
tokenizers average about 4 characters of English or code per token (long whitespace runs
aside), so a count below characters/8 is not a real count."""


def worst_case_prompt_tokens(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
) -> int:
    """Upper bound on prompt tokens for any byte-level tokenizer: every token covers at least one
    UTF-8 byte, so the JSON byte length of the messages (and tools) bounds the tokens of their
    text; a per-message and per-request allowance covers chat-template and tool-prompt tokens a
    server adds."""
    n = len(orjson.dumps(messages)) + (len(orjson.dumps(tools)) if tools else 0)
    return n + PER_MESSAGE_OVERHEAD_TOKENS * len(messages) + PER_REQUEST_OVERHEAD_TOKENS


def min_tokens(chars: int, cap: int | None = None) -> int:
    """Fewest tokens a text of ``chars`` characters can plausibly have: ``chars / 8`` rounded
    down, at least 1 for any non-empty text, at most ``cap`` (a completion cut at
    ``max_tokens`` may be denser than average)."""
    floor = max(1, chars // MAX_CHARS_PER_TOKEN) if chars else 0
    return floor if cap is None else min(cap, floor)


def prompt_chars(messages: list[dict[str, Any]]) -> int:
    """Characters of the text a prompt carries (message contents, tool-call names and
    arguments): what `min_tokens` bounds from below."""
    n = 0
    for m in messages:
        content = m.get("content")
        n += len(content) if isinstance(content, str) else 0
        n += _calls_chars(m.get("tool_calls"))
    return n


def _calls_chars(calls: Any) -> int:
    n = 0
    for c in calls if isinstance(calls, list) else ():
        fn = c.get("function") if isinstance(c, dict) else None
        if isinstance(fn, dict):
            n += sum(len(v) for v in (fn.get("name"), fn.get("arguments")) if isinstance(v, str))
    return n


def worst_case_cost(spec: TeacherConfig, prompt_tokens_bound: int) -> float:
    """Dollars of a call if it uses the bound's prompt tokens and all of ``max_tokens``."""
    return spec.cost_usd(prompt_tokens_bound, spec.max_tokens)


@dataclass
class BilledUsage:
    """Tokens a call is billed for, and why the server's report was not used (None: it was)."""

    prompt_tokens: int
    completion_tokens: int
    misreport: str | None = None


def billed_usage(
    spec: TeacherConfig, prompt_bound: int, resp: TeacherResponse, prompt_floor: int = 0
) -> BilledUsage:
    """Bound the billed tokens from above by what was asked and from below by what was
    exchanged (``prompt_floor``: `min_tokens` of the prompt; see the module docstring)."""
    problems = []
    prompt = resp.prompt_tokens
    if prompt is None or prompt > prompt_bound:
        problems.append(f"prompt_tokens={_show(resp, 'prompt_tokens')}")
        prompt = prompt_bound
    elif prompt < prompt_floor:
        problems.append(f"prompt_tokens={prompt} < {prompt_floor} for the prompt's text")
        prompt = prompt_bound
    completion = resp.completion_tokens
    chars = len(resp.text) + _calls_chars(resp.tool_calls)
    floor = min_tokens(chars, cap=spec.max_tokens)
    if completion is not None and completion < floor:
        problems.append(f"completion_tokens={completion} < {floor} for {chars} characters")
        completion = None
    elif completion is None or completion > spec.max_tokens:
        problems.append(f"completion_tokens={_show(resp, 'completion_tokens')}")
    if completion is None or completion > spec.max_tokens:
        answer = orjson.dumps(resp.as_message()["content"]) + orjson.dumps(resp.tool_calls)
        completion = min(spec.max_tokens, len(answer))
    if not isinstance(resp.raw_usage, dict):
        problems = ["no usage block"]
    return BilledUsage(prompt, completion, "; ".join(problems) or None)


def _show(resp: TeacherResponse, key: str) -> str:
    raw = resp.raw_usage.get(key) if isinstance(resp.raw_usage, dict) else None
    return repr(raw)[:40]


@dataclass
class Reservation:
    amount: float
    teacher: str


class BudgetLedger:
    """Spent and reserved dollars against a ceiling (``budget_usd=None``: no ceiling).

    ``spent_usd`` starts from what an earlier run of the same journal already spent, so a
    resumed replay keeps one ceiling.
    """

    def __init__(self, budget_usd: float | None, spent_usd: float = 0.0):
        if budget_usd is not None and budget_usd < 0:
            raise ValueError(f"budget_usd must be >= 0, got {budget_usd}")
        self.budget_usd = budget_usd
        self.spent_usd = spent_usd
        self.reserved_usd = 0.0
        self.in_flight = 0
        self.refused = 0  # calls refused because their worst case did not fit
        self.smallest_refused_usd: float | None = None
        self.max_committed_usd = spent_usd  # highest spent+reserved ever seen (tests assert on it)
        self.calls_settled = 0
        self.overruns = 0  # calls whose real cost exceeded their reservation (a bad usage report)
        self._lock = threading.Lock()
        self._cond: asyncio.Condition | None = None

    def _fits(self, amount: float) -> bool:
        if self.budget_usd is None:
            return True
        return self.spent_usd + self.reserved_usd + amount <= self.budget_usd + 1e-12

    @property
    def exhausted(self) -> bool:
        """Whether some call was refused because the budget could not cover it."""
        return self.refused > 0

    def try_reserve(self, amount: float, teacher: str = "") -> Reservation | None:
        """Reserve now or return None (never waits)."""
        with self._lock:
            if not self._fits(amount):
                return None
            self.reserved_usd += amount
            self.in_flight += 1
            self.max_committed_usd = max(self.max_committed_usd, self.spent_usd + self.reserved_usd)
            return Reservation(amount, teacher)

    async def reserve(self, amount: float, teacher: str = "") -> Reservation | None:
        """Reserve, waiting for in-flight calls to settle if needed; None when ``amount`` does
        not fit even with nothing in flight (only this call is refused: a smaller one may fit)."""
        if self._cond is None:
            self._cond = asyncio.Condition()
        async with self._cond:
            while True:
                res = self.try_reserve(amount, teacher)
                if res is not None:
                    return res
                if self.in_flight == 0:
                    self._refuse(amount)
                    return None
                await self._cond.wait()

    def _refuse(self, amount: float) -> None:
        with self._lock:
            self.refused += 1
            low = self.smallest_refused_usd
            self.smallest_refused_usd = amount if low is None else min(low, amount)

    def _finish(self, res: Reservation, actual: float) -> None:
        with self._lock:
            self.reserved_usd = max(0.0, self.reserved_usd - res.amount)
            self.spent_usd += actual
            self.overruns += actual > res.amount + 1e-12
            self.in_flight -= 1
            self.calls_settled += 1
            self.max_committed_usd = max(self.max_committed_usd, self.spent_usd + self.reserved_usd)

    async def settle(self, res: Reservation, actual_usd: float) -> None:
        """Replace a reservation by the call's real cost (0 for a call that produced no usage)."""
        self._finish(res, actual_usd)
        if self._cond is not None:
            async with self._cond:
                self._cond.notify_all()
