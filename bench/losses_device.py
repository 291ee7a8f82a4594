"""In-process benchmark of the chunked generalized JSD on an accelerator (``bench_losses.py
--device cuda``) and its tiny CPU smoke run (``bench_losses.py --smoke``).

Variants, all from the same inputs (student hidden ``[T, H]`` + head ``[V, H]``, both trainable;
teacher hidden + head, frozen; every label valid; beta 0.5, temperature 1):

* ``ours``          - ``chunked_generalized_jsd_loss`` (``impl="auto"``: the fused path off CPU)
* ``liger_torch``   - ``liger_kernel.chunked_loss.LigerFusedLinearJSDLoss(compiled=False)``
* ``liger_triton``  - ``liger_kernel.transformers.LigerFusedLinearJSD`` (Liger's Triton kernel)
* ``trl``           - ``GKDTrainer.generalized_jsd_loss`` on full logits (pays for its matmuls)

Time: forward+backward between CUDA events (host clock on CPU), ``--warmup`` untimed runs per
variant, then ``--reps`` rounds in which every live variant runs once (rotating order); the
median. Memory: ``torch.cuda.max_memory_allocated()`` during the first forward+backward minus
the allocation before it (the inputs; the returned gradients count). A variant that runs out
of memory is marked ``OOM`` for that size. Floor: ``8*T*V*H`` FLOPs (the four head matmuls) at
the rate of a probed ``8192^3`` matmul in the benchmark dtype. Accuracy: at ``--acc-T`` rows,
each variant's loss and both gradients against TRL in the same dtype and against a float64
reference (norm-relative errors), in bf16 and in fp32.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import time
from collections.abc import Callable

import torch

DEVICE_GRID = [(4096, 151936, 896), (4096, 151936, 3584), (16384, 151936, 3584)]
SMOKE_GRID = [(64, 512, 32), (96, 1024, 48)]
VARIANTS = ("ours", "ours_512m", "liger_torch", "liger_triton", "trl")
"""``ours_512m``: ours with ``fused_budget_bytes`` at least 512 MiB (the default, half the head
weight, where that is more): fewer, larger chunks at a small hidden size; the time and memory
it trades, measured beside the default."""
PEERS = ("liger_torch", "liger_triton", "trl")
BETA = 0.5
ISSUE_NUMBERS = {  # issue 35, H100, bf16 fwd+bwd: (ms, GB) per variant
    (4096, 151936, 896): {
        "ours_before": (234.5, 2.24),
        "liger_torch": (66.3, 5.60),
        "liger_triton": (141.1, 0.46),
        "trl": (74.9, 21.2),
    },
    (4096, 151936, 3584): {
        "ours_before": (555.1, 8.11),
        "liger_torch": (87.2, 6.40),
        "liger_triton": (111.3, 1.82),
        "trl": (93.6, 21.2),
    },
    (16384, 151936, 3584): {
        "ours_before": (2226.4, 8.73),
        "liger_torch": (344.0, 6.49),
        "liger_triton": (231.7, 4.01),
        "trl": (None, None),
    },
}


def _inputs(cfg, dtype, device, seed=0):
    T, V, H = cfg
    g = torch.Generator(device="cpu").manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)

    h = rnd(T, H).requires_grad_()
    w = rnd(V, H, scale=H**-0.5).requires_grad_()
    th, tw = rnd(T, H), rnd(V, H, scale=H**-0.5)
    labels = torch.randint(0, V, (T,), generator=g).to(device)
    return h, w, th, tw, labels


def make_variant(name: str) -> Callable:
    """``fn(h, w, th, tw, labels) -> loss``, or raises ImportError/RuntimeError when unusable."""
    if name in ("ours", "ours_512m"):
        from composer_replication.losses import chunked_generalized_jsd_loss

        def ours(h, w, th, tw, lab):
            half_head = w.numel() * w.element_size() // 2  # the default budget
            budget = max(half_head, 512 * 2**20) if name == "ours_512m" else None
            return chunked_generalized_jsd_loss(
                h, w, th, tw, labels=lab, beta=BETA, fused_budget_bytes=budget
            )[0]

        return ours
    if name == "trl":
        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
        from trl.experimental.gkd import GKDTrainer

        def trl(h, w, th, tw, lab):
            with torch.no_grad():
                t_logits = (th @ tw.t()).unsqueeze(0)
            s_logits = (h @ w.t()).unsqueeze(0)
            return GKDTrainer.generalized_jsd_loss(
                s_logits, t_logits, labels=lab.unsqueeze(0), beta=BETA
            )

        return trl
    if name == "liger_torch":
        from liger_kernel.chunked_loss import LigerFusedLinearJSDLoss

        mod = LigerFusedLinearJSDLoss(
            weight_hard_loss=0.0, weight_soft_loss=1.0, beta=BETA, compiled=False
        )
        return lambda h, w, th, tw, lab: mod(h, w, th, tw, lab)
    if name == "liger_triton":
        try:
            from liger_kernel.transformers import LigerFusedLinearJSD
        except ImportError:  # its model patches may not import on this transformers
            from liger_kernel.ops import LigerFusedLinearJSDFunction as fn  # 0.8.5's signature

            return lambda h, w, th, tw, lab: fn.apply(
                h, w, th, tw, lab, BETA, -100, 1.0, None, None, None
            )
        mod = LigerFusedLinearJSD(jsd_beta=BETA)
        return lambda h, w, th, tw, lab: mod(h, w, th, tw, lab)
    raise ValueError(name)


class Clock:
    """Times a callable with CUDA events on CUDA, the host clock elsewhere; returns ms."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def time_ms(self, fn: Callable[[], object]) -> float:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3


def _fwdbwd(fn, inputs) -> Callable[[], torch.Tensor]:
    h, w = inputs[0], inputs[1]

    def run():
        loss = fn(*inputs)
        loss.backward()
        h.grad = None
        w.grad = None
        return loss

    return run


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _peak_extra_gb(run, device: torch.device, clock: Clock) -> float | None:
    if device.type != "cuda":
        run()
        return None
    _free(device)
    clock.sync()
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    run()
    clock.sync()
    return (torch.cuda.max_memory_allocated(device) - base) / 1e9


def matmul_tflops(device: torch.device, dtype: torch.dtype, clock: Clock, n: int = 8192) -> float:
    """Rate of one ``n^3`` matmul on random data (median of 10 after 3 warm-ups)."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    for _ in range(3):
        torch.mm(a, b, out=out)
    ms = statistics.median(clock.time_ms(lambda: torch.mm(a, b, out=out)) for _ in range(10))
    return 2 * n**3 / (ms / 1e3) / 1e12


def _is_oom(err: BaseException) -> bool:
    return isinstance(err, torch.OutOfMemoryError) or "out of memory" in str(err).lower()


def bench_size(cfg, variants, args, device, clock) -> dict:
    """Memory, then interleaved timing of every variant that ran at this size."""
    dtype = getattr(torch, args.dtype)
    inputs = _inputs(cfg, dtype, device)
    runs, res = {}, {}
    for name in variants:
        try:
            run = _fwdbwd(make_variant(name), inputs)
            for _ in range(max(args.warmup, 1)):  # the first call compiles (ours, Liger Triton)
                run()
            gb = _peak_extra_gb(run, device, clock)
            runs[name], res[name] = run, {"peak_gb": gb, "ms": []}
        except Exception as err:  # noqa: BLE001 - a peer that cannot run is reported, not fatal
            res[name] = {"error": "OOM" if _is_oom(err) else f"{type(err).__name__}: {err}"[:300]}
        if "error" in res[name]:  # outside the handler: its traceback no longer pins memory
            inputs[0].grad = inputs[1].grad = None
            _free(device)
        print(f"#   {cfg} {name}: {res[name]}", flush=True)
    names = list(runs)
    for rep in range(args.reps):
        for name in names[rep % max(len(names), 1) :] + names[: rep % max(len(names), 1)]:
            res[name]["ms"].append(clock.time_ms(runs[name]))
    for ours in ("ours", "ours_512m"):  # did the elementwise part compile, or fall back?
        if ours in res:
            from composer_replication.losses import chunked

            res[ours]["compile_error"] = chunked.ROWS_COMPILE["error"]
    for r in res.values():
        if "ms" in r:
            r["median_ms"] = statistics.median(r["ms"]) if r["ms"] else None
    del runs, inputs
    _free(device)
    return {"cfg": list(cfg), "dtype": args.dtype, "res": res}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def accuracy(variants, T: int, V: int, H: int, device) -> list[dict]:
    """Loss and gradient errors of each variant against TRL (same dtype) and float64."""
    x64 = _inputs((T, V, H), torch.float64, device, seed=1)
    trl = make_variant("trl")

    def grads(fn, xs):
        h, w = xs[0].detach().requires_grad_(), xs[1].detach().requires_grad_()
        loss = fn(h, w, *xs[2:])
        gh, gw = torch.autograd.grad(loss, (h, w))
        return loss.detach(), gh, gw

    ref = grads(trl, x64)
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        xs = [x.to(dtype) if x.is_floating_point() else x for x in x64]
        peer = grads(trl, xs)
        for name in variants:
            try:
                got = grads(make_variant(name), xs)
            except Exception as err:  # noqa: BLE001 - reported per variant
                rows.append({"dtype": str(dtype), "variant": name, "error": str(err)[:200]})
                continue
            rows.append(
                {
                    "dtype": str(dtype).replace("torch.", ""),
                    "variant": name,
                    **{
                        f"vs_trl_{k}": _rel(a, b)
                        for k, a, b in zip(("loss", "gh", "gw"), got, peer, strict=True)
                    },
                    **{
                        f"vs_f64_{k}": _rel(a, b)
                        for k, a, b in zip(("loss", "gh", "gw"), got, ref, strict=True)
                    },
                }
            )
            del got
            _free(device)
    return rows


def _usable(names, device) -> tuple[list[str], dict[str, str]]:
    ok, skipped = [], {}
    for name in names:
        if name == "liger_triton" and device.type != "cuda":
            skipped[name] = "needs CUDA (Triton kernel)"
            continue
        try:
            make_variant(name)
            ok.append(name)
        except Exception as err:  # noqa: BLE001 - e.g. liger_kernel not installed
            skipped[name] = f"{type(err).__name__}: {err}"[:200]
    return ok, skipped


def print_report(out: dict) -> None:
    """Markdown: time, memory, ratios against the best peer and Liger Triton, the floor."""
    print(f"\n{out['device_name']}, {out['dtype']}, beta {BETA}, fwd+bwd, "
          f"median of {out['reps']} after {out['warmup']} warm-ups (interleaved)")  # fmt: skip
    if out.get("tflops"):
        print(f"matmul probe: {out['tflops']:.3g} TFLOP/s ({out['dtype']}, 8192^3)")
    for name, why in out["skipped"].items():
        print(f"skipped {name}: {why}")
    cols = "| T, V, H | variant | ms | peak extra GB | time / best peer | mem / Liger Triton | time / floor |"
    print(cols + "\n|---|---|---|---|---|---|---|")
    for row in out["sizes"]:
        T, V, H = row["cfg"]
        res = row["res"]
        floor = 8 * T * V * H / (out["tflops"] * 1e12) * 1e3 if out.get("tflops") else None
        peers = [res[p]["median_ms"] for p in PEERS if res.get(p, {}).get("median_ms")]
        best = min(peers) if peers else None
        lt_gb = res.get("liger_triton", {}).get("peak_gb")
        for name, r in res.items():
            if "error" in r:
                print(f"| {T}, {V}, {H} | {name} | {r['error'][:60]} | | | | |")
                continue
            ms, gb = r["median_ms"], r["peak_gb"]
            if r.get("compile_error"):
                name += " (EAGER: compile failed, see losses.json)"
            print(
                f"| {T}, {V}, {H} | {name} | {ms:.1f} | {_f(gb, '.2f')} | {_ratio(ms, best)} | "
                f"{_ratio(gb, lt_gb)} | {_ratio(ms, floor)} |"
            )
        if floor:
            print(f"| {T}, {V}, {H} | floor | {floor:.1f} | | | | |")
    if out.get("accuracy"):
        print("\naccuracy (norm-relative errors; loss, grad hidden, grad weight):")
        print(
            "| dtype | variant | vs TRL loss | vs TRL gh | vs TRL gw | vs f64 loss | vs f64 gh | vs f64 gw |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for a in out["accuracy"]:
            if "error" in a:
                print(f"| {a['dtype']} | {a['variant']} | {a['error'][:60]} |")
                continue
            keys = (
                "vs_trl_loss",
                "vs_trl_gh",
                "vs_trl_gw",
                "vs_f64_loss",
                "vs_f64_gh",
                "vs_f64_gw",
            )
            print(
                f"| {a['dtype']} | {a['variant']} | "
                + " | ".join(f"{a[k]:.1e}" for k in keys)
                + " |"
            )


def _f(x, fmt) -> str:
    return "-" if x is None else format(x, fmt)


def _ratio(a, b) -> str:
    return "-" if a is None or not b else f"{a / b:.2f}"


def main(args) -> None:
    device = torch.device("cpu" if args.smoke and not torch.cuda.is_available() else args.device)
    if args.smoke:
        args.reps, args.warmup = min(args.reps, 2), 1
    clock = Clock(device)
    grid = SMOKE_GRID if args.smoke else DEVICE_GRID
    if args.configs:
        grid = [tuple(int(x) for x in c.split("x")) for c in args.configs.split(",")]
    names, skipped = _usable([v for v in args.variants if v in VARIANTS], device)
    out = {
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "dtype": args.dtype,
        "reps": args.reps,
        "warmup": args.warmup,
        "skipped": skipped,
        "sizes": [],
        "issue_numbers": {"x".join(map(str, k)): v for k, v in ISSUE_NUMBERS.items()},
    }
    dtype = getattr(torch, args.dtype)
    out["tflops"] = matmul_tflops(device, dtype, clock, 256 if args.smoke else 8192)
    for cfg in grid:
        t0 = time.time()
        out["sizes"].append(bench_size(cfg, names, args, device, clock))
        print(f"# {cfg} done in {time.time() - t0:.0f} s", flush=True)
        _dump(out, args.json)
        print_report(out)  # so far: a stage cut short keeps its table
    if args.acc_T:
        V, H = (grid[0][1], grid[0][2])
        out["accuracy"] = accuracy(names, args.acc_T, V, H, device)
    _dump(out, args.json)
    print_report(out)


def _dump(out: dict, path: str | None) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(out, f, indent=1)
