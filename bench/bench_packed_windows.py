"""Time and peak memory of the policy's loss forward + backward on packed episodes (issue 61):
the packed forward (every window's tokens run, positions restarting per window: what a
packing trainer does) against ``packed_logps_with_prefix`` (the prefix every window repeats
run once, lm/packing.py; also with each chunk checkpointed), same model, rows and tokens,
measured in one run.

The batch has the memory task's shape (configs/memory_summarize.yaml, its first training
step: 16 episodes, 6 of them summarized): every window starts with the same prompt
(``--prefix`` tokens: system, tool schema, the worked exchange, the task); a summarized
episode's window 0 goes on for ``--tail0`` tokens (the call, drawer 1, the instruction, the
summary) and its window 1 for ``--tail1`` after the prefix (the summary, drawer 2, the
answer); an episode that did not summarize answers in ``--short`` tokens.

Each variant runs in a fresh subprocess (so peak RSS is its own); subprocesses alternate
(packed, prefix, prefix_checkpointed, packed, ...) so a noisy machine slows all alike; the
table gives medians of the timed repeats (the first of each subprocess dropped) and the
ratios packed / prefix.

    python bench/bench_packed_windows.py                      # the embedded SmolLM2-135M, 2 rounds
    python bench/bench_packed_windows.py --smoke              # a tiny random model, seconds
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

VARIANTS = ("packed", "prefix", "prefix_checkpointed")
"""The packed forward; the prefix run once; the same with each chunk checkpointed (what runs
under ``optim.gradient_checkpointing``)."""


def build_batch(args, vocab: int):
    """``ids [B, P + K]``, ``mask``, ``K`` and the completion tokens' windows."""
    import torch

    g = torch.Generator().manual_seed(0)
    rand = lambda n: torch.randint(10, vocab - 1, (n,), generator=g).tolist()  # noqa: E731
    prefix = rand(args.prefix)
    rows = []  # (window-0 completion tail, window-1 tokens or None)
    for b in range(args.rows):
        summarized = b < args.summarized
        rows.append((rand(args.tail0 if summarized else args.short),
                     prefix + rand(args.tail1) if summarized else None))  # fmt: skip
    k = max(len(t0) + (len(t1) if t1 else 0) for t0, t1 in rows)
    p = args.prefix
    ids = torch.zeros(len(rows), p + k, dtype=torch.long)
    mask = torch.zeros_like(ids)
    window = torch.zeros(len(rows), k, dtype=torch.long)
    for b, (t0, t1) in enumerate(rows):
        comp = t0 + (t1 or [])
        ids[b, :p], mask[b, :p] = torch.tensor(prefix), 1
        ids[b, p : p + len(comp)], mask[b, p : p + len(comp)] = torch.tensor(comp), 1
        if t1:
            window[b, len(t0) : len(comp)] = 1
    return ids, mask, k, window


def worker(variant: str, args) -> dict:
    import torch
    from trl.trainer.utils import add_fused_lm_head

    from composer_replication.lm.packing import (
        packed_forward,
        packed_logps_with_prefix,
        packed_position_ids,
    )

    torch.set_num_threads(args.threads)
    if args.smoke:
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(vocab_size=512, hidden_size=64,
                                             intermediate_size=128, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2,
                                             max_position_embeddings=2048))  # fmt: skip
    else:
        from composer_replication.lm.models import load_model

        model = load_model("embedded:smollm2-135m-instruct")
    add_fused_lm_head(model, outputs=("log_probs",))
    model.train()
    ids, mask, k, window = build_batch(args, model.config.vocab_size)
    real = mask[:, -k:].float()
    times = []
    for _ in range(args.repeats + 1):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        if variant.startswith("prefix"):
            lp = packed_logps_with_prefix(model, ids, mask, k, window, entropy=False,
                                          checkpoint=variant.endswith("checkpointed"))[0]  # fmt: skip
        else:
            pos = packed_position_ids(mask[:, :-k], mask[:, -k:], window)
            labels = ids.masked_fill(mask == 0, -100)
            labels[:, :-k] = -100
            lp = packed_forward(model, ids, pos, labels=labels, fused_lm_head=True).log_probs
            lp = lp[:, -k:]
        (lp * real).sum().backward()
        times.append(time.perf_counter() - start)
    return {
        "variant": variant,
        "times": times[1:],
        "tokens": int(mask.sum()),
        "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2, help="timed repeats per subprocess")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--summarized", type=int, default=6)
    ap.add_argument("--prefix", type=int, default=507)
    ap.add_argument("--tail0", type=int, default=316)
    ap.add_argument("--tail1", type=int, default=90)
    ap.add_argument("--short", type=int, default=40)
    ap.add_argument("--smoke", action="store_true", help="a tiny random model")
    ap.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args)))
        return
    passed = sys.argv[1:]
    results: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    killed: dict[str, int] = {}  # variant -> the signal that ended its subprocess
    for r in range(args.rounds):
        for v in VARIANTS:
            if v in killed:  # it would die again: the machine is the same
                continue
            out = subprocess.run([sys.executable, __file__, *passed, "--worker", v],
                                 capture_output=True, text=True)  # fmt: skip
            if out.returncode < 0:  # SIGKILL: the kernel's out-of-memory killer, as a rule
                killed[v] = -out.returncode
                print(f"round {r + 1} {v}: killed by signal {killed[v]}", flush=True)
                continue
            if out.returncode != 0:
                raise SystemExit(f"{v} failed (exit {out.returncode}):\n{out.stderr[-2000:]}")
            res = json.loads(out.stdout.strip().splitlines()[-1])
            results[v].append(res)
            print(f"round {r + 1} {v}: {', '.join(f'{t:.2f}' for t in res['times'])} s, "
                  f"peak {res['peak_mb']:.0f} MB", flush=True)  # fmt: skip
    print(table(args, results, killed))


def table(args, results: dict[str, list[dict]], killed: dict[str, int]) -> str:
    """The Markdown table of medians and the ratios packed / each prefix variant (a variant
    killed before it finished, e.g. for memory, is named so and has no ratio)."""
    done = [v for v in VARIANTS if results[v]]
    med = {v: statistics.median(t for res in results[v] for t in res["times"]) for v in done}
    peak = {v: statistics.median(res["peak_mb"] for res in results[v]) for v in done}
    tokens = next((results[v][0]["tokens"] for v in done), "?")
    lines = [f"\nrows {args.rows} ({args.summarized} summarized), real tokens {tokens}, "
             f"{args.threads} threads", "| variant | median forward + backward (s) | peak RSS (MB) |",
             "| --- | --- | --- |"]  # fmt: skip
    for v in VARIANTS:
        if v in med:
            lines.append(f"| {v} | {med[v]:.2f} | {peak[v]:.0f} |")
        else:
            lines.append(f"| {v} | killed by signal {killed.get(v, '?')} (SIGKILL: out of "
                         "memory, as a rule) | - |")  # fmt: skip
    for v in VARIANTS[1:]:
        if "packed" in med and v in med:
            lines.append(f"| **ratio packed / {v}** | **{med['packed'] / med[v]:.2f}x** | "
                         f"**{peak['packed'] / peak[v]:.2f}x** |")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    main()
