"""Which training task a group is for: uniformly, or by difficulty estimated during the run.

Cursor's Composer 2.5 chose its tasks' difficulty "dynamically throughout the run"
(cursor.com/blog/composer-2-5). A GRPO group of ``G`` rollouts carries an advantage only when
its rewards differ: a task the policy always passes, or always fails, teaches nothing (DAPO's
dynamic sampling drops such groups after paying for them; Yu et al. 2025, sec. 3.2). The
adaptive :class:`TaskSampler` spends the generation budget before that: each task's pass rate
``p`` has a Beta posterior from the successes and failures of the run's own scored rollouts
(prior ``Beta(prior, prior)``), and a task is drawn with weight ``max(floor, m^sharpness)``,

    m = P(a group of G is mixed) = 1 - E[p^G] - E[(1-p)^G],   E[p^G] = prod_{j<G} (a+j)/(a+b+j)

(the Beta moments, closed form; ``sharpness`` 3 by default, as ``m`` of a task failed by every
rollout of n groups decays only as about 1/(n+1)), so untried tasks (w = (G-1)/(G+1) under Beta(1, 1)) and tasks
near 50% are favoured, and a task whose groups all fail sinks towards the ``floor`` weight: it
is revisited rarely, in case the policy learned it. A task retires (weight 0) once its pass
rate is above ``retire_pass_rate`` with posterior probability ``retire_confidence`` after
``retire_min_rollouts`` rollouts. Within one :meth:`TaskSampler.next_tasks` call tasks are drawn
without replacement while enough are eligible.

Determinism and resume: draw call ``k`` uses ``random.Random(f"{seed}:{k}")``, so the state is
plain data (the success/failure counts and the number of draws, :meth:`state_dict`) and a run
restored from it draws what the uninterrupted run draws, given the same verdicts.

The held-out split is never drawn: the sampler knows only the task ids it is built with, and
refuses ids also in ``heldout_ids``.

The Ray engine's learner-owned dispenser (``rollout_engine/dispenser.py``) draws every new
ticket's task with ``next_task()`` (a ticket handed out again keeps its task), calls
``update(task_id, rewards)`` when a ticket's group is consumed, and saves ``state_dict()``
beside its own.

Pure Python: no torch, no numpy.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Iterable, Sequence
from typing import Any

from composer_replication.config.data import AdaptiveSamplerConfig, UniformSamplerConfig

SAMPLER_FILE = "task_sampler.json"
"""The sampler's state in a checkpoint directory."""


def moment(a: float, b: float, g: int) -> float:
    """``E[p^g]`` for ``p ~ Beta(a, b)``."""
    out = 1.0
    for j in range(g):
        out *= (a + j) / (a + b + j)
    return out


def mixed_probability(a: float, b: float, g: int) -> float:
    """Probability that ``g`` rollouts of a task with pass rate ``p ~ Beta(a, b)`` neither all
    pass nor all fail."""
    return max(0.0, 1.0 - moment(a, b, g) - moment(b, a, g))


def beta_tail(a: int, b: int, x: float) -> float:
    """``P(p > x)`` for ``p ~ Beta(a, b)``, integer ``a, b >= 1``: the probability that a
    Binomial(a + b - 1, x) is below ``a`` (the order-statistic identity), summed in log space."""
    if x <= 0.0:
        return 1.0
    if x >= 1.0:
        return 0.0
    n = a + b - 1
    lx, l1x, lfn = math.log(x), math.log1p(-x), math.lgamma(n + 1)
    total = 0.0
    for k in range(a):
        log_term = lfn - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * lx + (n - k) * l1x
        total += math.exp(log_term)
    return min(1.0, total)


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (linear interpolation between order statistics)."""
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def task_digest(task_ids: Iterable[str]) -> str:
    """A short digest of a task set (order-free): a saved state belongs to one task set."""
    return hashlib.sha256("\n".join(sorted(set(task_ids))).encode()).hexdigest()[:16]


class TaskSampler:
    """Per-task pass-rate posteriors from scored groups, and seeded draws (uniform or adaptive).

    Args:
        task_ids: the training tasks (duplicates are dropped; order kept).
        group_size: rollouts per group (``num_generations``), the ``G`` of the weight.
        seed: seed of the draws.
        config: ``data.sampler`` (uniform when None).
        heldout_ids: held-out tasks; any of them in ``task_ids`` is an error.
    """

    def __init__(
        self,
        task_ids: Sequence[str],
        group_size: int,
        seed: int,
        config: UniformSamplerConfig | None = None,
        heldout_ids: Iterable[str] = (),
    ):
        self.task_ids = list(dict.fromkeys(task_ids))
        if not self.task_ids:
            raise ValueError("task sampler: no training tasks")
        leaked = sorted(set(self.task_ids) & set(heldout_ids))
        if leaked:
            raise ValueError(f"task sampler: held-out tasks in the training split: {leaked[:3]}")
        if group_size < 1:
            raise ValueError(f"task sampler: group_size must be >= 1, got {group_size}")
        self.config = config or UniformSamplerConfig()
        self.adaptive = isinstance(self.config, AdaptiveSamplerConfig)
        self.group_size = group_size
        self.seed = seed
        self.draws = 0
        """Draw calls made so far (call ``k`` is seeded by ``seed`` and ``k``)."""
        self.drawn = 0
        """Tasks drawn so far (the uniform sampler's position in its epochs)."""
        self.successes: dict[str, int] = {}
        self.failures: dict[str, int] = {}
        self._weights = dict.fromkeys(self.task_ids, self._weight(0, 0))
        self._retired: set[str] = set()
        self._window: list[tuple[float, bool]] = []  # (pass-rate estimate, mixed) per group

    # ---- estimates -------------------------------------------------------------------------
    def posterior(self, task_id: str) -> tuple[int, int]:
        """``(a, b)`` of the task's Beta posterior."""
        prior = getattr(self.config, "prior", 1)
        return prior + self.successes.get(task_id, 0), prior + self.failures.get(task_id, 0)

    def pass_rate(self, task_id: str) -> float:
        """Posterior mean of the task's pass rate."""
        a, b = self.posterior(task_id)
        return a / (a + b)

    def rollouts(self, task_id: str) -> int:
        """Scored rollouts of the task so far."""
        return self.successes.get(task_id, 0) + self.failures.get(task_id, 0)

    def estimate(self, task_id: str) -> tuple[float, int]:
        """``(pass_rate, rollouts)``: the posterior mean and the scored rollouts behind it (what
        the reward function's hack telemetry splits tasks by, envs/telemetry.py; an unknown
        task, e.g. held out, is ``(prior mean, 0)``)."""
        return self.pass_rate(task_id), self.rollouts(task_id)

    def retired(self, task_id: str) -> bool:
        return task_id in self._retired

    def weight(self, task_id: str) -> float:
        """The task's draw weight (adaptive; the uniform sampler ignores weights)."""
        return self._weights[task_id]

    def _weight(self, s: int, f: int) -> float:
        if not self.adaptive:
            return 1.0
        prior = self.config.prior
        mixed = mixed_probability(prior + s, prior + f, self.group_size)
        return max(self.config.floor, mixed**self.config.sharpness)

    def _is_retired(self, task_id: str) -> bool:
        cfg = self.config
        if not self.adaptive or self.rollouts(task_id) < cfg.retire_min_rollouts:
            return False
        a, b = self.posterior(task_id)
        return beta_tail(a, b, cfg.retire_pass_rate) >= cfg.retire_confidence

    # ---- draws -----------------------------------------------------------------------------
    def next_task(self) -> str:
        """One task (the dispenser's call per new ticket)."""
        return self.next_tasks(1)[0]

    def next_tasks(self, n: int) -> list[str]:
        """``n`` tasks, distinct while enough are eligible (one generation batch's groups)."""
        rng = random.Random(f"{self.seed}:{self.draws}")
        self.draws += 1
        if not self.adaptive:
            out = [self.uniform_at(self.drawn + i) for i in range(n)]
        else:
            out = self._weighted(rng, n)
        self.drawn += n
        return out

    def uniform_at(self, index: int) -> str:
        """The uniform sampler's ``index``-th task: position ``index % n`` of epoch
        ``index // n``'s seeded shuffle."""
        epoch, pos = divmod(index, len(self.task_ids))
        order = list(self.task_ids)
        random.Random(f"{self.seed}:epoch:{epoch}").shuffle(order)
        return order[pos]

    def _weighted(self, rng: random.Random, n: int) -> list[str]:
        eligible = [t for t in self.task_ids if t not in self._retired]
        every_task_retired = not eligible
        out: list[str] = []
        pool: list[str] = []
        while len(out) < n:
            if not pool:
                pool = list(eligible or self.task_ids)
            weights = [1.0 if every_task_retired else self._weights[t] for t in pool]
            if sum(weights) <= 0.0:  # floor 0 and every group tied so far
                weights = [1.0] * len(pool)
            pick = rng.choices(range(len(pool)), weights=weights)[0]
            out.append(pool.pop(pick))
        return out

    # ---- updates ---------------------------------------------------------------------------
    def update(self, task_id: str, rewards: Sequence[float | bool]) -> None:
        """Add one scored group of ``task_id``: each entry a verdict (bool: passed) or a
        reward (a success when above ``success_threshold``)."""
        if task_id not in self._weights:
            raise KeyError(f"task sampler: unknown task {task_id!r} (held out, or not training)")
        wins = sum(1 for r in rewards if self._success(r))
        estimate = self.pass_rate(task_id)
        self._window.append((estimate, 0 < wins < len(rewards)))
        self.successes[task_id] = self.successes.get(task_id, 0) + wins
        self.failures[task_id] = self.failures.get(task_id, 0) + len(rewards) - wins
        self._refresh(task_id)

    def _success(self, reward: float | bool) -> bool:
        if isinstance(reward, bool):
            return reward
        return float(reward) > self.config.success_threshold

    def _refresh(self, task_id: str) -> None:
        s, f = self.successes.get(task_id, 0), self.failures.get(task_id, 0)
        self._weights[task_id] = self._weight(s, f)
        if self._is_retired(task_id):
            self._retired.add(task_id)
        else:
            self._retired.discard(task_id)

    # ---- metrics ---------------------------------------------------------------------------
    def drain_metrics(self) -> dict[str, float]:
        """``sampler/*`` over the groups updated since the last call: the fraction with a
        signal (mixed verdicts), the distribution of their tasks' pass-rate estimates when they
        were drawn (mean, 10/50/90% quantiles), and the retired tasks now (count, share). Empty when no group
        was updated."""
        window, self._window = self._window, []
        if not window:
            return {}
        rates = [r for r, _ in window]
        return {
            "sampler/signal_frac": sum(m for _, m in window) / len(window),
            "sampler/sampled_pass_rate_mean": sum(rates) / len(rates),
            "sampler/sampled_pass_rate_p10": quantile(rates, 0.1),
            "sampler/sampled_pass_rate_p50": quantile(rates, 0.5),
            "sampler/sampled_pass_rate_p90": quantile(rates, 0.9),
            "sampler/retired": float(len(self._retired)),
            "sampler/retired_frac": len(self._retired) / len(self.task_ids),
            "sampler/tasks_seen": float(len(self.successes)),
        }

    # ---- checkpoints -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain JSON data: the counts, the draw positions, the seed and the task set's digest."""
        return {
            "type": self.config.type,
            "seed": self.seed,
            "group_size": self.group_size,
            "tasks": task_digest(self.task_ids),
            "n_tasks": len(self.task_ids),
            "draws": self.draws,
            "drawn": self.drawn,
            "successes": dict(self.successes),
            "failures": dict(self.failures),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (refused when it was saved over another task set or seed;
        the sampler type may change: the estimates carry over)."""
        if state["tasks"] != task_digest(self.task_ids) or state["seed"] != self.seed:
            raise ValueError(
                f"task sampler state for seed {state['seed']} over {state['n_tasks']} tasks "
                f"({state['tasks']}); this run has seed {self.seed} over {len(self.task_ids)} "
                f"({task_digest(self.task_ids)})"
            )
        self.draws, self.drawn = int(state["draws"]), int(state["drawn"])
        self.successes = {k: int(v) for k, v in state["successes"].items()}
        self.failures = {k: int(v) for k, v in state["failures"].items()}
        self._retired = set()
        for task_id in self.task_ids:
            self._refresh(task_id)
        self._window = []
