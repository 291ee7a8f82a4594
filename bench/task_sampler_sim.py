"""``data.sampler`` on simulated groups: uniform vs adaptive over tasks whose success
probabilities are a third 0, a third 1, a third 0.5 (the acceptance setting of
tests/unit/envs/test_sampler.py, over more seeds and steps), printing the fraction of groups
with a GRPO signal after a warm-up and its ratio, and drawing docs/task_sampler.png: the signal
fraction per step for both samplers, and the adaptive run's task mix (the pass-rate estimates
of the drawn tasks, mean and 10/90% quantiles, and the share of tasks retired).

    PYTHONPATH=src python bench/task_sampler_sim.py [--out docs/task_sampler.png]
"""

from __future__ import annotations

import argparse
import random
import statistics

from composer_replication.config.data import DataConfig
from composer_replication.envs.sampler import TaskSampler

G, GROUPS, TASKS, STEPS, WARM_UP = 4, 8, 30, 60, 10


def run(kind: str, seed: int) -> list[dict[str, float]]:
    probs = {f"t{i:02d}": (0.0, 1.0, 0.5)[i % 3] for i in range(TASKS)}
    sampler = TaskSampler(list(probs), G, seed, DataConfig(sampler=kind).sampler)
    rng = random.Random(seed)
    rows = []
    for _ in range(STEPS):
        for task in sampler.next_tasks(GROUPS):
            sampler.update(task, [rng.random() < probs[task] for _ in range(G)])
        rows.append(sampler.drain_metrics())
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="docs/task_sampler.png")
    parser.add_argument("--seeds", type=int, default=10)
    args = parser.parse_args()
    runs = {k: [run(k, s) for s in range(args.seeds)] for k in ("uniform", "adaptive")}
    after = {
        k: statistics.mean(r["sampler/signal_frac"] for rows in v for r in rows[WARM_UP:])
        for k, v in runs.items()
    }
    print(f"signal fraction after {WARM_UP} steps, {args.seeds} seeds x {STEPS} steps x "
          f"{GROUPS} groups of {G}: uniform {after['uniform']:.3f}, adaptive "
          f"{after['adaptive']:.3f}, ratio {after['adaptive'] / after['uniform']:.2f}")  # fmt: skip
    draw(runs, args.out)


def draw(runs: dict[str, list[list[dict[str, float]]]], out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def mean_of(kind: str, key: str) -> list[float]:
        return [statistics.mean(rows[i][key] for rows in runs[kind]) for i in range(STEPS)]

    steps = list(range(1, STEPS + 1))
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for kind in runs:
        left.plot(steps, mean_of(kind, "sampler/signal_frac"), label=kind)
    left.set_title("sampler/signal_frac (groups with a GRPO signal)")
    for key in ("mean", "p10", "p90"):
        right.plot(steps, mean_of("adaptive", f"sampler/sampled_pass_rate_{key}"),
                   label=f"sampled pass rate, {key}")  # fmt: skip
    right.plot(steps, mean_of("adaptive", "sampler/retired_frac"), label="retired tasks (share)")
    right.set_title("adaptive: the task mix")
    for ax in (left, right):
        ax.set_xlabel("step")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
