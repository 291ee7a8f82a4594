"""Where the calculator hint acts: the first token of the right turn, with and without the hint.

Run by hand: ``PYTHONPATH=src python bench/uplift_first_token.py [n_prompts] [shots]``. For the
first n train problems (one worked exchange by default), the failure the hint names is the one
sampled rollouts make most ("turn 0: no tool call", docs/results.md). Prints, averaged over
prompts: p(first token of the ``calculate`` call), p(the plain greedy first token), whether the
call's first token is the argmax, and log p of the whole call, without and with the hint (the
channel's template and the ``process`` form), and with the placebo (``turn 0 went wrong``).
"""

from __future__ import annotations

import statistics
import sys

import torch

from composer_replication.channels.hints import HintTemplates, insert_hint
from composer_replication.envs.calculator import CalculatorEnv
from composer_replication.envs.tools import tool_functions
from composer_replication.lm.chat import render_prompt
from composer_replication.lm.chat_templates import ensure_tool_template
from composer_replication.lm.models import DEFAULT_MODEL, load_model, load_tokenizer
from composer_replication.run.uplift_turns import turn_text

HINTS = {"no hint": None, "process": "turn 0: no tool call", "placebo": "turn 0 went wrong"}


@torch.no_grad()
def token_logps(model, tok, context, text, tools) -> tuple[torch.Tensor, torch.Tensor]:
    """log p of each token of ``text`` after ``context``, and the first position's distribution."""
    q = tok(render_prompt(tok, context, tools=tools), add_special_tokens=False)["input_ids"]
    c = tok(text, add_special_tokens=False)["input_ids"]
    lp = torch.log_softmax(model(torch.tensor([q + c])).logits[0].float(), -1)
    return lp[torch.arange(len(q) - 1, len(q) + len(c) - 1), torch.tensor(c)], lp[len(q) - 1]


def main(n: int = 16, shots: int = 1) -> None:
    tok, model = load_tokenizer(DEFAULT_MODEL), load_model(DEFAULT_MODEL).eval()
    ensure_tool_template(tok)
    env = CalculatorEnv(shots=shots)
    tools = tool_functions(env.tools_class()())
    tpl = HintTemplates()
    stats: dict[str, dict[str, list[float]]] = {k: {} for k in HINTS}
    for task in env.tasks("train")[:n]:
        prompt = env.row(task)["prompt"]
        call = turn_text(tok, prompt, env.reference_turn(task, []), tools)
        call_first = tok(call, add_special_tokens=False)["input_ids"][0]
        greedy_first = None
        for name, feedback in HINTS.items():
            ctx = (
                prompt
                if feedback is None
                else insert_hint(prompt, tpl.feedback.format(feedback=feedback))
            )
            per_tok, first = token_logps(model, tok, ctx, call, tools)
            greedy_first = int(first.argmax()) if greedy_first is None else greedy_first
            row = stats[name]
            for key, val in (
                ("p(call's first token)", float(per_tok[0].exp())),
                ("p(unhinted greedy first token)", float(first[greedy_first].exp())),
                ("call's first token is the argmax", float(int(first.argmax()) == call_first)),
                ("log p(whole call)", float(per_tok.sum())),
                ("log p(call after its first token)", float(per_tok[1:].sum())),
            ):
                row.setdefault(key, []).append(val)
    keys = list(stats["no hint"])
    print(f"{n} prompts, {shots} worked exchange(s); means over prompts")
    print("| | " + " | ".join(HINTS) + " |")
    print("| --- |" + " --- |" * len(HINTS))
    for key in keys:
        print(
            f"| {key} | "
            + " | ".join(f"{statistics.fmean(stats[h][key]):.3f}" for h in HINTS)
            + " |"
        )


if __name__ == "__main__":
    args = sys.argv[1:]
    main(int(args[0]) if args else 16, int(args[1]) if len(args) > 1 else 1)
