"""verl agent-loop classes whose teacher is the policy itself, shown a hint (imports verl).

Set ``actor_rollout_ref.rollout.agent.agent_loop_manager_class`` to
``composer_replication.recipes.verl.agent_loop.HintedAgentLoopManagerTQ`` (verl's default
``main_ppo`` path) or ``...HintedAgentLoopManager`` (``main_ppo_v0``), with
``distillation.enabled=true`` and ``distillation.distillation_loss.loss_mode=composer_sdpo``.
After a rollout is scored, a failed one with verifier feedback in the reward's extra info is
rescored by the *rollout server* (the current policy's weights) with the hint in its context:
:func:`~composer_replication.recipes.verl.hinted.hinted_teacher_logprobs`. The configured
``distillation.teacher_models`` pool is then not consulted for log-probs (verl still starts it;
give it the smallest footprint). Multi-turn rollouts get the hint after the first prompt's last
user turn, not at the failed turn as in our TRL trainer.
"""

from __future__ import annotations

from typing import Any

import ray
from verl.experimental.agent_loop.agent_loop import AgentLoopManager, AgentLoopWorker
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ

from composer_replication.channels.hints import HintTemplates
from composer_replication.recipes.verl.hinted import (
    feedback_hint,
    hinted_teacher_logprobs,
    unhinted_rows,
)


class HintedTeacherMixin:
    """Overrides verl's ``_compute_teacher_logprobs`` (called after ``_compute_score``)."""

    hint_templates: HintTemplates = HintTemplates()
    pass_reward: float = 1.0

    async def _compute_teacher_logprobs(
        self,
        output: Any,
        prompt_ids: list[int],
        response_ids: list[int],
        validate: bool,
        sample_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if validate or not getattr(self, "distillation_enabled", False):
            return
        kwargs = sample_kwargs or {}
        info = output.extra_fields.get("reward_extra_info") or {}
        hint = feedback_hint(output.reward_score, info, self.hint_templates, self.pass_reward)
        messages = kwargs.get("raw_prompt")
        if hint is None or messages is None:
            ids, lps = unhinted_rows(len(prompt_ids), len(response_ids))
        else:
            ids, lps = await hinted_teacher_logprobs(
                self.llm_client, self.tokenizer, list(messages), hint, prompt_ids, response_ids
            )
        output.extra_fields["teacher_ids"] = ids
        output.extra_fields["teacher_logprobs"] = lps


class HintedAgentLoopWorker(HintedTeacherMixin, AgentLoopWorker):
    """verl's agent-loop worker with the hinted self-teacher."""


# verl decorates AgentLoopWorkerTQ with @ray.remote; Ray forbids subclassing the actor class,
# so the mixin goes on the plain class it wraps.
_WorkerTQ = getattr(AgentLoopWorkerTQ, "__ray_actor_class__", AgentLoopWorkerTQ)


class HintedAgentLoopWorkerTQ(HintedTeacherMixin, _WorkerTQ):
    """verl's TransferQueue agent-loop worker with the hinted self-teacher."""


class HintedAgentLoopManager(AgentLoopManager):
    """``main_ppo_v0``'s agent-loop manager running :class:`HintedAgentLoopWorker`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.agent_loop_workers_class = ray.remote(HintedAgentLoopWorker)
        super().__init__(*args, **kwargs)


class HintedAgentLoopManagerTQ(AgentLoopManagerTQ):
    """``main_ppo``'s agent-loop manager running :class:`HintedAgentLoopWorkerTQ`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # sets verl's worker class; workers start in create()
        self.agent_loop_workers_class = ray.remote(HintedAgentLoopWorkerTQ)
