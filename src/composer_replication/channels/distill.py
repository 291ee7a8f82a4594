"""On-policy distillation from stronger teachers, one or many, as one channel (``distill``).

After each generation round is scored, :meth:`DistillChannel.attach` hands every completion to
its teacher (``distill.route``), which scores the student's *own* tokens: a local Hugging Face
model in this process, or a server answering vLLM's ``prompt_logprobs`` protocol
(replay/scoring.py). All teachers of a round are asked at once (``asyncio.gather``; a remote
teacher batches rows per request and keeps ``max_concurrency`` requests in flight). The loss
(:meth:`DistillChannel.loss`) pulls the student toward its teacher on the completion tokens,
tool-result tokens excluded, as for the policy loss:

* ``loss.type: reverse_kl`` -- the sampled reverse KL of on-policy distillation (Thinking
  Machines' "On-Policy Distillation", 2025; MOPD, arXiv:2606.30406; GKD, arXiv:2306.13649):
  per token the dense advantage ``log q(y) - log p(y)`` in the policy gradient
  (losses/sampled.py). The channel is on-policy within a generation round: its importance
  ratio is taken to the current weights (1 on the first use of a batch). With
  ``loss.as_advantage`` the same per-token advantage, times ``distill.weight``, is added to
  GRPO's advantages right after scoring (``advantages`` becomes ``[B, K]``, which TRL's loss
  takes), and GRPO's clipped loss trains it; the channel's own term is then an exact 0.
* ``loss.type: jsd`` -- the generalized JSD (beta 0: forward KL): over the whole vocabulary
  for a local teacher (the chunked fused kernel of losses/chunked.py, fed with the teacher's
  last hidden states computed in ``attach`` and its head), over the teacher's top-k with a
  tail bucket for a remote one (losses/distill.py).

The student side costs no extra forward: the trainer captures the policy forward's hidden
states (``needs_student_hidden``). With several processes each scores its own rows against an
equal share of ``budget_usd`` / ``max_scored_tokens`` (no collective per round), and each
checkpoints its own counters. Rows no teacher scored (no route, a failed call, the budget
spent) are masked out and counted (``distill/unrouted_frac``, ``failed_frac``,
``over_budget_frac``); ``distill/active`` is 0 on a micro-batch with no scored token.
Routing is visible per teacher: ``distill/teacher/<name>/rows`` (rows it scored in the
step, over its micro-batches and processes), ``.../failed_rows`` (rows it was asked for and could not score, also under
``best`` when another teacher took the row), ``.../reverse_kl`` and its running ``requests``,
``scored_tokens`` and ``cost_usd``. ``distill/teacher_forward_s`` is the wall time of the
teachers' scoring of the round the step trained on (local forwards, or waiting for a server's
answers; all teachers at once), so a step's cost can be split into the student's and the
teachers' share.
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
from typing import Any

import torch
from torch import Tensor

from composer_replication.channels.base import Channel, LossContext, Rollouts
from composer_replication.config import (
    BestRoute,
    ColumnRoute,
    ConfigError,
    DistillConfig,
    JsdDistillLoss,
    LocalTeacherConfig,
)
from composer_replication.lm.models import head_weight, pad_token_id
from composer_replication.losses import (
    chunked_generalized_jsd_loss,
    gather_student_logps,
    sampled_reverse_kl_loss,
    topk_distill_loss,
)
from composer_replication.replay.scoring import (
    LocalScorer,
    RemoteScorer,
    RowScores,
    full_vocab_problem,
)
from composer_replication.replay.teachers import TeacherError

SCORED, UNROUTED, FAILED, OVER_BUDGET, EMPTY = range(5)
"""``distill_status`` per row: why a row was (not) scored."""

log = logging.getLogger(__name__)


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
        self.scorers: list[Any] = []
        self.rank, self.world = 0, 1  # this process of how many (setup reads the launch)
        self._hidden_rows: dict[int, tuple[list[int], Tensor]] = {}
        self._warned: set[tuple[str, str]] = set()  # (teacher, error kind) already logged

    # ---- setup ------------------------------------------------------------------------------
    def setup(self, model, tokenizer, args) -> None:
        """Build the teachers: local ones loaded on their device and dtype, frozen."""
        self.pad_id = pad_token_id(tokenizer)
        self.model, self.temperature = model, float(getattr(args, "temperature", 1.0))
        # several processes: each scores its own rows, against an equal share of the budget
        self.rank = int(getattr(args, "process_index", 0))
        self.world = int(getattr(args, "world_size", 1))
        student_device = next(model.parameters()).device
        for spec in self.cfg.teachers:
            if isinstance(spec, LocalTeacherConfig):
                device = student_device if spec.device == "same" else spec.device
                self.scorers.append(LocalScorer(spec, device, self._models.get(spec.name)))
            else:
                self.scorers.append(RemoteScorer(spec))
        self._full_jsd = [
            self.cfg.full_vocabulary and isinstance(s, LocalScorer) for s in self.scorers
        ]
        self._check_heads(model, tokenizer)

    def _check_heads(self, model, tokenizer) -> None:
        """Every teacher scores within the student's ids (``scorer.vocab``: its head's rows;
        a local teacher's head is cut to them, a server naming another id fails its row).
        Heads padded past the tokenizer to different sizes (Qwen2.5-7B's 152064 rows and
        Qwen2.5-0.5B's 151936) are fine; for the full-vocabulary loss, fewer shared rows than
        the tokenizer's ids are not."""
        mine = head_weight(model).shape[0]
        for full, scorer in zip(self._full_jsd, self.scorers, strict=True):
            theirs = scorer.head_weight().shape[0] if full else mine
            if full and (why := full_vocab_problem(scorer.spec.name, mine, theirs, len(tokenizer))):
                raise ConfigError(why)
            scorer.vocab = mine

    @property
    def top_k(self) -> int:
        """Top-k log-probs kept per position for the sparse JSD (1 is enough for reverse KL)."""
        loss = self.cfg.loss
        remote = [s.spec.top_k for s in self.scorers if isinstance(s, RemoteScorer)]
        if isinstance(loss, JsdDistillLoss):
            return max([loss.top_k or 1, *remote])
        return 1

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
        seqs, plens, lengths = _sequences(batch)
        n_rows, k_len = batch["completion_ids"].shape
        device = batch["completion_ids"].device
        wanted = self._route(rollouts, n_rows)
        asked = [[r for r in range(n_rows) if lengths[r] > 0 and i in wanted[r]]
                 for i in range(len(self.scorers))]  # fmt: skip
        sizes = [len(x) for x in seqs]
        asked = [self._within_budget(i, rows, sizes) for i, rows in enumerate(asked)]
        started = time.perf_counter()
        results = _run(self._score_all(asked, seqs, plens))
        batch["distill_teacher_s"] = torch.full(
            (n_rows,), time.perf_counter() - started, device=device
        )
        choice = self._choose(wanted, asked, results, lengths, batch)
        status = torch.full((n_rows,), UNROUTED, dtype=torch.long)
        actual = torch.full((n_rows, k_len), math.nan)
        top_ids = torch.full((n_rows, k_len, self.top_k), -1, dtype=torch.long)
        top_lp = torch.full((n_rows, k_len, self.top_k), -math.inf)
        for r in range(n_rows):
            status[r] = self._row_status(r, wanted, asked, results, choice, lengths)
            if status[r] == SCORED:
                _fill(results[choice[r]][r], r, actual, top_ids, top_lp)
        batch["distill_teacher"] = torch.tensor(choice, dtype=torch.long, device=device)
        batch["distill_status"] = status.to(device)
        batch["distill_failed_by"] = _failed_by(results, n_rows).to(device)
        batch["distill_actual"] = actual.to(device)
        batch["distill_top_ids"] = top_ids.to(device)
        batch["distill_top_logps"] = top_lp.to(device)
        for i, scorer in enumerate(self.scorers):
            if self._full_jsd[i]:
                batch[f"distill_hidden_{i}"] = self._hidden(scorer, i, choice, status, k_len)
        if getattr(self.cfg.loss, "as_advantage", False):
            self._fold_into_advantages(batch)
        return batch

    def _fold_into_advantages(self, batch: dict[str, Any]) -> None:
        """``advantages[B] -> [B, K]``: plus ``weight * (log q(y) - log p_old(y))`` on the
        scored tokens (the sampling policy's log-probs, as TRL computes them: logits divided
        by the generation temperature)."""
        mask = self.token_mask(batch) & torch.isfinite(batch["distill_actual"])
        old = batch.get("old_per_token_logps")
        if old is None:
            old = self._policy_logps(batch)
        gap = (batch["distill_actual"] - old).masked_fill(~mask, 0.0)
        adv = batch["advantages"]
        adv_BK = adv[:, None] if adv.dim() == 1 else adv
        batch["advantages"] = adv_BK + self.weight * gap.to(adv.dtype)

    @torch.no_grad()
    def _policy_logps(self, batch: dict[str, Any]) -> Tensor:
        """``[B, K]`` log-probs of the completion tokens under the current policy."""
        ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        k = batch["completion_ids"].shape[1]
        was_training = self.model.training
        self.model.eval()
        try:
            logits = self.model(input_ids=ids, attention_mask=mask, logits_to_keep=k + 1).logits
        finally:
            self.model.train(was_training)
        logp = torch.log_softmax(logits[:, :-1].float() / self.temperature, dim=-1)
        return logp.gather(2, batch["completion_ids"][..., None]).squeeze(2)

    def _route(self, rollouts: Rollouts, n_rows: int) -> list[set[int]]:
        """Per row, the teachers asked to score it."""
        route, names = self.cfg.route, [s.spec.name for s in self.scorers]
        if isinstance(route, BestRoute):
            return [set(range(len(names))) for _ in range(n_rows)]
        if not isinstance(route, ColumnRoute):
            return [{0} for _ in range(n_rows)]
        columns = rollouts.columns or [{}] * n_rows
        if len(columns) != n_rows:
            raise RuntimeError(f"distill: {len(columns)} row columns for {n_rows} rows")
        out = []
        for row in columns:
            value = str(row.get(route.column, ""))
            hit = next((n for n, pats in route.match.items()
                        if any(fnmatch.fnmatchcase(value, p) for p in pats)), None)  # fmt: skip
            out.append({names.index(hit)} if hit is not None else set())
        return out

    def _within_budget(self, i: int, rows: list[int], sizes: list[int]) -> list[int]:
        """The prefix of ``rows`` teacher ``i`` may still score (``budget_usd``,
        ``max_scored_tokens``: a row costs its whole sequence, prompt and completion, as a
        server bills it); the rest are reported over budget."""
        spent_usd = sum(s.stats.cost_usd for s in self.scorers)
        spent_tok = sum(s.stats.scored_tokens for s in self.scorers)
        price = getattr(self.scorers[i].spec, "price_in_per_mtok", 0.0) / 1e6
        kept = []
        for r in rows:
            spent_tok += sizes[r]
            spent_usd += sizes[r] * price
            if (
                self.cfg.max_scored_tokens is not None
                and spent_tok > self.cfg.max_scored_tokens / self.world
            ):
                break
            if self.cfg.budget_usd is not None and spent_usd > self.cfg.budget_usd / self.world:
                break
            kept.append(r)
        return kept

    async def _score_all(self, asked, seqs, plens) -> list[dict[int, Any]]:
        """Per teacher: row -> RowScores or TeacherError, every teacher at once."""

        async def one(i: int, rows: list[int]) -> dict[int, Any]:
            if not rows:
                return {}
            scorer = self.scorers[i]
            try:
                got = await scorer.ascore([seqs[r] for r in rows], [plens[r] for r in rows],
                                          self.top_k, self.pad_id)  # fmt: skip
            finally:
                await scorer.aclose()
            if self._full_jsd[i] and isinstance(scorer, LocalScorer):  # kept for the loss
                self._hidden_rows[i] = (rows, scorer.last_hidden)
            self._log_failures(scorer, got)
            return dict(zip(rows, got, strict=True))

        self._hidden_rows = {}
        return list(await asyncio.gather(*(one(i, rows) for i, rows in enumerate(asked))))

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

    def _choose(self, wanted, asked, results, lengths, batch) -> list[int]:
        """The teacher each row is distilled from (-1: none). ``best``: the scored teacher with
        the highest mean log-prob of the row's own tokens (tool results excluded)."""
        mask = _loss_mask(batch).cpu()
        choice = []
        for r, teachers in enumerate(wanted):
            ok = [i for i in sorted(teachers) if isinstance(results[i].get(r), RowScores)]
            if not ok:
                choice.append(min(teachers) if teachers else -1)
                continue
            if len(ok) == 1 or not isinstance(self.cfg.route, BestRoute):
                choice.append(ok[0])
                continue
            keep = mask[r, : lengths[r]]
            means = [_masked_mean(results[i][r].actual, keep) for i in ok]
            choice.append(ok[max(range(len(ok)), key=lambda j: means[j])])
        return choice

    @staticmethod
    def _row_status(r, wanted, asked, results, choice, lengths) -> int:
        if lengths[r] == 0:
            return EMPTY
        if choice[r] < 0:
            return UNROUTED
        if isinstance(results[choice[r]].get(r), RowScores):
            return SCORED
        return FAILED if any(r in rows for rows in asked) else OVER_BUDGET

    def _hidden(self, scorer: LocalScorer, i: int, choice, status, k_len: int) -> Tensor:
        """``[B, K, H_t]`` hidden states of local teacher ``i`` (from its scoring forward) on
        the rows distilled from it, zeros elsewhere; kept on the teacher's device until the
        loss needs them."""
        width = scorer.head_weight().shape[1]
        out = torch.zeros(len(choice), k_len, width, device=scorer.device)
        rows, h = self._hidden_rows.get(i, ([], None))
        for j, r in enumerate(rows):
            if choice[r] == i and status[r] == SCORED:
                n = min(k_len, h.shape[1])
                out[r, :n] = h[j, :n].to(out.dtype)
        return out

    # ---- in the loss ------------------------------------------------------------------------
    def token_mask(self, batch: dict[str, Any]) -> Tensor:
        """``[B, K]`` bool: completion tokens (tool results excluded) of scored rows."""
        return _loss_mask(batch) & (batch["distill_status"] == SCORED)[:, None]

    def loss(self, ctx: LossContext) -> tuple[Tensor, dict[str, Tensor | float]]:
        batch, h_BKH = ctx.batch, ctx.student_hidden_BKH
        w = head_weight(ctx.model)
        mask = self.token_mask(batch)
        if not isinstance(self.cfg.loss, JsdDistillLoss):
            mask = mask & torch.isfinite(batch["distill_actual"])
        n_tok = int(mask.sum())
        divisor = max(n_tok, 1) * ctx.grad_accum
        metrics = self._row_metrics(batch)
        if getattr(self.cfg.loss, "as_advantage", False):  # trained through GRPO's loss
            zero = torch.zeros((), device=w.device, dtype=w.dtype)
            if n_tok:
                y = batch["completion_ids"][mask][:, None]
                logp_N = gather_student_logps(h_BKH[mask].detach(), w.detach(), y).squeeze(1)
                metrics.update(self._teacher_metrics(batch, mask, logp_N))
            return zero, {**metrics, "num_tokens": float(n_tok), "active": float(n_tok > 0)}
        if n_tok == 0:
            zero = (h_BKH.sum() + w.sum()) * 0.0
            return zero, {**metrics, "num_tokens": 0.0, "active": 0.0}
        y_N = batch["completion_ids"][mask]
        h_NH = h_BKH[mask]
        if isinstance(self.cfg.loss, JsdDistillLoss):
            loss, extra = self._jsd(batch, mask, h_NH, w, divisor)
            logp_N = gather_student_logps(h_NH.detach(), w.detach(), y_N[:, None]).squeeze(1)
        else:
            logp_N = gather_student_logps(h_NH, w, y_N[:, None]).squeeze(1)
            ones = torch.ones_like(logp_N, dtype=torch.bool)
            teacher = batch["distill_actual"][mask].to(logp_N.dtype)
            loss, extra = sampled_reverse_kl_loss(
                logp_N, teacher, logp_N.detach(), ones, divisor=divisor
            )
        metrics.update(self._teacher_metrics(batch, mask, logp_N.detach()))
        return loss, {**metrics, **extra, "num_tokens": float(n_tok), "active": 1.0}

    def _jsd(self, batch, mask, h_NH, w, divisor) -> tuple[Tensor, dict[str, Any]]:
        """Full-vocabulary JSD for rows of local teachers, top-k + tail for the others."""
        lc = self.cfg.loss
        teacher_N = batch["distill_teacher"][:, None].expand_as(mask)[mask]
        total, parts = h_NH.new_zeros(()), 0.0
        sparse = torch.ones_like(teacher_N, dtype=torch.bool)
        for i, full in enumerate(self._full_jsd):
            rows = teacher_N == i
            if not full or not rows.any():
                continue
            sparse &= ~rows
            t_NH = batch[f"distill_hidden_{i}"].to(h_NH.device)[mask][rows].to(h_NH.dtype)
            t_w = self.scorers[i].head_weight().to(h_NH.device, h_NH.dtype)
            v = t_w.shape[0]  # the teacher's head is cut to the rows both share (setup)
            loss, m = chunked_generalized_jsd_loss(h_NH[rows], w[:v], t_NH, t_w, beta=lc.beta,
                                                   temperature=lc.temperature, divisor=divisor)  # fmt: skip
            total, parts = total + loss, parts + float(m["jsd_per_token"]) * int(rows.sum())
        if sparse.any():
            ids = batch["distill_top_ids"][mask][sparse]
            lps = batch["distill_top_logps"][mask][sparse]
            loss, m = topk_distill_loss(h_NH[sparse], w, ids, lps, ids >= 0, lc.beta,
                                        lc.temperature, lc.add_tail, divisor)  # fmt: skip
            total = total + loss
            parts += float(m["divergence_per_token"]) * int(sparse.sum())
        return total, {"divergence_per_token": parts / max(int(mask.sum()), 1)}

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


def _sequences(batch: dict[str, Any]) -> tuple[list[list[int]], list[int], list[int]]:
    """Per row: prompt + completion token ids (unpadded), the prompt length, and the completion
    length (up to the last token the completion mask keeps; 0 for a fully masked row)."""
    seqs, plens, lengths = [], [], []
    comp_mask = batch["completion_mask"].bool().cpu()
    for p_ids, p_mask, c_ids, c_mask in zip(batch["prompt_ids"].cpu(), batch["prompt_mask"].cpu(),
                                             batch["completion_ids"].cpu(), comp_mask, strict=True):  # fmt: skip
        prompt = p_ids[p_mask.bool()].tolist()
        kept = c_mask.nonzero()
        n = int(kept[-1]) + 1 if kept.numel() else 0
        seqs.append(prompt + c_ids[:n].tolist())
        plens.append(len(prompt))
        lengths.append(n)
    return seqs, plens, lengths


def _failed_by(results: list[dict[int, Any]], n_rows: int) -> Tensor:
    """``[B, T]`` bool: teacher ``t`` was asked to score row ``b`` and could not. Under
    ``best`` a row another teacher then scored still counts against the one that failed, so
    a dead teacher shows in its ``failed_rows`` whichever teacher the rows went to."""
    out = torch.zeros(n_rows, max(len(results), 1), dtype=torch.bool)
    for t, by_row in enumerate(results):
        for r, got in by_row.items():
            out[r, t] = isinstance(got, TeacherError)
    return out


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
    for field in dataclasses.fields(cls):
        total = sum(x.get(field.name, 0) for x in per_rank)
        if isinstance(total, int):
            out[field.name] = total // world + (1 if rank < total % world else 0)
        else:
            out[field.name] = total / world
    return cls(**out)
