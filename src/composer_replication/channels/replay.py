"""Channel 3: a preference loss (DPO or SimPO) on pairs from multi-teacher
trace replay, sampled every step.

DPO's reference log-probs are computed once, with the initial weights, when the trainer is
built (before any update), and cached per pair: they are real forwards of the initial model,
never constants (Rafailov et al., "Direct Preference Optimization", 2023). SimPO needs no
reference (Meng et al., "SimPO: Simple Preference Optimization with a Reference-Free
Reward", 2024).

Data: TRL's conversational preference format, one JSON object per line::

    {"prompt": [{"role": ..., "content": ...}, ...],
     "chosen": [{"role": "assistant", "content": ..., "tool_calls": [...]}],
     "rejected": [{"role": "assistant", ...}]}

(``chosen``/``rejected`` may also be plain strings.) Reading and checking the file is
``prefs/dataset.py``'s (torch-free, so a run checks it before any model loads).
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import torch
from torch import Tensor

from composer_replication.channels.base import Channel, LossContext
from composer_replication.config import ReplayChannelConfig
from composer_replication.lm.chat import render_prompt, to_text
from composer_replication.lm.models import backbone, pad_token_id
from composer_replication.lm.prefix import (
    forward_with_prefix,
    pad_rows,
    split_prefixes,
    use_prefix,
)
from composer_replication.losses import ReplayInputs, preference_loss, sequence_logps
from composer_replication.prefs.dataset import load_pairs


@dataclass
class EncodedPair:
    prompt_ids: list[int]
    chosen_ids: list[int]
    rejected_ids: list[int]


def pair_tools(row: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The tool schemas a pair's teachers were given (``tools_json``, or a ``tools`` list)."""
    tools = row.get("tools")
    if tools is None and row.get("tools_json"):
        tools = orjson.loads(row["tools_json"])
    return tools if isinstance(tools, list) and tools else None


_TEXT_CALL = re.compile(r'<tool_call>\s*\{\s*"name"\s*:\s*"([^"]+)"')


def pair_vocabulary(rows: list[dict[str, Any]]) -> set[str]:
    """The tool names the pairs speak: each pair's tool schemas (the source harness's, kept
    from ingestion), or, for a pair without them, the calls in its ``chosen`` and ``rejected``
    (OpenAI ``tool_calls``, or ``<tool_call>`` blocks of text-format pairs). The prompt's
    history is context, not trained on, and may hold tools outside any profile (MCP tools)."""
    names: set[str] = set()
    for row in rows:
        schemas = pair_tools(row)
        if schemas:
            names.update(n for t in schemas if isinstance(n := _schema_name(t), str))
            continue
        for key in ("chosen", "rejected"):
            msgs = row.get(key)
            for m in msgs if isinstance(msgs, list) else [{"content": msgs}]:
                names.update(_call_names(m) if isinstance(m, dict) else ())
    return names


def _schema_name(tool: Any) -> Any:
    fn = tool.get("function") if isinstance(tool, dict) else None
    return fn.get("name") if isinstance(fn, dict) else None


def _call_names(message: dict[str, Any]) -> set[str]:
    names = {n for c in message.get("tool_calls") or () if isinstance(n := _schema_name(c), str)}
    if isinstance(message.get("content"), str):
        names.update(_TEXT_CALL.findall(message["content"]))
    return names


def vocabulary_mismatch(rows: list[dict[str, Any]], run_tools: set[str]) -> str | None:
    """Why channel 3's pairs and the run's rollouts do not share a tool vocabulary (the pairs
    name tools the run's environment does not offer), or None when they do."""
    foreign = sorted(pair_vocabulary(rows) - set(run_tools))
    if not foreign:
        return None
    shown = ", ".join(foreign[:8]) + (", ..." if len(foreign) > 8 else "")
    return (
        f"channel 3's pairs use tools the run's environment does not offer ({shown}; the "
        f"run's tools: {', '.join(sorted(run_tools)) or 'none'}): the preference loss trains "
        "on a tool vocabulary the rollouts never use. Train with the matching tool "
        "profile (env.tool_profile=claude_code for Claude Code logs, codex for Codex CLI logs)."
    )


def encode_pair(tokenizer, row: dict[str, Any], max_length: int) -> EncodedPair:
    """Tokenize prompt (chat template, with the pair's tool schemas when it has them, as the
    rollouts are rendered with the environment's) and both responses (+ EOS); truncate the
    prompt from the left and the responses from the right so prompt + response <=
    max_length."""
    prompt = render_prompt(tokenizer, row["prompt"], tools=pair_tools(row))
    p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    c_ids = tokenizer(to_text(row["chosen"]), add_special_tokens=False)["input_ids"] + eos
    r_ids = tokenizer(to_text(row["rejected"]), add_special_tokens=False)["input_ids"] + eos
    budget_resp = max(max_length // 2, max_length - len(p_ids))
    c_ids, r_ids = c_ids[:budget_resp], r_ids[:budget_resp]
    p_ids = p_ids[-(max_length - max(len(c_ids), len(r_ids))) :]
    return EncodedPair(p_ids, c_ids, r_ids)


def collate(pairs: list[EncodedPair], pad_id: int, device) -> dict[str, Tensor]:
    """``[2P, L]`` batch: chosen rows then rejected rows; prompts left-padded, responses
    right-padded (the GRPO layout), with the response mask and length."""
    prompt_ids, prompt_mask = pad_rows([p.prompt_ids for p in pairs] * 2, pad_id, left=True)
    resp_ids, resp_mask = pad_rows(_responses(pairs), pad_id, left=False)
    return {
        "input_ids": torch.cat([prompt_ids, resp_ids], dim=1).to(device),
        "attention_mask": torch.cat([prompt_mask, resp_mask], dim=1).to(device),
        "response_mask": resp_mask.to(device),
        "response_len": resp_ids.shape[1],
    }


def _responses(pairs: list[EncodedPair]) -> list[list[int]]:
    """Chosen answers of all pairs, then their rejected answers."""
    return [p.chosen_ids for p in pairs] + [p.rejected_ids for p in pairs]


def response_logps(model, batch: dict[str, Any], reduction: str) -> Tensor:
    """Per-row log-prob of the responses under ``model`` (logits only at response positions)."""
    k = batch["response_len"]
    out = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        logits_to_keep=k + 1,
        use_cache=False,
    )
    logits = out.logits[:, :-1].float()
    labels = batch["input_ids"][:, -k:]
    return sequence_logps(logits, labels, batch["response_mask"], reduction=reduction)


def pair_logps(
    model, pairs: list[EncodedPair], pad_id: int, reduction: str, shared_prefix: bool = True
) -> Tensor:
    """``[2P]`` log-probs of the chosen answers then the rejected ones. The prompt a chosen
    and a rejected answer share is run once and its KV cache reused for both answers
    (lm/prefix.py), when ``shared_prefix`` and the model allow it; otherwise one padded
    forward."""
    device = next(model.parameters()).device
    net = backbone(model)
    if not use_prefix(net, shared_prefix):
        return response_logps(model, collate(pairs, pad_id, device), reduction)
    tails, mask = pad_rows(_responses(pairs), pad_id, left=False)
    tails, mask = tails.to(device), mask.to(device)
    k = tails.shape[1]
    n = len(pairs)
    batch = split_prefixes(
        [p.prompt_ids for p in pairs] * 2, list(range(n)) * 2, tails, mask, pad_id
    )
    logits = forward_with_prefix(net, model, batch, logits_to_keep=k + 1).logits
    return sequence_logps(logits[:, :-1].float(), tails, mask, reduction=reduction)


class ReplayChannel(Channel):
    """Channel 3: each optimizer step draws ``pairs_per_step`` pairs (split across the step's
    gradient-accumulation micro-batches) and scores them with the policy in train mode; the
    divisor is the step's pair count, so the step's loss is the mean over its pairs."""

    name = "replay"
    idle_hint = "No pair was scored."
    STATE_FILE = "replay_channel.json"

    def __init__(self, cfg: ReplayChannelConfig, progress=None):
        super().__init__(cfg)
        self.progress = progress
        self.reduction = "sum" if cfg.loss.type == "dpo" else "mean"
        self.ref: Tensor | None = None
        self._step_chunks: list[list[int]] = []
        self._step_of_chunks = -1
        self.rank, self.world = 0, 1  # this process of how many (set from the trainer args)

    def setup(self, model, tokenizer, args) -> None:
        """Load and encode the pairs; DPO's reference log-probs with the initial weights."""
        self.pad_id = pad_token_id(tokenizer)
        rows = load_pairs(self.cfg.dataset, self.cfg.max_pairs)
        self.pairs = [encode_pair(tokenizer, r, self.cfg.max_length) for r in rows]
        self.rng = random.Random(args.seed)  # the same draws on every rank
        self.rank, self.world = args.process_index, args.world_size
        if self.cfg.loss.type == "dpo":
            self.ref = self.reference_logps(model, self.progress)

    @torch.no_grad()
    def reference_logps(self, model, progress=None, batch_pairs: int = 8) -> Tensor:
        """``[N, 2]`` (chosen, rejected) summed log-probs under the current (initial) weights."""
        was_training = model.training
        model.eval()
        out = []
        try:
            for start in range(0, len(self.pairs), batch_pairs):
                chunk = self.pairs[start : start + batch_pairs]
                lp = pair_logps(model, chunk, self.pad_id, "sum", self.shared_prefix)
                out.append(torch.stack([lp[: len(chunk)], lp[len(chunk) :]], dim=1))
                if progress is not None:
                    progress(len(chunk))
        finally:
            model.train(was_training)
        return torch.cat(out).cpu()

    def save(self, checkpoint_dir: str) -> None:
        """The pair sampler's RNG state, so a resumed run draws the same pairs."""
        Path(checkpoint_dir, self.STATE_FILE).write_text(json.dumps(self.rng.getstate()))

    def load(self, checkpoint_dir: str) -> None:
        version, internal, gauss = json.loads(Path(checkpoint_dir, self.STATE_FILE).read_text())
        self.rng.setstate((version, tuple(internal), gauss))

    def draw(self, global_step: int, grad_accum: int) -> list[int]:
        """This micro-batch's pair indices: the step's ``pairs_per_step`` draws (identical on
        every rank), rank ``r`` of ``W`` taking draws ``r, r + W, ...``, dealt to its
        ``grad_accum`` micro-batches in order (a micro-batch may get none)."""
        if global_step != self._step_of_chunks:
            draws = [self.rng.randrange(len(self.pairs)) for _ in range(self.cfg.pairs_per_step)]
            idx = draws[self.rank :: self.world]
            n = len(idx)
            bounds = [n * i // grad_accum for i in range(grad_accum + 1)]
            self._step_chunks = [idx[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
            self._step_of_chunks = global_step
        return self._step_chunks.pop(0) if self._step_chunks else []

    def loss(self, ctx: LossContext) -> tuple[Tensor, dict[str, Tensor | float]]:
        if ctx.mode == "train":
            idx = self.draw(ctx.global_step, ctx.grad_accum)
        else:  # evaluation: a fixed set, the training sampler untouched
            idx = list(range(min(self.cfg.pairs_per_step, len(self.pairs))))
        if not idx:
            return _zero(ctx.model), {"num_pairs": 0.0, "active": 0.0}
        device = next(ctx.model.parameters()).device
        lp = pair_logps(
            ctx.model, [self.pairs[i] for i in idx], self.pad_id, self.reduction, self.shared_prefix
        )
        n, lc = len(idx), self.cfg.loss
        ref_c = ref_r = None
        if self.ref is not None:
            ref_c, ref_r = self.ref[idx, 0].to(device), self.ref[idx, 1].to(device)
        loss, metrics = preference_loss(
            ReplayInputs(
                policy_chosen_logps=lp[:n],
                policy_rejected_logps=lp[n:],
                ref_chosen_logps=ref_c,
                ref_rejected_logps=ref_r,
                kind=lc.type,
                beta=lc.beta,
                gamma=getattr(lc, "gamma", 0.0),
                label_smoothing=lc.label_smoothing,
                # DDP averages gradients over ranks: pairs_per_step / W per rank makes the step's
                # objective the mean over all pairs_per_step pairs
                divisor=self.cfg.pairs_per_step / self.world if ctx.mode == "train" else n,
            )
        )
        return loss, {**metrics, "active": 1.0}


def _zero(model) -> Tensor:
    """An exact 0 on the model's device (a micro-batch that drew no pair)."""
    return torch.zeros((), device=next(model.parameters()).device)
