"""Channel 2 inside the trainer: the hinted self-teacher.

After rollouts are scored, :meth:`SelfTeacher.attach` gives every failed completion a hint
(hints/) and tokenizes the teacher's prompt: the same conversation with the hint inserted. In
the loss, :meth:`SelfTeacher.sdpo_inputs` runs the teacher (live policy, EMA copy, or initial
weights) under ``no_grad`` on *hinted rows only*, over the teacher prompt followed by the *same*
completion tokens, and pairs its final hidden states with the student's. The hinted rows of one
problem share its text: that prefix is run once and its KV cache reused (trainer/prefix.py).

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

from composer_replication.chat import as_messages, render_prompt, to_text
from composer_replication.config import SdpoConfig
from composer_replication.hints.build import HintTemplates, build_hints, insert_hint
from composer_replication.losses import SdpoInputs, TAIDScheduler
from composer_replication.trainer.prefix import (
    forward_with_prefix,
    split_prefixes,
    supports_prefix_cache,
)

_LOGIT_CHUNK = 256  # rows per chunk when logits are needed (metrics, TAID, entropy-OPD)


def unwrap(model):
    """The plain transformers model under accelerate / PEFT wrappers."""
    model = getattr(model, "module", model)
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    return model


def backbone(model):
    """The decoder stack whose ``last_hidden_state`` feeds the LM head."""
    return unwrap(model).base_model


def head_weight(model) -> Tensor:
    return unwrap(model).get_output_embeddings().weight


class HiddenCapture:
    """Records the backbone's ``last_hidden_state`` of every forward while active."""

    def __init__(self, model):
        self.module = backbone(model)
        self.states: list[Tensor] = []

    @contextlib.contextmanager
    def active(self) -> Iterator[HiddenCapture]:
        def hook(_module, _args, output):
            self.states.append(output.last_hidden_state)

        handle = self.module.register_forward_hook(hook)
        try:
            yield self
        finally:
            handle.remove()

    def completion_states(self, n_rows: int, completion_len: int) -> Tensor:
        """``[B, K, H]`` hidden states that predict the ``K`` completion tokens."""
        h = torch.cat(self.states, dim=0)
        if h.shape[0] != n_rows:
            raise RuntimeError(
                f"captured {h.shape[0]} rows of hidden states for a batch of {n_rows}: the "
                "policy forward did not run as expected (multiple forwards per micro-batch?)"
            )
        return h[:, -completion_len - 1 : -1]


class SelfTeacher:
    """Builds hinted teacher contexts and scores the same completion under the teacher."""

    def __init__(self, cfg: SdpoConfig, tokenizer, model, max_steps: int, hint_model=None):
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.templates = HintTemplates(feedback=cfg.feedback_template, sibling=cfg.sibling_template)
        self.hint_model = hint_model
        self.is_peft = hasattr(getattr(model, "module", model), "disable_adapter")
        self.frozen = None
        if cfg.teacher == "ema" or (cfg.teacher == "initial" and not self.is_peft):
            self.frozen = copy.deepcopy(unwrap(model)).eval().requires_grad_(False)
        self.taid = TAIDScheduler(max_steps) if cfg.loss == "taid" else None

    # ---- after rollouts are scored --------------------------------------------------------
    def attach(
        self,
        batch: dict[str, Any],
        prompts: list,
        completions: list[str],
        results: list,
        group_size: int,
    ) -> dict[str, Any]:
        """Add ``sdpo_hinted`` [B], ``sdpo_prompt_ids/mask`` and the hint texts to ``batch``."""
        hints = build_hints(
            completions,
            results,
            group_size,
            self.cfg.hint_sources,
            self.templates,
            prompts=[to_text(p) for p in prompts],
            hint_model=self.hint_model,
        )
        device = batch["completion_ids"].device
        hinted = torch.tensor([h is not None for h in hints], dtype=torch.bool, device=device)
        texts = [
            render_prompt(self.tokenizer, insert_hint(as_messages(p), h.text))
            if h is not None
            else ""
            for p, h in zip(prompts, hints, strict=True)
        ]
        enc = self.tokenizer(
            texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False
        )
        batch["sdpo_hinted"] = hinted
        batch["sdpo_prompt_ids"] = enc["input_ids"].to(device)
        batch["sdpo_prompt_mask"] = enc["attention_mask"].to(device)
        batch["sdpo_hint"] = [h.text if h is not None else None for h in hints]
        batch["sdpo_hint_source"] = [h.source if h is not None else None for h in hints]
        return batch

    # ---- in the loss ------------------------------------------------------------------------
    @contextlib.contextmanager
    def _teacher(self, model) -> Iterator[tuple[Any, Tensor]]:
        """(backbone, head weight) of the configured teacher."""
        if self.frozen is not None:
            yield self.frozen.base_model, self.frozen.get_output_embeddings().weight
        elif self.cfg.teacher == "initial":  # LoRA: the base weights are the initial weights
            with getattr(model, "module", model).disable_adapter():
                yield backbone(model), head_weight(model)
        else:
            yield backbone(model), head_weight(model)

    @torch.no_grad()
    def teacher_states(self, model, batch: dict[str, Any], rows: Tensor) -> tuple[Tensor, Tensor]:
        """Teacher hidden states ``[R, K, H]`` on the hinted prompt + same completion, and its head."""
        comp_ids, comp_mask = batch["completion_ids"][rows], batch["completion_mask"][rows]
        t_ids, t_mask = batch["sdpo_prompt_ids"][rows], batch["sdpo_prompt_mask"][rows]
        k = comp_ids.shape[1]
        with self._teacher(model) as (net, weight):
            if supports_prefix_cache(net):  # a group's problem text is run once, not per row
                prompts = [ids[m.bool()].tolist() for ids, m in zip(t_ids, t_mask, strict=True)]
                groups = _group_labels(batch["prompt_ids"][rows], batch["prompt_mask"][rows])
                pb = split_prefixes(prompts, groups, comp_ids, comp_mask, self.pad_id)
                out = forward_with_prefix(net, net, pb)
            else:
                ids = torch.cat([t_ids, comp_ids], dim=1)
                mask = torch.cat([t_mask, comp_mask], dim=1)
                out = net(input_ids=ids, attention_mask=mask, use_cache=False)
            return out.last_hidden_state[:, -k - 1 : -1], weight.detach()

    def sdpo_inputs(
        self,
        model,
        batch: dict[str, Any],
        student_BKH: Tensor,
        divisor: float,
    ) -> tuple[SdpoInputs, dict[str, float]]:
        """Channel-2 inputs for this micro-batch (an empty mask when nothing is hinted)."""
        rows = batch["sdpo_hinted"].nonzero().squeeze(1)
        token_mask = batch["completion_mask"].bool()
        if "tool_mask" in batch:
            token_mask = token_mask & batch["tool_mask"].bool()
        extra = {"hinted_frac": rows.numel() / max(len(batch["sdpo_hinted"]), 1)}
        w_s = head_weight(model)
        if rows.numel() == 0:
            empty = student_BKH[:0].reshape(0, student_BKH.shape[-1])
            return self._make_inputs(
                empty, w_s, empty.detach(), w_s.detach(), token_mask[:0].reshape(0), divisor
            ), extra
        t_RKH, w_t = self.teacher_states(model, batch, rows)
        keep = token_mask[rows]
        s_NH, t_NH = student_BKH[rows][keep], t_RKH[keep]
        targets = batch["completion_ids"][rows][keep]
        extra["teacher_student_logprob_gap"] = _logprob_gap(s_NH, w_s, t_NH, w_t, targets)
        ones = torch.ones(s_NH.shape[0], dtype=torch.bool, device=s_NH.device)
        return self._make_inputs(s_NH, w_s, t_NH, w_t, ones, divisor), extra

    def _make_inputs(self, s_NH, w_s, t_NH, w_t, mask_N, divisor) -> SdpoInputs:
        c = self.cfg
        if c.loss == "jsd" and c.token_clip is None:
            return SdpoInputs(
                mask=mask_N,
                student_hidden=s_NH,
                student_head_weight=w_s,
                teacher_hidden=t_NH,
                teacher_head_weight=w_t,
                beta=c.jsd_beta,
                temperature=c.temperature,
                divisor=divisor,
            )
        return SdpoInputs(
            mask=mask_N,
            student_logits=s_NH @ w_s.T,
            teacher_logits=(t_NH @ w_t.T).detach(),
            kind=c.loss,
            beta=c.jsd_beta,
            temperature=c.temperature,
            token_clip=c.token_clip,
            taid_t=self.taid.t if self.taid else None,
            divisor=divisor,
        )

    STATE_FILE = "sdpo_teacher.pt"

    def save(self, checkpoint_dir: str) -> None:
        """EMA teacher weights and TAID schedule, next to the trainer's checkpoint."""
        state = {
            "taid": self.taid.state_dict() if self.taid else None,
            "ema": self.frozen.state_dict() if self.cfg.teacher == "ema" else None,
        }
        torch.save(state, f"{checkpoint_dir}/{self.STATE_FILE}")

    def load(self, checkpoint_dir: str) -> None:
        """Restore what :meth:`save` wrote (a missing file is an error: the run would diverge)."""
        path = f"{checkpoint_dir}/{self.STATE_FILE}"
        state = torch.load(path, weights_only=False)
        if self.taid is not None and state["taid"] is not None:
            self.taid.load_state_dict(state["taid"])
        if self.cfg.teacher == "ema":
            self.frozen.load_state_dict(state["ema"])

    def after_step(self, model, sdpo_loss: float | None, global_step: int) -> None:
        """EMA update of the teacher copy, and the TAID schedule."""
        if self.cfg.teacher == "ema":
            decay = self.cfg.ema_decay
            with torch.no_grad():
                for p_t, p in zip(
                    self.frozen.parameters(), unwrap(model).parameters(), strict=True
                ):
                    p_t.lerp_(p.detach(), 1.0 - decay)
        if self.taid is not None and sdpo_loss is not None:
            self.taid.update_t(sdpo_loss, global_step)


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
