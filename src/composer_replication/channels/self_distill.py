"""Channel 2: hint-conditioned self-distillation (SDPO / OPSD) as one channel object.

After rollouts are scored, :meth:`SelfDistillChannel.attach` gives every failed completion a
hint (channels/hints.py) and tokenizes the teacher's prompt: the same conversation with the hint inserted.
In the loss, :meth:`SelfDistillChannel.loss` runs the teacher (live policy, EMA copy, or initial
weights) under ``no_grad`` on *hinted rows only*, over the teacher prompt followed by the *same*
completion tokens, and pairs its final hidden states with the student's. The hinted rows of one
problem share its text: that prefix is run once and its KV cache reused (lm/prefix.py).

The channel's token mask is :meth:`SelfDistillChannel.token_mask` (completion tokens of hinted
rows, minus tool-result tokens when the batch has a ``tool_mask``); its divisor is that mask's
count times the gradient-accumulation steps: one mask for both.

Multi-turn tool rollouts (Composer's "targeted RL with textual feedback"): when the verifier
pins a failure to an assistant turn (``StepResult.info["failed_turn"]``), the mask keeps only
that turn's tokens (``sdpo.turn_scope``: or that turn and the later ones). The teacher's
context is then the hinted prompt followed by the rollout's own turns and tool results before
that turn: the conversation up to the error plus the hint, on the same tokens the student saw.

With ``sdpo.contrast: placebo`` the teacher also runs on a placebo-hinted prompt (the same
template with a content-free verdict) and the target becomes the student's logits plus the
hinted-minus-placebo logits (losses/contrast.py): the template's own effect cancels.

On episodes packed from several context windows (``rollout.context``), the hint goes into
every window's prompt and the teacher runs the packed forward, each window alone; a summary is
not a turn for the turn mask (channels/packed.py; docs/summarization.md).

The student side costs no extra forward: TRL's GRPO computes log-probs with a fused LM head
that never materializes logits, so we capture the backbone's last hidden states from that very
forward (a forward hook) and feed them, with the LM-head weight, to the chunked fused JSD of
the loss library, which also never builds ``[B, T, V]``.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from composer_replication.channels.base import Channel, LossContext, Rollouts, informative_groups
from composer_replication.channels.hints import (
    HintTemplates,
    build_hints,
    insert_hint,
    placebo_hint,
)
from composer_replication.channels.packed import hinted_windows, summary_mask
from composer_replication.config import SdpoConfig
from composer_replication.lm.chat import as_messages, render_prompt, to_text
from composer_replication.lm.models import (
    backbone,
    head_weight,
    is_peft,
    pad_token_id,
    strip_accelerate,
    unwrap,
)
from composer_replication.lm.packing import packed_forward, packed_position_ids, pad_windows
from composer_replication.lm.prefix import (
    forward_with_prefix,
    split_prefixes,
    use_prefix,
)
from composer_replication.losses import (
    SdpoInputs,
    TAIDScheduler,
    contrast_teacher_states,
    self_distill_loss,
)
from composer_replication.rollout import turn_index

_LOGIT_CHUNK = 256  # rows per chunk when logits are needed (metrics, TAID, entropy-OPD)


class SelfDistillChannel(Channel):
    """Channel 2 (module docstring). ``hint_model``: a callable (prompt, completion, feedback)
    -> hint for source ``model``; by default the OpenAI-compatible model the config names."""

    name = "sdpo"
    needs_verdicts = True
    needs_student_hidden = True
    idle_hint = (
        "No rollout got a hint: every reply was right, or no hint source in "
        "sdpo.hint_sources applied (feedback empty, no successful sibling)."
    )
    STATE_FILE = "sdpo_teacher.pt"

    def __init__(self, cfg: SdpoConfig, hint_model=None):
        super().__init__(cfg)
        self.hint_model = hint_model
        self.templates = HintTemplates(feedback=cfg.feedback_template, sibling=cfg.sibling_template)
        self.frozen = None
        self.taid: TAIDScheduler | None = None
        self._step_ce = [0.0, 0.0]  # TAID: token-weighted objective over the step's micro-batches

    def setup(self, model, tokenizer, args) -> None:
        c = self.cfg
        self.tokenizer = tokenizer
        self.pad_id = pad_token_id(tokenizer)
        if c.teacher == "ema" or (c.teacher == "initial" and not is_peft(model)):
            self.frozen = copy.deepcopy(unwrap(model)).eval().requires_grad_(False)
        if c.loss.type == "taid":
            lc = c.loss
            self.taid = TAIDScheduler(
                args.max_steps, lc.t_start, lc.t_end, lc.alpha, lc.momentum, not lc.adaptive
            )
        if self.hint_model is None and "model" in c.hint_sources:
            from composer_replication.channels.hints import OpenAIHintModel

            self.hint_model = OpenAIHintModel(c.hint_model_url, c.hint_model_name)

    # ---- after rollouts are scored --------------------------------------------------------
    def attach(self, batch: dict[str, Any], rollouts: Rollouts) -> dict[str, Any]:
        """Add ``sdpo_hinted`` [B], ``sdpo_prompt_ids/mask`` and the hint texts to ``batch``."""
        prompts = rollouts.prompts
        hints = build_hints(
            rollouts.completions,
            rollouts.results,
            rollouts.group_size,
            self.cfg.hint_sources,
            self.templates,
            prompts=[to_text(p) for p in prompts],
            hint_model=self.hint_model,
            feedback_form=self.cfg.feedback_form,
        )
        if self.cfg.gate == "policy_signal":
            hints = _gate_on_policy_signal(hints, batch["advantages"], rollouts.group_size)
        device = batch["completion_ids"].device
        if "infra_masked" in batch:  # rows the machine failed (trainer/masking.py): no hint
            masked = batch["infra_masked"].tolist()
            hints = [None if m else h for h, m in zip(hints, masked, strict=True)]
        hinted = torch.tensor([h is not None for h in hints], dtype=torch.bool, device=device)
        messages = [insert_hint(as_messages(p), h.text) if h is not None else None
                    for p, h in zip(prompts, hints, strict=True)]  # fmt: skip
        turns = [
            _failed_turn(r) if h is not None else -1
            for r, h in zip(rollouts.results, hints, strict=True)
        ]
        if self.cfg.route_failures and "advantages" in batch:
            batch["advantages"] = batch["advantages"].masked_fill(hinted, 0.0)
        batch["sdpo_hinted"] = hinted
        batch["sdpo_turn"] = torch.tensor(turns, dtype=torch.long, device=device)
        self._teacher_prompts(batch, "sdpo_prompt", messages, rollouts)
        if self.cfg.contrast == "placebo":  # the same template with a content-free verdict
            placebos = [insert_hint(as_messages(p), placebo_hint(r, self.templates))
                        if h is not None else None
                        for p, r, h in zip(prompts, rollouts.results, hints, strict=True)]  # fmt: skip
            self._teacher_prompts(batch, "sdpo_placebo", placebos, rollouts)
        if rollouts.windows is not None:  # summary tokens: not graded turns (channels/packed.py)
            k = batch["completion_ids"].shape[1]
            batch["sdpo_summary"] = torch.tensor(
                [summary_mask(ws, k) for ws in rollouts.windows], dtype=torch.bool, device=device
            ).view(-1, k)
        batch["sdpo_hint"] = [h.text if h is not None else None for h in hints]
        batch["sdpo_hint_source"] = [h.source if h is not None else None for h in hints]
        return batch

    def _teacher_prompts(self, batch: dict[str, Any], key: str, messages: list[Any],
                         rollouts: Rollouts) -> None:  # fmt: skip
        """Left-padded ``{key}_ids`` / ``{key}_mask``: the teacher prompts rendered from
        ``messages`` (None: a row without a hint). On packed episodes (``rollouts.windows``)
        also the teacher's own packed completion, every window's prompt hinted
        (``{key}_comp_ids/_comp_mask/_comp_window``), and ``{key}_index``: per student
        completion token its teacher position (-1: none; channels/packed.py)."""
        texts = [render_prompt(self.tokenizer, m, tools=rollouts.tools) if m is not None else ""
                 for m in messages]  # fmt: skip
        enc = self.tokenizer(
            texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False
        )
        device = batch["completion_ids"].device
        batch[f"{key}_ids"] = enc["input_ids"].to(device)
        batch[f"{key}_mask"] = enc["attention_mask"].to(device)
        if rollouts.windows is None:
            return
        k = batch["completion_ids"].shape[1]
        rows = []
        for b, (m, ws) in enumerate(zip(messages, rollouts.windows, strict=True)):
            if m is None:
                rows.append(([], [], [-1] * k))
                continue
            prompt = batch[f"{key}_ids"][b][batch[f"{key}_mask"][b].bool()].tolist()
            ids, window, index = hinted_windows(self.tokenizer, ws, m, prompt, rollouts.tools)
            rows.append((ids, window, (index + [-1] * k)[:k]))
        width = max([1] + [len(r[0]) for r in rows])
        comp = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        for b, (ids, _, _) in enumerate(rows):
            comp[b, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            mask[b, : len(ids)] = 1
        batch[f"{key}_comp_ids"] = comp.to(device)
        batch[f"{key}_comp_mask"] = mask.to(device)
        batch[f"{key}_comp_window"] = pad_windows([r[1] for r in rows], width, device)
        batch[f"{key}_index"] = torch.tensor([r[2] for r in rows], dtype=torch.long,
                                             device=device).view(-1, k)  # fmt: skip

    # ---- in the loss ------------------------------------------------------------------------
    def token_mask(self, batch: dict[str, Any]) -> Tensor:
        """``[B, K]`` bool: completion tokens of hinted rows, tool-result tokens excluded; on
        rows whose failure is pinned to a turn (``sdpo_turn`` >= 0), only that turn's tokens
        (``turn_scope: turn``) or that turn's and the later ones' (``turn_and_rest``)."""
        mask = batch["completion_mask"].bool() & batch["sdpo_hinted"][:, None]
        if "sdpo_prompt_index" in batch:  # packed episodes: tokens the teacher scored
            mask = mask & (batch["sdpo_prompt_index"] >= 0)
        if "tool_mask" not in batch:
            return mask
        mask = mask & batch["tool_mask"].bool()
        turn_B = batch.get("sdpo_turn")
        if turn_B is None or self.cfg.turn_scope == "all":
            return mask
        turns_BK = batch["tool_mask"].bool()
        if "sdpo_summary" in batch:  # a summary is not a graded turn: not counted, not pinned
            turns_BK = turns_BK & ~batch["sdpo_summary"]
        index_BK = turn_index(turns_BK, batch["completion_mask"])
        pinned_B1 = (turn_B >= 0)[:, None]
        if self.cfg.turn_scope == "turn":
            keep_BK = index_BK == turn_B[:, None]
        else:  # that turn and everything the policy wrote after it (summaries included)
            keep_BK = index_BK.cummax(dim=1).values >= turn_B[:, None]
        return mask & (~pinned_B1 | keep_BK)

    def loss(self, ctx: LossContext) -> tuple[Tensor, dict[str, Tensor | float]]:
        batch, student_BKH = ctx.batch, ctx.student_hidden_BKH
        mask_BK = self.token_mask(batch)
        divisor = max(int(mask_BK.sum()), 1) * ctx.grad_accum
        rows = batch["sdpo_hinted"].nonzero().squeeze(1)
        extra: dict[str, Tensor | float] = {
            "hinted_frac": rows.numel() / max(len(batch["sdpo_hinted"]), 1)
        }
        if "tool_mask" in batch and "sdpo_turn" in batch:
            extra.update(_turn_metrics(batch["sdpo_turn"], batch["sdpo_hinted"]))
        w_s = head_weight(ctx.model)
        if rows.numel() == 0:
            empty = student_BKH[:0].reshape(0, student_BKH.shape[-1])
            inputs = self._inputs(empty, w_s, empty.detach(), w_s.detach(), divisor)
        else:
            t_RKH, w_t = self.teacher_states(ctx.model, batch, rows)
            keep = mask_BK[rows]
            s_NH, t_NH = student_BKH[rows][keep], t_RKH[keep]
            if self.cfg.contrast == "placebo":
                p_NH = self.teacher_states(ctx.model, batch, rows, "sdpo_placebo")[0][keep]
                t_NH, w_t = contrast_teacher_states(
                    s_NH, w_s, t_NH, p_NH, w_t, self.cfg.contrast_scale
                )
            targets = batch["completion_ids"][rows][keep]
            extra["teacher_student_logprob_gap"] = _logprob_gap(s_NH, w_s, t_NH, w_t, targets)
            inputs = self._inputs(s_NH, w_s, t_NH, w_t, divisor)
        loss, metrics = self_distill_loss(inputs)
        n_tok = float(metrics["num_tokens"])
        if n_tok == 0:  # nothing measured: no per-token figure (a 0 would dilute the step's mean)
            metrics = {"num_tokens": 0.0}
        metrics = {**metrics, **extra, "active": float(n_tok > 0)}
        if self.taid is not None and ctx.mode == "train" and n_tok > 0:
            self._step_ce[0] += float(metrics["cross_entropy"]) * n_tok
            self._step_ce[1] += n_tok
        return loss, metrics

    def _inputs(self, s_NH, w_s, t_NH, w_t, divisor) -> SdpoInputs:
        lc = self.cfg.loss
        mask_N = torch.ones(s_NH.shape[0], dtype=torch.bool, device=s_NH.device)
        if lc.type == "jsd" and (lc.token_clip is None or lc.token_clip_mode == "token"):
            return SdpoInputs(  # chunked fused-linear path: no [N, V] tensor
                mask=mask_N,
                student_hidden=s_NH,
                student_head_weight=w_s,
                teacher_hidden=t_NH,
                teacher_head_weight=w_t,
                beta=lc.beta,
                temperature=lc.temperature,
                token_clip=lc.token_clip,
                token_clip_mode="token",
                divisor=divisor,
            )
        return SdpoInputs(
            mask=mask_N,
            student_logits=s_NH @ w_s.T,
            teacher_logits=(t_NH @ w_t.T).detach(),
            kind=lc.type,
            beta=getattr(lc, "beta", 0.5),
            token_clip=getattr(lc, "token_clip", None),
            temperature=getattr(lc, "temperature", 1.0),
            h_max=getattr(lc, "h_max", None),
            taid_t=self.taid.t if self.taid else None,
            divisor=divisor,
        )

    @contextlib.contextmanager
    def _teacher(self, model) -> Iterator[tuple[Any, Tensor]]:
        """(backbone, head weight) of the configured teacher."""
        if self.frozen is not None:
            yield backbone(self.frozen), head_weight(self.frozen)
        elif self.cfg.teacher == "initial":  # LoRA: the base weights are the initial weights
            with strip_accelerate(model).disable_adapter():
                yield backbone(model), head_weight(model)
        else:
            yield backbone(model), head_weight(model)

    @torch.no_grad()
    def teacher_states(
        self, model, batch: dict[str, Any], rows: Tensor, prompt: str = "sdpo_prompt"
    ) -> tuple[Tensor, Tensor]:
        """Teacher hidden states ``[R, K, H]`` on the hinted prompt (``prompt``: the batch's
        ``{prompt}_ids/mask``; ``sdpo_placebo``: the placebo-hinted one) + the same completion,
        and its head. Packed episodes: the teacher's own packed row (every window's prompt
        hinted), its states gathered back to the student's completion positions."""
        comp_ids, comp_mask = batch["completion_ids"][rows], batch["completion_mask"][rows]
        t_ids, t_mask = batch[f"{prompt}_ids"][rows], batch[f"{prompt}_mask"][rows]
        k = comp_ids.shape[1]
        with self._teacher(model) as (net, weight):
            if f"{prompt}_index" in batch:  # packed episodes: every window alone, hinted
                c_ids = batch[f"{prompt}_comp_ids"][rows]
                c_mask = batch[f"{prompt}_comp_mask"][rows]
                pos = packed_position_ids(t_mask, c_mask, batch[f"{prompt}_comp_window"][rows])
                ids = torch.cat([t_ids, c_ids], dim=1)
                h = packed_forward(net, ids, pos).last_hidden_state[:, -c_ids.shape[1] - 1 : -1]
                idx = batch[f"{prompt}_index"][rows].clamp(min=0)
                return h.gather(1, idx[..., None].expand(-1, -1, h.shape[-1])), weight.detach()
            if use_prefix(net, self.shared_prefix):  # a group's problem text is run once
                prompts = [ids[m.bool()].tolist() for ids, m in zip(t_ids, t_mask, strict=True)]
                groups = _group_labels(batch["prompt_ids"][rows], batch["prompt_mask"][rows])
                pb = split_prefixes(prompts, groups, comp_ids, comp_mask, self.pad_id)
                out = forward_with_prefix(net, net, pb)
            else:
                ids = torch.cat([t_ids, comp_ids], dim=1)
                mask = torch.cat([t_mask, comp_mask], dim=1)
                out = net(input_ids=ids, attention_mask=mask, use_cache=False)
            return out.last_hidden_state[:, -k - 1 : -1], weight.detach()

    # ---- state -------------------------------------------------------------------------------
    def after_step(self, model, global_step: int) -> None:
        """EMA update of the teacher copy; TAID's schedule advanced with the step's objective
        (upstream's cross-entropy value, token-weighted over the step's micro-batches)."""
        if self.cfg.teacher == "ema":
            decay = self.cfg.ema_decay
            with torch.no_grad():
                for p_t, p in zip(
                    self.frozen.parameters(), unwrap(model).parameters(), strict=True
                ):
                    p_t.lerp_(p.detach(), 1.0 - decay)
        if self.taid is not None and self._step_ce[1] > 0:
            self.taid.update_t(self._step_ce[0] / self._step_ce[1], global_step)
        self._step_ce = [0.0, 0.0]

    def save(self, checkpoint_dir: str) -> None:
        """EMA teacher weights and TAID schedule, next to the trainer's checkpoint."""
        state = {
            "taid": self.taid.state_dict() if self.taid else None,
            "ema": self.frozen.state_dict() if self.cfg.teacher == "ema" else None,
        }
        torch.save(state, f"{checkpoint_dir}/{self.STATE_FILE}")

    def load(self, checkpoint_dir: str) -> None:
        """Restore what :meth:`save` wrote (a missing file is an error: the run would diverge)."""
        state = torch.load(f"{checkpoint_dir}/{self.STATE_FILE}", weights_only=False)
        if self.taid is not None and state["taid"] is not None:
            self.taid.load_state_dict(state["taid"])
        if self.cfg.teacher == "ema":
            self.frozen.load_state_dict(state["ema"])


def _gate_on_policy_signal(hints: list[Any], advantages_B: Tensor, group_size: int) -> list[Any]:
    """``hints`` with those of groups whose GRPO advantages are all zero dropped."""
    keep = set(informative_groups(advantages_B, group_size))
    return [h if i // group_size in keep else None for i, h in enumerate(hints)]


def _failed_turn(result: Any) -> int:
    """The assistant turn the verifier blamed (``info["failed_turn"]``), or -1."""
    turn = (getattr(result, "info", None) or {}).get("failed_turn")
    return int(turn) if isinstance(turn, int) and turn >= 0 else -1


def _turn_metrics(turn_B: Tensor, hinted_B: Tensor) -> dict[str, float]:
    """How many rows got a turn-level hint, and (when some did) at which turn on average."""
    pinned = (turn_B >= 0) & hinted_B
    out = {"turn_hinted_frac": float(pinned.float().mean()) if len(turn_B) else 0.0}
    if pinned.any():
        out["hint_turn_mean"] = float(turn_B[pinned].float().mean())
    return out


@torch.no_grad()
def _logprob_gap(s_NH: Tensor, w_s: Tensor, t_NH: Tensor, w_t: Tensor, targets_N: Tensor) -> float:
    """Mean over tokens of log q_teacher(y) - log p_student(y) at the sampled tokens y
    (negative where the hinted teacher disowns what the student wrote)."""
    total, n = 0.0, targets_N.numel()
    for start in range(0, n, _LOGIT_CHUNK):
        sl = slice(start, start + _LOGIT_CHUNK)
        y = targets_N[sl].unsqueeze(1)
        ls = torch.log_softmax(s_NH[sl].detach() @ w_s.T, dim=-1).gather(1, y)
        lt = torch.log_softmax(t_NH[sl] @ w_t.T, dim=-1).gather(1, y)
        total += float((lt - ls).sum())
    return total / max(n, 1)


def _group_labels(prompt_ids_RL: Tensor, prompt_mask_RL: Tensor) -> list[int]:
    """One label per row, equal for rows whose (student) prompts are equal: the rollouts of
    one problem, whose hinted teacher prompts share the problem text."""
    seen: dict[tuple[int, ...], int] = {}
    return [
        seen.setdefault(tuple(ids[m.bool()].tolist()), len(seen))
        for ids, m in zip(prompt_ids_RL, prompt_mask_RL, strict=True)
    ]
