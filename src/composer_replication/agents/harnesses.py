"""How each supported harness is started in the sandbox: a shell command run in ``/repo`` and
the environment variables that keep it offline and non-interactive. The harness itself is
not modified: these are its documented command-line options and environment variables.

Every harness also gets ``AGENT_TASK`` (the task text), ``AGENT_STEP_LIMIT``,
``OPENAI_API_KEY`` (the episode's proxy key) and ``OPENAI_BASE_URL`` / ``OPENAI_API_BASE``
(the relay inside the sandbox).
"""

from __future__ import annotations

__all__ = ["HARNESSES", "harness_command", "harness_tools"]

MODEL_NAME = "policy"
"""The model name the proxy serves (harnesses ask for ``openai/policy``)."""

MINI_SWE_AGENT_COMMAND = (
    "mini --yolo --exit-immediately --agent-class minisweagent.agents.default.DefaultAgent "
    f"--model openai/{MODEL_NAME} --config mini.yaml "
    '--config agent.step_limit="$AGENT_STEP_LIMIT" --config agent.cost_limit=0 '
    '--output /tmp/trajectory.json --task "$AGENT_TASK" >/tmp/agent.log 2>&1\n'
    "status=$?; tail -c 3000 /tmp/agent.log; exit $status"
)
"""mini-swe-agent 2.x (``pip install mini-swe-agent``): its built-in ``mini.yaml`` (system
and instance prompts, one ``bash`` tool called through OpenAI tool calls, ``echo
COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` to finish), the non-interactive ``DefaultAgent``, no
confirmations, a step limit, no cost limit (the proxy costs nothing)."""

MINI_SWE_AGENT_ENV = (
    ("MSWEA_CONFIGURED", "true"),  # no first-run setup prompt
    ("MSWEA_SILENT_STARTUP", "1"),
    ("MSWEA_GLOBAL_CONFIG_DIR", "/tmp/mini-swe-agent"),
    ("MSWEA_COST_TRACKING", "ignore_errors"),  # a local model has no price
    ("MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT", "1"),  # a refused request ends the episode
    ("LITELLM_LOCAL_MODEL_COST_MAP", "True"),  # no download of litellm's model map
    ("HF_HUB_OFFLINE", "1"),
    ("NO_COLOR", "1"),
    ("TERM", "dumb"),
)

HARNESSES: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {
    "mini_swe_agent": (MINI_SWE_AGENT_COMMAND, MINI_SWE_AGENT_ENV),
}
"""name -> (command, environment) of the harnesses with a preset."""


MINI_SWE_AGENT_REQUIREMENTS = ("mini-swe-agent==2.4.6", "litellm==1.110.2", "openai==3.57.0")
"""The harness and the two libraries its model calls go through, pinned (the versions PyPI
resolved on 2026-11-26); installed into their own venv, never the trainer's environment."""


def venv_setup_command(venv: str) -> str:
    """The shell command that builds mini-swe-agent's venv at ``venv`` from PyPI (~1-2 min,
    ~750 MB; the tests build theirs with tests/support/agent_venv.py)."""
    return f"python -m venv {venv} && {venv}/bin/pip install " + " ".join(
        MINI_SWE_AGENT_REQUIREMENTS
    )


HARNESS_TOOLS: dict[str, tuple[str, ...]] = {"mini_swe_agent": ("bash",)}
"""The tools each preset harness offers its model (for channel 3's vocabulary check)."""


def harness_tools(name: str) -> tuple[str, ...]:
    """The tool names harness ``name`` offers (empty when unknown: ``command``)."""
    return HARNESS_TOOLS.get(name, ())


def harness_command(name: str, command: str = "") -> tuple[str, tuple[tuple[str, str], ...]]:
    """(command, environment) of harness ``name``; ``command`` for ``name == "command"``."""
    if name == "command":
        return command, ()
    return HARNESSES[name]
