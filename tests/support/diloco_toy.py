"""A tiny, fixed synthetic task for exercising the outer loop in real processes (tests, bench).

Task: regress the output of a fixed random "teacher" MLP (16 -> 32 -> 1, tanh) from Gaussian
inputs, with label noise of std 0.1; the student is a 16 -> 64 -> 1 MLP trained with AdamW on
MSE. Replica ``r`` draws its inner-step batches from its own shard (a generator seeded by
``(shard, step)``); the held-out set is shared. A test and benchmark harness, not part of the
library: ``PYTHONPATH=src:tests python -m support.diloco_toy --help``; executors take
``support.diloco_toy:replica_entrypoint``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

D_IN = 16
NOISE_STD = 0.3
TEACHER_SEED = 1234
EVAL_SEED = 999_999


def make_teacher() -> nn.Module:
    g = torch.Generator().manual_seed(TEACHER_SEED)
    teacher = nn.Sequential(nn.Linear(D_IN, 32), nn.Tanh(), nn.Linear(32, 1))
    with torch.no_grad():
        for p in teacher.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return teacher


def make_student(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(D_IN, 64), nn.Tanh(), nn.Linear(64, 1))


def make_batch(
    teacher: nn.Module, shard: int, step: int, batch: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and noisy targets for inner step ``step`` of data shard ``shard``."""
    g = torch.Generator().manual_seed(1_000_003 * (shard + 1) + step)
    x_BD = torch.randn(batch, D_IN, generator=g)
    with torch.no_grad():
        y_B1 = teacher(x_BD) + NOISE_STD * torch.randn(batch, 1, generator=g)
    return x_BD, y_B1


def eval_loss(model: nn.Module, teacher: nn.Module, n: int = 2048) -> float:
    """MSE on a fixed held-out set shared by all replicas and runs."""
    x, y = make_batch(teacher, EVAL_SEED, 0, n)
    with torch.no_grad():
        return float(nn.functional.mse_loss(model(x), y))


def cosine_schedule(opt: torch.optim.Optimizer, steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Cosine decay from the base lr to 0 over ``steps`` (a stable end point for comparisons)."""
    import math

    return torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))
    )


def train_single(steps: int, batch: int, shards: int, lr: float, seed: int = 0) -> dict[str, Any]:
    """The synchronous baseline: one process whose every step sees all ``shards`` batches of that
    step (exactly what a synchronous data-parallel all-reduce of the mean gradient computes)."""
    teacher, model = make_teacher(), make_student(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    sched = cosine_schedule(opt, steps)
    for step in range(steps):
        xs, ys = zip(*(make_batch(teacher, s, step, batch) for s in range(shards)), strict=True)
        loss = nn.functional.mse_loss(model(torch.cat(xs)), torch.cat(ys))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    return {
        "eval_loss": eval_loss(model, teacher),
        "params": sum(p.numel() for p in model.parameters()),
    }


SIGN_THETA0 = (1.0, 2.0)
SIGN_GRADS = ((0.5, -0.25), (0.25, 0.75), (-0.5, 0.5))


class _Vector(nn.Module):
    def __init__(self, values: tuple[float, ...]):
        super().__init__()
        self.theta = nn.Parameter(torch.tensor(values, dtype=torch.float32))


def _sign_setup(rank: int) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    """The sign-convention task: theta0 = (1, 2), replica r's loss is ``g_r . theta`` (constant
    gradient g_r), inner SGD with lr 1, so after H steps ``theta_local = theta0 - H * g_r``."""
    model = _Vector(SIGN_THETA0)
    g = torch.tensor(SIGN_GRADS[rank])
    return model, torch.optim.SGD(model.parameters(), lr=1.0), lambda: (g * model.theta).sum()


def _build_manager(args: argparse.Namespace):
    if args.backend == "torchft":
        return None
    from composer_replication.diloco.serverless import ObjectStoreAllReduce, ObjectStoreManager

    reducer = ObjectStoreAllReduce(
        args.store_uri,
        rank=args.rank,
        world_size=args.world,
        timeout_s=args.timeout,
        compression=args.compression,
        storage_options={"endpoint_url": args.endpoint_url} if args.endpoint_url else None,
    )
    return ObjectStoreManager(reducer)


def run_ddp_replica(args: argparse.Namespace) -> dict[str, Any]:
    """The synchronous peer for the benchmark: every step, average the *gradients* of all ranks
    through the same ObjectStoreAllReduce (fp32), then take the inner optimizer step."""
    from composer_replication.diloco.serverless import ObjectStoreAllReduce

    torch.set_num_threads(1)
    teacher, model = make_teacher(), make_student(args.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    sched = cosine_schedule(opt, args.steps)
    reducer = ObjectStoreAllReduce(
        args.store_uri,
        rank=args.rank,
        world_size=args.world,
        timeout_s=args.timeout,
        storage_options={"endpoint_url": args.endpoint_url} if args.endpoint_url else None,
    )
    params = list(model.parameters())
    t0 = time.monotonic()
    for step in range(args.steps):
        x, y = make_batch(teacher, args.rank, step, args.batch)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        for p, g in zip(params, reducer.allreduce([p.grad for p in params]), strict=True):
            p.grad.copy_(g)
        opt.step()
        sched.step()
    return {
        "rank": args.rank,
        "inner_steps": args.steps,
        "final_checksum": params_checksum_of(model),
        "eval_loss": eval_loss(model, teacher),
        "seconds": time.monotonic() - t0,
        "wire": reducer.stats.as_dict(),
        "syncs": [],
    }


def params_checksum_of(model: nn.Module) -> str:
    from composer_replication.diloco.outer import params_checksum

    return params_checksum(model.parameters())


def _target_syncs(args: argparse.Namespace) -> int:
    """Stop after this many outer steps: ``--target-syncs``, or the number written to
    ``--stop-file`` once it exists (lets a test stop all replicas at the same outer step)."""
    if args.stop_file and os.path.exists(args.stop_file):
        text = Path(args.stop_file).read_text().strip()
        if text:
            return int(text)
    return args.target_syncs


def run_replica(args: argparse.Namespace) -> dict[str, Any]:
    """Train one replica under DiLoCo; returns the record the tests and bench read."""
    from composer_replication.config.diloco import DilocoConfig
    from composer_replication.diloco.outer import DilocoRuntime

    if args.rank == args.absent_rank:
        return {"rank": args.rank, "absent": True}
    if args.task == "ddp":
        return run_ddp_replica(args)
    torch.set_num_threads(1)
    teacher = make_teacher()
    if args.task == "sign":
        model, opt, sign_loss = _sign_setup(args.rank)
        sched = None
    else:
        model = make_student(args.seed)
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
        sched = cosine_schedule(opt, args.steps)
    cfg = DilocoConfig(
        enabled=True,
        replicas=args.world,
        min_replicas=args.min_replicas,
        replica_id=args.rank,
        sync_every=args.sync_every,
        outer_lr=args.outer_lr,
        outer_momentum=args.outer_momentum,
        nesterov=args.outer_momentum > 0,
        fragments=args.fragments,
        lighthouse=args.lighthouse,
        timeout_s=args.timeout,
    )

    def report(ev):
        print(json.dumps({"rank": args.rank, "sync": ev.row()}), flush=True)

    rt = DilocoRuntime(
        cfg,
        model,
        opt,
        manager=_build_manager(args),
        keep_tensors=args.keep_tensors,
        on_sync=report,
    )
    losses = []
    t0 = time.monotonic()
    with rt:
        step = 0
        while step < args.steps:
            target = _target_syncs(args)
            if target and rt.manager.current_step() >= target:
                break
            if args.task == "sign":
                loss = sign_loss()
            else:
                shard = args.shard if args.shard is not None else args.rank
                x, y = make_batch(teacher, shard, step, args.batch)
                loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if sched is not None:
                sched.step()
            losses.append(float(loss.detach()))
            step += 1
            if args.step_sleep:
                time.sleep(args.step_sleep)
    out = {
        "rank": args.rank,
        "inner_steps": step,
        "syncs": [e.row() for e in rt.events],
        "final_checksum": rt.checksum(),
        "eval_loss": eval_loss(model, teacher) if args.task != "sign" else None,
        "final_params": [p.detach().flatten().tolist() for p in model.parameters()]
        if args.task == "sign"
        else None,
        "losses": losses,
        "seconds": time.monotonic() - t0,
        "manager_step": rt.manager.current_step(),
    }
    stats = getattr(rt.manager, "stats", None)
    if stats is not None:
        out["wire"] = stats()
    if args.keep_tensors:
        torch.save(
            {
                "pre": [e.pre_sync for e in rt.events],
                "post": [e.post_sync for e in rt.events],
                "steps": [e.manager_step for e in rt.events],
            },
            Path(args.out).with_suffix(".pt"),
        )
    rt.shutdown()
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--task", choices=["regression", "sign", "ddp"], default="regression")
    ap.add_argument("--rank", type=int, default=int(os.environ.get("REPLICA_RANK", 0)))
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--min-replicas", type=int, default=1)
    ap.add_argument("--shard", type=int, default=None)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--target-syncs", type=int, default=0)
    ap.add_argument("--sync-every", type=int, default=4)
    ap.add_argument("--fragments", type=int, default=1)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--outer-lr", type=float, default=0.7)
    ap.add_argument("--outer-momentum", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lighthouse", default=None)
    ap.add_argument("--backend", choices=["torchft", "object_store"], default="torchft")
    ap.add_argument("--store-uri", default=None)
    ap.add_argument("--compression", choices=["none", "bf16", "int8"], default="none")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--stop-file", default=None)
    ap.add_argument("--step-sleep", type=float, default=0.0)
    ap.add_argument("--keep-tensors", action="store_true")
    ap.add_argument("--endpoint-url", default=None, help="s3 endpoint (e.g. a local moto server)")
    ap.add_argument(
        "--absent-rank", type=int, default=-1, help="this rank exits at once, writing nothing"
    )
    ap.add_argument("--out", required=True)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = run_replica(args)
    Path(args.out).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())


def replica_entrypoint(**kwargs: Any) -> dict[str, Any]:
    """Entrypoint for the executors: ``kwargs`` are this module's CLI options (underscored),
    the rank comes from ``$REPLICA_RANK``; ``{rank}`` in ``out`` is replaced by it."""
    rank = int(os.environ.get("REPLICA_RANK", "0"))
    kwargs = {**kwargs, "rank": rank, "out": str(kwargs["out"]).format(rank=rank)}
    argv: list[str] = []
    for key, value in kwargs.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value not in (False, None):
            argv += [flag, str(value)]
    args = parse_args(argv)
    out = run_replica(args)
    Path(args.out).write_text(json.dumps(out))
    return out


def toy_command(out: str | Path, rank: int, **options: Any) -> list[str]:
    """argv for one toy replica process (``options`` are CLI flags, underscores allowed)."""
    argv = [sys.executable, "-m", "support.diloco_toy", "--rank", str(rank)]
    argv += ["--out", str(out)]
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value not in (False, None):
            argv += [flag, str(value)]
    return argv


def toy_env() -> dict[str, str]:
    """Child environment: this checkout's package and ``tests/support`` importable, torchft's
    Rust logs at warn."""
    repo = Path(__file__).resolve().parents[2]
    paths = [str(repo / "src"), str(repo / "tests"), os.environ.get("PYTHONPATH", "")]
    return dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(p for p in paths if p),
        RUST_LOG="warn",
        OMP_NUM_THREADS="1",
    )


def run_toy_replicas(
    n: int, out_dir: str | Path, timeout: float = 300.0, **options: Any
) -> list[dict[str, Any]]:
    """Start ``n`` toy replicas as OS processes, wait, and return their JSON records.

    Raises ``RuntimeError`` with the replica's output if any exits non-zero."""
    import subprocess

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    procs = []
    for r in range(n):
        log = (out_dir / f"r{r}.log").open("w")
        cmd = toy_command(out_dir / f"r{r}.json", r, world=n, **options)
        procs.append(
            (subprocess.Popen(cmd, env=toy_env(), stdout=log, stderr=subprocess.STDOUT), log)
        )
    failed = []
    for r, (p, log) in enumerate(procs):
        try:
            code = p.wait(timeout=timeout)
        except BaseException:  # the timeout, or Ctrl-C: the replicas go with the test
            for q, _ in procs:
                q.kill()
                q.wait()
            raise
        log.close()
        if code != 0:
            failed.append((r, code, (out_dir / f"r{r}.log").read_text()[-3000:]))
    if failed:
        raise RuntimeError(
            "toy replicas failed: " + "; ".join(f"rank {r} exit {c}:\n{t}" for r, c, t in failed)
        )
    return [json.loads((out_dir / f"r{r}.json").read_text()) for r in range(n)]
