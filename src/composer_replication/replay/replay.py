"""`replay_trace`: N teachers answer every state of a trace, within a hard budget, resumably.

    result = await replay_trace(states, pool.teachers, journal="replay.db", budget_usd=2.0)

For each state the conversation prefix (OpenAI messages) is sent to each teacher; every outcome
(answer, usage, cost, or error) is committed to the journal (journal.py) as it arrives. Calls
already in the journal are not sent again (a failed one only with ``retry_failed``). Per-teacher
concurrency is a semaphore of ``max_concurrency``; the budget ledger (budget.py) reserves each
call's worst case before it is sent. With ``tiered=True`` teachers are asked tier by tier
(lowest first) and higher tiers only when the answers so far do not agree (see
`tier_settled`). States may be pre-selected by VOI gating (gating.py) with ``selected``.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console

from composer_replication.config import TeacherBase, TeacherConfig
from composer_replication.progress import progress_bar
from composer_replication.teachers.chat import INCOMPLETE_FINISH, Teacher, build_teacher
from composer_replication.teachers.edge import MAYBE_BILLED_KINDS, OnRetry, TeacherError
from composer_replication.traces.actions import action_key
from composer_replication.traces.redact import Redactor
from composer_replication.traces.schema import TraceState

from .budget import (
    BudgetLedger,
    Reservation,
    billed_usage,
    min_tokens,
    prompt_chars,
    worst_case_cost,
    worst_case_prompt_tokens,
)
from .journal import CallRecord, Journal, JournalError, Unrecorded, params_hash

BUDGET = "budget"  # sentinel outcome: not sent, its worst case does not fit the budget left
JOURNAL = "journal"  # sentinel outcome: not sent because the journal can no longer be written
STOPPED = {
    BUDGET: "the budget left does not cover another attempt",
    JOURNAL: "the journal cannot be written",
}
TRANSIENT_KINDS = frozenset({"connection", "transport", "timeout", "rate_limit", "server"})
"""Journaled failures of these kinds are sent again by the next run (no answer was received, so
nothing is lost but the retry); other failures are final unless ``retry_failed``."""


@dataclass
class ReplayResult:
    """What a replay did. ``calls_sent`` counts requests that went out this run (retries of one
    call count once; ``attempts`` counts every HTTP attempt)."""

    states_total: int = 0
    states_completed: int = 0
    states_failed: dict[str, str] = field(default_factory=dict)  # state_id -> reason
    states_remaining: int = 0  # not finished because the budget ran out
    states_not_started: int = 0  # not finished because the journal could not be written
    journal_error: str | None = None  # why the journal could not be written (the run stopped)
    calls_unrecorded: int = 0  # outcomes the journal refused (saved in ``unrecorded_path``)
    unrecorded_path: str | None = None  # None with calls_unrecorded > 0: those answers are lost
    calls_reimported: int = 0  # answers an earlier run saved beside the journal, now stored
    states_gated_out: int = 0
    states_skipped_empty: int = 0  # empty prefix: nothing to send (not a failure)
    states_duplicate: int = 0  # dropped: same state_id as an earlier state (replayed once)
    calls_sent: int = 0
    calls_cached: int = 0
    calls_failed: int = 0
    attempts: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0  # spent by this run
    journal_cost_usd: float = 0.0  # everything the journal has spent, all runs
    budget_usd: float | None = None
    budget_exhausted: bool = False  # some state was skipped: its worst case did not fit
    smallest_refused_usd: float | None = None
    max_committed_usd: float = 0.0
    calls_full_replay: int = 0  # states x teachers, before gating and tiers
    calls_saved_gating: int = 0
    calls_saved_tiers: int = 0
    usd_saved_estimate: float | None = None
    errors_by_kind: dict[str, int] = field(default_factory=dict)
    misreported_usage: dict[str, int] = field(default_factory=dict)  # teacher -> calls this run
    flagged_answers: dict[str, int] = field(default_factory=dict)  # "teacher: why" -> calls
    unreachable: dict[str, str] = field(default_factory=dict)  # teacher -> base_url (connection)
    broken: dict[str, str] = field(default_factory=dict)  # teacher -> a transport error seen
    calls_maybe_paid_twice: int = 0  # in flight when an earlier run was killed; sent again
    lost_usd: float = 0.0  # worst case of every attempt killed runs left in flight (all runs)
    attempts_charged: int = 0  # attempts this run that got no kept answer but may be billed
    charged_usd: float = 0.0  # their worst case (included in cost_usd)
    teacher_actions: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    interrupted: bool = False  # cancelled (Ctrl-C): calls in flight were abandoned

    def journal_failure(self) -> str:
        line = (
            f"journal write failed ({self.journal_error}): no new call was started after it, "
            f"{self.states_not_started} states not started"
        )
        if self.calls_unrecorded and self.unrecorded_path:
            return line + (
                f"; {self.calls_unrecorded} paid answers the journal refused are saved in "
                f"{self.unrecorded_path}"
            )
        if self.calls_unrecorded:
            return line + f"; {self.calls_unrecorded} paid answers could not be saved (lost)"
        return line

    def failed_reasons(self) -> dict[str, int]:
        """Failed states counted by their first error kind (every failed state is counted)."""
        out: dict[str, int] = defaultdict(int)
        for reason in self.states_failed.values():
            kind = reason.split(": ", 2)[1] if reason.count(": ") >= 2 else reason[:40]
            out[kind] += 1
        return dict(out)

    def summary(self) -> str:
        budget = "none" if self.budget_usd is None else f"${self.budget_usd:.6f}"
        lines = [
            f"states: {self.states_total} total, {self.states_completed} completed, "
            f"{len(self.states_failed)} failed, {self.states_remaining} remaining (budget), "
            f"{self.states_gated_out} gated out",
            f"calls: {self.calls_sent} sent ({self.attempts} HTTP attempts), "
            f"{self.calls_cached} from journal, {self.calls_failed} failed; "
            f"tokens in/out {self.prompt_tokens}/{self.completion_tokens}",
            f"cost: ${self.cost_usd:.6f} this run, ${self.journal_cost_usd:.6f} in journal; "
            f"budget {budget}",
            f"saved vs full replay ({self.calls_full_replay} calls): gating "
            f"{self.calls_saved_gating}, tiers {self.calls_saved_tiers}"
            + (f", ~${self.usd_saved_estimate:.6f}" if self.usd_saved_estimate is not None else ""),
        ]
        if self.interrupted:
            lines.append(
                "interrupted: calls in flight were abandoned (a resumed run counts their worst "
                "case as spent, since they may have been billed); run the same command to resume"
            )
        if self.states_skipped_empty:
            lines.append(
                f"{self.states_skipped_empty} states skipped: empty prefix (the session's "
                "opening action), nothing to send to a teacher"
            )
        if self.journal_error:
            lines.append(self.journal_failure())
        if self.calls_reimported:
            lines.append(
                f"{self.calls_reimported} paid answers an earlier run could not journal were "
                "imported from the file it saved them in"
            )
        if self.states_duplicate:
            lines.append(f"{self.states_duplicate} duplicate state ids replayed once")
        if self.budget_exhausted:
            need = self.smallest_refused_usd or 0.0
            lines.append(
                f"budget exhausted: stopped cleanly, {self.states_remaining} states remain "
                f"(skipped: their worst case did not fit what was left; the smallest needs "
                f"${need:.6f}); rerun with a larger --budget-usd to continue"
            )
        for what, n in sorted(self.flagged_answers.items()):
            lines.append(f"flagged answers: {what} on {n} calls (answers kept)")
        for name, n in sorted(self.misreported_usage.items()):
            lines.append(
                f"teacher {name!r} misreported usage on {n} calls: billed by the bound rule "
                "(a count above the local upper bound or max_tokens, or below the local lower bound "
                "for the text exchanged, is billed at the upper bound); raw usage is in the journal"
            )
        if self.calls_maybe_paid_twice:
            lines.append(
                f"resumed: {self.calls_maybe_paid_twice} calls were in flight when an earlier run "
                "stopped and may have been paid although no answer was recorded"
            )
        if self.attempts_charged:
            lines.append(
                f"{self.attempts_charged} attempts without a kept answer (timed out, broken or "
                f"rejected) were charged their worst case, ${self.charged_usd:.6f} (included "
                "above): the provider may have billed them"
            )
        if self.lost_usd:
            lines.append(
                f"${self.lost_usd:.6f}: worst case of calls lost in flight by stopped runs, "
                "counted against the budget (their provider may have billed them)"
            )
        for name, url in sorted(self.unreachable.items()):
            lines.append(
                f"teacher {name!r}: could not connect to {url}; start that server (or fix "
                "base_url) and run the same command again: failed connections are retried"
            )
        for name, why in sorted(self.broken.items()):
            lines.append(
                f"teacher {name!r}: the server answered but the exchange broke ({why[:200]}); "
                "a re-run retries these calls"
            )
        if self.errors_by_kind:
            lines.append("errors: " + ", ".join(f"{k}={v}" for k, v in self.errors_by_kind.items()))
        return "\n".join(lines)


def session_tools(states: Iterable[TraceState]) -> dict[str, list[dict[str, Any]]]:
    """Tool definitions per session, inferred from the tool calls seen in it.

    TraceStates do not carry the agent's tool schemas, so teachers get every tool name the
    session used, with a permissive parameters schema. (An adapter over traces/; no schema change.)
    """
    names: dict[str, dict[str, None]] = defaultdict(dict)
    for s in states:
        msgs = [*s.prefix, s.action.as_message()]
        for m in msgs:
            for c in m.get("tool_calls") or []:
                names[s.session_id][c["function"]["name"]] = None
    return {
        sid: [
            {
                "type": "function",
                "function": {
                    "name": n,
                    "description": "",
                    "parameters": {"type": "object", "additionalProperties": True},
                },
            }
            for n in tools
        ]
        for sid, tools in names.items()
    }


def state_tools(
    state: TraceState, inferred: list[dict[str, Any]] | None
) -> list[dict[str, Any]] | None:
    """The tools a teacher gets for ``state``: the source harness's schemas the state kept
    (``TraceState.tools``, traces/harness_tools.py), then the inferred definitions of other
    tools its session called (MCP tools, ``TodoWrite``...), or None."""
    known = [t for t in state.tools or () if isinstance(t, dict)]
    names = {_tool_name(t) for t in known}
    extra = [t for t in inferred or () if _tool_name(t) not in names]
    return known + extra or None


def _tool_name(tool: dict[str, Any]) -> Any:
    fn = tool.get("function")
    return fn.get("name") if isinstance(fn, dict) else None


def tier_settled(
    answers: dict[str, dict[str, Any]], agreement_threshold: int, min_agreement: float
) -> bool:
    """True when the answers so far agree enough to skip higher tiers: the largest group of
    equivalent answers (normalized exact match) has at least ``agreement_threshold`` members and
    at least ``min_agreement`` of all answers."""
    if not answers:
        return False
    counts: dict[str, int] = defaultdict(int)
    for msg in answers.values():
        counts[action_key(msg)] += 1
    top = max(counts.values())
    return top >= agreement_threshold and top / len(answers) >= min_agreement


class _Replayer:
    def __init__(self, teachers: Sequence[Teacher], journal: Journal, ledger: BudgetLedger, **kw):
        self.teachers = list(teachers)
        self.journal = journal
        self.ledger = ledger
        self.tools_by_session: dict[str, list[dict[str, Any]]] = kw["tools_by_session"]
        self.retry_failed: bool = kw["retry_failed"]
        self.tiered: bool = kw["tiered"]
        self.agreement_threshold: int = kw["agreement_threshold"]
        self.min_agreement: float = kw["min_agreement"]
        self.base_urls = {t.spec.name: t.spec.base_url for t in teachers}
        self.sems = {t.spec.name: asyncio.Semaphore(t.spec.max_concurrency) for t in teachers}
        self.result: ReplayResult = kw.get("result") or ReplayResult()
        self.cost_by_teacher: dict[str, list[float]] = defaultdict(list)
        self.tokens_ok = [0, 0]  # prompt, completion tokens of successful calls this run
        self.skipped_by_teacher: dict[str, int] = defaultdict(int)  # calls saved by tiers
        self.advance: Callable[..., None] | None = None
        self.redactor = Redactor()
        self.unrecorded: list[Unrecorded] = []  # outcomes the journal refused

    def tiers(self) -> list[list[Teacher]]:
        if not self.tiered:
            return [self.teachers]
        by_tier: dict[int, list[Teacher]] = defaultdict(list)
        for t in self.teachers:
            by_tier[t.spec.tier].append(t)
        return [by_tier[k] for k in sorted(by_tier)]

    def request(self, state: TraceState, spec: TeacherConfig) -> tuple[list, list | None, str]:
        """What is sent to ``spec`` for ``state``: its prefix and tools with every string
        redacted again (states from our ``ingest`` are already clean, so this changes nothing
        for them; states written elsewhere never reach a teacher with a secret in them)."""
        tools = state_tools(state, self.tools_by_session.get(state.session_id))
        messages = self.redactor.redact_obj(state.prefix)
        tools = self.redactor.redact_obj(tools) if tools else None
        phash = params_hash({**spec.request_params(), "messages": messages, "tools": tools})
        return messages, tools, phash

    async def call(self, state: TraceState, teacher: Teacher) -> CallRecord | str:
        spec = teacher.spec
        messages, tools, phash = self.request(state, spec)
        old = self.journal.get(state.state_id, spec.name, phash)
        if old is not None and self._final(old):
            self.result.calls_cached += 1
            if old.status == "ok":  # journaled usage also informs the savings estimate
                self.cost_by_teacher[old.teacher].append(old.cost_usd)
                self.tokens_ok[0] += old.prompt_tokens
                self.tokens_ok[1] += old.completion_tokens
            self._advance()
            return old
        async with self.sems[spec.name]:
            bound = worst_case_prompt_tokens(messages, tools)
            worst = worst_case_cost(spec, bound)
            first = await self._open_attempt(state, spec.name, phash, worst)
            if isinstance(first, str):
                return first
            attempts: list[tuple[Reservation | None, int | None]] = [first]

            async def on_retry(err: TeacherError) -> bool:
                """Before a retry: an attempt that may have been billed is spent at its worst
                case, and the next attempt needs a reservation of its own."""
                if not err.maybe_billed:
                    return True  # not billed: the same reservation covers the next attempt
                failed = attempts[-1][0]
                assert failed is not None  # a stopped call is not retried again
                await self.ledger.settle(failed, worst)
                nxt = await self._open_attempt(state, spec.name, phash, worst)
                if isinstance(nxt, str):
                    attempts.append((None, None))
                    err.message += f"; not retried: {STOPPED[nxt]}"
                    return False
                attempts.append(nxt)
                return True

            rec = await self._send(state, teacher, messages, tools, phash, bound, on_retry)
            charges = [worst] * (len(attempts) - 1)  # earlier attempts that may have been billed
            last = attempts[-1][0]
            charge: float | None = None  # what the last attempt cost without a kept answer
            if rec.status == "error" and rec.cost_usd:  # a rejected answer, at its usage: a
                charge, rec.cost_usd = rec.cost_usd, 0.0  # charge a retry's row cannot erase
            if last is not None:
                if rec.status == "error" and rec.error_kind in MAYBE_BILLED_KINDS:
                    charge = worst
                await self.ledger.settle(last, rec.cost_usd + (charge or 0.0))
            charges += [] if charge is None else [charge]
        self._record(rec, [i for _, i in attempts if i is not None], charges)
        self._account(rec, charges)
        return rec

    async def _open_attempt(
        self, state: TraceState, teacher: str, phash: str, worst: float
    ) -> tuple[Reservation, int] | str:
        """Reserve an attempt's worst case and commit its intent; BUDGET or JOURNAL when it
        must not be sent (checked again after waiting for budget room: the journal may have
        failed meanwhile)."""
        if self.result.journal_error:
            return JOURNAL
        res = await self.ledger.reserve(worst, teacher)
        if res is None:
            return BUDGET
        if self.result.journal_error:
            await self.ledger.settle(res, 0.0)
            return JOURNAL
        try:
            return res, self.journal.add_intent(state.state_id, teacher, phash, res.amount)
        except sqlite3.Error as err:  # nothing sent yet: stop here, nothing is lost
            self._journal_failed(err)
            await self.ledger.settle(res, 0.0)
            return JOURNAL

    def _record(self, rec: CallRecord, intents: list[int], charges: list[float]) -> None:
        """Journal an outcome; if the journal refuses it (locked, disk full, I/O error) keep the
        paid answer in memory, to be saved next to the journal, and start no new call."""
        try:
            self.journal.record(rec, intents, charges)
        except sqlite3.Error as err:
            self._journal_failed(err)
            self.unrecorded.append((rec, intents, charges))

    def _journal_failed(self, err: sqlite3.Error) -> None:
        if not self.result.journal_error:
            self.result.journal_error = f"{self.journal.path}: {type(err).__name__}: {err}"

    def worst_case_usd(self, state: TraceState | None, teacher: str) -> float:
        """The reservation a call of ``state`` to ``teacher`` holds (0 if either is unknown)."""
        spec = next((t.spec for t in self.teachers if t.spec.name == teacher), None)
        if state is None or spec is None:
            return 0.0
        messages, tools, _ = self.request(state, spec)
        return worst_case_cost(spec, worst_case_prompt_tokens(messages, tools))

    def _final(self, old: CallRecord) -> bool:
        """Whether a journaled outcome stands (else the call is sent again)."""
        if old.status == "ok":
            return True
        return not (self.retry_failed or old.error_kind in TRANSIENT_KINDS)

    async def _send(
        self, state, teacher, messages, tools, phash, bound: int, on_retry: OnRetry
    ) -> CallRecord:
        spec = teacher.spec
        base = {"state_id": state.state_id, "teacher": spec.name, "params_hash": phash}
        try:
            resp = await teacher.complete(messages, tools, on_retry=on_retry)
        except TeacherError as err:
            return CallRecord(
                **base, status="error", error_kind=err.kind, error=err.message[:2000],
                attempts=err.attempts, tier=spec.tier,
            )  # fmt: skip
        floor = min_tokens(prompt_chars(messages)) if messages else 0
        bill = billed_usage(spec, bound, resp, prompt_floor=floor)
        for why in resp.anomalies:
            key = f"teacher {spec.name!r} {why}"
            self.result.flagged_answers[key] = self.result.flagged_answers.get(key, 0) + 1
        cut = INCOMPLETE_FINISH.get(resp.finish_reason or "")
        if resp.finish_reason == "length" and spec.keep_cut_answers:
            cut = None
        outcome: dict[str, Any] = {"status": "ok", "response": resp.as_message()}
        if cut is not None:  # paid for, but not the whole action: never a consensus answer
            why = cut.format(max_tokens=spec.max_tokens)  # (its text is kept, for audit)
            outcome = {**outcome, "status": "error", "error_kind": "incomplete",
                       "error": f"the answer was cut (finish_reason {resp.finish_reason!r}): {why}"}  # fmt: skip
        return CallRecord(
            **base,
            **outcome,
            prompt_tokens=bill.prompt_tokens,
            completion_tokens=bill.completion_tokens,
            cost_usd=spec.cost_usd(bill.prompt_tokens, bill.completion_tokens),
            attempts=resp.attempts,
            latency_s=resp.latency_s,
            tier=spec.tier,
            raw_usage=resp.raw_usage,
            misreport=bill.misreport,
        )

    def _account(self, rec: CallRecord, charges: list[float]) -> None:
        r = self.result
        r.calls_sent += 1
        r.attempts += rec.attempts
        r.prompt_tokens += rec.prompt_tokens
        r.completion_tokens += rec.completion_tokens
        r.cost_usd += rec.cost_usd + sum(charges)
        r.attempts_charged += len(charges)
        r.charged_usd += sum(charges)
        if rec.status == "error":
            r.calls_failed += 1
            if rec.error_kind == "connection":
                r.unreachable[rec.teacher] = self.base_urls.get(rec.teacher, "?")
            elif rec.error_kind == "transport":
                r.broken[rec.teacher] = rec.error or "?"
            r.errors_by_kind[rec.error_kind or "other"] = (
                r.errors_by_kind.get(rec.error_kind or "other", 0) + 1
            )
        else:
            if rec.misreport:
                r.misreported_usage[rec.teacher] = r.misreported_usage.get(rec.teacher, 0) + 1
            self.cost_by_teacher[rec.teacher].append(rec.cost_usd)
            self.tokens_ok[0] += rec.prompt_tokens
            self.tokens_ok[1] += rec.completion_tokens
        self._advance()

    def _advance(self) -> None:
        if self.advance is None:
            return
        r = self.result
        self.advance(
            1,
            description=(
                f"calls {r.calls_sent} (+{r.calls_cached} cached, {r.calls_failed} failed) "
                f"tok {r.prompt_tokens}/{r.completion_tokens} ${r.cost_usd:.4f}"
            ),
        )

    async def run_state(self, state: TraceState) -> None:
        r = self.result
        if not state.prefix:  # a session's opening action: there is no question to ask
            r.states_skipped_empty += 1
            return
        answers: dict[str, dict[str, Any]] = {}
        errors: list[str] = []
        tiers = self.tiers()
        for i, group in enumerate(tiers):
            outcomes = await asyncio.gather(*(self.call(state, t) for t in group))
            if JOURNAL in outcomes:
                r.states_not_started += 1
                return
            if BUDGET in outcomes:
                r.states_remaining += 1
                return
            for rec in outcomes:
                if rec.status == "ok":
                    answers[rec.teacher] = rec.response or {}
                else:
                    errors.append(f"{rec.teacher}: {rec.error_kind}: {rec.error}")
            settled = tier_settled(answers, self.agreement_threshold, self.min_agreement)
            if self.tiered and settled and i + 1 < len(tiers):
                r.calls_saved_tiers += sum(len(g) for g in tiers[i + 1 :])
                for t in (t for g in tiers[i + 1 :] for t in g):
                    self.skipped_by_teacher[t.spec.name] += 1
                self._advance_by(sum(len(g) for g in tiers[i + 1 :]))
                break
        r.teacher_actions[state.state_id] = answers
        if errors:
            r.states_failed[state.state_id] = "; ".join(errors)[:2000]
        else:
            r.states_completed += 1

    def _advance_by(self, n: int) -> None:
        if self.advance is not None:
            self.advance(n)


async def replay_trace(
    states: Sequence[TraceState],
    teachers: Sequence[Teacher | TeacherConfig],
    *,
    journal: Journal | str | os.PathLike[str] = ":memory:",
    budget_usd: float | None = None,
    selected: set[str] | None = None,
    tiered: bool = False,
    agreement_threshold: int = 2,
    min_agreement: float = 0.6,
    infer_tools: bool = True,
    retry_failed: bool = False,
    max_states_in_flight: int | None = None,
    progress: bool | Console = False,
    result: ReplayResult | None = None,
) -> ReplayResult:
    """Replay ``states`` with ``teachers`` (specs are turned into clients and closed after).

    ``selected``: ids of states chosen by VOI gating (others are counted as gated out).
    ``tiered``: ask tiers in order, escalating while `tier_settled` is False.
    The budget covers the whole journal: spend recorded by earlier runs counts against it.
    ``result``: filled in place and also complete when the run is cancelled (Ctrl-C), so a
    caller can still report what was done.
    """
    owned = [build_teacher(t) for t in teachers if isinstance(t, TeacherBase)]
    clients: list[Teacher] = [t for t in teachers if not isinstance(t, TeacherBase)] + owned
    _check_unique(clients)
    jr = journal if isinstance(journal, Journal) else Journal(journal)
    try:
        with jr.exclusive():  # one replay per journal at a time: one budget ceiling
            return await _replay(states, clients, jr, budget_usd, selected, tiered,
                                 agreement_threshold, min_agreement, infer_tools, retry_failed,
                                 max_states_in_flight, progress, result)  # fmt: skip
    finally:
        for t in owned:
            await t.aclose()
        if not isinstance(journal, Journal):
            jr.close()


def _check_unique(clients: Sequence[Teacher]) -> None:
    names = [t.spec.name for t in clients]
    if len(set(names)) != len(names):
        raise ValueError(f"teacher names must be unique, got {names}")


async def _replay(states, clients, jr, budget_usd, selected, tiered, agreement_threshold,
                  min_agreement, infer_tools, retry_failed, max_states_in_flight, progress,
                  result):  # fmt: skip
    states, duplicates = _unique(states)
    result = result or ReplayResult()
    try:
        jr.add_states(states)
        result.calls_reimported = jr.import_unrecorded()  # before intents become lost calls
        known = jr.get_meta("teachers", {})
        jr.set_meta("teachers", {**known, **{t.spec.name: t.spec.model_dump() for t in clients}})
    except sqlite3.Error as err:  # before any call: bad input, nothing to lose
        raise JournalError(f"{jr.path}: cannot write the journal: {err}") from err
    ledger = BudgetLedger(budget_usd)
    rp = _Replayer(
        clients, jr, ledger,
        tools_by_session=session_tools(states) if infer_tools else {},
        retry_failed=retry_failed, tiered=tiered,
        agreement_threshold=agreement_threshold, min_agreement=min_agreement, result=result,
    )  # fmt: skip
    # attempts a killed run left in flight may have been billed: their worst case is spent
    maybe_paid_twice, _ = jr.adopt_lost_intents(lambda s, t: rp.worst_case_usd(jr.state(s), t))
    ledger.spent_usd = ledger.max_committed_usd = jr.spent_usd() + jr.lost_usd()
    todo = [s for s in states if selected is None or s.state_id in selected]
    r = rp.result
    r.states_total, r.budget_usd = len(states), budget_usd
    r.calls_maybe_paid_twice = maybe_paid_twice
    r.states_duplicate = duplicates
    r.calls_full_replay = len(states) * len(clients)
    r.states_gated_out = len(states) - len(todo)
    r.calls_saved_gating = r.states_gated_out * len(clients)
    limit = asyncio.Semaphore(
        max_states_in_flight or 2 * sum(t.spec.max_concurrency for t in clients)
    )

    async def one(state: TraceState) -> None:
        async with limit:
            await rp.run_state(state)

    console = (
        progress if isinstance(progress, Console) else Console(stderr=True) if progress else None
    )
    try:
        with progress_bar(console, "replay", total=len(todo) * len(clients)) as rp.advance:
            await asyncio.gather(*(one(s) for s in todo))
    except asyncio.CancelledError:
        r.interrupted = True
        raise
    finally:  # also when cancelled: the summary is of what was done
        _finish(rp, ledger, jr, len(todo), len(states))
    return r


def _finish(rp: _Replayer, ledger: BudgetLedger, jr: Journal, n_todo: int, n_all: int) -> None:
    """Fill the end-of-run fields of the result."""
    r = rp.result
    r.budget_exhausted = ledger.exhausted
    r.smallest_refused_usd = ledger.smallest_refused_usd
    save_unrecorded(rp.unrecorded, jr, r)
    r.max_committed_usd = ledger.max_committed_usd
    r.usd_saved_estimate = _saved_usd(rp, r.calls_saved_gating, n_todo, n_all)
    try:
        r.journal_cost_usd = jr.spent_usd() + jr.lost_usd("charged")
        r.lost_usd = jr.lost_usd("killed")
    except sqlite3.Error:  # the journal failed (reported): these stay unknown
        pass


def save_unrecorded(recs: list[Unrecorded], jr: Journal, r: ReplayResult) -> None:
    """Save outcomes the journal refused next to it (`Journal.save_unrecorded`), so paid
    answers survive a journal that cannot be written; the next replay imports them."""
    r.calls_unrecorded = len(recs)
    if not recs:
        return
    try:
        r.unrecorded_path = str(jr.save_unrecorded(recs))
    except OSError:
        return  # the summary says the answers are lost


def _unique(states: Sequence[TraceState]) -> tuple[list[TraceState], int]:
    """``states`` with each state id once (first kept), and how many were dropped: a duplicate
    would be sent and paid again, and its journal row would overwrite the first one's."""
    by_id: dict[str, TraceState] = {}
    for s in states:
        by_id.setdefault(s.state_id, s)
    return list(by_id.values()), len(states) - len(by_id)


def _saved_usd(rp: _Replayer, saved_gating: int, n_todo: int, n_all: int) -> float | None:
    """Estimated dollars saved: each skipped call priced with its teacher's prices at this run's
    mean prompt/completion tokens per successful call (None when no call succeeded)."""
    ok = sum(len(v) for v in rp.cost_by_teacher.values())
    if not ok:
        return None
    p_mean, c_mean = rp.tokens_ok[0] / ok, rp.tokens_ok[1] / ok
    per_call = {t.spec.name: t.spec.cost_usd(p_mean, c_mean) for t in rp.teachers}  # type: ignore[arg-type]
    gating = (n_all - n_todo) * sum(per_call.values())
    tiers = sum(per_call[name] * n for name, n in rp.skipped_by_teacher.items())
    return gating + tiers
