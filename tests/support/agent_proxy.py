"""Shared pieces of the agent-proxy tests: the task mini-swe-agent is run on (textkit's
``Counter.__init__``), the answers that rebuild it right or wrong in the harness's own format
(OpenAI tool calls of its ``bash`` tool, our template's ``<tool_call>`` text), a policy that
plays fixed answers, and a stand-in for the trainer fields the rollout function reads (the
harness venv and the tool tokenizer are fixtures of tests/conftest.py: ``agent_venv``,
``tool_tok``)."""

from __future__ import annotations

import json
import time
import weakref
from collections import defaultdict
from types import SimpleNamespace

import torch

from support.scripted_lm import ScriptedLlama

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


class Held(Played):
    """:class:`Played` behind a busy generator: each request waits ``hold_s`` seconds in the
    queue (other episodes' batches) before its answer, reported as its ``queued_s``. No CPU
    is spent meanwhile, as for an agent whose request is queued."""

    def __init__(self, tokenizer, texts: list[str], hold_s: float):
        super().__init__(tokenizer, texts)
        self.hold_s = hold_s

    def __call__(self, prompt_ids):
        from composer_replication.lm.generator import Completion

        time.sleep(self.hold_s)
        ids, logprobs = super().__call__(prompt_ids)
        return Completion(ids, logprobs, queued_s=self.hold_s)


class TrainerStub:
    """What ``AgentEpisodes`` uses of a trainer when its policy is given explicitly: the
    completion limit, the model's mode, the dataset rows of the prompts (``rollout_rows``)
    and ``log_metric`` (values kept in ``logged``)."""

    def __init__(self, rows: list[dict], max_completion_length: int = 4096) -> None:
        self.rollout_rows = list(rows)
        self.max_completion_length = max_completion_length
        self.model = SimpleNamespace(training=True)
        self.logged: dict[str, defaultdict[str, list[float]]] = {
            "train": defaultdict(list), "eval": defaultdict(list)}  # fmt: skip

    def log_metric(self, key: str, value: float, mode: str | None = None) -> None:
        self.logged[mode or "train"][key].append(float(value))


def trainer_stub(rows: list[dict], max_completion_length: int = 4096) -> TrainerStub:
    """A :class:`TrainerStub` generating for ``rows``."""
    return TrainerStub(rows, max_completion_length)


class BranchingLlama(ScriptedLlama):
    """A tiny random Llama pushed (a logit bias, the same at generation and at scoring) to
    write, in its k-th assistant turn, one of ``scripts[k]``'s alternatives: every
    alternative consistent with what the turn holds so far gets the bias on its next token,
    so where alternatives part (``RIGHT`` vs ``WRONG``: the body) the model's own logits
    decide, at the sampling temperature, and gradient moves that choice."""

    def set_branches(self, header_ids: list[int], scripts: list[list[list[int]]]) -> None:
        self.set_script(header_ids, [])
        self._branches = scripts
        # decoding with a KV cache (~1 k-token prompts: without one each step reran the whole
        # rows, ~a third of the 8-agent train test's CPU); the rows are rebuilt per cache
        self.generation_config.use_cache = True
        self._seen: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def _rows(self, input_ids, kwargs):
        """The whole rows: with a KV cache (read after the forward, so it holds
        ``input_ids`` too), the tokens of its earlier forwards (kept per cache object)
        followed by ``input_ids``."""
        cache = kwargs.get("cache", kwargs.get("past_key_values"))  # transformers 5.24 / 5.17
        if cache is None or not kwargs.get("use_cache", True):
            return input_ids
        before = cache.get_seq_length() - input_ids.shape[1]
        held = self._seen.get(cache)
        if before and (held is None or held.shape[1] != before):
            raise RuntimeError("a KV cache this model did not fill: its rows are unknown")
        rows = torch.cat([held, input_ids], dim=1) if before else input_ids
        self._seen[cache] = rows
        return rows

    def _targets(self, row: list[int]) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in row]
        h, turn, start = len(self._header), -1, None
        for t in range(len(row)):
            if row[max(0, t - h + 1) : t + 1] == self._header:
                turn, start = turn + 1, t + 1
            if start is None or not 0 <= turn < len(self._branches):
                continue
            done = row[start : t + 1]
            nxt = {s[len(done)] for s in self._branches[turn]
                   if len(done) < len(s) and s[: len(done)] == done}  # fmt: skip
            out[t] = sorted(nxt)
        return out


def branching_model(tokenizer, seed: int = 0) -> BranchingLlama:
    """A :class:`BranchingLlama` whose first turn is ``RIGHT[0]`` or ``WRONG[0]`` and whose
    second turn submits (each followed by the end-of-turn token)."""
    from conftest import make_tiny_model

    enc = lambda s: tokenizer(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    end = [tokenizer.eos_token_id]
    model = make_tiny_model(len(tokenizer), seed, cls=BranchingLlama, max_positions=4096)
    model.set_branches(enc("<|im_start|>assistant\n"),
                       [[enc(RIGHT[0]) + end, enc(WRONG[0]) + end], [enc(RIGHT[1]) + end]])  # fmt: skip
    return model


def record_episodes(monkeypatch) -> list:
    """Every episode ``AgentEpisodes`` runs from now on, in the order they end (the test's
    view of each one: its turns, the harness's exit status and output)."""
    from composer_replication.agents.episodes import AgentEpisodes

    ran: list = []
    run_episode = AgentEpisodes.run_episode

    def recorded(self, task):
        ep = run_episode(self, task)
        ran.append(ep)
        return ep

    monkeypatch.setattr(AgentEpisodes, "run_episode", recorded)
    return ran


def describe(episodes: list) -> str:
    """One line per episode that did not take the scripted two turns: turns, refused
    requests, error, machine failure, the harness's exit status and the end of its output."""
    lines = []
    for e in episodes:
        if len(e.turns) == 2:
            continue
        run = e.run
        tail = (run.output[-600:] if run is not None else "").replace("\n", " | ")
        lines.append(
            f"turns={len(e.turns)} refused={e.refused} error={e.error!r} "
            f"infra={e.infra!r} exit={getattr(run, 'exit_code', None)} "
            f"timed_out={getattr(run, 'timed_out', None)} s={e.seconds:.1f} output={tail}"
        )
    return f"{len(lines)} of {len(episodes)} episodes:\n" + "\n".join(lines)
