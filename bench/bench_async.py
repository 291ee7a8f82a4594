"""Rollouts that never wait for the learner: samples/min of ``rollout.engine: ray`` (2
workers, ``rollout.max_staleness=1``) vs ``local`` (the trainer generates, runs tools or grades,
then trains) with an environment that waits ``--delay`` seconds like a remote sandbox, on a
tiny model (the time measured is the engines', not a model's). Three cases (``--case``):

* ``arithmetic``: the quickstart's task; every grading call waits (a call grades all the
  rollouts it is given at once: the local engine's one call per step, a worker's one per
  group).
* ``calculator``: the agent quickstart's tool environment (``calculate``), every tool call
  waiting ``--delay`` s first; tool calls of a turn run at once on both engines
  (``rollout.concurrent_tools``, the default). The tiny random model is first fitted for a
  few seconds to answer every prompt with a ``calculate`` call (so every rollout makes one
  call and waits once; a random model never writes a parsable call), 2 turns per episode,
  on the 2 training tasks it was fitted on (every step draws both).
* ``feature-deletion``: Feature Deletion (envs/feature_deletion/) on the textkit fixture
  repository (tests/fixtures/feature_deletion/textkit; its tasks generated at first use into
  ``$TMPDIR/cr-bench-async-textkit-tasks``, then cached), every tool waiting ``--delay`` s
  first; grading runs the hidden tests in the sandbox (real time, counted in w, as are the
  tool calls). The tiny model is fitted as for the calculator, to answer every prompt of the
  2 training tasks it trains on with ``list_files`` (no arguments: the tool's own work is
  negligible, so a call's time is the delay), 2 turns per episode.

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
    PYTHONPATH=src python bench/bench_async.py --case feature-deletion --steps 6 --rounds 2

The quickstart staleness study (``force_staleness`` 0 vs 4, with and without the correction,
held-out scores over 3 seeds) is bench/bench_staleness.py."""

from __future__ import annotations

import argparse
import functools
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

from support.textkit import TEXTKIT  # noqa: E402
from support.tiny_run import save_tiny_model  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from composer_replication.config import load_config  # noqa: E402
from composer_replication.envs import FeatureDeletionEnv  # noqa: E402
from composer_replication.envs.arithmetic import ArithmeticEnv  # noqa: E402
from composer_replication.envs.calculator import CalculatorEnv, CalculatorTools  # noqa: E402
from composer_replication.envs.tools import tool_functions, tool_methods  # noqa: E402
from composer_replication.run import preflight, train  # noqa: E402
from composer_replication.sandbox.sandbox import set_sandbox_slots  # noqa: E402
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


def _slowed(tool):
    """``tool`` after a ``DELAY`` s wait, timed into ``WAIT``; its signature and docstring kept
    (TRL builds the tool's schema from them)."""

    @functools.wraps(tool)
    def slow_tool(self, *args, **kwargs):
        def slow():
            time.sleep(DELAY["s"])
            return tool(self, *args, **kwargs)

        return _timed(WAIT, slow)

    return slow_tool


TEXTKIT_TASKS = Path(tempfile.gettempdir()) / "cr-bench-async-textkit-tasks"
"""Where the textkit Feature Deletion tasks are generated at first use (then cached)."""


class SlowFeatureDeletion(FeatureDeletionEnv):
    """Feature Deletion whose every tool waits ``DELAY`` s first and whose gradings (the hidden
    tests in the sandbox) are timed into ``WAIT``, training on the fitted tasks only."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._splits["train"] = self._splits["train"][:FITTED_TASKS]

    def tools_class(self) -> type:
        base = super().tools_class()
        slowed = {name: _slowed(fn) for name, fn in tool_methods(base).items()}
        return type(base.__name__, (base,), {**slowed, "__doc__": base.__doc__})

    def grade_episodes(self, tasks, rollouts, instances):
        return _timed(WAIT, super().grade_episodes, tasks, rollouts, instances)

    def do_nothing_reward(self, task):
        return _timed(WAIT, super().do_nothing_reward, task)


def slow_env(cfg):
    if cfg.env.name == "calculator":
        return SlowCalculator(few_shot=cfg.env.few_shot)
    if cfg.env.name == "feature_deletion":
        set_sandbox_slots(cfg.sandbox.workers)  # as preflight.build_env does
        return SlowFeatureDeletion(**cfg.env.env_options(cfg.sandbox))
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


def fit_tool_caller(model_dir: Path, env, tools, call: str, steps: int = 300) -> None:
    """Fit the tiny model in ``model_dir`` to answer every prompt of ``env`` (as training
    renders it: its worked exchanges, if any, and the schemas of ``tools``, an instance of its
    tools class) with ``call``, one tool call: teacher forcing on the first ``FITTED_TASKS``
    training prompts (the cases train on those only), Adam, until the loss is below 0.02
    (position ids count from each prompt's first token; the ~800-token Feature Deletion
    prompts took 218 steps, ~10 min on the loaded 2-core machine). A harness for timing,
    not a policy: what it computes is never looked at."""
    import torch
    from transformers import AutoModelForCausalLM

    from composer_replication.lm.chat_templates import ensure_tool_template
    from composer_replication.lm.models import load_tokenizer

    tok = load_tokenizer(str(model_dir))
    ensure_tool_template(tok)
    schemas = tool_functions(tools)
    prompts = [
        tok.apply_chat_template(env.row(t)["prompt"], tools=schemas, add_generation_prompt=True,
                                tokenize=True, return_dict=True)["input_ids"]
        for t in env.tasks("train")[:FITTED_TASKS]
    ]  # fmt: skip
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
    model.config.max_position_embeddings = 2048  # the prompts are ~400 to ~900 tokens
    model.save_pretrained(model_dir)


def _call(name: str, arguments: dict[str, str]) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def fit_case_caller(case: str, model_dir: Path) -> None:
    """Fit the tool caller of a tool case: the calculator's worked exchanges' call,
    ``calculate("12 * 34")``, or Feature Deletion's ``list_files()``."""
    if case == "calculator":
        env = CalculatorEnv(few_shot=True)
        fit_tool_caller(model_dir, env, CalculatorTools(),
                        _call("calculate", {"expression": "12 * 34"}))  # fmt: skip
        return
    cfg = load_config(None, [f"model.name={model_dir}", *CASES[case]])
    env = FeatureDeletionEnv(**cfg.env.env_options(cfg.sandbox))
    fit_tool_caller(model_dir, env, env.tools_class()(), _call("list_files", {}))


CASES = {
    "arithmetic": [
        "generation.max_completion_length=8", "env.num_train=64",
    ],
    "calculator": [
        "env.name=calculator", "env.few_shot=true", "env.num_train=64", "rollout.max_turns=2",
        "rollout.max_tool_calls=2", "generation.max_completion_length=64",
        "generation.temperature=0.3",  # the fitted call, ~0.02 nats a token, nearly always
    ],
    "feature-deletion": [
        "env.name=feature_deletion", f"env.task_sources=[{TEXTKIT}]",
        f"env.task_dir={TEXTKIT_TASKS}", "env.task_generation.workers=2",
        "env.task_generation.suite_timeout_s=30", "env.few_shot=false", "env.num_train=64",
        "env.max_tool_output_chars=200", "rollout.max_turns=2", "rollout.max_tool_calls=2",
        "generation.max_completion_length=64", "generation.temperature=0.3",
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
    ap.add_argument("--case", choices=list(CASES), default="arithmetic")
    ap.add_argument("--delay", type=float, default=3.0)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    DELAY["s"] = a.delay
    preflight.build_env = train.build_env = slow_env  # both engines wait in the same env
    ComposerReplicationTrainer._generate_single_turn = timed_generation(
        ComposerReplicationTrainer._generate_single_turn
    )
    with tempfile.TemporaryDirectory() as tmp:
        model = save_tiny_model(Path(tmp) / "tiny")
        if a.case != "arithmetic":  # a tool case: its fitted tool caller
            name = {"calculator": "tool-caller"}.get(a.case, f"{a.case}-caller")
            cached = Path(tempfile.gettempdir()) / f"cr-bench-async-{name}"
            if not (cached / "config.json").is_file():  # fitting takes minutes on a loaded CPU
                fit_case_caller(a.case, model)
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
