"""DiLoCo communication vs a synchronous all-reduce every step, and the loss gap at equal tokens.

One run: 2 replicas (real processes) of the toy regression task (tests/support/diloco_toy.py, a
1.2K-parameter MLP), all exchanging through the same transport, ObjectStoreAllReduce on file://, so every byte
is counted the same way. Peers, interleaved in one run:
  - sync: the gradients are averaged every step (fp32) -- data-parallel SGD;
  - DiLoCo with H in {1, 10, 50} x {fp32, bf16, int8} pseudo-gradients
    (outer SGD lr 0.7, Nesterov momentum 0.5; plus the paper's momentum 0.9 at H=10 fp32).
Every run sees the same tokens (steps x 2 replicas x batch 32). Reported per replica: bytes of
the objects written per inner step (payload + torch.save framing) and of the tensor data alone,
the ratio to the sync peer, the final held-out MSE and its gap to the sync peer, and the
max relative reconstruction error of the compressed pseudo-gradients.

    PYTHONPATH=src python bench/bench_diloco.py [--steps 600] [--out runs/bench_diloco.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO / "tests")]  # the package; tests/support harnesses

from support.diloco_toy import run_toy_replicas  # noqa: E402


def run(label: str, steps: int, workdir: Path, **opts) -> dict:
    out = workdir / label
    t0 = time.monotonic()
    recs = run_toy_replicas(
        2,
        out,
        timeout=900,
        steps=steps,
        backend="object_store",
        store_uri=f"file://{out}/store",
        lr=0.03,
        **opts,
    )
    equal = len({r["final_checksum"] for r in recs}) == 1
    w = recs[0]["wire"]
    return {
        "label": label,
        "equal_final_weights": equal,
        "eval_loss": recs[0]["eval_loss"],
        "bytes_per_step": w["bytes_sent"] / steps,
        "tensor_bytes_per_step": w["tensor_bytes_sent"] / steps,
        "rounds": w["rounds"],
        "max_rel_error": w["max_relative_error"],
        "wall_s": time.monotonic() - t0,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--out", default="runs/bench_diloco.json")
    args = ap.parse_args()
    os.environ.setdefault("RUST_LOG", "warn")
    rows = []
    with tempfile.TemporaryDirectory() as td:
        wd = Path(td)
        rows.append(run("sync (grad all-reduce every step, fp32)", args.steps, wd, task="ddp"))
        for h in (1, 10, 50):
            for codec, name in (("none", "fp32"), ("bf16", "bf16"), ("int8", "int8")):
                rows.append(
                    run(
                        f"DiLoCo H={h} {name}",
                        args.steps,
                        wd,
                        sync_every=h,
                        compression=codec,
                        outer_lr=0.7,
                        outer_momentum=0.5,
                    )
                )
        rows.append(
            run(
                "DiLoCo H=10 fp32, paper momentum 0.9",
                args.steps,
                wd,
                sync_every=10,
                outer_lr=0.7,
                outer_momentum=0.9,
            )
        )
    base = rows[0]
    print(
        f"steps={args.steps}, 2 replicas, batch 32 each; sync peer eval MSE {base['eval_loss']:.5f}"
    )
    hdr = (
        f"{'run':<40} {'B/step':>9} {'tensor B/step':>13} {'ratio':>8} "
        f"{'eval MSE':>9} {'gap':>8} {'rel.err':>8} {'equal':>5}"
    )
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        r["ratio_vs_sync"] = r["tensor_bytes_per_step"] / base["tensor_bytes_per_step"]
        r["loss_gap_vs_sync"] = (r["eval_loss"] - base["eval_loss"]) / base["eval_loss"]
        print(
            f"{r['label']:<40} {r['bytes_per_step']:>9.0f} {r['tensor_bytes_per_step']:>13.1f} "
            f"{r['ratio_vs_sync']:>8.4f} {r['eval_loss']:>9.5f} {r['loss_gap_vs_sync']:>+8.2%} "
            f"{r['max_rel_error']:>8.1e} {str(r['equal_final_weights']):>5}"
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"steps": args.steps, "rows": rows}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
