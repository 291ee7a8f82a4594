"""A trainer whose policy follows a script: generation returns fixed token ids, so a round
of ``_generate_and_score_completions`` runs TRL's real tool loop, our overrides, the
environments and the rewards, and no model forward decides what happens (the concurrency
tests and bench/bench_rollouts.py)."""

from __future__ import annotations

import time

from conftest import make_tiny_model
from datasets import Dataset
from trl import GRPOConfig

from composer_replication.trainer.trainer import ComposerReplicationTrainer

HEADER = "<|im_start|>assistant\n"


class ScriptedTrainer(ComposerReplicationTrainer):
    """A row's k-th turn (after the prompt's ``shots`` assistant turns) is
    ``scripts[key][k]`` (the last one repeated), ``key`` the first key of ``scripts`` found in
    the row's text ("" matches every row). ``loop_s``: seconds spent in the tool loop."""

    scripts: dict[str, list[list[int]]] = {}
    shots = 0
    loop_s = 0.0

    def _generate_single_turn(self, prompt_ids, *args, **kwargs):
        out = []
        for ids in prompt_ids:
            text = self.processing_class.decode(ids)
            turn = text.count(HEADER) - self.shots - 1
            script = next(v for k, v in self.scripts.items() if k in text)
            out.append(script[min(turn, len(script) - 1)])
        return out, None

    def _tool_call_loop(self, *args):
        t0 = time.perf_counter()
        try:
            return super()._tool_call_loop(*args)
        finally:
            self.loop_s += time.perf_counter() - t0


def scripted_trainer(tok, rows, tools, reward, turns: int, out: str,
                     scripts: dict[str, list[str]]) -> ScriptedTrainer:  # fmt: skip
    """A ScriptedTrainer over ``rows`` (its batch), its ``scripts`` given as text turns."""
    args = GRPOConfig(
        output_dir=out, per_device_train_batch_size=len(rows), num_generations=2,
        max_completion_length=8192, max_tool_calling_iterations=turns, report_to="none",
        save_strategy="no", use_cpu=True, seed=0, disable_tqdm=True,
    )  # fmt: skip
    model = make_tiny_model(len(tok), max_positions=16384)
    trainer = ScriptedTrainer(model=model, reward_funcs=reward, args=args,
                              train_dataset=Dataset.from_list(rows), processing_class=tok,
                              environment_factory=tools)  # fmt: skip
    trainer.scripts = {k: [tok(t, add_special_tokens=False)["input_ids"] for t in v]
                       for k, v in scripts.items()}  # fmt: skip
    trainer.shots = sum(m["role"] == "assistant" for m in rows[0]["prompt"])
    return trainer
