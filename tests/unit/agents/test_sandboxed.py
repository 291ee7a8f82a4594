"""An agent's time limit is its own time (agents/sandboxed.py): the seconds it waits for the
policy (its requests queued behind other episodes' batches, then generated) are not counted
against ``agent_proxy.timeout_s``, while an agent that spends its own time past the limit is
still killed, whatever signals it ignores (the host's backstop, for an agent that stops the
sandbox's own-time watchdog: tests/unit/sandbox/test_shell.py).

Each agent is a shell command (``harness: command``) run by ``AgentEpisodes`` on a Feature
Deletion episode with the proxy up; its requests are answered by ``support.agent_proxy.Held``,
a policy whose every answer waits in the queue for a fixed time."""

from __future__ import annotations

import pytest
from support.agent_proxy import Held, trainer_stub
from support.textkit import textkit_env

from composer_replication.agents.episodes import AgentEpisodes
from composer_replication.config import AgentProxyConfig

TASK_ID = "textkit-local:textkit/core.py::slugify"
ASK_TWICE = (  # two chat requests to the proxy, one after the other, from one process
    'python -c "import json, os, urllib.request as u\n'
    "def ask():\n"
    "    r = u.Request('http://127.0.0.1:8000/v1/chat/completions', json.dumps({'model': "
    "'policy', 'messages': [{'role': 'user', 'content': 'hi'}]}).encode(), "
    "{'Authorization': 'Bearer ' + os.environ['OPENAI_API_KEY'], "
    "'Content-Type': 'application/json'})\n"
    "    print('status', u.urlopen(r, timeout=120).status)\n"
    'ask(); ask()"'
)
IGNORE_SIGNALS = (  # a process that ignores every signal it can, forever
    "python -c \"import signal, time\nfor s in ('SIGTERM', 'SIGINT', 'SIGHUP', 'SIGQUIT', "
    "'SIGUSR1', 'SIGALRM'):\n    signal.signal(getattr(signal, s), signal.SIG_IGN)\n"
    'while True: time.sleep(1)"'
)

pytestmark = pytest.mark.agent_venv  # harness_venv needs a venv; the command agent uses none


@pytest.fixture(scope="module")
def env(textkit_tasks):
    return textkit_env(textkit_tasks)


def _episode(env, tok, venv, command: str, hold_s: float, timeout_s: float):
    cfg = AgentProxyConfig(enabled=True, harness="command", command=command, venv=venv,
                           timeout_s=timeout_s, workers=1, max_requests=4)  # fmt: skip
    episodes = AgentEpisodes(env, cfg, tok, policy=Held(tok, [], hold_s))
    row = env.row(env.task_by_id(TASK_ID))
    try:
        episodes([row["prompt"]], trainer_stub([row]))
    finally:
        episodes.close()
    return episodes.last_episodes[0]


def test_time_queued_for_the_policy_does_not_count_against_the_agent(env, tool_tok, agent_venv):
    """Two requests, each held 3.5 s in the queue: the agent's run lasts > 7 s of wall time
    against a 5 s limit, its own work (a shell, a Python start) well under a second."""
    ep = _episode(env, tool_tok, agent_venv, ASK_TWICE + "; echo finished > finished.txt",
                  hold_s=3.5, timeout_s=5)  # fmt: skip
    assert not ep.run.timed_out and ep.run.exit_code == 0, ep.run.output
    assert ep.run.output.count("status 200") == 2 and len(ep.turns) == 2
    assert "finished.txt" in ep.run.changed
    assert ep.queued_s >= 7.0 and ep.seconds > 7.0


def test_an_agent_past_its_own_time_is_killed_whatever_signals_it_ignores(
    env, tool_tok, agent_venv
):
    """One request held 2 s, then a process that ignores signals and never ends: it is killed
    once its own time passes the limit (the credit for its wait does not save it), by the
    sandbox's own watchdog: the workspace it left still comes back."""
    command = f"{ASK_TWICE.replace('ask(); ask()', 'ask()')}; echo started > started.txt; "
    command += f"trap '' TERM INT HUP QUIT; {IGNORE_SIGNALS}"
    ep = _episode(env, tool_tok, agent_venv, command, hold_s=2.0, timeout_s=3)
    assert ep.run.timed_out and ep.run.exit_code is None, ep.run.output
    assert len(ep.turns) == 1 and ep.queued_s >= 2.0
    assert ep.run.error == "" and "started.txt" in ep.run.changed  # killed inside, copied out
    assert ep.seconds < 60  # not the host's backstop (the limit + 30 s), let alone forever
