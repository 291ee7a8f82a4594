"""Benchmark: chunked fused-linear generalized JSD vs TRL (naive) and Liger (chunked peer).

    python bench/bench_losses.py            # full table (heavy: ~3 h on 2 cores, up to ~12 GB)
    python bench/bench_losses.py --configs 2048x49152x576 --reps 10   # one size, ~12 min
    python bench/bench_losses.py --quick    # small sizes, a few minutes
    python bench/bench_losses.py --device cuda --json out.json   # GPU: bf16, in process, with
                                            # Liger's Triton kernel (bench/losses_device.py)
    python bench/bench_losses.py --smoke    # the GPU harness at tiny sizes (CPU if no GPU)

``--baseline-src DIR`` adds a variant ``base``: our loss imported from another checkout's
``src`` (e.g. ``git worktree add /tmp/base main``), timed interleaved with ``ours`` (CPU).
The rest of this docstring is the CPU benchmark.

Every variant starts from the same inputs: student hidden states ``[T, H]`` + lm_head
``[V, H]`` (both trainable) and teacher hidden states + head (frozen); beta 0.5, fp32,
2 threads. The naive peers pay for their own logits matmuls.

* ``ours``  - ``composer_replication.losses.chunked_generalized_jsd_loss``
* ``trl``   - ``trl.experimental.gkd.GKDTrainer.generalized_jsd_loss`` on full logits
* ``liger`` - ``liger_kernel.chunked_loss.LigerFusedLinearJSDLoss(compiled=False)``
  (pure torch on CPU; install with ``pip install --no-deps liger-kernel==0.8.5``)

Each variant runs in its own fresh worker process. Memory: peak RSS growth (``ru_maxrss``)
over the RSS once inputs are built, on the first forward+backward in that process
(cross-checked with the torch profiler's allocation trace on the second run). Time: the
parent drives the workers round-robin (interleaved), ``--reps`` times, forward-only and
forward+backward; medians are reported with ratios to the peers from the same run. Probes in
the ``ours`` worker measure matmul FLOP/s and streaming bandwidth, giving the floors
``8*T*V*H`` FLOPs (4 head matmuls) and ``12*T*V`` bytes (read two logits, write one grad).
A naive peer whose estimated peak would exceed ``--mem-budget-gb`` is skipped and marked.

Every variant must hand back a ``[V, H]`` head-weight gradient (``V*H*4`` bytes in fp32; a
trainer keeps it anyway as ``weight.grad``). The table therefore also shows each variant's
peak *minus one such buffer* ("excl. grad_w"), computed the same way for all variants from the
same measurement. ``--grad-preallocated`` instead allocates ``weight.grad`` / ``hidden.grad``
(zeros) as part of the inputs for every variant, before the baseline RSS is taken, and lets
autograd accumulate into them; ``--reps 0`` measures memory only.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

VARIANTS = ("ours", "base", "trl", "liger")
FULL_GRID = [(t, v, h) for t in (512, 2048) for v in (49152, 151936) for h in (576, 896)]
QUICK_GRID = [(256, 8192, 256), (512, 32768, 576)]
# peak-extra-memory models (bytes) used only to skip peers that would not fit; fitted on
# this machine: TRL ~14 fp32 [T, V] tensors; Liger ~16.5 fp32 [min(T, 1024), V] tensors.
EST_FACTOR = {"trl": 14.0, "liger": 16.5, "ours": 0.0, "base": 0.0}


# ----------------------------------------------------------------------------- worker


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _build(T: int, V: int, H: int, seed: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    h = (torch.randn(T, H, generator=g)).requires_grad_()
    w = (torch.randn(V, H, generator=g) / H**0.5).requires_grad_()
    th = torch.randn(T, H, generator=g)
    tw = torch.randn(V, H, generator=g) / H**0.5
    labels = torch.randint(0, V, (T,), generator=g)
    return h, w, th, tw, labels


def _make_step(variant: str, inputs, beta: float, chunk: int | None, base_src: str | None = None):
    import torch

    h, w, th, tw, labels = inputs
    if variant in ("ours", "base"):
        src = (
            base_src if variant == "base" else os.path.join(os.path.dirname(__file__), "..", "src")
        )
        sys.path.insert(0, os.path.abspath(src))
        from composer_replication.losses import chunked_generalized_jsd_loss

        def fwd():
            return chunked_generalized_jsd_loss(
                h, w, th, tw, labels=labels, beta=beta, chunk_size=chunk
            )[0]

    elif variant == "trl":
        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
        from trl.experimental.gkd import GKDTrainer

        def fwd():
            with torch.no_grad():
                t_logits = (th @ tw.t()).unsqueeze(0)
            s_logits = (h @ w.t()).unsqueeze(0)
            return GKDTrainer.generalized_jsd_loss(
                s_logits, t_logits, labels=labels.unsqueeze(0), beta=beta
            )

    elif variant == "liger":
        from liger_kernel.chunked_loss import LigerFusedLinearJSDLoss

        mod = LigerFusedLinearJSDLoss(
            weight_hard_loss=0.0, weight_soft_loss=1.0, beta=beta, compiled=False
        )

        def fwd():
            return mod(h, w, th, tw, labels)

    else:
        raise ValueError(variant)
    return fwd


def _profiled_peak(fn) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    cur = peak = 0
    for e in sorted(prof.events(), key=lambda e: e.time_range.start):
        cur += e.cpu_memory_usage if e.name == "[memory]" else e.self_cpu_memory_usage
        peak = max(peak, cur)
    return peak


def _probes(T: int, V: int, H: int) -> dict:
    """Matmul FLOP/s ([512, H] x [H, V], like a head chunk) and streaming bytes/s (3 x 64 MB add)."""
    import torch

    a, b = torch.randn(512, H), torch.randn(V, H)
    out = torch.empty(512, V)
    n = 16 * 1024 * 1024
    x, y, z = torch.randn(n), torch.randn(n), torch.empty(n)

    def best(fn, k=5):
        fn()
        ts = []
        for _ in range(k):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return min(ts)

    mm_t = best(lambda: torch.mm(a, b.t(), out=out))
    bw_t = best(lambda: torch.add(x, y, out=z))
    return {"matmul_flops": 2 * 512 * V * H / mm_t, "stream_bytes": 12 * n / bw_t}


def worker(args) -> None:
    import torch

    torch.set_num_threads(args.threads)
    # warm up on a tiny problem first so one-time library initialisation (lazy imports, BLAS
    # workspaces) is not charged to the variant's peak memory
    tiny = _build(16, 64, args.H, args.seed)
    _make_step(args.variant, tiny, args.beta, None, args.baseline_src)().backward()
    del tiny
    inputs = _build(args.T, args.V, args.H, args.seed)
    h, w = inputs[0], inputs[1]
    fwd = _make_step(args.variant, inputs, args.beta, args.chunk, args.baseline_src)
    if args.grad_preallocated:  # part of the inputs: touched before the baseline is taken
        h.grad, w.grad = torch.zeros_like(h), torch.zeros_like(w)
    rss0 = _rss_bytes()
    max0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def fwdbwd():
        loss = fwd()
        loss.backward()
        if args.grad_preallocated:
            h.grad.zero_()
            w.grad.zero_()
        else:
            h.grad = None
            w.grad = None
        return loss

    loss = fwdbwd()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    rss_peak_extra = max(peak, max0) - rss0
    prof_peak = _profiled_peak(fwdbwd)
    info = {
        "rss_peak_extra": rss_peak_extra,
        "prof_peak": prof_peak,
        "loss": loss.item(),
        "grad_w_bytes": w.numel() * w.element_size(),
    }
    if args.variant == "ours":
        info.update(_probes(args.T, args.V, args.H))
    print(json.dumps({"ready": info}), flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "quit":
            break
        t0 = time.perf_counter()
        if cmd == "fwd":
            fwd()
        else:
            fwdbwd()
        print(json.dumps({"t": time.perf_counter() - t0}), flush=True)


# ----------------------------------------------------------------------------- parent


def _estimate_gb(variant: str, T: int, V: int, H: int) -> float:
    rows = T if variant == "trl" else min(T, 1024)
    inputs = 2 * V * H * 4
    return (EST_FACTOR[variant] * rows * V * 4 + V * H * 4 + inputs) / 1e9


class Worker:
    def __init__(self, variant: str, cfg: tuple[int, int, int], args) -> None:
        T, V, H = cfg
        cmd = [sys.executable, __file__, "--worker", variant, "--T", str(T), "--V", str(V)]
        cmd += ["--H", str(H), "--beta", str(args.beta), "--threads", str(args.threads)]
        if args.chunk:
            cmd += ["--chunk", str(args.chunk)]
        if args.grad_preallocated:
            cmd += ["--grad-preallocated"]
        if args.baseline_src:
            cmd += ["--baseline-src", args.baseline_src]
        self.variant = variant
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.info = self._read()["ready"]
        self.times: dict[str, list[float]] = {"fwd": [], "fwdbwd": []}

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.variant} died (exit {self.proc.wait()})")
        return json.loads(line)

    def run(self, mode: str) -> None:
        self.proc.stdin.write(mode + "\n")
        self.proc.stdin.flush()
        self.times[mode].append(self._read()["t"])

    def close(self) -> None:
        self.proc.stdin.write("quit\n")
        self.proc.stdin.flush()
        self.proc.wait()


def bench_config(cfg, args) -> dict:
    T, V, H = cfg
    workers, skipped = [], {}
    for variant in VARIANTS:
        if variant not in args.variants:
            continue
        est = _estimate_gb(variant, T, V, H)
        idle = sum(2 * V * H * 4 / 1e9 for _ in workers)
        if est + idle > args.mem_budget_gb:
            skipped[variant] = est
            continue
        workers.append(Worker(variant, cfg, args))  # one at a time: memory measured alone
        print(f"#   {cfg} {variant} ready: {workers[-1].info}", file=sys.stderr, flush=True)
    for rep in range(args.reps):
        for mode in ("fwd", "fwdbwd"):
            order = workers[rep % len(workers) :] + workers[: rep % len(workers)]
            for wk in order:
                wk.run(mode)
        if args.verbose:
            last = {wk.variant: round(wk.times["fwdbwd"][-1], 2) for wk in workers}
            print(
                f"#   {cfg} rep {rep + 1}/{args.reps} fwd+bwd s: {last}",
                file=sys.stderr,
                flush=True,
            )
    for wk in workers:
        wk.close()
    return {
        "cfg": cfg,
        "reps": args.reps,
        "grad_preallocated": args.grad_preallocated,
        "skipped": skipped,
        "res": {
            wk.variant: {
                **wk.info,
                "fwd": _median(wk.times["fwd"]),
                "fwdbwd": _median(wk.times["fwdbwd"]),
                "times": wk.times,
            }
            for wk in workers
        },
    }


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _fmt_ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{a / b:.3f}"


def _fmt_s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _mem_cells(r: dict, peers: dict) -> list[str]:
    """Memory columns: raw peak, peak minus one grad_w buffer, and both ratios to the peers."""
    gw = r["grad_w_bytes"]
    raw, excl = r["rss_peak_extra"], r["rss_peak_extra"] - gw
    cells = [f"{raw / 1e6:.0f}", f"{excl / 1e6:.0f}", f"{r['prof_peak'] / 1e6:.0f}"]
    for key, val in (("rss", raw), ("excl", excl)):
        for peer in ("trl", "liger"):
            p = peers.get(peer)
            ref = None if p is None else p["rss_peak_extra"] - (gw if key == "excl" else 0)
            cells.append(_fmt_ratio(val, ref))
    return cells


def _time_cells(r: dict, peers: dict) -> list[str]:
    cells = [_fmt_s(r["fwd"]), _fmt_s(r["fwdbwd"])]
    for peer in ("trl", "liger"):
        p = peers.get(peer)
        cells.append(_fmt_ratio(r["fwdbwd"], p and p["fwdbwd"]))
    return cells


def print_table(rows: list[dict], args) -> None:
    reps = sorted({r.get("reps", args.reps) for r in rows})
    pre = {r.get("grad_preallocated", args.grad_preallocated) for r in rows}
    grad = {frozenset([True]): "weight.grad preallocated", frozenset([False]): "grads by autograd"}
    print(
        f"\nbeta={args.beta} fp32 threads={args.threads} reps={reps} "
        f"(medians, interleaved; {grad.get(frozenset(pre), 'mixed grad modes')})"
    )
    cols = [
        "T, V, H",
        "variant",
        "peak extra MB (RSS)",
        "excl. grad_w MB",
        "profiler MB",
        "mem/TRL",
        "mem/Liger",
        "excl. grad_w /TRL",
        "excl. grad_w /Liger",
        "fwd s",
        "fwd+bwd s",
        "time/TRL",
        "time/Liger",
    ]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for row in rows:
        T, V, H = row["cfg"]
        res = row["res"]
        for variant in VARIANTS:
            if variant in row["skipped"]:
                est = row["skipped"][variant]
                print(f"| {T}, {V}, {H} | {variant} | skipped: est. {est:.1f} GB > budget |")
            elif variant in res:
                cells = _mem_cells(res[variant], res) + _time_cells(res[variant], res)
                print(f"| {T}, {V}, {H} | {variant} | " + " | ".join(cells) + " |")
    for row in rows:
        res = row["res"]
        if "ours" in res and "base" in res:
            print(
                f"ours / base at {row['cfg']}: fwd {_fmt_ratio(res['ours']['fwd'], res['base']['fwd'])}, "
                f"fwd+bwd {_fmt_ratio(res['ours']['fwdbwd'], res['base']['fwdbwd'])}"
            )
    _print_floors(rows)
    print("\nloss value per variant (should agree to ~1e-5 relative):")
    for row in rows:
        print(f"  {row['cfg']}: " + json.dumps({v: r["loss"] for v, r in row["res"].items()}))


def _print_floors(rows: list[dict]) -> None:
    print(
        "\nFloors (probes in the `ours` worker): FLOPs = 8*T*V*H (4 head matmuls), bytes = 12*T*V"
    )
    print(
        "| T, V, H | matmul GFLOP/s probe | stream GB/s probe | floor s (max) | variant | "
        "achieved GFLOP/s | achieved GB/s | time / floor |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        T, V, H = row["cfg"]
        ours = row["res"].get("ours")
        if ours is None:
            continue
        flops, nbytes = 8 * T * V * H, 12 * T * V
        floor = max(flops / ours["matmul_flops"], nbytes / ours["stream_bytes"])
        for variant, r in row["res"].items():
            if r["fwdbwd"] is None:
                continue
            print(
                f"| {T}, {V}, {H} | {ours['matmul_flops'] / 1e9:.0f} | "
                f"{ours['stream_bytes'] / 1e9:.1f} | {floor:.2f} | {variant} | "
                f"{flops / r['fwdbwd'] / 1e9:.0f} | {nbytes / r['fwdbwd'] / 1e9:.2f} | "
                f"{r['fwdbwd'] / floor:.2f} |"
            )


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="small sizes, a few minutes")
    p.add_argument("--configs", default=None, help="e.g. 2048x49152x576,512x151936x896")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--beta", type=float, default=0.5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--chunk", type=int, default=None, help="rows per chunk for ours (default: auto)"
    )
    p.add_argument("--mem-budget-gb", type=float, default=12.0)
    p.add_argument(
        "--grad-preallocated",
        action="store_true",
        help="allocate weight.grad/hidden.grad (zeros) with the inputs, for every variant",
    )
    p.add_argument("--verbose", action="store_true", help="per-rep times on stderr")
    p.add_argument("--json", default=None, help="also write raw results here")
    p.add_argument("--from-json", default=None, help="print the table of saved --json file(s)")
    p.add_argument("--baseline-src", default=None, help="src dir of a baseline checkout (CPU)")
    p.add_argument("--device", default="cpu", help="cpu (worker processes) or cuda (in process)")
    p.add_argument("--smoke", action="store_true", help="device harness, tiny sizes, CPU ok")
    p.add_argument("--dtype", default="bfloat16", help="device harness dtype")
    p.add_argument("--warmup", type=int, default=3, help="device harness warm-up runs")
    p.add_argument("--acc-T", type=int, default=1024, help="device harness accuracy rows (0: off)")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--T", type=int, help=argparse.SUPPRESS)
    p.add_argument("--V", type=int, help=argparse.SUPPRESS)
    p.add_argument("--H", type=int, help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        args.variant = args.worker
        worker(args)
        return
    args.variants = args.variants.split(",")
    if args.device != "cpu" or args.smoke:
        import losses_device

        if args.variants == list(VARIANTS):
            args.variants = list(losses_device.VARIANTS)
        if args.reps == 10:
            args.reps = 5
        if args.smoke:
            args.acc_T = min(args.acc_T, 32)
        losses_device.main(args)
        return
    if "base" in args.variants and not args.baseline_src:
        args.variants.remove("base")
    if args.from_json:  # re-print saved results (e.g. several partial runs, in this order)
        rows = []
        for path in args.from_json.split(","):
            with open(path) as f:
                rows += [{**r, "cfg": tuple(r["cfg"])} for r in json.load(f)]
        print_table(rows, args)
        return
    if args.configs:
        grid = [tuple(int(x) for x in c.split("x")) for c in args.configs.split(",")]
    else:
        grid = QUICK_GRID if args.quick else FULL_GRID
    rows = []
    for cfg in grid:
        t0 = time.time()
        rows.append(bench_config(cfg, args))
        print(f"# {cfg} done in {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
    print_table(rows, args)


if __name__ == "__main__":
    main()
