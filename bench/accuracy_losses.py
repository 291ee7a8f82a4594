"""Accuracy of the fp32 generalized JSD paths against a float64 reference.

    python bench/accuracy_losses.py                 # T=64, V=49152, H=576 (a few CPU-minutes)
    python bench/accuracy_losses.py --T 32 --V 8192

For three regimes (logit scale 1; scale 4 with unrelated teacher = confident, far apart;
scale 4 with the teacher's head = the student's and hidden states 0.05 apart = confident,
nearly matched), beta in {0, 0.5, 0.9, 1} (and temperature 0.7 at beta 0.5), it prints the
relative error of the loss and the max-norm relative error of d/dhidden and d/dweight of

* ``trl``  - TRL's ``GKDTrainer.generalized_jsd_loss`` on fp32 logits (the naive path), and
* ``ours`` - ``chunked_generalized_jsd_loss`` in fp32,

both against TRL's function evaluated in float64 on the same (fp64) inputs, plus ours vs TRL.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def _inputs(T: int, V: int, H: int, scale: float, near: bool, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    f64 = torch.float64
    h = torch.randn(T, H, generator=g, dtype=f64)
    w = torch.randn(V, H, generator=g, dtype=f64) * scale / H**0.5
    if near:
        th, tw = h + 0.05 * torch.randn(T, H, generator=g, dtype=f64), w
    else:
        th = torch.randn(T, H, generator=g, dtype=f64)
        tw = torch.randn(V, H, generator=g, dtype=f64) * scale / H**0.5
    labels = torch.randint(0, V, (T,), generator=g)
    labels[: T // 8] = -100
    return h, w, th, tw, labels


def _run(name, inputs, dtype, beta, temp, chunk):
    from trl.experimental.gkd import GKDTrainer

    from composer_replication.losses import chunked_generalized_jsd_loss

    h, w, th, tw, labels = inputs
    hh, ww = h.to(dtype, copy=True).requires_grad_(), w.to(dtype, copy=True).requires_grad_()
    th, tw = th.to(dtype), tw.to(dtype)
    if name == "ours":
        loss = chunked_generalized_jsd_loss(
            hh, ww, th, tw, labels=labels, beta=beta, temperature=temp, chunk_size=chunk
        )[0]
    else:
        with torch.no_grad():
            t_logits = (th @ tw.t())[None]
        loss = GKDTrainer.generalized_jsd_loss(
            (hh @ ww.t())[None], t_logits, labels=labels[None], beta=beta, temperature=temp
        )
    gh, gw = torch.autograd.grad(loss, (hh, ww))
    return loss.double(), gh.double(), gw.double()


def _errs(x, ref) -> str:
    loss_err = abs(x[0].item() - ref[0].item()) / abs(ref[0].item())
    return f"{loss_err:.1e} / {_rel(x[1], ref[1]):.1e} / {_rel(x[2], ref[2]):.1e}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--T", type=int, default=64)
    p.add_argument("--V", type=int, default=49152)
    p.add_argument("--H", type=int, default=576)
    p.add_argument("--chunk", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(f"T={args.T} V={args.V} H={args.H}; errors as loss / d_hidden / d_weight (relative)")
    print(
        "| regime | beta | tau | loss (fp64) | TRL fp32 vs fp64 | ours fp32 vs fp64 | ours vs TRL |"
    )
    print("|---|---|---|---|---|---|---|")
    regimes = {"scale 1": (1.0, False), "scale 4, far": (4.0, False), "scale 4, near": (4.0, True)}
    for label, (scale, near) in regimes.items():
        inputs = _inputs(args.T, args.V, args.H, scale, near)
        for beta in (0.0, 0.5, 0.9, 1.0):
            for temp in (1.0, 0.7) if beta == 0.5 else (1.0,):
                ref = _run("trl", inputs, torch.float64, beta, temp, args.chunk)
                trl = _run("trl", inputs, torch.float32, beta, temp, args.chunk)
                ours = _run("ours", inputs, torch.float32, beta, temp, args.chunk)
                print(
                    f"| {label} | {beta} | {temp} | {ref[0].item():.4g} | {_errs(trl, ref)} | "
                    f"{_errs(ours, ref)} | {_errs(ours, trl)} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
