"""The policy proxy (agents/proxy.py) driven by the ``openai`` client over its unix socket: per
key recording, tool calls parsed into OpenAI ``tool_calls``, refusals, and log-probs that are
the policy's own."""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest
import torch
from conftest import make_tiny_model
from support.generation import forward_logprobs, gated_context

from composer_replication.agents.policy import GeneratorPolicy, ModelPolicy
from composer_replication.agents.proxy import PolicyProxy
from composer_replication.lm.generator import Generator, Sampling
from composer_replication.lm.models import pad_token_id

BASH = {"type": "function", "function": {"name": "bash", "description": "Run a command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                       "required": ["command"]}}}  # fmt: skip


class Scripted:
    """A policy answering fixed texts in turn (its ids are the tokenizer's), log-probs from a
    real tiny model, so the proxy's wire format is checked against known answers."""

    def __init__(self, tok, model, texts):
        self.tok, self.model, self.texts, self.prompts = tok, model, list(texts), []

    def __call__(self, prompt_ids):
        self.prompts.append(prompt_ids)
        ids = self.tok(self.texts.pop(0), add_special_tokens=False)["input_ids"]
        ids.append(self.tok.eos_token_id)
        return ids, forward_logprobs(self.model, prompt_ids, ids, 1.0).tolist()


def _client(proxy: PolicyProxy, key: str) -> openai.OpenAI:
    transport = httpx.HTTPTransport(uds=proxy.socket_path)
    return openai.OpenAI(api_key=key, base_url="http://proxy/v1", max_retries=0,
                         http_client=httpx.Client(transport=transport))  # fmt: skip


def test_openai_client_gets_tool_calls_and_each_key_records_its_own_turns(tool_tok, tmp_path):
    tok = tool_tok
    model = make_tiny_model(len(tok), max_positions=1024)
    texts = ['Let me look.<tool_call>{"name": "bash", "arguments": {"command": "ls -la"}}'
             "</tool_call>", "All done."]  # fmt: skip
    policy = Scripted(tok, model, texts)
    with PolicyProxy(policy, tok, str(tmp_path / "p.sock"), max_requests=2) as proxy:
        a, b = proxy.open_episode(), proxy.open_episode()
        msgs = [{"role": "system", "content": "You are an agent."},
                {"role": "user", "content": "List the files."}]  # fmt: skip
        r = _client(proxy, a).chat.completions.create(model="policy", messages=msgs,
                                                       tools=[BASH])  # fmt: skip
        call = r.choices[0].message.tool_calls[0]
        assert r.choices[0].finish_reason == "tool_calls"
        assert r.choices[0].message.content == "Let me look."
        assert (call.function.name, json.loads(call.function.arguments)) == (
            "bash", {"command": "ls -la"})  # fmt: skip
        r2 = _client(proxy, b).chat.completions.create(model="policy", messages=msgs)
        assert r2.choices[0].message.content == "All done."
        assert r2.choices[0].finish_reason == "stop" and not r2.choices[0].message.tool_calls
        turns_a, refused_a = proxy.close_episode(a)
        turns_b, _ = proxy.close_episode(b)
        with pytest.raises(openai.AuthenticationError):  # a closed key answers nothing
            _client(proxy, a).chat.completions.create(model="policy", messages=msgs)
    assert refused_a == 0 and len(turns_a) == 1 and len(turns_b) == 1
    (ta,), (tb,) = turns_a, turns_b
    # the recorded prompt is the rendered request (tools listed in it) and what the policy saw
    assert tok.decode(ta.prompt_ids).count('"name": "bash"') == 1
    assert '"name": "bash"' not in tok.decode(tb.prompt_ids)
    assert policy.prompts == [ta.prompt_ids, tb.prompt_ids]
    assert ta.completion_ids[-1] == tok.eos_token_id
    assert len(ta.logprobs) == len(ta.completion_ids)
    assert r.usage.prompt_tokens == len(ta.prompt_ids)
    assert ta.messages[-1]["tool_calls"][0]["function"]["name"] == "bash"


def test_refusals_unknown_key_request_budget_and_context(tool_tok, tmp_path):
    tok = tool_tok
    model = make_tiny_model(len(tok), max_positions=1024)
    policy = Scripted(tok, model, ["one", "two", "three"])
    with PolicyProxy(policy, tok, str(tmp_path / "p.sock"), max_requests=2,
                     max_prompt_tokens=64) as proxy:  # fmt: skip
        msgs = [{"role": "user", "content": "hi"}]
        with pytest.raises(openai.AuthenticationError):
            _client(proxy, "cr-guessed").chat.completions.create(model="policy", messages=msgs)
        key = proxy.open_episode()
        c = _client(proxy, key)
        with pytest.raises(openai.BadRequestError, match="maximum context length"):
            c.chat.completions.create(model="policy", messages=[{"role": "user",
                                                                  "content": "word " * 200}])  # fmt: skip
        c.chat.completions.create(model="policy", messages=msgs)
        with pytest.raises(openai.RateLimitError):
            c.chat.completions.create(model="policy", messages=msgs)
        turns, refused = proxy.close_episode(key)
    assert len(turns) == 1 and refused == 2 and policy.prompts == [turns[0].prompt_ids]


def test_model_policy_logprobs_are_the_sampling_distribution(tool_tok, tmp_path):
    """Real sampling from a tiny model: the recorded log-probs equal a fresh forward's
    ``log_softmax(logits / T)`` at the sampled tokens, and 4 concurrent clients each get their
    own single turn."""
    tok = tool_tok
    torch.manual_seed(0)
    model = make_tiny_model(len(tok), max_positions=1024).eval()
    policy = ModelPolicy(model, tok, temperature=0.7, max_new_tokens=8)
    with PolicyProxy(policy, tok, str(tmp_path / "p.sock")) as proxy:
        keys = [proxy.open_episode() for _ in range(4)]

        def ask(i):
            _client(proxy, keys[i]).chat.completions.create(
                model="policy", messages=[{"role": "user", "content": f"task {i}"}])  # fmt: skip

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        recorded = [proxy.close_episode(k)[0] for k in keys]
    for i, turns in enumerate(recorded):
        (turn,) = turns
        assert f"task {i}" in tok.decode(turn.prompt_ids)
        ids = torch.tensor([turn.prompt_ids + turn.completion_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(turn.prompt_ids) - 1 : -1]
        want = torch.log_softmax(logits / 0.7, -1).gather(
            1, torch.tensor(turn.completion_ids)[:, None])[:, 0]  # fmt: skip
        torch.testing.assert_close(torch.tensor(turn.logprobs), want, atol=1e-5, rtol=1e-5)
        assert 1 <= len(turn.completion_ids) <= 8


def test_a_streaming_client_gets_the_whole_answer_as_one_chunk(tool_tok, tmp_path):
    tok = tool_tok
    model = make_tiny_model(len(tok), max_positions=1024)
    text = 'ok<tool_call>{"name": "bash", "arguments": {"command": "pwd"}}</tool_call>'
    with PolicyProxy(Scripted(tok, model, [text]), tok, str(tmp_path / "p.sock")) as proxy:
        key = proxy.open_episode()
        stream = _client(proxy, key).chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "where?"}], tools=[BASH],
            stream=True)  # fmt: skip
        chunks = list(stream)
        turns, _ = proxy.close_episode(key)
    (chunk,) = chunks
    delta = chunk.choices[0].delta
    assert delta.content == "ok" and chunk.choices[0].finish_reason == "tool_calls"
    assert json.loads(delta.tool_calls[0].function.arguments) == {"command": "pwd"}
    assert len(turns) == 1


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [{"role": "assistant", "content": "", "tool_calls": "abc"}]},
        {"messages": [{"role": "assistant", "content": "", "tool_calls": [1]}]},
        {"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": 5}}]}]},
        {"messages": [{"role": "user", "content": 5}]},
        {"messages": [{"content": "no role"}]},
        "[" * 100_000 + "]" * 100_000,  # past the JSON parser's recursion limit
        "{not json",
    ],
    ids=["tool-calls-str", "tool-calls-int", "name-int", "content-int", "no-role", "deep", "bad"],
)
def test_malformed_requests_are_refused_and_counted_never_a_500(tool_tok, tmp_path, body):
    """Such bodies used to raise inside the chat template or the JSON parser (500, not counted
    as refused); each is a 400 saying why, and the episode's next request is answered."""
    tok = tool_tok
    policy = Scripted(tok, make_tiny_model(len(tok), max_positions=1024), ["fine"])
    with PolicyProxy(policy, tok, str(tmp_path / "p.sock")) as proxy:
        key = proxy.open_episode()
        raw = body if isinstance(body, str) else json.dumps({"model": "policy", **body})
        transport = httpx.HTTPTransport(uds=proxy.socket_path)
        with httpx.Client(transport=transport, timeout=60) as http:
            r = http.post("http://proxy/v1/chat/completions", content=raw,
                          headers={"authorization": f"Bearer {key}"})  # fmt: skip
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "invalid_request_error"
        ok = _client(proxy, key).chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "hi"}]
        )
        assert ok.choices[0].message.content == "fine"
        turns, refused = proxy.close_episode(key)
    assert refused == 1 and len(turns) == 1


def test_one_episodes_request_is_not_held_behind_anothers_five(tool_tok, tmp_path):
    """Fairness: episode B's agent sends five requests one after another; episode A's single
    request, sent while B's first is being generated, completes before B's fifth (it joins
    the next batch, in arrival order). No lock is held across generation: A's request
    reaches the generator while B's is in it. Each episode's queue time is recorded."""
    tok = tool_tok
    model = make_tiny_model(len(tok), max_positions=1024).eval()
    generating, release = threading.Event(), threading.Event()

    def gated():  # B's first batch waits until A's request is queued behind it
        generating.set()
        return gate_context()

    gate_context = gated_context(model, release)
    generator = Generator(model, pad_token_id(tok), tok.eos_token_id, model_context=gated)
    policy = GeneratorPolicy(generator, Sampling(temperature=1.0, max_new_tokens=6))
    done: list[str] = []
    with PolicyProxy(policy, tok, str(tmp_path / "p.sock")) as proxy:
        a, b = proxy.open_episode(), proxy.open_episode()

        def episode_b():
            client = _client(proxy, b)
            for i in range(5):
                client.chat.completions.create(
                    model="policy", messages=[{"role": "user", "content": f"step {i}"}])  # fmt: skip
                done.append(f"b{i + 1}")

        def episode_a():
            _client(proxy, a).chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "one question"}])  # fmt: skip
            done.append("a1")

        tb = threading.Thread(target=episode_b)
        tb.start()
        assert generating.wait(30)  # B's first request is in the generator
        ta = threading.Thread(target=episode_a)
        ta.start()
        while generator.pending() < 1:  # A's request queued while B's generates
            pass
        release.set()
        ta.join()
        tb.join()
        rec_a, rec_b = proxy.close_episode_record(a), proxy.close_episode_record(b)
    generator.close()
    assert done.index("a1") < done.index("b5"), done
    assert len(rec_a.turns) == 1 and len(rec_b.turns) == 5
    assert rec_a.queued_s > 0 and rec_a.policy_s >= rec_a.queued_s
    assert rec_b.policy_s > 0 and rec_b.queued_s >= 0


class _Meeting:
    """A policy whose first call waits (up to 10 s) for a second call to arrive: it can
    only return promptly if two requests reach the policy at once."""

    def __init__(self, tok):
        self.tok, self.arrived, self.in_flight, self.most = tok, threading.Event(), 0, 0
        self.lock, self.calls = threading.Lock(), 0

    def __call__(self, prompt_ids):
        with self.lock:
            self.calls += 1
            first = self.calls == 1
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            if not first:
                self.arrived.set()
        if first:
            self.arrived.wait(10)
        with self.lock:
            self.in_flight -= 1
        ids = [self.tok.eos_token_id]
        return ids, [0.0]


def test_no_lock_is_held_across_generation(tool_tok, tmp_path):
    """Two episodes' requests reach the policy at the same time (the generator then batches
    them); the old proxy held one lock across generation, so the second request waited for
    the first's whole generation."""
    policy = _Meeting(tool_tok)
    with PolicyProxy(policy, tool_tok, str(tmp_path / "p.sock")) as proxy:
        keys = [proxy.open_episode() for _ in range(2)]

        def ask(key):
            _client(proxy, key).chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "hi"}])  # fmt: skip

        threads = [threading.Thread(target=ask, args=(k,)) for k in keys]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert policy.most == 2


def test_an_episode_s_wait_for_the_policy_counts_its_concurrent_requests_once(tool_tok, tmp_path):
    """The wait not counted against an agent's own time (``policy_wait``, agents/sandboxed.py)
    is the time at least one of its requests is in the policy, read as it accrues: two
    requests of one episode in the policy together for 1 s are credited ~1 s, not the 2 s
    they spent there summed (an agent gains nothing by sending requests in parallel)."""
    both_in = threading.Barrier(2, timeout=30)
    seen: list[tuple[float, bool]] = []

    def policy(prompt_ids):
        both_in.wait()
        seen.append(proxy.policy_wait(key))  # read while the wait is in progress
        time.sleep(1.0)
        return [tool_tok.eos_token_id], [0.0]

    with PolicyProxy(policy, tool_tok, str(tmp_path / "p.sock")) as proxy:
        key = proxy.open_episode()
        assert proxy.policy_wait(key) == (0.0, False)

        def ask():
            _client(proxy, key).chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "hi"}])  # fmt: skip

        threads = [threading.Thread(target=ask) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        waited, waiting = proxy.policy_wait(key)
        record = proxy.close_episode_record(key)
    assert all(in_progress for _, in_progress in seen) and not waiting
    assert len(record.turns) == 2 and record.waited_s == waited
    assert 1.0 <= waited < 0.75 * record.policy_s, (waited, record.policy_s)
