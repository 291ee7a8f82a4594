"""The ``agent_proxy:`` section: train an unmodified agent harness through the policy proxy
(agents/, docs/agents.md "Proxy for unmodified agents"). Imports no torch."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from composer_replication.config.base import StrictModel


class AgentProxyConfig(StrictModel):
    """Per prompt and generation: a fresh workspace of the environment, the harness run in it
    inside the sandbox against the policy proxy, graded by the environment; the episodes train
    through TRL's ``rollout_func``."""

    enabled: bool = False
    """Generate rollouts by running the harness (instead of TRL's own generation loop)."""
    harness: Literal["mini_swe_agent", "command"] = "mini_swe_agent"
    """``mini_swe_agent``: SWE-agent's bash-only agent (``mini``, tool calls, the built-in
    ``mini.yaml`` prompts), run with the settings agents/harnesses.py gives it (offline, no
    prompts to a user, ``step_limit``); ``command``: ``command`` as given, with the same
    environment variables (``AGENT_TASK``, ``AGENT_STEP_LIMIT``, ``OPENAI_API_KEY``,
    ``OPENAI_BASE_URL``)."""
    venv: str = "~/.cache/composer-replication/mini-swe-agent-venv"
    """The harness's virtual environment (``~`` expanded, links resolved; its ``bin`` goes on
    ``PATH``; bound read-only into the sandbox). A missing one is a one-line error holding the
    command that builds mini-swe-agent's here from PyPI (``agents.harnesses``)."""
    command: str = ""
    """The shell command that runs the agent in ``/repo`` (``harness: command`` only)."""
    step_limit: int = Field(6, ge=1, le=200)
    """Most model calls the harness makes per episode (``AGENT_STEP_LIMIT``)."""
    max_requests: int = Field(12, ge=1, le=1000)
    """Most requests the proxy answers per episode; later ones are refused (429)."""
    max_prompt_tokens: int = Field(4096, ge=64, le=1_000_000)
    """Longest rendered request the proxy answers; longer ones are refused (400)."""
    timeout_s: float = Field(300.0, gt=0.0, le=7200.0)
    """Limit on one agent run's own time: its wall-clock seconds less those it waited for the
    policy (its requests queued behind other episodes' batches and generated), after which
    it is killed (agents/sandboxed.py)."""
    max_policy_wait_s: float = Field(3600.0, gt=0.0, le=86400.0)
    """Most seconds of one agent run's wait for the policy not counted against ``timeout_s``
    (past it, waiting counts): the run's wall time is at most their sum."""
    memory_mb: int = Field(4096, ge=512, le=65536)
    """Address-space limit of each process of the agent's sandbox (the harness's Python with
    litellm needs ~1-2 GB)."""
    max_processes: int = Field(128, ge=8, le=4096)
    """Processes and threads of the agent's sandbox at once (the harness's threads count)."""
    workers: int = Field(0, ge=0, le=256)
    """Episodes run at once (0: the sandbox slots; never more than the slots, since an
    episode queued for a slot would be masked when its wait times out). Their requests are
    generated together, in arrival order, by the trainer's generator."""
    port: int = Field(8000, ge=1024, le=65535)
    """The port of the relay inside the sandbox (its own network namespace: any free one)."""

    @model_validator(mode="after")
    def _usable(self) -> AgentProxyConfig:
        if self.harness == "command" and self.enabled and not self.command.strip():
            raise ValueError("agent_proxy.harness=command needs agent_proxy.command")
        return self
