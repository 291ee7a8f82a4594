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

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from composer_replication.envs.tools import call_tool, tool_functions


def sampling_kwargs(temperature: float) -> dict:
    """``generate`` arguments: greedy at 0, else plain sampling at ``temperature``."""
    if temperature <= 0:
        return {"do_sample": False}
    return {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}


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
) -> list[AgentRollout]:
    """Multi-turn episodes, one per row (greedy, or sampled at ``temperature`` > 0 with
    top-p 1 and no top-k, as in training): generate a turn for every open episode, run the
    tool calls it makes, append the results, repeat until an episode answers without a call or
    has had ``max_turns`` turns. ``tools_class`` is instantiated once per row and ``reset`` with
    the row, as TRL's trainer does."""
    from trl.chat_template_utils import parse_response

    envs = [tools_class() for _ in rows]
    for env, row in zip(envs, rows, strict=True):
        env.reset(**row)
    schemas = tool_functions(envs[0]) if envs else []
    convs = [list(row["prompt"]) for row in rows]
    done: list[AgentRollout | None] = [None] * len(rows)
    stats = [[0, 0, 0] for _ in rows]  # turns, calls, errors
    for turn in range(max_turns):
        open_ = [i for i in range(len(rows)) if done[i] is None]
        if not open_:
            break
        for start in range(0, len(open_), batch_size):
            idx = open_[start : start + batch_size]
            ids, prefixes = _generate(model, tokenizer, [convs[i] for i in idx], schemas,
                                      max_new_tokens, temperature)  # fmt: skip
            for i, out, prefix in zip(idx, ids, prefixes, strict=True):
                message = parse_response(tokenizer, out, prefix=prefix, tools=schemas)
                message.setdefault("role", "assistant")
                convs[i].append(message)
                stats[i][0] += 1
                calls = message.get("tool_calls") or []
                if not calls or turn == max_turns - 1:
                    done[i] = _finish(convs[i], rows[i], stats[i], envs[i])
                    if progress is not None:
                        progress(1)
                    continue
                for call in calls:
                    content, failed = call_tool(envs[i], call)
                    name = call.get("function", call).get("name")
                    convs[i].append({"role": "tool", "name": name, "content": content})
                    stats[i][1] += 1
                    stats[i][2] += failed
    return [
        r if r is not None else _finish(convs[i], rows[i], stats[i], envs[i])
        for i, r in enumerate(done)
    ]


def _finish(conv: list[dict[str, Any]], row: dict[str, Any], s: list[int], env) -> AgentRollout:
    """Calls written in the last allowed turn are not run (as in TRL) nor counted."""
    return AgentRollout(conv[len(row["prompt"]) :], turns=s[0], tool_calls=s[1],
                        tool_errors=s[2], instance=env)  # fmt: skip


def until_eos(ids: list[int], eos_ids: int | list[int]) -> list[int]:
    """``ids`` up to and including the first end-of-sequence token (TRL's completion cut)."""
    stops = {eos_ids} if isinstance(eos_ids, int) else set(eos_ids)
    end = next((i for i, t in enumerate(ids) if t in stops), None)
    return ids if end is None else ids[: end + 1]


def _generate(model, tokenizer, convs, tools, max_new_tokens, temperature=0.0):
    """One turn for each conversation; the prompt tokens every conversation shares (system
    prompt, tool schemas, worked examples) are run once (``generate_with_prefix``)."""
    from composer_replication.lm.models import pad_token_id
    from composer_replication.lm.prefix import generate_with_prefix

    texts = [
        tokenizer.apply_chat_template(c, tools=tools, add_generation_prompt=True, tokenize=False)
        for c in convs
    ]
    prefixes = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    model.eval()
    pad = pad_token_id(tokenizer)
    new_BN = generate_with_prefix(
        model, prefixes, pad, max_new_tokens=max_new_tokens, pad_token_id=pad,
        **sampling_kwargs(temperature),
    )  # fmt: skip
    ids = [until_eos(row.tolist(), tokenizer.eos_token_id) for row in new_BN.cpu()]
    return ids, prefixes
