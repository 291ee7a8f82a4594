"""``rollout.ContextLoop`` (docs/summarization.md) with a scripted policy on the calculator's
tools: when a summary is asked for, the cap, a cut summary, truncation, and the exact tokens
of every window (which are policy tokens: the turns and the summary in its own window; never
the instruction, the tool results, or the summary re-rendered in the next window)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from composer_replication.envs.calculator import CalculatorEnv, CalculatorTools
from composer_replication.envs.tools import bounded_tools, tool_functions
from composer_replication.rollout import (
    ContextLoop,
    ToolLoop,
    Window,
    call_like_trl,
    instruction_after_tools,
    parse_turn,
    render_ids,
)

CALL = '<tool_call>{"name": "calculate", "arguments": {"expression": "208 * 67"}}</tool_call><|im_end|>'
ANSWER = "13936<|im_end|>"
SUMMARY = "208*67=13936<|im_end|>"
PROMPT = "Summarize."
HEADER = "Summary:\n"


class Script:
    """A policy by script, per task ("What is X?"): ``calls`` tool-call turns, then the
    answer; a summary when the context ends with the instruction. Records every request."""

    def __init__(self, tok, calls: int, summary: str = SUMMARY):
        self.tok, self.calls, self.turns, self.requests = tok, calls, {}, []
        self.summary = summary
        self.instruction = None

    def enc(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def __call__(self, prompts, limit):
        out = []
        for ids in prompts:
            self.requests.append((list(ids), limit))
            if ids[-len(self.instruction) :] == self.instruction:
                out.append(self.enc(self.summary)[:limit])
                continue
            task = re.search(r"What is ([^?]+)\?", self.tok.decode(ids)).group(1)
            k = self.turns[task] = self.turns.get(task, 0) + 1
            out.append(self.enc(CALL if k <= self.calls else ANSWER)[:limit])
        return out, [[-0.25] * len(o) for o in out], "v7"


def setup(tok, strategy, calls, max_tokens, max_turns=12, max_summaries=4, summary=SUMMARY,
          summary_max_tokens=16, n_rows=1):  # fmt: skip
    env = CalculatorEnv(per_kind=4, few_shot=False)
    rows = [env.row(t) for t in env.tasks("train")[:n_rows]]
    cfg = SimpleNamespace(strategy=strategy, max_tokens=max_tokens, max_summaries=max_summaries,
                          summary_prompt=PROMPT, summary_header=HEADER,
                          summary_max_tokens=summary_max_tokens)  # fmt: skip
    script = Script(tok, calls, summary)
    tools = tool_functions(CalculatorTools())
    suffix = ToolLoop(tok, None, None, 2, 64)._get_tool_suffix_ids
    loop = ContextLoop(tok, cfg, 40, max_turns, script, suffix, tools)
    script.instruction = loop.instruction_ids
    prompt_ids = [render_ids(tok, r["prompt"], tools) for r in rows]
    first, lps, _ = script(prompt_ids, 40)
    msgs = [[parse_turn(tok, f, p, tools)] for f, p in zip(first, prompt_ids, strict=True)]
    instances = [bounded_tools(CalculatorTools, 64)() for _ in rows]
    for inst, r in zip(instances, rows, strict=True):
        inst.reset(**r)
    dicts = [{"calculate": inst.calculate} for inst in instances]
    out = loop.run([r["prompt"] for r in rows], prompt_ids, first, msgs, lps, dicts)
    return loop, script, rows, prompt_ids, out


def test_summaries_fire_when_the_next_turn_and_a_summary_would_not_fit(tool_tok):
    """Lengths (SmolLM2 tokens): prompt P=183, a call turn C=33, its tool result R=15, the
    instruction I=len(instruction_ids)=13 (``<|im_start|>user\nSummarize.<|im_end|>\n`` and
    the generation prompt ``<|im_start|>assistant\n``, G=4 tokens, which also ends R and is
    dropped before the instruction), summary len(SUMMARY)=13, limits T=40, S=16, max_tokens
    M=360. Summarize before a turn when L + T + R + I + S > M, i.e. L > 276:
    window 0 grows 183 -> 231 -> 279 and summarizes after 2 calls; the next windows start at
    P1=203 (prompt + summary) -> 251 -> 299 and summarize after 2 calls: 2 + 2 + 2 calls,
    3 summaries, then the 7th call and the answer in window 3. Every window's policy tokens
    are its turns and its summary."""
    loop, script, rows, prompt_ids, out = setup(tool_tok, "summarize", calls=7, max_tokens=360)
    mask, msgs, ids, logps, calls, failures, _ = out
    ep = loop.episodes[0]
    enc = script.enc
    c, s, sigma, instr = enc(CALL), None, enc(SUMMARY), loop.instruction_ids
    s = ToolLoop(tool_tok, None, None, 2, 64)._get_tool_suffix_ids(
        [{"role": "tool", "name": "calculate", "content": "13936"}])  # fmt: skip
    assert (len(prompt_ids[0]), len(c), len(s)) == (183, 33, 15)
    gen = loop.generation_prompt_ids
    assert tool_tok.decode(gen) == "<|im_start|>assistant\n" and s[-len(gen) :] == gen
    user = f"<|im_start|>user\n{PROMPT}<|im_end|>\n"
    assert tool_tok.decode(instr) == user + tool_tok.decode(gen)
    limit = 360 - 40 - 15 - len(instr) - 16  # the window may hold this much before a turn
    # expected windows, built by the rule: a unit (call + result) at a time
    expected, n_calls, window = [], 0, len(prompt_ids[0])
    turns_in = []
    while n_calls < 7:
        window += len(c) + len(s)
        n_calls += 1
        turns_in.append(n_calls)
        if window > limit and n_calls < 7 + 1:
            expected.append(len(turns_in))
            turns_in = []
            p1 = render_ids(tool_tok, [*rows[0]["prompt"], {"role": "user",
                            "content": HEADER + "208*67=13936"}], loop.tools)  # fmt: skip
            window = len(p1)
    assert [len(w.turn_tags) - (w.summary is not None) for w in ep.windows[:-1]] == expected
    assert expected == [2, 2, 2] and len(ep.summaries) == 3 and ep.ended == "done"
    assert ep.summaries == ["208*67=13936"] * len(expected)
    for k, w in enumerate(ep.windows):
        n_turns = len(w.turn_tags) - (w.summary is not None)
        last = k == len(ep.windows) - 1
        body, body_mask = [], []
        for t in range(n_turns):
            answer = last and t == n_turns - 1
            body += enc(ANSWER) if answer else c + s
            body_mask += [1] * len(enc(ANSWER)) if answer else [1] * len(c) + [0] * len(s)
        if w.summary is not None:  # the last result's generation prompt gives way to the user turn
            body, body_mask = body[: -len(gen)], body_mask[: -len(gen)]
            body += instr + sigma
            body_mask += [0] * len(instr) + [1] * len(sigma)
        assert w.completion_ids == body and w.tool_mask == body_mask
        assert w.logprobs == [-0.25 if m else 0.0 for m in body_mask]
        assert len(w) <= 360  # the whole window, summary included, fits
        if k:  # the summary is context here: in the prompt, never a policy token
            assert w.prompt_ids == p1 and "208*67=13936" in tool_tok.decode(w.prompt_ids)
    # the packed episode: window 0's completion, then each later window's prompt (mask 0)
    packed_ids, packed_mask = list(ep.windows[0].completion_ids), list(ep.windows[0].tool_mask)
    for w in ep.windows[1:]:
        packed_ids += w.prompt_ids + w.completion_ids
        packed_mask += [0] * len(w.prompt_ids) + w.tool_mask
    assert ids[0] == packed_ids and mask[0] == packed_mask
    # graded messages: the 7 calls, their results and the answer; no summary, no instruction
    assert [m["role"] for m in msgs[0]] == ["assistant", "tool"] * 7 + ["assistant"]
    assert msgs[0][-1]["content"] == "13936" and (calls, failures) == (7, 0)
    # each summary is logged where it took effect: on the first message of its next window
    marks = [(k, m["context_window"]) for k, m in enumerate(msgs[0]) if "context_window" in m]
    assert [(k, m["window"], m["summary"]) for k, m in marks] == [
        (4, 1, "208*67=13936"), (8, 2, "208*67=13936"), (12, 3, "208*67=13936")]  # fmt: skip
    # every request fit its window: prompt + at most the limit asked
    assert all(len(x) + lim <= 360 for x, lim in script.requests)
    assert ep.tokens_saved > 0


def test_the_cap_ends_the_episode_as_it_stands(tool_tok):
    """max_summaries=1 and 7 calls: the second summary is never asked for; the episode ends
    with its last tool result, graded as it stands (no final answer)."""
    loop, script, *_ , out = setup(tool_tok, "summarize", calls=7, max_tokens=360,
                                   max_summaries=1)  # fmt: skip
    ep = loop.episodes[0]
    assert ep.ended == "cap" and len(ep.summaries) == 1 and len(ep.windows) == 2
    msgs = out[1][0]
    assert msgs[-1]["role"] == "tool"  # graded as it stands: with its last tool result
    # the packed row ends with the policy's last end of turn (TRL's truncation check), the
    # trailing tool result (context no token follows) dropped from the tokens
    assert out[2][0][-1] == tool_tok.eos_token_id and out[0][0][-1] == 1
    n_summary_requests = sum(x[-len(loop.instruction_ids):] == loop.instruction_ids
                             for x, _ in script.requests)  # fmt: skip
    assert n_summary_requests == 1


def test_a_long_summary_is_cut_at_its_limit(tool_tok):
    long = "208*67=13936 and then " * 10 + "<|im_end|>"
    loop, script, *_ = setup(tool_tok, "summarize", calls=4, max_tokens=360, summary=long)
    w = loop.episodes[0].windows[0]
    assert w.summary_cut and w.summary_tokens == 16
    assert w.tool_mask[-16:] == [1] * 16 and w.tool_mask[-17] == 0
    assert all(lim == 16 for x, lim in script.requests if x[-1] == loop.instruction_ids[-1]
               and x[-len(loop.instruction_ids):] == loop.instruction_ids)  # fmt: skip


def test_truncate_drops_the_oldest_turns_and_keeps_the_task(tool_tok):
    """M=300, T=40, R=15: a turn fits while L <= 245. Window 0: 183 -> 231 -> 279 (> 245):
    the new window keeps the prompt and the newest unit that fits (183 + 48 + 55 <= 300), as
    context (mask 0 in the packed row); no summary is asked for."""
    loop, script, rows, prompt_ids, out = setup(tool_tok, "truncate", calls=4, max_tokens=300)
    ep = loop.episodes[0]
    assert not ep.summaries and len(ep.windows) >= 2 and ep.ended == "done"
    c = script.enc(CALL)
    w1 = ep.windows[1]
    assert w1.prompt_ids[: len(prompt_ids[0])] == prompt_ids[0]
    kept = w1.prompt_ids[len(prompt_ids[0]) :]
    assert kept[: len(c)] == c and len(kept) == 48  # the newest call and its result only
    assert ep.windows[0].completion_ids[-48:] == kept  # copied token for token
    assert all(len(x) + lim <= 300 for x, lim in script.requests)
    assert [m["role"] for m in out[1][0]] == ["assistant", "tool"] * 4 + ["assistant"]


def test_a_prompt_without_room_is_refused_in_one_line(tool_tok):
    with pytest.raises(ValueError, match=r"rollout.context.max_tokens=250 leaves no room"):
        setup(tool_tok, "summarize", calls=1, max_tokens=250)


def test_tool_calls_fail_as_trl_answers_them():
    """An unknown tool, an exception and a call that is not a function call give TRL 1.16's
    error results (its ``_tool_call_loop``: ``{"error": ...}`` as text) and count as failed."""

    def boom(x):
        raise RuntimeError("bad x")

    tools = {"f": lambda x: x * 2, "boom": boom}
    call = lambda name, **a: {"type": "function", "function": {"name": name, "arguments": a}}  # noqa: E731
    assert call_like_trl(tools, call("f", x=3)) == ("f", "6", False)
    assert call_like_trl(tools, call("g")) == ("g", "{'error': 'Tool g not found.'}", True)
    assert call_like_trl(tools, call("boom", x=1)) == ("boom", "{'error': 'bad x'}", True)
    assert call_like_trl(tools, {"type": "code", "name": "f"}) == (
        "f", "{'error': 'Unsupported tool call type: code'}", True)  # fmt: skip


def test_the_summary_request_is_the_templates_own_rendering(tool_tok):
    """The summary is asked for with exactly what the chat template renders for the task,
    the call, its result and the instruction as a user turn, generation prompt on: no empty
    assistant turn between the tool result and the instruction (the generation prompt that
    followed the result is dropped from the window, not left as context)."""
    loop, script, rows, prompt_ids, _ = setup(tool_tok, "summarize", calls=7, max_tokens=360)
    instr = loop.instruction_ids
    asks = [x for x, _ in script.requests if x[-len(instr) :] == instr]
    assert len(asks) == 3
    call = parse_turn(tool_tok, script.enc(CALL), prompt_ids[0], loop.tools)
    unit = [call, {"role": "tool", "name": "calculate", "content": "13936"}]
    messages = [*rows[0]["prompt"], *unit, *unit, {"role": "user", "content": PROMPT}]
    want = tool_tok.apply_chat_template(messages, tools=loop.tools, add_generation_prompt=True,
                                        tokenize=False)  # fmt: skip
    assert tool_tok.decode(asks[0]) == want
    w = loop.episodes[0].windows[0]  # the window holds the same tokens, then the summary
    assert w.prompt_ids + w.completion_ids[: -w.summary_tokens] == asks[0]


def test_a_template_that_rewrites_the_tool_turn_is_refused_in_one_line():
    """A template whose rendering of the tool message changes when a user turn follows it has
    no instruction tokens to append to a window: one-line error."""

    class Tok:  # one token per message (its length); the tool message grows before a user turn
        def apply_chat_template(self, messages, add_generation_prompt=False, **_):
            ids = [len(m["content"]) for m in messages]
            if messages[-1]["role"] == "user" and len(messages) > 3:
                ids[2] += 100
            return ids + [7] * add_generation_prompt

    with pytest.raises(ValueError, match="renders a conversation differently when a user"):
        instruction_after_tools(Tok(), PROMPT)


def test_only_context_is_dropped_from_a_windows_tail():
    w = Window([1], [2, 3, 4], [1, 0, 0], [-0.5, 0.0, 0.0])
    w.drop_context_tail(2)
    assert (w.completion_ids, w.tool_mask, w.logprobs, len(w)) == ([2], [1], [-0.5], 2)
    with pytest.raises(ValueError, match="not all context"):
        w.drop_context_tail(1)
