"""Multi-turn tool rollouts: the bounds a run config puts on them, the turn structure of a
TRL tool batch, and the agent loop held-out evaluation uses.

In training, TRL's ``GRPOTrainer`` runs the loop (``environment_factory``; docs/agents.md): a
rollout is ONE completion holding every assistant turn and the tool results between them, and
``tool_mask`` is 0 on the tool-result tokens. :func:`turn_index` recovers the assistant turns
from that mask. Evaluation runs the same loop here (:func:`run_agent`, greedy or sampled), with
the same tool classes, parser and bounds, so a held-out score means what a training reward
means.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from composer_replication.envs.tools import (
    after_summary_tool,
    call_tool,
    tool_functions,
    tool_methods,
)
from composer_replication.lm.generator import Generator, Sampling

MAX_TOOL_THREADS = 64
"""Threads that run one turn's tool calls (one per rollout up to this); the sandbox slots and
the OpenEnv connection limit bound the work they start."""


def turn_index(tool_mask_BK, completion_mask_BK):
    """``[B, K]`` long: for each completion token the index of the assistant turn it belongs
    to (0, 1, ...), -1 on tool-result tokens and padding. Turns are the maximal runs of
    ``tool_mask == 1`` inside the completion mask (TRL: each tool round appends the tool
    suffix with mask 0, then the next turn with mask 1)."""
    import torch

    own_BK = tool_mask_BK.bool() & completion_mask_BK.bool()
    prev_BK = torch.zeros_like(own_BK)
    prev_BK[:, 1:] = own_BK[:, :-1]
    starts_BK = own_BK & ~prev_BK
    index_BK = starts_BK.long().cumsum(dim=1) - 1
    return torch.where(own_BK, index_BK, torch.full_like(index_BK, -1))


@dataclass
class AgentRollout:
    """One agent episode: the messages after the prompt and its tool statistics."""

    messages: list[dict[str, Any]]
    turns: int
    tool_calls: int
    tool_errors: int
    instance: Any = None
    """The tool instance that served the episode (its state, e.g. an edited repository)."""
    context: ContextEpisode | None = None
    """Its windows and summaries, when it ran under a ``rollout.context`` strategy."""


@dataclass
class RolloutStats:
    """Means over rollouts, as ``eval`` reports them."""

    turns: float = 0.0
    tool_calls: float = 0.0
    tool_error_frac: float = 0.0
    """Failed tool calls (unknown tool, bad arguments, an error result) over all calls."""

    @classmethod
    def of(cls, rollouts: list[AgentRollout]) -> RolloutStats:
        n = max(len(rollouts), 1)
        calls = sum(r.tool_calls for r in rollouts)
        return cls(
            turns=sum(r.turns for r in rollouts) / n,
            tool_calls=calls / n,
            tool_error_frac=sum(r.tool_errors for r in rollouts) / max(calls, 1),
        )


class TurnCalls:
    """The tool calls of one turn of every rollout of a batch, run at once: one job per
    rollout, its calls in the rollout's order on its own environment instance (so a rollout's
    results depend on its own calls only: deterministic given the calls), the jobs of all
    rollouts in a thread pool. What bounds the real work is below: sandboxed tools wait for a
    sandbox slot (sandbox/sandbox.py ``SLOTS``, shared with grading), remote ones for a
    connection (envs/openenv/adapter.py). A call that fails raises its own exception to its
    own rollout; a call that hangs is cut by its environment's own deadline (sandbox wall
    time, ``tests_budget_s``, the OpenEnv message timeout) and holds back only the end of
    the turn, not the other rollouts' calls.

    It plugs into TRL's loop without changing its bookkeeping (trainer/trainer.py):
    :meth:`deferred` gives, per rollout, a tool dict whose functions do not run the tool but
    take its result. The first call of a turn starts every rollout's pending calls (a rollout
    is pending when its last message is an assistant turn with tool calls that was not run
    yet), and each rollout then takes its results in order. TRL calls these functions
    exactly as it called the tools (same arguments, same exceptions caught, same counts), so
    messages, masks and metrics are those of the sequential loop.
    """

    def __init__(
        self,
        conversations: list[list[dict[str, Any]]],
        tool_dicts: list[dict[str, Callable[..., Any]]],
        pool: Any,
    ):
        self._convs, self._tools, self._pool = conversations, tool_dicts, pool
        self._started: set[int] = set()  # ids of assistant messages whose calls were started
        self._queues: dict[int, list[tuple[str, dict, int]]] = {}
        self._jobs: dict[int, Any] = {}

    def deferred(self) -> list[dict[str, Callable[..., Any]]]:
        """Per rollout, its tool names mapped to functions that return the started call's
        result (or raise its exception)."""

        def take(i: int, name: str) -> Callable[..., Any]:
            return lambda **kwargs: self._take(i, name, kwargs)

        return [{name: take(i, name) for name in tools} for i, tools in enumerate(self._tools)]

    def _take(self, i: int, name: str, kwargs: dict[str, Any]) -> Any:
        if not self._queues.get(i):
            self._start_pending()
        queue = self._queues.get(i)
        if not queue or queue[0][:2] != (name, kwargs):
            raise RuntimeError(f"rollout {i}: tool call {name!r} was not started in order")
        _, _, k = queue.pop(0)
        outcome = self._jobs[i].result()[k]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def _start_pending(self) -> None:
        for i, conv in enumerate(self._convs):
            last = conv[-1] if conv else None
            if not isinstance(last, dict) or last.get("role", "assistant") != "assistant":
                continue
            if id(last) in self._started or not last.get("tool_calls"):
                continue
            self._started.add(id(last))
            calls = runnable_calls(last["tool_calls"], self._tools[i])
            self._queues[i] = [(name, args, k) for k, (name, args) in enumerate(calls)]
            self._jobs[i] = self._pool.submit(_run_calls, self._tools[i], calls)


@contextlib.contextmanager
def calls_at_once(
    completions: list[list[dict[str, Any]]],
    tool_dicts: list[dict[str, Callable[..., Any]]],
    max_threads: int,
) -> Iterator[list[dict[str, Callable[..., Any]]]]:
    """Tool dicts for TRL's loop whose calls run at once across the batch (:class:`TurnCalls`
    over a pool of up to ``max_threads`` threads, shut down when the block ends). The one
    wrapping of TRL's loop: the trainer's ``_tool_call_loop`` and :class:`ToolLoop` use it."""
    from concurrent.futures import ThreadPoolExecutor

    threads = max(1, min(len(completions), max_threads))
    with ThreadPoolExecutor(threads, thread_name_prefix="cr-tools") as pool:
        yield TurnCalls(completions, tool_dicts, pool).deferred()


def reset_at_once(instances: list[Any], rows: list[dict[str, Any]], pool: Any) -> None:
    """Reset every rollout's environment at once (an OpenEnv reset is a round trip, a
    Feature Deletion reset builds a workspace), then let each instance's next ``reset`` call
    take its result instead of running: TRL resets the batch one instance after another, and
    the call it makes (same keyword arguments, checked) gets the value or the exception of the
    reset that already ran. Instances must be distinct."""
    outcomes = list(pool.map(_reset_outcome, instances, rows))
    for instance, row, outcome in zip(instances, rows, outcomes, strict=True):
        instance.reset = _taken_reset(instance, row, outcome)


def undo_resets(instances: list[Any]) -> None:
    """Drop reset results no one took (a batch that failed before TRL reset every instance)."""
    for instance in instances:
        instance.__dict__.pop("reset", None)


def _reset_outcome(instance: Any, row: dict[str, Any]) -> Any:
    try:
        return type(instance).reset(instance, **row)
    except Exception as e:  # raised to TRL's own reset call
        return e


def _taken_reset(instance: Any, row: dict[str, Any], outcome: Any) -> Callable[..., Any]:
    def reset(**kwargs: Any) -> Any:
        del instance.reset  # one result, taken once
        if kwargs != row:
            raise RuntimeError("reset called with other arguments than the ones run at once")
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    return reset


def runnable_calls(calls: list[Any], tools: dict[str, Any]) -> list[tuple[str, dict]]:
    """The calls of one assistant turn that TRL's loop runs, in order: function calls to a
    tool the rollout has, with a mapping of arguments (TRL answers the others with an error
    without calling anything)."""
    out = []
    for call in calls:
        if not isinstance(call, dict) or call.get("type") != "function":
            continue
        fn = call.get("function") or {}
        name, args = fn.get("name"), fn.get("arguments")
        if isinstance(name, str) and name in tools and isinstance(args, dict):
            out.append((name, args))
    return out


def _run_calls(tools: dict[str, Callable[..., Any]], calls: list[tuple[str, dict]]) -> list:
    """One rollout's calls in order; each outcome is the result or the exception raised."""
    outcomes: list[Any] = []
    for name, args in calls:
        try:
            outcomes.append(tools[name](**args))
        except Exception as e:  # the rollout's own failure, raised to it by TurnCalls._take
            outcomes.append(e)
    return outcomes


TurnFn = Callable[..., tuple[list[list[int]], list[list[float]], Any]]
"""Generates one turn for each prompt (token ids): ``(completion ids, their sampling
log-probs, a tag)``; the tag (a Ray worker: its policy version) is recorded per turn. Under a
context strategy it also takes the turn's token limit (:data:`GenerateFn`)."""


@dataclass
class ToolEpisode:
    """One rollout of :class:`ToolLoop`, as TRL's trainer records it."""

    prompt_ids: list[int]
    completion_ids: list[int]
    """Every assistant turn and the tool-result tokens between them (TRL concatenates token
    ids; nothing is re-tokenized)."""
    logprobs: list[float]
    """Sampling log-prob of each completion token; 0.0 on tool-result tokens."""
    tool_mask: list[int]
    """1 on the tokens the policy wrote, 0 on tool results."""
    messages: list[dict[str, Any]]
    """The completion as messages (assistant turns, tool results): what reward functions
    grade."""
    turn_tags: list[Any]
    """The tag ``generate`` returned for each assistant turn of this rollout."""
    instance: Any
    """The tool instance that served it (graded from its state by some environments)."""
    context: ContextEpisode | None = None
    """Under a context strategy: the episode's windows (the fields above are its packed
    row, :meth:`ContextEpisode.packed`)."""


class ToolLoop:
    """TRL 1.16's multi-turn tool loop, the one local training runs, outside a trainer.

    TRL's loop is a method of its trainer (``GRPOTrainer._tool_call_loop``). This class holds
    what that method reads from the trainer (the batch's tool dicts, the token budget, the
    tokenizer, the number of tool rounds) and the two methods it calls (the chat template's
    tool suffix, TRL's own; a turn's generation, ``generate``), and runs TRL's method on it:
    a Ray rollout worker (rollout_engine/worker.py) runs the same loop as the local trainer,
    not a copy of it. Tool calls of a turn run at once across the batch as in the trainer
    (:func:`calls_at_once`). Before the loop, as TRL's ``_generate_and_score_completions`` and
    ``_generate`` do: each instance is reset with its row (the observation a reset returns is
    appended to the last prompt message), the prompt is rendered with the instance's tools,
    the first turn generated and parsed (the tokenizer's response template, else its text).
    With ``context`` (``rollout.context`` with a strategy) the turns after the first run in
    :class:`ContextLoop` instead of TRL's loop, as in the trainer's ``_tool_call_loop``:
    ``generate`` then also takes a token limit. Tied to TRL 1.16 (pinned in pyproject.toml);
    tests/unit/test_rollout.py runs it (with a context:
    tests/unit/rollout_engine/test_ray_packed_windows.py). Held-out evaluation (evaluation.py)
    runs the same loop, so its scores mean what training rewards mean; each episode's windows
    are its :attr:`ToolEpisode.context`."""

    def __init__(
        self,
        tokenizer: Any,
        model_config: Any,
        generate: TurnFn,
        max_turns: int,
        max_completion_length: int,
        concurrent_tools: bool = True,
        context: Any = None,
    ):
        from types import SimpleNamespace

        self.processing_class = self._tokenizer = tokenizer
        self.model = SimpleNamespace(config=model_config)  # its context length bounds turns
        self.generate = generate
        self.max_tool_calling_iterations = max_turns - 1
        self.max_completion_length = max_completion_length
        self.concurrent_tools = concurrent_tools
        self.context = context if context is not None and context.strategy != "none" else None
        self.chat_template, self.chat_template_kwargs = None, {}
        self.use_vllm, self.vllm_mode, self._is_vlm, self.async_loop = False, None, False, None
        self.environment_factories = None  # TRL then parses every turn against ``tools``
        self.tools: list[Callable[..., Any]] = []
        self._sync_tool_dicts: list[dict[str, Callable[..., Any]]] = []
        self._async_tool_dicts: list[dict[str, Callable[..., Any]]] = []
        self.tags: list[Any] = []
        self.tool_calls = 0
        """Tool calls the last :meth:`run` made (TRL's count: ``tools/call_frequency``)."""
        self.tool_failures = 0
        """Of those, the ones that failed (TRL's count: ``tools/failure_frequency``)."""

    # ---- what TRL's loop calls on its trainer ---------------------------------------------
    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations,
                              has_tool_images=False):  # fmt: skip
        ids, logprobs, tag = self.generate([list(p) for p in prompt_ids])
        self.tags.append(tag)
        return ids, logprobs

    def _get_tool_suffix_ids(self, tool_messages):
        from trl import GRPOTrainer

        return GRPOTrainer._get_tool_suffix_ids(self, tool_messages)

    # ---- one batch --------------------------------------------------------------------------
    def run(self, rows: list[dict[str, Any]], instances: list[Any]) -> list[ToolEpisode]:
        """One episode per row, row ``i`` on ``instances[i]`` (distinct instances)."""
        from trl import GRPOTrainer

        self.tags = []
        prompts = _reset_prompts(rows, instances)
        self.tools = tool_functions(instances[0])
        self._sync_tool_dicts = [
            {n: getattr(e, n) for n in tool_methods(type(e))} for e in instances
        ]
        self._async_tool_dicts = [{} for _ in instances]
        prompt_ids = [self._prompt_ids(p) for p in prompts]
        completion_ids, logprobs = self._generate_single_turn(prompt_ids, None, {}, 1)
        completions = [[self._parse(c, p)] for c, p in zip(completion_ids, prompt_ids, strict=True)]
        if self.context is not None:
            return self._run_context(prompts, prompt_ids, completion_ids, completions, logprobs,
                                     instances)  # fmt: skip
        with contextlib.ExitStack() as stack:
            if self.concurrent_tools and len(rows) > 1:
                self._sync_tool_dicts = stack.enter_context(
                    calls_at_once(completions, self._sync_tool_dicts, MAX_TOOL_THREADS)
                )
            masks, completions, completion_ids, logprobs, calls, failures, _ = (
                GRPOTrainer._tool_call_loop(
                    self, prompts, prompt_ids, completion_ids, completions, logprobs, None, {}
                )
            )
        self.tool_calls, self.tool_failures = int(calls), int(failures)
        return [
            ToolEpisode(p, c, lp, m, msgs, self.tags[: max(1, _runs(m))], e)
            for p, c, lp, m, msgs, e in zip(prompt_ids, completion_ids, logprobs, masks,
                                            completions, instances, strict=True)
        ]  # fmt: skip

    def _run_context(self, prompts, prompt_ids, completion_ids, completions, logprobs,
                     instances) -> list[ToolEpisode]:  # fmt: skip
        """The turns after the first in :class:`ContextLoop` (its own concurrent calls); each
        episode's windows kept in :attr:`ToolEpisode.context`."""
        loop = ContextLoop(self._tokenizer, self.context, self.max_completion_length,
                           self.max_tool_calling_iterations + 1, self.generate,
                           self._get_tool_suffix_ids, self.tools)  # fmt: skip
        masks, msgs, ids, logps, calls, failures, _ = loop.run(
            prompts, prompt_ids, completion_ids, completions, logprobs, self._sync_tool_dicts,
            first_tag=self.tags[0], environments=instances,
        )  # fmt: skip
        self.tool_calls, self.tool_failures = int(calls), int(failures)
        return [
            ToolEpisode(p, c, lp, m, ms, e.turn_tags, inst, e)
            for p, c, lp, m, ms, inst, e in zip(prompt_ids, ids, logps, masks, msgs, instances,
                                                loop.episodes, strict=True)
        ]  # fmt: skip

    def _prompt_ids(self, prompt: list[dict[str, Any]]) -> list[int]:
        """The prompt's tokens as TRL renders a tool environment's prompt."""
        return self._tokenizer.apply_chat_template(
            prompt, tools=self.tools or None, add_generation_prompt=True, tokenize=True,
            return_dict=True,
        )["input_ids"]  # fmt: skip

    def _parse(self, ids: list[int], prefix: list[int]) -> dict[str, Any]:
        from trl.chat_template_utils import parse_response

        tok = self._tokenizer
        if getattr(tok, "response_template", None) or getattr(tok, "response_schema", None):
            return parse_response(tok, ids, prefix=prefix, tools=self.tools)
        return {"role": "assistant", "content": tok.decode(ids, skip_special_tokens=True)}


def _reset_prompts(rows: list[dict[str, Any]], instances: list[Any]) -> list[list[dict]]:
    """Reset every instance with its row at once; each row's prompt messages, a reset's
    observation (text) appended to the last one's content as TRL does."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(1, min(len(rows), MAX_TOOL_THREADS))) as pool:
        observations = list(pool.map(lambda e, r: e.reset(**r), instances, rows))
    prompts = []
    for row, obs in zip(rows, observations, strict=True):
        prompt = [dict(m) for m in row["prompt"]]
        if obs is not None:
            if not (isinstance(obs, str) and isinstance(prompt[-1]["content"], str)):
                raise ValueError("ToolLoop: a reset observation that is not text (images?)")
            prompt[-1]["content"] += obs
        prompts.append(prompt)
    return prompts


def _runs(mask: list[int]) -> int:
    """Maximal runs of 1 in ``mask``: the assistant turns that wrote tokens."""
    return sum(1 for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1]))


def run_agent(
    model: Any,
    tokenizer: Any,
    rows: list[dict[str, Any]],
    tools_class: type,
    max_turns: int,
    max_new_tokens: int,
    batch_size: int,
    progress: Callable[[int], None] | None = None,
    temperature: float = 0.0,
    shared_prefix: bool = True,
    generator: Generator | None = None,
    context: Any = None,
) -> list[AgentRollout]:
    """Multi-turn episodes, one per row (greedy, or sampled at ``temperature`` > 0 with
    top-p 1 and no top-k, as in training): generate a turn for every open episode, run the
    tool calls it makes (the episodes' calls at once, each episode's in order), append the
    results, repeat until an episode answers without a call or
    has had ``max_turns`` turns. ``tools_class`` is instantiated once per row and ``reset`` with
    the row, as TRL's trainer does. Turns are generated by ``generator`` (lm/generator.py;
    default: one over ``model`` with batches of ``batch_size``, ``shared_prefix``: the prompt
    tokens a batch shares run once).

    With a ``rollout.context`` strategy (``context``, config/env.py ``ContextConfig``) the
    episodes run as training runs them: :class:`ToolLoop` with :class:`ContextLoop` (the same
    windows, summaries and budget; ``max_new_tokens`` is the per-turn cap of the budget, as
    ``generation.max_completion_length`` is in training), see :func:`run_context_agent`."""
    from trl.chat_template_utils import parse_response

    if context is not None and context.strategy != "none":
        return run_context_agent(model, tokenizer, rows, tools_class, context, max_turns,
                                 max_new_tokens, batch_size, temperature, shared_prefix,
                                 generator)  # fmt: skip
    envs = [tools_class() for _ in rows]
    for env, row in zip(envs, rows, strict=True):
        env.reset(**row)
    schemas = tool_functions(envs[0]) if envs else []
    convs = [list(row["prompt"]) for row in rows]
    done: list[AgentRollout | None] = [None] * len(rows)
    stats = [[0, 0, 0] for _ in rows]  # turns, calls, errors
    sampling = Sampling(temperature=temperature, max_new_tokens=max_new_tokens)
    model.eval()
    with _own_generator(generator, model, tokenizer, batch_size, shared_prefix) as gen:
        for turn in range(max_turns):
            idx = [i for i in range(len(rows)) if done[i] is None]
            if not idx:
                break
            ids, prefixes = _generate_turns(
                gen, tokenizer, [convs[i] for i in idx], schemas, sampling
            )
            calling = []
            for i, out, prefix in zip(idx, ids, prefixes, strict=True):
                message = parse_response(tokenizer, out, prefix=prefix, tools=schemas)
                message.setdefault("role", "assistant")
                convs[i].append(message)
                stats[i][0] += 1
                if not message.get("tool_calls") or turn == max_turns - 1:
                    done[i] = _finish(convs[i], rows[i], stats[i], envs[i])
                    if progress is not None:
                        progress(1)
                    continue
                calling.append(i)
            _run_turn_calls(calling, convs, envs, stats)
    return [
        r if r is not None else _finish(convs[i], rows[i], stats[i], envs[i])
        for i, r in enumerate(done)
    ]


def run_context_agent(
    model: Any,
    tokenizer: Any,
    rows: list[dict[str, Any]],
    tools_class: type,
    context: Any,
    max_turns: int,
    max_new_tokens: int,
    batch_size: int,
    temperature: float = 0.0,
    shared_prefix: bool = True,
    generator: Generator | None = None,
) -> list[AgentRollout]:
    """:func:`run_agent` under a ``rollout.context`` strategy: :class:`ToolLoop` running
    :class:`ContextLoop` (the loop the trainer runs in place of TRL's), turns of at most
    ``max_new_tokens`` tokens, greedy or sampled at ``temperature``. Each rollout keeps its
    windows and summaries (``context``); its messages carry ``context_window`` where a window
    starts. A call written in the last allowed turn is not run, as in training."""
    instances = [tools_class() for _ in rows]
    model.eval()
    with _own_generator(generator, model, tokenizer, batch_size, shared_prefix) as gen:

        def turn(prompts: list[list[int]], max_new_tokens: int = max_new_tokens):
            sampling = Sampling(temperature=temperature, max_new_tokens=max_new_tokens)
            outs = gen.generate(prompts, sampling)
            return [o.ids for o in outs], [o.logprobs for o in outs], None

        loop = ToolLoop(tokenizer, model.config, turn, max_turns, max_new_tokens,
                        context=context)  # fmt: skip
        episodes = loop.run(rows, instances) if rows else []
    out = []
    for ep in episodes:
        turns = sum(m.get("role") == "assistant" for m in ep.messages)
        ctx = ep.context
        out.append(AgentRollout(ep.messages, turns, ctx.tool_calls, ctx.tool_failures,
                                instance=ep.instance, context=ctx))  # fmt: skip
    return out


def context_stats(episodes: list[ContextEpisode]) -> dict[str, float]:
    """Per batch of :class:`ContextLoop` episodes: summaries and windows per episode,
    context tokens the closed windows dropped, episodes ended at the cap, the share of
    summaries cut at their limit, (when there were summaries) their mean length, and (when
    any) the tool calls the loop ran for the environment after a summary. The
    trainer logs them under ``rollout/``; ``eval`` reports them."""
    n = max(len(episodes), 1)
    summaries = [w for e in episodes for w in e.windows if w.summary is not None]
    values = {
        "summaries": sum(len(e.summaries) for e in episodes) / n,
        "windows": sum(len(e.windows) for e in episodes) / n,
        "tokens_saved": sum(e.tokens_saved for e in episodes) / n,
        "ended_at_cap": sum(e.ended == "cap" for e in episodes) / n,
        "summaries_cut": sum(w.summary_cut for w in summaries) / max(len(summaries), 1),
    }
    if summaries:
        values["summary_tokens"] = sum(w.summary_tokens for w in summaries) / len(summaries)
    if any(e.environment_calls for e in episodes):  # envs/tools.py AFTER_SUMMARY
        values["environment_calls"] = sum(e.environment_calls for e in episodes) / n
    return values


@contextlib.contextmanager
def _own_generator(
    generator: Generator | None, model: Any, tokenizer: Any, batch_size: int, shared_prefix: bool
) -> Iterator[Generator]:
    """``generator``, or one over ``model`` for the duration of the block."""
    if generator is not None:
        yield generator
        return
    from composer_replication.lm.models import pad_token_id

    with Generator(model, pad_token_id(tokenizer), tokenizer.eos_token_id,
                   shared_prefix=shared_prefix, max_batch=batch_size) as own:  # fmt: skip
        yield own


def _run_turn_calls(idx: list[int], convs, envs, stats) -> None:
    """The calls of the last turn of each conversation in ``idx``, the conversations at once
    (each one's calls in order, as in training: :class:`TurnCalls`); results appended."""
    from concurrent.futures import ThreadPoolExecutor

    def run(i: int) -> list[tuple[str, bool]]:
        return [call_tool(envs[i], call) for call in convs[i][-1]["tool_calls"]]

    with ThreadPoolExecutor(max(1, min(len(idx), 64))) as pool:
        outcomes = list(pool.map(run, idx))
    for i, results in zip(idx, outcomes, strict=True):
        for call, (content, failed) in zip(convs[i][-1]["tool_calls"], results, strict=True):
            name = call.get("function", call).get("name")
            convs[i].append({"role": "tool", "name": name, "content": content})
            stats[i][1] += 1
            stats[i][2] += failed


def _finish(conv: list[dict[str, Any]], row: dict[str, Any], s: list[int], env) -> AgentRollout:
    """Calls written in the last allowed turn are not run (as in TRL) nor counted."""
    return AgentRollout(conv[len(row["prompt"]) :], turns=s[0], tool_calls=s[1],
                        tool_errors=s[2], instance=env)  # fmt: skip


def _generate_turns(generator: Generator, tokenizer, convs, tools, sampling: Sampling):
    """One turn for each conversation, all handed to the generator at once (it batches them
    and runs the prompt tokens they share once); returns the new ids and the prompts."""
    texts = [
        tokenizer.apply_chat_template(c, tools=tools, add_generation_prompt=True, tokenize=False)
        for c in convs
    ]
    prefixes = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    outs = generator.generate(prefixes, sampling)
    return [o.ids for o in outs], prefixes


# ---- episodes longer than the context: truncate or summarize (docs/summarization.md) ------


@dataclass
class Window:
    """One context window of an episode, as its own token sequence: what the policy saw
    (``prompt_ids``) and what followed (``completion_ids``), with the tool mask and the
    sampling log-probs of every completion token."""

    prompt_ids: list[int]
    """Window 0: the task's prompt. Later: system + task + the summary (``summarize``), or
    system + task + the turns kept (``truncate``), all context."""
    completion_ids: list[int] = field(default_factory=list)
    tool_mask: list[int] = field(default_factory=list)
    """1 on tokens the policy wrote in this window (its turns and its summary), 0 on tool
    results and on the instruction that asked for the summary."""
    logprobs: list[float] = field(default_factory=list)
    """Sampling log-prob per completion token; 0.0 where the mask is 0."""
    summary: str | None = None
    """The summary that closed this window (None: the last window, or a truncation)."""
    summary_tokens: int = 0
    summary_cut: bool = False
    """The summary hit its token limit (``summary_max_tokens``, or the room left)."""
    turn_tags: list[Any] = field(default_factory=list)
    """The tag (Ray: the policy version) of each turn generated in this window."""
    context_message: dict[str, Any] | None = None
    """The message after the task's prompt messages that opened this window (``summarize``:
    the user message holding the summary), so a channel can re-render the window's prompt with
    a hint (channels/packed.py); None for window 0 and ``truncate`` (whose later prompts are
    window 0's prompt followed by the kept turns' tokens)."""
    observation: str | None = None
    """What the environment showed at the start of this window, after the summary (the result
    of the tool its instance asks to be run after a summary, envs/tools.py ``AFTER_SUMMARY``;
    also in :attr:`context_message`), or None."""

    def add(self, ids: list[int], mask: int, logprobs: list[float] | None = None) -> None:
        self.completion_ids += ids
        self.tool_mask += [mask] * len(ids)
        self.logprobs += list(logprobs) if (mask and logprobs is not None) else [0.0] * len(ids)

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)

    def drop_trailing_context(self) -> None:
        """Drop the tokens after the last one the policy wrote (an episode that ended on a
        tool result: at the cap, or out of room). Nothing follows them, so nothing is lost
        for training, and the completion ends with the policy's own end of turn, as TRL's
        ``mask_truncated_completions`` expects of an episode that was not cut."""
        last = max((k for k, m in enumerate(self.tool_mask) if m), default=-1)
        del self.completion_ids[last + 1 :], self.tool_mask[last + 1 :], self.logprobs[last + 1 :]

    def drop_context_tail(self, n: int) -> None:
        """Drop the completion's last ``n`` tokens, which must be context (mask 0): the
        generation prompt after tool results, when a user turn (the summary instruction)
        follows them instead of the policy's turn."""
        if n > len(self.completion_ids) or any(self.tool_mask[len(self.tool_mask) - n :]):
            raise ValueError(f"cannot drop the window's last {n} tokens: not all context")
        if n:
            del self.completion_ids[-n:], self.tool_mask[-n:], self.logprobs[-n:]


@dataclass
class ContextEpisode:
    """An episode of :class:`ContextLoop`: its windows and how it ended."""

    windows: list[Window]
    ended: str = "done"
    """``done`` (answered, or out of turns), ``cap`` (one more summary than
    ``max_summaries`` was needed), ``no_room`` (not even the latest turn fits the window)."""
    tokens_saved: int = 0
    """Context tokens dropped when windows were closed (old length minus new prompt)."""
    tool_calls: int = 0
    tool_failures: int = 0
    """Of its tool calls, those that failed (TRL's error result)."""
    environment_calls: int = 0
    """Tool calls the loop ran for the environment after a summary (envs/tools.py
    ``AFTER_SUMMARY``), not in :attr:`tool_calls`."""

    def packed(self) -> tuple[list[int], list[int], list[float], list[int]]:
        """The episode as ONE completion after window 0's prompt: each later window's prompt
        (context, mask 0) then its completion. Returns ids, tool mask, log-probs and the window
        index of each token (positions restart at each window: lm/packing.py)."""
        ids, mask, logps, window = [], [], [], []
        for k, w in enumerate(self.windows):
            head = [] if k == 0 else w.prompt_ids
            ids += head + w.completion_ids
            mask += [0] * len(head) + w.tool_mask
            logps += [0.0] * len(head) + w.logprobs
            window += [k] * (len(head) + len(w.completion_ids))
        return ids, mask, logps, window

    @property
    def summaries(self) -> list[str]:
        return [w.summary for w in self.windows if w.summary is not None]

    @property
    def turn_tags(self) -> list[Any]:
        return [t for w in self.windows for t in w.turn_tags]


GenerateFn = Callable[[list[list[int]], int], tuple[list[list[int]], list[list[float]] | None, Any]]
"""Generates one turn per prompt with at most the given number of new tokens: ``(ids,
log-probs or None, a tag)``."""


class ContextLoop:
    """The multi-turn tool loop under a context budget (``rollout.context``;
    docs/summarization.md). What replaces TRL's ``_tool_call_loop`` when a strategy is set:
    it takes the first turn TRL generated and returns TRL's tuple for the packed episodes
    (:meth:`ContextEpisode.packed`), keeping each window in :attr:`episodes`.

    Before each turn after the first, with ``L`` the window's length, ``T`` the per-turn cap,
    ``R`` the longest tool result of the episode so far (what the turn's calls may add), ``I``
    the summary instruction's tokens and ``S`` ``summary_max_tokens``: ``summarize`` asks for
    a summary when ``L + T + R + I + S > max_tokens`` (at ``max_summaries`` the episode ends
    instead); ``truncate`` drops the oldest (turn + tool results) units when
    ``L + T + R > max_tokens``. A tool result longer than any before may still leave less than
    ``S`` for the summary: it is then cut at the room left (``summary_cut``). Tool calls are run as TRL runs them (same results, same error
    texts, same counts), the rollouts' calls of a turn at once."""

    def __init__(
        self,
        tokenizer: Any,
        context: Any,
        turn_tokens: int,
        max_turns: int,
        generate: GenerateFn,
        suffix_ids: Callable[[list[dict[str, Any]]], list[int]],
        tools: list[Any] | None = None,
    ):
        self.tok, self.cfg, self.turn_tokens = tokenizer, context, turn_tokens
        self.max_turns, self.generate, self.suffix_ids = max_turns, generate, suffix_ids
        self.tools = tools or []
        self.generation_prompt_ids, self.instruction_ids = instruction_after_tools(
            tokenizer, context.summary_prompt
        )
        self.episodes: list[ContextEpisode] = []

    def _reserve(self) -> int:
        """Tokens a window keeps free besides the next turn."""
        if self.cfg.strategy == "summarize":
            return len(self.instruction_ids) + self.cfg.summary_max_tokens
        return 0

    def check_prompt(self, n_prompt: int) -> None:
        """A prompt that leaves no room for a turn (and a summary, and the next window's
        summary) is a config error, raised in one line."""
        c = self.cfg
        need = n_prompt + self.turn_tokens + self._reserve()
        if c.strategy == "summarize":  # the next window: prompt + header + summary, same room
            need += len(self.tok(c.summary_header, add_special_tokens=False)["input_ids"])
            need += c.summary_max_tokens + 8
        if need > c.max_tokens:
            raise ValueError(
                f"rollout.context.max_tokens={c.max_tokens} leaves no room: a prompt of "
                f"{n_prompt} tokens needs {need} (a turn of generation.max_completion_length="
                f"{self.turn_tokens}, the summary and the next window's prompt)"
            )

    def run(self, prompts, prompt_ids, completion_ids, completions, logprobs, tool_dicts,
            first_tag: Any = None, environments: list[Any] | None = None):  # fmt: skip
        """TRL's ``_tool_call_loop`` contract: returns ``(tool_mask, completions,
        completion_ids, logprobs, tool_call_count, tool_failure_count, tool_images)`` with the
        packed episodes; ``prompts`` are the rows' prompt messages, ``first_tag`` the tag of
        the first turn (generated before the loop: a Ray worker's policy version).
        ``environments``: the rollouts' environment instances (TRL's ``environments``), read
        for the tool each asks to be run after a summary (envs/tools.py ``AFTER_SUMMARY``);
        None: none asks."""
        for p in prompt_ids:
            self.check_prompt(len(p))
        n = len(prompt_ids)
        self._tool_dicts = tool_dicts
        self._after = [after_summary_tool(e) for e in environments or [None] * n]
        self.episodes = [ContextEpisode([Window(list(p))]) for p in prompt_ids]
        self._prompts = [[dict(m) for m in p] for p in prompts]
        self._units: list[list[list[int]]] = [[] for _ in range(n)]  # turns kept (truncate)
        self._summaries = [0] * n
        self._result_tokens = [0] * n  # the longest tool result so far: what a turn may add
        msgs = [list(c) for c in completions]
        for i in range(n):
            lp = logprobs[i] if logprobs is not None else None
            self._add_turn(i, completion_ids[i], lp, first_tag)
        active = [i for i in range(n) if msgs[i] and msgs[i][-1].get("tool_calls")]
        calls = failures = 0
        for _ in range(self.max_turns - 1):
            if not active:
                break
            c, f = self._run_tools(active, msgs, tool_dicts)
            calls, failures = calls + c, failures + f
            active = self._make_room(active)
            if not active:
                break
            new = self._request(active, [self._context(i) for i in active], self.turn_tokens)
            for i, (ids, lp, tag) in zip(active, new, strict=True):
                self._add_turn(i, ids, lp, tag)
                message = parse_turn(self.tok, ids, self._context(i)[: -len(ids) or None],
                                     self.tools)  # fmt: skip
                msgs[i].append(self._mark_window(i, message))
            active = [i for i in active if msgs[i][-1].get("tool_calls")]
        for e in self.episodes:
            if e.ended != "done":
                e.windows[-1].drop_trailing_context()
        packed = [e.packed() for e in self.episodes]
        return ([p[1] for p in packed], msgs, [p[0] for p in packed],
                [p[2] for p in packed] if logprobs is not None else None,
                calls, failures, [[] for _ in range(n)])  # fmt: skip

    # ---- one episode's window ------------------------------------------------------------
    def _mark_window(self, i: int, message: dict[str, Any]) -> dict[str, Any]:
        """The first message of a new window carries ``context_window``: the window's index
        and the summary it starts from (or the tokens truncation kept), so a person reading
        the logged episode sees each summary where it took effect. Graders and chat templates
        ignore the key."""
        windows = self.episodes[i].windows
        if len(windows) > 1 and len(windows[-1].turn_tags) == 1:
            before = windows[-2]
            message = dict(message)
            message["context_window"] = {
                "window": len(windows) - 1,
                "summary": before.summary,
                "summary_tokens": before.summary_tokens,
                "summary_cut": before.summary_cut,
                "prompt_tokens": len(windows[-1].prompt_ids),
            }
            if windows[-1].observation is not None:  # what the environment showed after it
                message["context_window"]["observation"] = windows[-1].observation
        return message

    def _window(self, i: int) -> Window:
        return self.episodes[i].windows[-1]

    def _context(self, i: int) -> list[int]:
        w = self._window(i)
        return w.prompt_ids + w.completion_ids

    def _add_turn(self, i: int, ids: list[int], lp: list[float] | None, tag: Any) -> None:
        self._window(i).add(list(ids), 1, lp if lp is not None else [0.0] * len(ids))
        self._window(i).turn_tags.append(tag)
        self._units[i].append(list(ids))

    def _request(self, rows: list[int], inputs: list[list[int]], limit: int):
        ids, lps, tag = self.generate(inputs, limit)
        lps = lps if lps is not None else [None] * len(ids)
        return [(list(a), b, tag) for a, b in zip(ids, lps, strict=True)]

    def _run_tools(self, active: list[int], msgs, tool_dicts) -> tuple[int, int]:
        """Each active rollout's calls in order (the rollouts at once); results appended to
        its messages and, as TRL's tool suffix tokens, to its window (mask 0)."""
        from concurrent.futures import ThreadPoolExecutor

        def run(i: int) -> list[tuple[str, str, bool]]:
            return [call_like_trl(tool_dicts[i], c) for c in msgs[i][-1]["tool_calls"]]

        with ThreadPoolExecutor(max(1, min(len(active), MAX_TOOL_THREADS))) as pool:
            outcomes = list(pool.map(run, active))
        calls = failures = 0
        for i, results in zip(active, outcomes, strict=True):
            tool_messages = [{"role": "tool", "name": n, "content": c} for n, c, _ in results]
            msgs[i] += tool_messages
            calls, failures = calls + len(results), failures + sum(f for *_, f in results)
            self.episodes[i].tool_calls += len(results)
            self.episodes[i].tool_failures += sum(f for *_, f in results)
            suffix = self.suffix_ids(tool_messages)
            self._result_tokens[i] = max(self._result_tokens[i], len(suffix))
            self._window(i).add(suffix, 0)
            self._units[i][-1] += suffix
        return calls, failures

    def _make_room(self, active: list[int]) -> list[int]:
        """Rows whose next turn fits (after a summary or a truncation); the others end."""
        c, keep, summarize = self.cfg, [], []
        for i in active:
            if len(self._window(i)) + self._next_turn(i) + self._reserve() <= c.max_tokens:
                keep.append(i)
            elif c.strategy == "truncate":
                if self._truncate(i):
                    keep.append(i)
            elif self._summaries[i] >= c.max_summaries:
                self.episodes[i].ended = "cap"
            else:
                summarize.append(i)
        if summarize:
            keep += self._summarize(summarize)
        return sorted(keep)

    def _next_turn(self, i: int) -> int:
        """Tokens the next turn may add: the per-turn cap and, as its tool results, the
        longest results this episode has had (so the summary after it still fits)."""
        return self.turn_tokens + self._result_tokens[i]

    def _truncate(self, i: int) -> bool:
        """A new window: the task's prompt and the newest units that fit (at least the latest,
        which holds the tool results the next turn answers)."""
        base, units = self.episodes[i].windows[0].prompt_ids, self._units[i]
        for j in range(1, len(units)):
            kept = [t for u in units[j:] for t in u]
            if len(base) + len(kept) + self._next_turn(i) <= self.cfg.max_tokens:
                self._open(i, base + kept)
                self._units[i] = [list(u) for u in units[j:]]
                return True
        self.episodes[i].ended = "no_room"
        return False

    def _summarize(self, rows: list[int]) -> list[int]:
        """The summary turn of each row (instruction: mask 0; summary: mask 1, or 0 with
        ``train_summaries`` off, cut at the room left), then the next window: the prompt messages and one user message with the
        summary. Returns the rows that go on."""
        c, instr, gen, go_on = self.cfg, self.instruction_ids, self.generation_prompt_ids, []
        for i in rows:  # the user turn follows the tool results, not an empty assistant turn
            if gen and self._context(i)[-len(gen) :] != gen:
                raise ValueError("the tool results do not end with the chat template's "
                                 "generation prompt: cannot place the summary instruction")  # fmt: skip
            self._window(i).drop_context_tail(len(gen))
        inputs = [self._context(i) + instr for i in rows]
        out = self._request(rows, inputs, c.summary_max_tokens)
        for i, x, (ids, lp, tag) in zip(rows, inputs, out, strict=True):
            room = min(c.summary_max_tokens, c.max_tokens - len(x))
            if room < 1:
                self.episodes[i].ended = "no_room"
                continue
            w = self._window(i)
            ids, lp = ids[:room], (lp[:room] if lp is not None else [0.0] * min(len(ids), room))
            w.add(instr, 0)
            w.add(ids, int(getattr(c, "train_summaries", True)), lp)
            w.turn_tags.append(tag)
            text = self.tok.decode(ids, skip_special_tokens=True).strip()
            w.summary, w.summary_tokens = text, len(ids)
            w.summary_cut = len(ids) >= room and ids[-1] != self.tok.eos_token_id
            self._summaries[i] += 1
            seen = self._environment_turn(i)
            content = c.summary_header + text + (f"\n\n{seen}" if seen is not None else "")
            message = {"role": "user", "content": content}
            self._open(i, render_ids(self.tok, [*self._prompts[i], message], self.tools), message)
            self._window(i).observation = seen
            self._units[i] = []
            go_on.append(i)
        return go_on

    def _environment_turn(self, i: int) -> str | None:
        """The result of the tool row ``i``'s environment asks to be run after a summary (no
        arguments, run as TRL runs a call; counted in the episode's ``environment_calls``,
        not its ``tool_calls``), or None when it asks for none."""
        name = self._after[i]
        if name is None:
            return None
        call = {"type": "function", "function": {"name": name, "arguments": {}}}
        _, result, _ = call_like_trl(self._tool_dicts[i], call)
        self.episodes[i].environment_calls += 1
        return result

    def _open(self, i: int, prompt_ids: list[int], message: dict[str, Any] | None = None) -> None:
        episode = self.episodes[i]
        episode.tokens_saved += len(episode.windows[-1]) - len(prompt_ids)
        episode.windows.append(Window(list(prompt_ids), context_message=message))


def call_like_trl(tools: dict[str, Callable[..., Any]], call: Any) -> tuple[str, str, bool]:
    """One tool call as TRL 1.16's loop makes it: ``(name, result text, failed)``; an unknown
    tool, an exception or a call that is not a function call gives TRL's error result."""
    if not isinstance(call, dict) or call.get("type") != "function":
        kind = call.get("type") if isinstance(call, dict) else type(call).__name__
        name = call.get("name", "unknown") if isinstance(call, dict) else "unknown"
        return name, str({"error": f"Unsupported tool call type: {kind}"}), True
    fn = call.get("function") or {}
    name = fn.get("name")
    try:
        if name not in tools:
            raise ValueError(f"Tool {name} not found.")
        return name, str(tools[name](**fn.get("arguments", {}))), False
    except Exception as e:  # the rollout's own failure, answered as TRL answers it
        return name, str({"error": str(e)}), True


def render_ids(tokenizer: Any, messages: list[dict[str, Any]], tools: list[Any]) -> list[int]:
    """A prompt's tokens as TRL renders a tool environment's prompt (generation prompt on)."""
    return tokenizer.apply_chat_template(
        messages, tools=tools or None, add_generation_prompt=True, tokenize=True,
        return_dict=True,
    )["input_ids"]  # fmt: skip


def instruction_after_tools(tokenizer: Any, text: str) -> tuple[list[int], list[int]]:
    """``(generation prompt, user turn)`` as they follow tool results: the tokens the chat
    template's generation prompt adds after a tool message (the end of TRL's tool-suffix
    tokens), and the tokens of a user turn ``text`` and the generation prompt after it. A
    context that ends with tool results, less that generation prompt, then the user turn, is
    the template's own rendering of ``[..., tool results, user(text)]`` with the generation
    prompt. Found as TRL finds its tool suffix (``GRPOTrainer._get_tool_suffix_ids``): a
    dummy exchange rendered with and without what follows."""
    call = {"type": "function", "function": {"name": "dummy", "arguments": {}}}
    dummy = [
        {"role": "user", "content": "dummy"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "dummy", "content": "dummy"},
    ]
    kw = {"tokenize": True, "return_dict": False}
    head = list(tokenizer.apply_chat_template(dummy, add_generation_prompt=False, **kw))
    with_gen = list(tokenizer.apply_chat_template(dummy, add_generation_prompt=True, **kw))
    full = list(tokenizer.apply_chat_template(
        [*dummy, {"role": "user", "content": text}], add_generation_prompt=True, **kw
    ))  # fmt: skip
    if with_gen[: len(head)] != head or full[: len(head)] != head:
        raise ValueError("the chat template renders a conversation differently when a user "
                         "turn follows: cannot find the summary instruction's tokens")  # fmt: skip
    return with_gen[len(head) :], full[len(head) :]


def parse_turn(tokenizer: Any, ids: list[int], prefix: list[int], tools: list[Any]) -> dict:
    """One generated turn as a message, parsed as TRL parses it (the tokenizer's response
    schema; else its text)."""
    from trl.chat_template_utils import parse_response

    if getattr(tokenizer, "response_template", None) or getattr(tokenizer, "response_schema", None):
        return parse_response(tokenizer, ids, prefix=prefix, tools=tools)
    return {"role": "assistant", "content": tokenizer.decode(ids, skip_special_tokens=True)}
