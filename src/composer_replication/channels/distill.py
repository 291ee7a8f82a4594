"""On-policy distillation from stronger teachers, one or many, as one channel (``distill``).

After each generation round is scored, :meth:`DistillChannel.attach` hands every completion to
its teacher (``distill.route``), which scores the student's *own* tokens: a local Hugging Face
model in this process, or a server answering vLLM's ``prompt_logprobs`` protocol
(teachers/scoring.py). All teachers of a round are asked at once (``asyncio.gather``; a remote
teacher batches rows per request and keeps ``max_concurrency`` requests in flight). Each row
is a :class:`Row` that carries its own journey: the teachers its route asks, the ones its
budget let it reach, their answers, the teacher it is distilled from and its status.

An episode packed from several context windows (``rollout.context``) is scored window by
window, each as its own prompt + completion, and the answers laid back onto its row
(channels/packed.py; docs/summarization.md).

The loss (:meth:`DistillChannel.loss`) pulls the student toward its teacher on the completion
tokens, tool-result tokens excluded, as for the policy loss. Each ``distill.loss`` setting is a
variant object with its own function (channels/distill_variants.py): the sampled reverse KL,
the same folded into GRPO's advantages (``as_advantage``), or the generalized JSD.

The student side costs no extra forward: the trainer captures the policy forward's hidden
states (``needs_student_hidden``), and ``as_advantage`` folds with the log-probs of TRL's own
policy forward (:meth:`DistillChannel.see_policy_logps`). With several processes each scores
its own rows against an equal share of ``budget_usd`` / ``max_scored_tokens`` (no collective
per round), and each checkpoints its own counters. Rows no teacher scored (no route, a failed
call, the budget spent) are masked out and counted (``distill/unrouted_frac``,
``failed_frac``, ``over_budget_frac``); ``distill/active`` is 0 on a micro-batch with no scored
token. Routing is visible per teacher: ``distill/teacher/<name>/rows`` (rows it scored in the
step, over its micro-batches and processes), ``.../failed_rows`` (rows it was asked for and
could not score, also under ``best`` when another teacher took the row), ``.../reverse_kl`` and
its running ``requests``, ``scored_tokens`` and ``cost_usd``. ``distill/teacher_forward_s`` is
the wall time of the teachers' scoring of the round the step trained on (local forwards, or
waiting for a server's answers; all teachers at once), so a step's cost can be split into the
student's and the teachers' share.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import fnmatch
import json
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from composer_replication.channels.base import Channel, LossContext, Rollouts
from composer_replication.channels.distill_variants import ScoredTokens, build_variant
from composer_replication.channels.packed import window_parts
from composer_replication.config import ConfigError, DistillConfig
from composer_replication.lm.models import head_weight, pad_token_id
from composer_replication.teachers.edge import TeacherError
from composer_replication.teachers.scoring import RowScores, build_scorer, full_vocab_problem

__all__ = ["Row", "DistillChannel"]

SCORED, UNROUTED, FAILED, OVER_BUDGET, EMPTY = range(5)
"""``distill_status`` per row: why a row was (not) scored."""

log = logging.getLogger(__name__)


@dataclass
class Row:
    """One completion on its way through the teachers."""

    sequence: list[int]
    """Prompt + completion token ids, unpadded (what a teacher scores)."""
    prompt_len: int
    length: int
    """Completion tokens up to the last one the completion mask keeps (0: a masked row)."""
    routed: list[int] = field(default_factory=list)
    """Teachers (indices) its route asks, in order."""
    asked: set[int] = field(default_factory=set)
    """Those the budget let it reach."""
    answers: dict[int, RowScores | TeacherError] = field(default_factory=dict)
    """Each asked teacher's scores, or why it could not score the row."""
    hidden: dict[int, Tensor] = field(default_factory=dict)
    """A local teacher's hidden states ``[K, H_t]`` of the row (the full-vocabulary JSD)."""
    teacher: int = -1
    """The teacher it is distilled from (-1: none routed)."""
    parts: list[tuple[list[int], int, int]] = field(default_factory=list)
    """A packed episode (``rollout.context``): each window as its own sequence, its prompt
    length and where its completion starts in the row's (channels/packed.py ``window_parts``);
    empty: the row is one sequence."""

    def pieces(self) -> list[tuple[list[int], int, int]]:
        """What a teacher scores for the row: its windows, or the row itself."""
        return self.parts or [(self.sequence, self.prompt_len, 0)]

    def scored_by(self) -> list[int]:
        """The routed teachers that scored it."""
        return [i for i in self.routed if isinstance(self.answers.get(i), RowScores)]

    def choose(self, best: bool, keep_K: Tensor) -> None:
        """Pick :attr:`teacher`: the first teacher that scored it, or under ``best`` the one
        giving its own tokens (``keep_K``: tool results excluded) the highest mean log-prob;
        none scored: its first routed teacher (the row reports why)."""
        ok = self.scored_by()
        if not ok:
            self.teacher = self.routed[0] if self.routed else -1
        elif len(ok) == 1 or not best:
            self.teacher = ok[0]
        else:
            means = [_masked_mean(self.answers[i].actual, keep_K) for i in ok]
            self.teacher = ok[max(range(len(ok)), key=means.__getitem__)]

    @property
    def status(self) -> int:
        """SCORED, EMPTY (no completion token), UNROUTED, FAILED (asked, no answer kept) or
        OVER_BUDGET (routed, never asked)."""
        if self.length == 0:
            return EMPTY
        if self.teacher < 0:
            return UNROUTED
        if isinstance(self.answers.get(self.teacher), RowScores):
            return SCORED
        return FAILED if self.asked else OVER_BUDGET


class DistillChannel(Channel):
    """On-policy distillation (module docstring). ``models`` maps a local teacher's name to an
    already loaded model (tests); otherwise each local teacher loads its ``model``."""

    name = "distill"
    needs_student_hidden = True
    running_counters = ("teacher/*/requests", "teacher/*/scored_tokens", "teacher/*/cost_usd")
    step_counts = ("num_tokens", "teacher/*/rows", "teacher/*/failed_rows")
    idle_hint = (
        "No completion token was scored by a teacher: every row unrouted, every teacher call "
        "failed, or the budget was spent (see distill/unrouted_frac, failed_frac, over_budget_frac)."
    )

    def __init__(self, cfg: DistillConfig, models: dict[str, Any] | None = None):
        super().__init__(cfg)
        self._models = models or {}
        self.variant = build_variant(cfg.loss, float(cfg.weight))
        self.scorers: list[Any] = []
        self.rank, self.world = 0, 1  # this process of how many (setup reads the launch)
        self._warned: set[tuple[str, str]] = set()  # (teacher, error kind) already logged

    # ---- setup ------------------------------------------------------------------------------
    def setup(self, model, tokenizer, args) -> None:
        """Build the teachers: local ones loaded on their device and dtype, frozen."""
        self.pad_id = pad_token_id(tokenizer)
        self.model = model
        # several processes: each scores its own rows, against an equal share of the budget
        self.rank = int(getattr(args, "process_index", 0))
        self.world = int(getattr(args, "world_size", 1))
        student_device = next(model.parameters()).device
        self.scorers = [build_scorer(spec, student_device, self._models.get(spec.name))
                        for spec in self.cfg.teachers]  # fmt: skip
        self._keeps_hidden = [self.variant.full_vocabulary and s.spec.type == "local"
                              for s in self.scorers]  # fmt: skip
        remote = [s.spec.top_k for s in self.scorers if s.spec.type == "remote"]
        self.top_k = self.variant.top_k(remote)
        """Top-k log-probs kept per position (1 is enough for reverse KL)."""
        self._check_heads(model, tokenizer)

    def _check_heads(self, model, tokenizer) -> None:
        """Every teacher scores within the student's ids (``scorer.vocab``: its head's rows;
        a local teacher's head is cut to them, a server naming another id fails its row).
        Heads padded past the tokenizer to different sizes (Qwen2.5-7B's 152064 rows and
        Qwen2.5-0.5B's 151936) are fine; for the full-vocabulary loss, fewer shared rows than
        the tokenizer's ids are not."""
        mine = head_weight(model).shape[0]
        for full, scorer in zip(self._keeps_hidden, self.scorers, strict=True):
            theirs = scorer.head_weight().shape[0] if full else mine
            if full and (why := full_vocab_problem(scorer.spec.name, mine, theirs, len(tokenizer))):
                raise ConfigError(why)
            scorer.vocab = mine

    def idle_report(self) -> str | None:
        """The channel's own report (inactive on every step), plus a sentence per teacher that
        could not score a single row it was asked for: under ``best`` or ``column`` the channel
        may stay active on the other teachers, and that teacher's failure would show only in
        its ``failed_rows`` and the first warning."""
        dead = [
            f"channel 'distill': teacher {s.spec.name!r} could not score any of the "
            f"{s.stats.failed_rows} rows it was asked for (distill/teacher/{s.spec.name}/"
            "failed_rows; the first failure's reason is in the log)."
            for s in self.scorers
            if s.stats.failed_rows and not s.stats.scored_rows
        ]
        parts = [r for r in (super().idle_report(), *dead) if r]
        return " ".join(parts) or None

    # ---- checkpoints -------------------------------------------------------------------------
    state_per_rank = True  # each process counts what it scored

    def save(self, checkpoint_dir: str) -> None:
        """This process's running counters of each teacher (requests, scored tokens, cost), so
        a resumed run keeps counting against ``max_scored_tokens`` / ``budget_usd`` where it
        stopped instead of spending the whole budget again."""
        state = {s.spec.name: dataclasses.asdict(s.stats) for s in self.scorers}
        self.state_file(checkpoint_dir, self.rank).write_text(json.dumps(state, indent=1))

    def load(self, checkpoint_dir: str) -> None:
        """Restore what :meth:`save` wrote; a teacher the checkpoint does not name (a resume
        with ``resume_override_channels``) starts from zero. Resumed by as many processes as
        saved it, each takes its own counters back; by another number, the saved processes'
        counters are summed and shared equally (each process's budget is an equal share, so
        the run as a whole spends what is left of it). A missing file is an error: the budget
        would silently start over."""
        files = self.saved_state_files(checkpoint_dir)
        if not files:
            raise ConfigError(
                f"{self.state_file(checkpoint_dir, 0)}: missing; the distill channel's teacher "
                "counters (its budget) cannot be restored from this checkpoint"
            )
        saved = [json.loads(f.read_text()) for f in files]
        if len(saved) != self.world:
            log.warning("distill: %d processes saved the teacher counters, %d resume: each "
                        "takes an equal share of their sum", len(saved), self.world)  # fmt: skip
        for scorer in self.scorers:
            per_rank = [x[scorer.spec.name] for x in saved if scorer.spec.name in x]
            if not per_rank:
                continue
            if len(saved) == self.world:
                own = saved[self.rank].get(scorer.spec.name)
                scorer.stats = type(scorer.stats)(**own) if own else type(scorer.stats)()
            else:
                scorer.stats = _share(type(scorer.stats), per_rank, self.rank, self.world)

    # ---- after rollouts are scored ----------------------------------------------------------
    def attach(self, batch: dict[str, Any], rollouts: Rollouts) -> dict[str, Any]:
        """Score every routed row with its teacher; add ``distill_*`` tensors to ``batch``."""
        rows = _rows(batch, rollouts.windows)
        self._route(rows, rollouts)
        self._within_budget(rows)
        started = time.perf_counter()
        _run(self._score_all(rows))
        device = batch["completion_ids"].device
        batch["distill_teacher_s"] = torch.full(
            (len(rows),), time.perf_counter() - started, device=device
        )
        keep_BK = _loss_mask(batch).cpu()
        best = self.cfg.route.type == "best"
        for r, row in enumerate(rows):
            row.choose(best, keep_BK[r, : row.length])
        batch.update(self._tensors(rows, batch["completion_ids"].shape[1], device))
        return batch

    def _tensors(self, rows: list[Row], k_len: int, device: Any) -> dict[str, Tensor]:
        """The ``distill_*`` batch entries: per row its teacher, status and the teachers that
        failed it; per token the chosen teacher's log-probs; per local teacher kept for the
        full-vocabulary loss its hidden states on the rows distilled from it."""
        n_rows = len(rows)
        actual = torch.full((n_rows, k_len), math.nan)
        top_ids = torch.full((n_rows, k_len, self.top_k), -1, dtype=torch.long)
        top_lp = torch.full((n_rows, k_len, self.top_k), -math.inf)
        failed_by = torch.zeros(n_rows, max(len(self.scorers), 1), dtype=torch.bool)
        for r, row in enumerate(rows):
            for i, got in row.answers.items():  # a failure counts against its teacher always
                failed_by[r, i] = isinstance(got, TeacherError)
            if row.status == SCORED:
                _fill(row.answers[row.teacher], r, actual, top_ids, top_lp)
        out = {
            "distill_teacher": torch.tensor([row.teacher for row in rows], dtype=torch.long),
            "distill_status": torch.tensor([row.status for row in rows], dtype=torch.long),
            "distill_failed_by": failed_by,
            "distill_actual": actual,
            "distill_top_ids": top_ids,
            "distill_top_logps": top_lp,
        }
        out = {k: v.to(device) for k, v in out.items()}
        for i, keeps in enumerate(self._keeps_hidden):
            if keeps:
                out[f"distill_hidden_{i}"] = self._hidden(i, rows, k_len)
        return out

    def _route(self, rows: list[Row], rollouts: Rollouts) -> None:
        """Set each row's :attr:`Row.routed` (``distill.route``)."""
        route, names = self.cfg.route, [s.spec.name for s in self.scorers]
        if route.type != "column":  # single: the one teacher; best: every teacher
            routed = [0] if route.type == "single" else list(range(len(names)))
            for row in rows:
                row.routed = list(routed)
            return
        columns = rollouts.columns or [{}] * len(rows)
        if len(columns) != len(rows):
            raise RuntimeError(f"distill: {len(columns)} row columns for {len(rows)} rows")
        for row, column in zip(rows, columns, strict=True):
            value = str(column.get(route.column, ""))
            hit = next((n for n, pats in route.match.items()
                        if any(fnmatch.fnmatchcase(value, p) for p in pats)), None)  # fmt: skip
            row.routed = [names.index(hit)] if hit is not None else []

    def _within_budget(self, rows: list[Row]) -> None:
        """Set each row's :attr:`Row.asked`: per teacher, the rows with completion tokens it
        may still score (``budget_usd``, ``max_scored_tokens``: a row costs its whole
        sequence, prompt and completion, as a server bills it), in row order, counted from
        the spending before this round; once one does not fit, the teacher's later rows are
        not asked (reported over budget)."""
        max_tok, max_usd = self.cfg.max_scored_tokens, self.cfg.budget_usd
        for i, scorer in enumerate(self.scorers):  # each against what the counters say now
            spent_usd = sum(s.stats.cost_usd for s in self.scorers)
            spent_tok = sum(s.stats.scored_tokens for s in self.scorers)
            price = scorer.spec.price_in_per_mtok / 1e6
            for row in (row for row in rows if row.length > 0 and i in row.routed):
                spent_tok += len(row.sequence)
                spent_usd += len(row.sequence) * price
                if max_tok is not None and spent_tok > max_tok / self.world:
                    break
                if max_usd is not None and spent_usd > max_usd / self.world:
                    break
                row.asked.add(i)

    async def _score_all(self, rows: list[Row]) -> None:
        """Every teacher scores the rows that ask it, all teachers at once; each answer (or
        failure) lands in its row, with a local teacher's hidden states when kept."""

        async def one(i: int) -> None:
            mine = [row for row in rows if i in row.asked]
            if not mine:
                return
            scorer = self.scorers[i]
            pieces = [p for row in mine for p in row.pieces()]
            try:
                got = await scorer.ascore([p[0] for p in pieces], [p[1] for p in pieces],
                                          self.top_k, self.pad_id)  # fmt: skip
            finally:
                await scorer.aclose()
            at = 0
            for row in mine:  # a row's windows laid back onto its packed completion
                n = len(row.pieces())
                hidden = scorer.last_hidden[at : at + n] if self._keeps_hidden[i] else None
                row.answers[i], h = _stitch(got[at : at + n], row.pieces(), row.length, hidden)
                if h is not None:
                    row.hidden[i] = h
                at += n
            self._log_failures(scorer, got)

        await asyncio.gather(*(one(i) for i in range(len(self.scorers))))

    def _log_failures(self, scorer: Any, got: list[Any]) -> None:
        """Log the first failed row of each kind per teacher with its reason (later ones are
        counted in ``distill/teacher/<name>/failed_rows``)."""
        for g in got:
            if isinstance(g, TeacherError) and (scorer.spec.name, g.kind) not in self._warned:
                self._warned.add((scorer.spec.name, g.kind))
                log.warning("distill: teacher %r could not score a row (%s); its rows are "
                            "reported unscored (distill/teacher/%s/failed_rows), further "
                            "failures of this kind are counted, not logged",
                            scorer.spec.name, g, scorer.spec.name)  # fmt: skip

    def _hidden(self, i: int, rows: list[Row], k_len: int) -> Tensor:
        """``[B, K, H_t]`` hidden states of local teacher ``i`` (from its scoring forward) on
        the rows distilled from it, zeros elsewhere; kept on the teacher's device until the
        loss needs them."""
        scorer = self.scorers[i]
        out = torch.zeros(len(rows), k_len, scorer.head_weight().shape[1], device=scorer.device)
        for r, row in enumerate(rows):
            if row.teacher == i and row.status == SCORED:
                h_KH = row.hidden[i]
                n = min(k_len, h_KH.shape[0])
                out[r, :n] = h_KH[:n].to(out.dtype)
        return out

    # ---- in the loss ------------------------------------------------------------------------
    def token_mask(self, batch: dict[str, Any]) -> Tensor:
        """``[B, K]`` bool: completion tokens (tool results excluded) of scored rows."""
        return _loss_mask(batch) & (batch["distill_status"] == SCORED)[:, None]

    def see_policy_logps(self, batch: dict[str, Any], logps_BK: Tensor) -> None:
        """The policy forward's log-probs, before TRL's loss reads ``batch``: the variant
        folds into the advantages there (``as_advantage``), else nothing happens."""
        if "distill_status" in batch:
            self.variant.fold(batch, self.token_mask(batch), logps_BK)

    def loss(self, ctx: LossContext) -> tuple[Tensor, dict[str, Tensor | float]]:
        batch, h_BKH = ctx.batch, ctx.student_hidden_BKH
        w = head_weight(ctx.model)
        mask = self.token_mask(batch)
        if self.variant.finite_only:
            mask = mask & torch.isfinite(batch["distill_actual"])
        n_tok = int(mask.sum())
        metrics = self._row_metrics(batch)
        if n_tok == 0:
            zero = self.variant.zero(h_BKH, w)
            return zero, {**metrics, "num_tokens": 0.0, "active": 0.0}
        tokens = self._scored_tokens(batch, mask, h_BKH, w, max(n_tok, 1) * ctx.grad_accum)
        loss, extra, logp_N = self.variant.loss(tokens)
        metrics.update(self._teacher_metrics(batch, mask, logp_N))
        return loss, {**metrics, **extra, "num_tokens": float(n_tok), "active": 1.0}

    def _scored_tokens(self, batch, mask, h_BKH, w, divisor: float) -> ScoredTokens:
        """The micro-batch's scored tokens as the variant takes them."""
        local = {  # a local teacher's hidden states move to the student's device here
            i: (batch[f"distill_hidden_{i}"].to(h_BKH.device)[mask], self.scorers[i].head_weight())
            for i, keeps in enumerate(self._keeps_hidden) if keeps
        }  # fmt: skip
        return ScoredTokens(
            h_NH=h_BKH[mask], w_VH=w, y_N=batch["completion_ids"][mask],
            teacher_N=batch["distill_teacher"][:, None].expand_as(mask)[mask],
            actual_N=batch["distill_actual"][mask], top_ids_NT=batch["distill_top_ids"][mask],
            top_logps_NT=batch["distill_top_logps"][mask], local=local, divisor=divisor,
        )  # fmt: skip

    def _row_metrics(self, batch: dict[str, Any]) -> dict[str, float]:
        status = batch["distill_status"]
        with_tokens = max(int((status != EMPTY).sum()), 1)
        frac = {k: float((status == v).sum()) / with_tokens for k, v in
                (("scored_frac", SCORED), ("unrouted_frac", UNROUTED), ("failed_frac", FAILED),
                 ("over_budget_frac", OVER_BUDGET))}  # fmt: skip
        if "distill_teacher_s" in batch:  # set by attach: the round's seconds, on every row
            frac["teacher_forward_s"] = float(batch["distill_teacher_s"][0])
        teacher = batch["distill_teacher"]
        failed_by = batch["distill_failed_by"]
        for i, s in enumerate(self.scorers):
            name = s.spec.name
            frac[f"teacher/{name}/rows"] = float(((teacher == i) & (status == SCORED)).sum())
            frac[f"teacher/{name}/failed_rows"] = float(failed_by[:, i].sum())
            frac[f"teacher/{name}/requests"] = float(s.stats.requests)
            frac[f"teacher/{name}/scored_tokens"] = float(s.stats.scored_tokens)
            frac[f"teacher/{name}/cost_usd"] = float(s.stats.cost_usd)
        return frac

    def _teacher_metrics(self, batch, mask, logp_N: Tensor) -> dict[str, float]:
        """Sampled reverse KL ``log p - log q`` on the scored tokens, overall and per teacher."""
        q_N = batch["distill_actual"][mask].to(logp_N.dtype)
        ok = torch.isfinite(q_N)
        teacher_N = batch["distill_teacher"][:, None].expand_as(mask)[mask]
        out = {}
        if ok.any():
            out["reverse_kl"] = float((logp_N - q_N)[ok].mean())
        for i, s in enumerate(self.scorers):
            sel = ok & (teacher_N == i)
            if sel.any():
                out[f"teacher/{s.spec.name}/reverse_kl"] = float((logp_N - q_N)[sel].mean())
        return out


def _rows(batch: dict[str, Any], windows: list[list[Any]] | None = None) -> list[Row]:
    """A :class:`Row` per completion: prompt + completion token ids (unpadded), the prompt
    length, and the completion length (up to the last token the completion mask keeps); with
    ``windows`` (packed episodes) also each window as its own sequence."""
    rows = []
    comp_mask = batch["completion_mask"].bool().cpu()
    for p_ids, p_mask, c_ids, c_mask in zip(batch["prompt_ids"].cpu(), batch["prompt_mask"].cpu(),
                                             batch["completion_ids"].cpu(), comp_mask, strict=True):  # fmt: skip
        prompt = p_ids[p_mask.bool()].tolist()
        kept = c_mask.nonzero()
        n = int(kept[-1]) + 1 if kept.numel() else 0
        rows.append(Row(prompt + c_ids[:n].tolist(), len(prompt), n))
    if windows is not None:
        for row, ws in zip(rows, windows, strict=True):
            row.parts = window_parts(row.sequence[: row.prompt_len], ws, row.length)
    return rows


def _stitch(answers: list[Any], pieces: list[tuple[list[int], int, int]], length: int,
            hidden: Any = None) -> tuple[Any, Tensor | None]:  # fmt: skip
    """One row's answer from its pieces' (a packed episode's windows): each window's scores at
    its place in the completion, nothing (NaN, no top-k) on the later windows' prompts; a
    failed piece fails the row. With ``hidden`` (the pieces' ``[n, K, H_t]``), the row's
    ``[length, H_t]`` hidden states, zeros between the windows."""
    failed = next((a for a in answers if isinstance(a, TeacherError)), None)
    if failed is not None:
        return failed, None
    if len(answers) == 1 and pieces[0][2] == 0:
        return answers[0], hidden[0] if hidden is not None else None
    actual = [math.nan] * length
    top_ids: list[list[int]] = [[] for _ in range(length)]
    top_logps: list[list[float]] = [[] for _ in range(length)]
    h = torch.zeros(length, hidden.shape[-1], dtype=hidden.dtype,
                    device=hidden.device) if hidden is not None else None  # fmt: skip
    for j, (answer, (_, _, start)) in enumerate(zip(answers, pieces, strict=True)):
        n = min(len(answer.actual), length - start)
        actual[start : start + n] = answer.actual[:n]
        top_ids[start : start + n] = answer.top_ids[:n]
        top_logps[start : start + n] = answer.top_logps[:n]
        if h is not None:
            h[start : start + n] = hidden[j, :n]
    return RowScores(actual, top_ids, top_logps), h


def _loss_mask(batch: dict[str, Any]) -> Tensor:
    """Completion tokens the policy loss counts: tool-result tokens excluded."""
    mask = batch["completion_mask"].bool()
    return mask & batch["tool_mask"].bool() if "tool_mask" in batch else mask


def _masked_mean(values: list[float], keep: Tensor) -> float:
    """Mean over the kept positions; a position the teacher did not report (NaN) or gave
    probability 0 counts as ``-inf``, so such a teacher is never the nearest."""
    t = torch.tensor(values).nan_to_num(nan=-math.inf, posinf=-math.inf)
    sel = keep[: len(values)]
    return float(t[sel].mean()) if sel.any() else -math.inf


def _fill(scores: RowScores, r: int, actual: Tensor, top_ids: Tensor, top_lp: Tensor) -> None:
    n = len(scores.actual)
    actual[r, :n] = torch.tensor(scores.actual, dtype=actual.dtype)
    k = top_ids.shape[2]
    for t in range(n):
        ids, lps = scores.top_ids[t][:k], scores.top_logps[t][:k]
        top_ids[r, t, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        top_lp[r, t, : len(lps)] = torch.tensor(lps, dtype=top_lp.dtype)


def _run(coro):
    """Run ``coro`` to completion from synchronous code (in a fresh thread if this thread
    already runs an event loop)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def _share(cls: type, per_rank: list[dict[str, Any]], rank: int, world: int) -> Any:
    """Process ``rank``'s equal share (of ``world``) of the summed counters ``per_rank``:
    floats divided, integers split so that the shares add up to the sum."""
    out = {}
    for counter in dataclasses.fields(cls):
        total = sum(x.get(counter.name, 0) for x in per_rank)
        if isinstance(total, int):
            out[counter.name] = total // world + (1 if rank < total % world else 0)
        else:
            out[counter.name] = total / world
    return cls(**out)
