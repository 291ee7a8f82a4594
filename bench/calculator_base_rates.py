"""How often the base embedded model calls the calculator tool (greedy and T=1), and passes.

Run by hand: ``PYTHONPATH=src python bench/calculator_base_rates.py [n_prompts] [--few-shot]``. Prints one
row per (system prompt variant, decoding): parseable tool-call rate, right-tool rate, pass rate
after one tool round-trip, on the first n held-out calculator problems.
"""

from __future__ import annotations

import sys

import torch
from trl.chat_template_utils import parse_response

from composer_replication.envs.calculator import (
    SYSTEM_PROMPT,
    CalculatorEnv,
    CalculatorTools,
    grade_conversation,
    safe_calculate,
)
from composer_replication.lm.chat_templates import ensure_tool_template
from composer_replication.lm.models import (
    DEFAULT_MODEL,
    load_model,
    load_tokenizer,
    resolve_model_path,
)

VARIANTS = {
    "plain": SYSTEM_PROMPT,
    "example": SYSTEM_PROMPT
    + ' Example: for "What is 12 * 34?" write <tool_call>{"name": "calculate", "arguments": '
    '{"expression": "12 * 34"}}</tool_call>, and after the result 408 reply 408.',
}


def _generate(model, tok, convs, tools, temperature):
    texts = [
        tok.apply_chat_template(c, tools=tools, add_generation_prompt=True, tokenize=False)
        for c in convs
    ]
    tok.padding_side = "left"
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    kw = {"do_sample": temperature > 0, "max_new_tokens": 64, "pad_token_id": tok.pad_token_id}
    if temperature > 0:
        kw.update(temperature=temperature, top_k=0, top_p=1.0)
    with torch.no_grad():
        out = model.generate(**enc, **kw)
    rows = []
    for i in range(len(convs)):
        prefix = enc["input_ids"][i][enc["attention_mask"][i].bool()].tolist()
        ids = out[i, enc["input_ids"].shape[1] :].tolist()
        ids = ids[: ids.index(tok.eos_token_id) + 1] if tok.eos_token_id in ids else ids
        rows.append(parse_response(tok, ids, prefix=prefix, tools=tools))
    return rows


def measure(model, tok, rows, system, temperature):
    tools = [CalculatorTools().calculate]
    convs = [[{"role": "system", "content": system}, *r["prompt"][1:]] for r in rows]
    first = _generate(model, tok, convs, tools, temperature)
    called = [bool(m.get("tool_calls")) for m in first]
    right = [
        any(c["function"]["name"] == "calculate" for c in m.get("tool_calls", [])) for m in first
    ]
    follow, idx = [], []
    for i, m in enumerate(first):
        if m.get("tool_calls"):
            results = [
                {
                    "role": "tool",
                    "name": c["function"]["name"],
                    "content": safe_calculate(c["function"]["arguments"].get("expression", ""))
                    if c["function"]["name"] == "calculate"
                    else "error: unknown tool",
                }
                for c in m["tool_calls"]
            ]
            follow.append(convs[i] + [m] + results)
            idx.append(i)
    second = _generate(model, tok, follow, tools, temperature) if follow else []
    convo = {i: [first[i]] for i in range(len(rows))}
    for j, i in enumerate(idx):
        convo[i] = follow[j][len(convs[i]) :] + [second[j]]
    passed = [grade_conversation(convo[i], r["answer"]).passed for i, r in enumerate(rows)]
    n = len(rows)
    return sum(called) / n, sum(right) / n, sum(passed) / n, first[:2]


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 64
    path = resolve_model_path(DEFAULT_MODEL)
    tok, model = load_tokenizer(path), load_model(path)
    ensure_tool_template(tok)
    model.eval()
    few_shot = "--few-shot" in sys.argv
    rows = CalculatorEnv(few_shot=few_shot).rows("heldout")[:n]
    torch.manual_seed(0)
    variants = {"plain": VARIANTS["plain"]} if "--plain" in sys.argv else VARIANTS
    for name, system in variants.items():
        for temperature in (0.0, 1.0):
            call, right, pas, examples = measure(model, tok, rows, system, temperature)
            print(
                f"{name:8s} T={temperature}: tool_call={call:.2f} right_tool={right:.2f} pass={pas:.2f}"
            )
            print(
                "   e.g.",
                [e.get("content", "")[:80] + str(e.get("tool_calls", ""))[:120] for e in examples],
            )


if __name__ == "__main__":
    main()
