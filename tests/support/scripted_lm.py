"""A tiny random Llama that follows a script: in its k-th assistant turn it is pushed (a large
logit bias) to write ``scripts[k]``, so TRL's real tool loop sees real tool calls from a model
that is still trained by gradient (the bias is a function of the prefix, the same at generation
and at scoring, so log-probs stay consistent)."""

from __future__ import annotations

import torch
from transformers import LlamaForCausalLM


class ScriptedLlama(LlamaForCausalLM):
    """``set_script(header_ids, scripts)``: after the k-th ``header_ids`` write ``scripts[k]``."""

    bias: float = 30.0

    def set_script(self, header_ids: list[int], scripts: list[list[int]], skip: int = 0) -> None:
        """``skip``: assistant headers in the prompt itself (few-shot turns) to pass over."""
        self._header, self._scripts, self._skip = header_ids, scripts, skip
        self.generation_config.use_cache = False  # the script reads the whole row each step
        self.config.prefix_cache = False  # so no forward may run a row's prefix separately

    def _targets(self, row: list[int]) -> list[int | None]:
        """For each position, the script's next token after it, or None."""
        out: list[int | None] = [None] * len(row)
        h, turn, start = len(self._header), -1 - self._skip, None
        for t in range(len(row)):
            if row[max(0, t - h + 1) : t + 1] == self._header:
                turn, start = turn + 1, t + 1
            if start is None or not 0 <= turn < len(self._scripts):
                continue
            script, done = self._scripts[turn], row[start : t + 1]
            if len(done) < len(script) and script[: len(done)] == done:
                out[t] = script[len(done)]
        return out

    def _rows(self, input_ids, kwargs):
        """The whole rows the script reads (``input_ids``: no KV cache)."""
        return input_ids

    def forward(self, input_ids=None, logits_to_keep=0, **kwargs):
        # ``logits_to_keep`` named in the signature: generate() then asks for the last position's
        # logits only (it looks for the name), not a [B, T, V] tensor per decoding step
        out = super().forward(input_ids=input_ids, logits_to_keep=logits_to_keep, **kwargs)
        keep = out.logits.shape[1]
        rows, cols, toks = [], [], []
        for b, row in enumerate(self._rows(input_ids, kwargs).tolist()):
            for t, nxt in enumerate(self._targets(row)[-keep:]):
                for tok in nxt if isinstance(nxt, list) else [] if nxt is None else [nxt]:
                    rows.append(b), cols.append(t), toks.append(tok)  # (a list: any of them)
        if rows:  # sparse: no [B, T, V] bias tensor
            dev = out.logits.device
            out.logits = out.logits.index_put(
                tuple(torch.tensor(x, device=dev) for x in (rows, cols, toks)),
                torch.tensor(self.bias, dtype=out.logits.dtype, device=dev),
                accumulate=True,
            )
        return out


class ConfigScriptedLlama(ScriptedLlama):
    """A :class:`ScriptedLlama` whose script travels in its config (``config.cr_script``, the
    arguments of ``set_script``): a copy built from the config alone (a Ray rollout worker's
    policy copy) follows the same script."""

    def __init__(self, config):
        super().__init__(config)
        script = getattr(config, "cr_script", None)
        if script:
            self.set_script(**script)

    def set_script(self, header_ids: list[int], scripts: list[list[int]], skip: int = 0) -> None:
        self.config.cr_script = {"header_ids": header_ids, "scripts": scripts, "skip": skip}
        super().set_script(header_ids, scripts, skip)
