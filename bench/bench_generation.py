"""Many agents, one generator: 8 agent requests arriving at once, generated in batches by
the one generator (lm/generator.py, ``max_batch`` 8) vs one at a time (the same generator
with ``max_batch`` 1: what the proxy's old lock did, without its second forward).

Each request is an agent's chat prompt (a shared system prompt with a tool schema, then
its own task), sampled at temperature 1 for ``--tokens`` new tokens (the end token is
disabled so every request generates the same number). Variants alternate round by round
(the order flips each round). The table gives medians of: tokens/s over the 8 requests, the
longest wait of any request (submit to answer), the longest time a request queued before
its batch started, the time of one batch, and the ratios batched / one at a time measured
in the same run. The fairness goal is "no request queues longer than one batch":
``max queued / batch`` <= 1.

    PYTHONPATH=src python bench/bench_generation.py                       # CPU, embedded model
    PYTHONPATH=src python bench/bench_generation.py --device cuda --dtype bfloat16 \\
        --model-shape qwen2.5-0.5b                                        # GPU kit stage
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO / "tests")]  # the package; tests/support

import torch  # noqa: E402

from composer_replication.lm.generator import Generator, Sampling  # noqa: E402
from composer_replication.lm.models import (  # noqa: E402
    DEFAULT_MODEL,
    load_model,
    load_tokenizer,
    pad_token_id,
)

SHAPES = {"qwen2.5-0.5b": ("Qwen/Qwen2.5-0.5B-Instruct", 24),
          "qwen2.5-1.5b": ("Qwen/Qwen2.5-1.5B-Instruct", 28)}  # fmt: skip
"""``--model-shape``: a published model's widths and layer count, random weights."""

SYSTEM = (
    "You are a helpful assistant that can interact with a computer. Your response must "
    "contain exactly ONE bash code block with ONE command. Include a THOUGHT section before "
    "your command where you explain your reasoning process. Do not combine several commands."
)
BASH = {"type": "function", "function": {"name": "bash", "description": "Run a command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                       "required": ["command"]}}}  # fmt: skip
TASKS = [
    "Implement `Counter.__init__` in textkit/core.py so that counts start empty.",
    "The function `slugify` in textkit/text.py lost its body; rebuild it.",
    "Fix the failing test tests/test_wrap.py::test_wrap_long_words.",
    "Add a `__repr__` to `Table` in textkit/table.py matching the docstring.",
    "Rebuild `merge_with` in toolz/dicttoolz.py; its tests are in toolz/tests.",
    "`pluralize` in inflection/__init__.py returns None; make it pass its tests.",
    "Find why `parse_header` drops the last field and fix it.",
    "Write the missing `unique` function in toolz/itertoolz.py.",
]


def build(args):
    tok = load_tokenizer(args.tokenizer or DEFAULT_MODEL)
    dtype = getattr(torch, args.dtype)
    if args.model_shape:
        from support.gpu_models import qwen2_from_config

        name, layers = SHAPES[args.model_shape]
        model = qwen2_from_config(name, len(tok), layers=layers, dtype=dtype)
    else:
        model = load_model(DEFAULT_MODEL, dtype=args.dtype)
    model = model.to(args.device).eval()
    prompts = []
    for task in TASKS[: args.agents]:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
        text = tok.apply_chat_template(messages, tools=[BASH], add_generation_prompt=True,
                                       tokenize=False)  # fmt: skip
        prompts.append(tok(text, add_special_tokens=False)["input_ids"])
    return tok, model, prompts


def one_round(model, tok, prompts, max_batch: int, tokens: int) -> dict:
    """The agents' requests sent at once from their own threads; their waits and answers."""
    sampling = Sampling(temperature=1.0, max_new_tokens=tokens)
    no_end = [len(tok) + 1]  # an id never sampled: every request generates ``tokens``
    gen = Generator(model, pad_token_id(tok), no_end, max_batch=max_batch)
    barrier = threading.Barrier(len(prompts))
    waits, outs = [0.0] * len(prompts), [None] * len(prompts)

    def agent(i: int) -> None:
        barrier.wait()
        start = time.perf_counter()
        outs[i] = gen.submit(prompts[i], sampling).result()
        waits[i] = time.perf_counter() - start

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(len(prompts))]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    gen.close()
    n_tokens = sum(len(o.ids) for o in outs)
    return {"tokens_per_s": n_tokens / wall, "wall_s": wall, "max_wait_s": max(waits),
            "max_queued_s": max(o.queued_s for o in outs),
            "batch_s": statistics.median(o.generate_s for o in outs),
            "batches": gen.batches, "tokens": n_tokens}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--agents", type=int, default=8, choices=range(1, len(TASKS) + 1))
    p.add_argument("--tokens", type=int, default=32, help="new tokens per request")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--model-shape", choices=sorted(SHAPES), default=None,
                   help="a config-built model of this shape (random weights) instead of the "
                        "embedded SmolLM2-135M")  # fmt: skip
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's; 1 on a shared, loaded CPU)")  # fmt: skip
    p.add_argument("--json", default=None, help="write the raw numbers here")
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer dir (default: the embedded SmolLM2's; the GPU kit brings one)")  # fmt: skip
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tok, model, prompts = build(args)
    variants = {"one at a time": 1, "batched": len(prompts)}
    one_round(model, tok, prompts[:2], 2, 4)  # warm-up (allocator, kernels)
    rows: dict[str, list[dict]] = {v: [] for v in variants}
    for r in range(args.rounds):
        order = list(variants) if r % 2 == 0 else list(reversed(variants))
        for v in order:
            rows[v].append(one_round(model, tok, prompts, variants[v], args.tokens))
            print(f"round {r + 1} {v:>13}: {rows[v][-1]['tokens_per_s']:.1f} tok/s", flush=True)
    med = {v: {k: statistics.median(x[k] for x in rows[v]) for k in rows[v][0]} for v in rows}
    lens = [len(x) for x in prompts]
    print(f"\n{len(prompts)} agents, prompts {min(lens)}-{max(lens)} tokens, {args.tokens} new "
          f"tokens each, {args.device} {args.dtype}, "
          f"{args.model_shape or DEFAULT_MODEL}, {torch.get_num_threads()} threads, "
          f"{args.rounds} rounds (medians)")  # fmt: skip
    print(f"{'variant':>14} {'tok/s':>8} {'wall s':>7} {'max wait s':>10} {'max queued s':>12} "
          f"{'batch s':>8} {'batches':>7} {'queued/batch':>12}")  # fmt: skip
    for v, m in med.items():
        print(f"{v:>14} {m['tokens_per_s']:8.1f} {m['wall_s']:7.2f} {m['max_wait_s']:10.2f} "
              f"{m['max_queued_s']:12.2f} {m['batch_s']:8.2f} {m['batches']:7.0f} "
              f"{m['max_queued_s'] / m['batch_s']:12.2f}")  # fmt: skip
    one, batched = med["one at a time"], med["batched"]
    print(f"\nbatched / one at a time: tokens/s x{batched['tokens_per_s'] / one['tokens_per_s']:.2f}, "
          f"longest wait x{batched['max_wait_s'] / one['max_wait_s']:.2f}")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rounds": rows,
                                               "medians": med}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
