"""A scripted policy for the memory task (envs/memory.py; docs/summarization.md): it opens the
drawers in order, summarizes when told to (its progress and the last drawer's number (code or offset) always; the key only
with ``carry``) and answers from what its window shows (0 when it shows no key). Used as a
turn function of ``rollout.ContextLoop`` and, through :class:`ReaderGenerator`, as the
generator of an evaluation or of a training run (no model forward decides what happens)."""

from __future__ import annotations

import re

from composer_replication.envs.memory import NEXT_CALL
from composer_replication.lm.generator import Completion
from composer_replication.rollout import instruction_after_tools

CALL = '<tool_call>{{"name": "open_drawer", "arguments": {{"number": {k}}}}}</tool_call><|im_end|>'


class Reader:
    """The policy: ``reader(prompts, limit) -> (ids, None, None)`` (``ContextLoop``'s turn
    function). ``instruction``: the summary instruction's tokens (how it knows it is asked for
    a summary); ``answer_windows``: the text of each window it answered in."""

    def __init__(self, tok, drawers: int, carry: bool, instruction: list[int] | None = None,
                 sequential: bool = False, after: str | None = None):  # fmt: skip
        """``sequential``: call ``open_next_drawer`` (env.sequential); ``after``: read only the
        text after the last occurrence of this string (the task's prompt: a worked exchange
        before it is not this episode)."""
        self.tok, self.drawers, self.carry = tok, drawers, carry
        self.sequential, self.after = sequential, after
        self.instruction: list[int] = list(instruction or [])
        self.answer_windows: list[str] = []
        self.summaries = 0

    def __call__(self, prompts, limit):
        return [self.turn(ids, limit) for ids in prompts], None, None

    def turn(self, ids: list[int], limit: int) -> list[int]:
        text = self.tok.decode(ids)
        if self.after and self.after in text:
            text = text[text.rindex(self.after) :]
        found = re.findall(r'"number": (\d+)|Drawer (\d+):', text)
        opened = [int(a or b) for a, b in found]
        opened += [int(k) for k in re.findall(r"opened up to (\d+)", text)]
        done = max(opened, default=0)  # progress is always carried, the key only if told
        if self.instruction and ids[-len(self.instruction) :] == self.instruction:
            self.summaries += 1
            key = re.findall(r"the key is (\d+)|key=(\d+)", text)
            fact = next((a or b for a, b in key), None)
            carried = f"key={fact}; " if self.carry and fact else ""
            plus = re.findall(r"(plus|code is) (\d+)|(plus|code)=(\d+)", text)
            asked = "".join(f"; {(a or c).split()[0]}={b or d}" for a, b, c, d in plus[-1:])
            reply = f"{carried}opened up to {done}{asked}"
        else:
            plus = re.findall(r"(plus|code is) (\d+)|(plus|code)=(\d+)", text)
            if plus:
                self.answer_windows.append(text)
                key = re.findall(r"the key is (\d+)|key=(\d+)", text)
                a, b, c, d = plus[-1]
                value = int(next((x or y for x, y in key), 0) or 0)
                if (a or c).startswith("code"):  # answer: copy (the key, a dash, the code)
                    reply = f"{value}-{b or d}"
                else:  # answer: sum
                    reply = str(value + int(b or d) if value else 0)
            else:
                reply = NEXT_CALL + "<|im_end|>" if self.sequential else CALL.format(k=done + 1)
        end = "" if reply.endswith("<|im_end|>") else "<|im_end|>"
        return self.tok(reply + end, add_special_tokens=False)["input_ids"][:limit]


class ReaderGenerator:
    """A :class:`Reader` behind the generator interface (lm/generator.py ``generate(prompts,
    sampling)``): what ``evaluate(..., generator=)`` and a trainer's ``rollout_generator``
    hand turns to. Log-probs are 0.0 (the script is certain)."""

    def __init__(self, tok, drawers: int, carry: bool, summary_prompt: str, **options):
        self.reader = Reader(tok, drawers, carry, instruction_after_tools(tok, summary_prompt)[1],
                             **options)  # fmt: skip
        self.calls = 0

    def generate(self, prompts, sampling) -> list[Completion]:
        self.calls += 1
        return [
            Completion(ids, [0.0] * len(ids))
            for ids in (self.reader.turn(list(p), sampling.max_new_tokens) for p in prompts)
        ]

    def close(self, wait: bool = True) -> None:
        """Nothing to stop (no worker thread); the signature is lm/generator.py's."""

    def __enter__(self) -> ReaderGenerator:
        return self

    def __exit__(self, *exc: object) -> None:
        pass
