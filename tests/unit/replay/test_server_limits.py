"""``serve``'s scoring endpoint bounds what one request may cost: the prompt count, each prompt's
length and the answer's size are checked before any model work, each with a 400 naming the limit
(a 20k-token prompt used to run as one forward pass, its attention memory quadratic in length)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import torch

from composer_replication.config import RemoteTeacherConfig
from composer_replication.replay.server import MAX_PROMPTS_PER_REQUEST, create_app
from composer_replication.teachers.edge import TeacherError
from composer_replication.teachers.local_model import LocalChatModel
from composer_replication.teachers.scoring import RemoteScorer, RowScores

from .conftest import ServerThread


@pytest.fixture
def limited(tokenizer, tiny_model):
    chat = LocalChatModel.from_objects(tiny_model, tokenizer, max_prompt_tokens=16)
    with ServerThread(create_app(chat, "tiny", max_logprob_entries=100)) as srv:
        yield srv.base_url


def _post(base_url, prompt, k):
    body = {"prompt": prompt, "max_tokens": 1, "prompt_logprobs": k}
    return httpx.post(f"{base_url}/completions", json=body, timeout=60)


@pytest.mark.parametrize(
    "prompt, k, status, says",
    [
        ([[5] * 16], 5, 200, None),  # 16 tokens x 6 = 96 entries: at both limits
        ([[5] * 17], 0, 400, "prompt 0 has 17 tokens; this server's maximum is 16"),
        ([[5] * 3, [5] * 17], 0, 400, "prompt 1 has 17 tokens"),
        ([[5] * 16, [5] * 16], 5, 400, "192 log-prob entries"),
        ([[5] * 3, []], 1, 400, "prompt 1 is empty"),
        (
            [[5]] * (MAX_PROMPTS_PER_REQUEST + 1),
            None,
            400,
            f"{MAX_PROMPTS_PER_REQUEST + 1} prompts",
        ),
    ],
    ids=["at-limits", "too-long", "second-too-long", "answer-too-big", "empty", "too-many"],
)
def test_scoring_requests_past_a_limit_are_refused_saying_which(limited, prompt, k, status, says):
    r = _post(limited, prompt, k)
    assert r.status_code == status, r.text
    if says is not None:
        assert says in r.json()["error"]["message"]
    else:
        assert len(r.json()["choices"][0]["prompt_logprobs"]) == 16


def test_a_scorer_sees_the_refusal_as_failed_rows_with_the_reason(limited):
    """Rows a server refuses for length fail with the server's reason; the request's other
    batches are scored (the channel reports those rows inactive, never a crash or a 0)."""
    spec = RemoteTeacherConfig(
        name="t", base_url=limited, model="tiny", top_k=2, rows_per_request=1, max_retries=0
    )
    scorer = RemoteScorer(spec, sleep=lambda _s: asyncio.sleep(0))
    rows = asyncio.run(scorer.ascore([[5] * 8, [5] * 40], [4, 4], 2, 0))
    assert isinstance(rows[0], RowScores)
    assert isinstance(rows[1], TeacherError) and "40 tokens" in str(rows[1])
    assert scorer.stats.scored_rows == 1 and scorer.stats.failed_rows == 1


class _Scripted(torch.nn.Module):
    """A "model" whose generate appends fixed ids (no end-of-turn): what a cut answer is."""

    def __init__(self, new_ids):
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(1))
        self.new_ids = new_ids
        self.config = type("Config", (), {"_name_or_path": "scripted"})()

    def generate(self, input_ids, **kwargs):
        new = torch.tensor([self.new_ids[: kwargs["max_new_tokens"]]])
        return torch.cat([input_ids, new], dim=1)


def test_an_answer_cut_after_a_whole_tool_call_is_reported_as_length(tool_tok):
    """OpenAI's rule: a generation that reached max_tokens is ``length`` even if the part
    before the cut parsed as a tool call (it used to say ``tool_calls``, so replay kept it)."""
    text = '<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call> and then'
    ids = tool_tok(text, add_special_tokens=False)["input_ids"]
    chat = LocalChatModel.from_objects(_Scripted(ids), tool_tok)
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {}}}]
    cut = chat.generate([{"role": "user", "content": "go"}], max_tokens=len(ids), tools=tools)
    assert cut.tool_calls and cut.finish_reason == "length"
    call_only = tool_tok(text.removesuffix(" and then"), add_special_tokens=False)["input_ids"]
    whole = LocalChatModel.from_objects(_Scripted(call_only), tool_tok)
    done = whole.generate([{"role": "user", "content": "go"}], max_tokens=len(ids), tools=tools)
    assert done.tool_calls and done.finish_reason == "tool_calls"


def test_a_huge_text_prompt_is_refused_before_it_is_tokenized(limited):
    """An 8 MB string used to be tokenized in full on the event loop (12 s here, every other
    request waiting) before its length was checked."""
    r = _post(limited, "word " * 200_000, 0)
    assert r.status_code == 400 and "1000000 characters" in r.json()["error"]["message"]


def test_a_body_past_the_limit_is_refused_by_its_length(limited, monkeypatch):
    from composer_replication.replay import server

    monkeypatch.setattr(server, "MAX_BODY_BYTES", 1000)
    r = _post(limited, [[5] * 1000], 0)  # about 2000 bytes
    assert r.status_code == 413 and "larger than 1000 bytes" in r.json()["error"]["message"]
