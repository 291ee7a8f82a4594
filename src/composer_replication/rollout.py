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
from dataclasses import dataclass
from typing import Any

from composer_replication.envs.tools import call_tool, tool_functions, tool_methods
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


TurnFn = Callable[[list[list[int]]], tuple[list[list[int]], list[list[float]], Any]]
"""Generates one turn for each prompt (token ids): ``(completion ids, their sampling
log-probs, a tag)``; the tag (a Ray worker: its policy version) is recorded per turn."""


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
    Tied to TRL 1.16 (pinned in pyproject.toml); tests/unit/test_rollout.py runs it."""

    def __init__(
        self,
        tokenizer: Any,
        model_config: Any,
        generate: TurnFn,
        max_turns: int,
        max_completion_length: int,
        concurrent_tools: bool = True,
    ):
        from types import SimpleNamespace

        self.processing_class = self._tokenizer = tokenizer
        self.model = SimpleNamespace(config=model_config)  # its context length bounds turns
        self.generate = generate
        self.max_tool_calling_iterations = max_turns - 1
        self.max_completion_length = max_completion_length
        self.concurrent_tools = concurrent_tools
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
) -> list[AgentRollout]:
    """Multi-turn episodes, one per row (greedy, or sampled at ``temperature`` > 0 with
    top-p 1 and no top-k, as in training): generate a turn for every open episode, run the
    tool calls it makes (the episodes' calls at once, each episode's in order), append the
    results, repeat until an episode answers without a call or
    has had ``max_turns`` turns. ``tools_class`` is instantiated once per row and ``reset`` with
    the row, as TRL's trainer does. Turns are generated by ``generator`` (lm/generator.py;
    default: one over ``model`` with batches of ``batch_size``, ``shared_prefix``: the prompt
    tokens a batch shares run once)."""
    from trl.chat_template_utils import parse_response

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
