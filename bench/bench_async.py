"""Rollouts that never wait for the learner: samples/min of ``rollout.engine: ray`` (2
workers, ``rollout.max_staleness=1``) vs ``local`` (the trainer generates, runs tools or grades,
then trains) with an environment that waits ``--delay`` seconds like a remote sandbox, on a
tiny model (the time measured is the engines', not a model's). Two cases (``--case``):

* ``arithmetic``: the quickstart's task; every grading call waits (a call grades all the
  rollouts it is given at once: the local engine's one call per step, a worker's one per
  group).
* ``calculator``: the agent quickstart's tool environment (``calculate``), every tool call
  waiting ``--delay`` s first; tool calls of a turn run at once on both engines
  (``rollout.concurrent_tools``, the default). The tiny random model is first fitted for a
  few seconds to answer every prompt with a ``calculate`` call (so every rollout makes one
  call and waits once; a random model never writes a parsable call), 2 turns per episode,
  on the 2 training tasks it was fitted on (every step draws both).
* ``feature-deletion``: not here (issue 54's Feature Deletion case needs Feature Deletion on
  the workers: branch i54-tools); the flag is refused with that message.

For the local engine it prints the step's generation, update and wait times (g, t, w, from
timestamps inside each step: the generation calls, the tool calls or gradings, the rest) and
the ceiling of overlapping them, ``(g + t + w) / max(g + t, w)``, beside the measured ratio
ray / local. Variants alternate round by round; medians. Ray's start-up is not counted:
samples/min is taken over the steps after the first (the first waits for the workers to
start). Ray's workers run at this process's niceness (``RAY_worker_niceness=0``; Ray's
default, 15 more, lets any other load on the machine starve them).

    PYTHONPATH=src python bench/bench_async.py                       # arithmetic, 2 rounds
    PYTHONPATH=src python bench/bench_async.py --delay 3 --steps 8 --rounds 3
    PYTHONPATH=src python bench/bench_async.py --case calculator --steps 6 --rounds 2

The quickstart staleness study (``force_staleness`` 0 vs 4, with and without the correction,
held-out scores over 3 seeds) is bench/bench_staleness.py."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO / "tests")]  # the package; tests/support harnesses
os.environ.setdefault("RAY_worker_niceness", "0")  # read by the raylet a local Ray starts

from support.tiny_run import save_tiny_model  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from composer_replication.config import load_config  # noqa: E402
from composer_replication.envs.arithmetic import ArithmeticEnv  # noqa: E402
from composer_replication.envs.calculator import CalculatorEnv, CalculatorTools  # noqa: E402
from composer_replication.run import preflight, train  # noqa: E402
from composer_replication.trainer.trainer import ComposerReplicationTrainer  # noqa: E402

DELAY = {"s": 3.0}
GEN: list[tuple[float, float]] = []
"""(start, end) of each of the local engine's generation calls."""
WAIT: list[tuple[float, float]] = []
"""(start, end) of each of the local engine's waits (a grading call, a tool call)."""
STEP_ENDS: list[float] = []


def _timed(log: list[tuple[float, float]], fn, *args, **kwargs):
    start = time.monotonic()
    try:
        return fn(*args, **kwargs)
    finally:  # list.append is atomic; no lock (Ray pickles this module's globals by value)
        log.append((start, time.monotonic()))


class SlowGradingArithmetic(ArithmeticEnv):
    """Arithmetic whose every grading call waits ``DELAY`` seconds first. Defined in this
    script, so Ray pickles it by value into the workers."""

    def grade_batch(self, tasks, completions):
        def slow():
            time.sleep(DELAY["s"])
            return super(SlowGradingArithmetic, self).grade_batch(tasks, completions)

        return _timed(WAIT, slow)


class SlowCalculatorTools(CalculatorTools):
    """``calculate`` after a ``DELAY`` s wait (a remote sandbox's round trip)."""

    def calculate(self, expression: str) -> str:
        """Evaluate an arithmetic expression and return its value.

        Args:
            expression: The arithmetic expression, for example "123 * 45 + 6".
        """

        def slow():
            time.sleep(DELAY["s"])
            return CalculatorTools.calculate(self, expression)

        return _timed(WAIT, slow)


FITTED_TASKS = 2
"""The calculator's training tasks the tool caller is fitted on: the only ones the case
trains on (a tiny model fitted on 2 prompts does not call the tool on others)."""


class SlowCalculator(CalculatorEnv):
    """The calculator with :class:`SlowCalculatorTools`, training on the fitted tasks only."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._splits["train"] = self._splits["train"][:FITTED_TASKS]

    def tools_class(self) -> type:
        return SlowCalculatorTools


def slow_env(cfg):
    if cfg.env.name == "calculator":
        return SlowCalculator(few_shot=cfg.env.few_shot)
    return SlowGradingArithmetic(levels=cfg.env.levels)


def timed_generation(original):
    def generate(self, *args, **kwargs):
        return _timed(GEN, original, self, *args, **kwargs)

    return generate


class StepClock(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        STEP_ENDS.append(time.monotonic())


def _within(spans: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Seconds of the union of ``spans`` (clipped to [lo, hi])."""
    total, end = 0.0, lo
    for a, b in sorted(spans):
        a, b = max(a, end), min(b, hi)
        if b > a:
            total += b - a
            end = b
    return total


def fit_tool_caller(model_dir: Path, steps: int = 300) -> None:
    """Fit the tiny model in ``model_dir`` to answer every calculator prompt (the agent
    quickstart's, worked exchanges and tool schema included) with the worked exchanges' call,
    ``calculate("12 * 34")``: teacher forcing on the first ``FITTED_TASKS`` training prompts
    (the case trains on those only), Adam, until the loss is
    below 0.02 (a few seconds; position ids count from each prompt's first token). A
    harness for timing, not a policy: what it computes is never looked at."""
    import torch
    from transformers import AutoModelForCausalLM

    from composer_replication.envs.tools import tool_functions
    from composer_replication.lm.chat_templates import ensure_tool_template
    from composer_replication.lm.models import load_tokenizer

    tok = load_tokenizer(str(model_dir))
    ensure_tool_template(tok)
    env = CalculatorEnv(few_shot=True)
    tools = tool_functions(CalculatorTools())
    prompts = [
        tok.apply_chat_template(env.row(t)["prompt"], tools=tools, add_generation_prompt=True,
                                tokenize=True, return_dict=True)["input_ids"]
        for t in env.tasks("train")[:FITTED_TASKS]
    ]  # fmt: skip
    call = '<tool_call>{"name": "calculate", "arguments": {"expression": "12 * 34"}}</tool_call>'
    target = tok(call, add_special_tokens=False)["input_ids"] + [
        tok.convert_tokens_to_ids("<|im_end|>")
    ]
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    opt = torch.optim.Adam(model.parameters(), lr=2e-2)
    model.train()
    width = max(map(len, prompts))
    ids_BL = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p + target for p in prompts])
    mask_BL = torch.arange(ids_BL.shape[1]) >= width - torch.tensor([[len(p)] for p in prompts])
    pos_BL = (mask_BL.long().cumsum(1) - 1).clamp(min=0)
    target_BT = torch.tensor([target] * len(prompts))
    n = len(target)
    for _done in range(1, steps + 1):  # left-padded, so every target sits at the same positions
        hidden_BLH = model.model(
            input_ids=ids_BL, attention_mask=mask_BL.long(), position_ids=pos_BL
        ).last_hidden_state
        logits_BTV = model.lm_head(hidden_BLH[:, -n - 1 : -1])  # only where targets are scored
        loss = torch.nn.functional.cross_entropy(logits_BTV.flatten(0, 1), target_BT.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        if float(loss) < 0.02:
            break
    with torch.no_grad():
        out = model.generate(torch.tensor([prompts[0]]), max_new_tokens=n, do_sample=False)
    print(f"tool caller fitted in {_done} steps: loss {float(loss):.4f}, greedy reply "
          f"{tok.decode(out[0, len(prompts[0]):])!r}", flush=True)  # fmt: skip
    model.config.max_position_embeddings = 2048  # the prompts are ~400 tokens
    model.save_pretrained(model_dir)


CASES = {
    "arithmetic": [
        "generation.max_completion_length=8", "env.num_train=64",
    ],
    "calculator": [
        "env.name=calculator", "env.few_shot=true", "env.num_train=64", "rollout.max_turns=2",
        "rollout.max_tool_calls=2", "generation.max_completion_length=64",
        "generation.temperature=0.3",  # the fitted call, ~0.02 nats a token, nearly always
    ],
}  # fmt: skip


def run(case: str, engine: str, model: Path, out: Path, steps: int) -> dict[str, float]:
    for log in (GEN, WAIT, STEP_ENDS):
        log.clear()
    extra = (
        ["rollout.engine=ray", "ray.num_workers=2", "rollout.max_staleness=1"]
        if engine == "ray"
        else []
    )
    cfg = load_config(None, [
        f"model.name={model}", f"output_dir={out}", f"max_steps={steps}", "num_threads=1",
        "generation.num_generations=4", "generation.prompts_per_step=2",
        "eval.before_and_after=false", "optim.warmup_steps=0", *CASES[case], *extra,
    ])  # fmt: skip
    train.run_training(cfg, extra_callbacks=[StepClock()])
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "step_time" in r]
    elapsed = [r["time/elapsed_s"] for r in rows]
    samples = 8 * (len(rows) - 1)
    result = {"samples_per_min": 60 * samples / (elapsed[-1] - elapsed[0])}
    calls = [r["tools/call_frequency"] for r in rows if "tools/call_frequency" in r]
    if calls:
        result["tool_calls_per_rollout"] = statistics.fmean(calls)
    if engine == "local":
        per_step = []
        for lo, hi in zip(STEP_ENDS, STEP_ENDS[1:], strict=False):  # steps after the first
            g, w = _within(GEN, lo, hi), _within(WAIT, lo, hi)
            per_step.append((g, w, hi - lo - g - w))
        g, w, t = (statistics.median(x[i] for x in per_step) for i in range(3))
        result.update(g=g, w=w, t=max(t, 0.0))
    else:
        sync = [r["rollout/weight_sync_s"] for r in rows[1:] if "rollout/weight_sync_s" in r]
        wait = [r["rollout/wait_s"] for r in rows[1:] if "rollout/wait_s" in r]
        result.update(sync_s=statistics.median(sync or [0.0]),
                      learner_wait_s=statistics.median(wait or [0.0]),
                      step_s=statistics.median(r["step_time"] for r in rows[1:]))  # fmt: skip
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", choices=[*CASES, "feature-deletion"], default="arithmetic")
    ap.add_argument("--delay", type=float, default=3.0)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    if a.case == "feature-deletion":
        # FEATURE-DELETION CASE: left for the branch that runs Feature Deletion on the workers
        # (i54-tools); add its slow environment to slow_env and its overrides to CASES.
        ap.error("--case feature-deletion: not built here (Feature Deletion on Ray workers is "
                 "branch i54-tools)")  # fmt: skip
    DELAY["s"] = a.delay
    preflight.build_env = train.build_env = slow_env  # both engines wait in the same env
    ComposerReplicationTrainer._generate_single_turn = timed_generation(
        ComposerReplicationTrainer._generate_single_turn
    )
    with tempfile.TemporaryDirectory() as tmp:
        model = save_tiny_model(Path(tmp) / "tiny")
        if a.case == "calculator":
            cached = Path(tempfile.gettempdir()) / "cr-bench-async-tool-caller"
            if not (cached / "config.json").is_file():  # fitting takes minutes on a loaded CPU
                fit_tool_caller(model)
                shutil.copytree(model, cached, dirs_exist_ok=True)
            model = cached
        results: dict[str, list[dict[str, float]]] = {"local": [], "ray": []}
        for r in range(a.rounds):
            order = ["local", "ray"] if r % 2 == 0 else ["ray", "local"]
            for engine in order:
                out = Path(tmp) / f"{engine}{r}"
                results[engine].append(run(a.case, engine, model, out, a.steps))
                print(engine, r, {k: round(v, 3) for k, v in results[engine][-1].items()},
                      flush=True)  # fmt: skip
    med = {e: statistics.median(x["samples_per_min"] for x in v) for e, v in results.items()}
    g, t, w = (statistics.median(x[k] for x in results["local"]) for k in "gtw")
    ceiling = (g + t + w) / max(g + t, w)
    ratio = med["ray"] / med["local"]
    print(f"case {a.case}, delay {a.delay} s, {a.steps} steps, {a.rounds} rounds (medians)")
    print(f"local  samples/min {med['local']:.1f}   g {g:.2f} s  t {t:.2f} s  w {w:.2f} s")
    ray = results["ray"]
    print(f"ray    samples/min {med['ray']:.1f}   weight sync "
          f"{statistics.median(x['sync_s'] for x in ray):.2f} s  learner wait "
          f"{statistics.median(x['learner_wait_s'] for x in ray):.2f} s  step "
          f"{statistics.median(x['step_s'] for x in ray):.2f} s")  # fmt: skip
    print(f"ratio ray/local {ratio:.2f}   ceiling {ceiling:.2f}   "
          f"share of ceiling {ratio / ceiling:.0%}")  # fmt: skip


if __name__ == "__main__":
    main()
