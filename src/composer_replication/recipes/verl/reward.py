"""verl reward function over our verifiers: ``reward.custom_reward_function.path`` = this
file, ``name: compute_score``. It returns a dict: verl uses ``score`` as the reward and passes
the other keys on as ``reward_extra_info``, where the hinted self-teacher
(:mod:`composer_replication.recipes.verl.agent_loop`) finds ``feedback``."""

from __future__ import annotations

from typing import Any

from composer_replication.envs.arithmetic import grade_answer

DATA_SOURCE = "composer_replication/arithmetic"


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: dict[str, Any] | None = None,
    **_: Any,
) -> dict[str, Any]:
    """Reward, pass flag and verifier feedback of one response (arithmetic: our shaped grader,
    the same as the TRL quickstart's)."""
    if data_source != DATA_SOURCE:
        raise ValueError(
            f"compute_score: unknown data_source {data_source!r}; this reward knows {DATA_SOURCE!r}"
        )
    info = extra_info or {}
    problem = (int(info["a"]), str(info["op"]), int(info["b"])) if "op" in info else None
    result = grade_answer(solution_str, int(ground_truth), problem)
    return {"score": result.reward, "passed": float(result.passed), "feedback": result.feedback}
