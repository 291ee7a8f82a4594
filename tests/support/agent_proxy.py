"""Shared pieces of the agent-proxy tests: the task mini-swe-agent is run on (textkit's
``Counter.__init__``), the answers that rebuild it right or wrong in the harness's own format
(OpenAI tool calls of its ``bash`` tool, our template's ``<tool_call>`` text), a policy that
plays fixed answers, and a stand-in for the trainer fields the rollout function reads."""

from __future__ import annotations

import json
from collections import defaultdict
from types import SimpleNamespace

TASK_ID = "textkit-local:textkit/core.py::Counter.__init__"
STUB = "raise NotImplementedError  # deleted: rebuild this"
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def bash_call(command: str) -> str:
    """An assistant turn calling mini-swe-agent's ``bash`` tool, as the template renders it."""
    args = json.dumps({"command": command}, ensure_ascii=False)
    return '<tool_call>{"name": "bash", "arguments": ' + args + "}</tool_call>"


def edit(body: str) -> str:
    return f"sed -i 's/{STUB}/{body}/' textkit/core.py"


RIGHT = [bash_call(edit("self.counts = {}")), bash_call(SUBMIT)]
"""Rebuilds ``Counter.__init__`` (graded 1), then finishes the harness's way."""
WRONG = [bash_call(edit("pass")), bash_call(SUBMIT)]
"""Leaves ``Counter`` without ``counts`` (graded 0); fewer tokens than ``RIGHT``."""


class Played:
    """A policy that answers the next text of a script per request (any episode), with its
    token ids and zero log-probs; records the prompts it saw."""

    def __init__(self, tokenizer, texts: list[str]):
        self.tok, self.texts, self.prompts = tokenizer, list(texts), []

    def __call__(self, prompt_ids):
        self.prompts.append(list(prompt_ids))
        text = self.texts.pop(0) if self.texts else bash_call(SUBMIT)
        ids = self.tok(text, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
        return ids, [0.0] * len(ids)


def trainer_stub(max_completion_length: int = 4096):
    """What ``AgentEpisodes`` reads of a trainer when its policy is given explicitly."""
    return SimpleNamespace(max_completion_length=max_completion_length,
                           model=SimpleNamespace(training=True),
                           _metrics={"train": defaultdict(list), "eval": defaultdict(list)})  # fmt: skip
