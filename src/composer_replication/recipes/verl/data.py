"""Write our arithmetic task as verl parquet files (``train.parquet``, ``test.parquet``):
``python -m composer_replication.recipes.verl.data --out ~/data/composer_arith --levels 1 2``.

Rows follow verl's RL dataset format: ``data_source``, ``prompt`` (chat messages),
``ability``, ``reward_model`` (``style``, ``ground_truth``) and ``extra_info`` (the problem,
for the grader). The train/test split is the environment's own (held-out problems never train).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from composer_replication.envs.arithmetic import ArithmeticEnv
from composer_replication.recipes.verl.reward import DATA_SOURCE


def _problem(problem: tuple[int, str, int]) -> dict[str, Any]:
    a, op, b = problem
    return {"a": a, "op": op, "b": b}


def rows(env: ArithmeticEnv, split: str) -> list[dict[str, Any]]:
    """verl dataset rows of one split."""
    return [
        {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": t.prompt}],
            "ability": "arithmetic",
            "reward_model": {"style": "rule", "ground_truth": str(t.data["answer"])},
            "extra_info": {"task_id": t.task_id, **_problem(t.data["problem"])},
        }
        for t in env.tasks(split)
    ]


def write(out: Path, levels: list[int]) -> dict[str, Path]:
    """Write ``train.parquet`` and ``test.parquet`` under ``out``; return their paths."""
    import pandas as pd

    env = ArithmeticEnv(levels)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, name in (("train", "train"), ("heldout", "test")):
        paths[name] = out / f"{name}.parquet"
        pd.DataFrame(rows(env, split)).to_parquet(paths[name])
    return paths


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--levels", type=int, nargs="+", default=[1, 2])
    args = ap.parse_args(argv)
    for name, path in write(args.out.expanduser(), args.levels).items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
