"""Rollouts that do not wait in line: a batch's environment work one rollout after another
(``concurrent_tools`` off, TRL's own loop; remote calls one at a time) vs at once
(``rollout.TurnCalls``, resets at once, gradings at once), through the trainer's real
generation-and-scoring round with a scripted policy (the turns are fixed token ids, so the
time measured is the environments' and TRL's loop's, not a model's).

* ``feature_deletion``: the vendored textkit task set, 8 rollouts (4 tasks x 2); every
  episode runs the tests, edits the deleted function, runs the tests again and submits
  (4 tool turns), then is graded (two sandboxes). Sandbox slots: ``--slots`` (2 = this
  machine's cores).
* ``openenv``: the calculator served over OpenEnv on 127.0.0.1 behind a proxy that adds
  ``--delay`` seconds to every reply (a remote environment); 8 rollouts call ``calculate``
  once, then answer; each is graded on the server.

Variants alternate round by round (the order flips each round); the table gives medians of
the step time (one ``_generate_and_score_completions``), of the time inside the tool loop,
episodes per minute, and the ratio concurrent / sequential measured in the same run.

    PYTHONPATH=src python bench/bench_rollouts.py                 # both, 3 rounds
    PYTHONPATH=src python bench/bench_rollouts.py --case openenv --delay 0.2 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO / "tests")]  # the package; tests/support harnesses

from support.delay_proxy import delayed  # noqa: E402
from support.openenv_server import served  # noqa: E402
from support.scripted_agent import ANSWER, CALL  # noqa: E402
from support.scripted_policy import ScriptedTrainer, scripted_trainer  # noqa: E402
from support.textkit import textkit_env  # noqa: E402

from composer_replication.envs.calculator import CalculatorEnv  # noqa: E402
from composer_replication.envs.feature_deletion.env import STUB_LINE  # noqa: E402
from composer_replication.envs.openenv.adapter import (  # noqa: E402
    CONNECTIONS,
    OpenEnvReward,
    openenv_tools_class,
)
from composer_replication.envs.tools import bounded_tools  # noqa: E402
from composer_replication.lm.chat_templates import ensure_tool_template  # noqa: E402
from composer_replication.lm.models import DEFAULT_MODEL, load_tokenizer  # noqa: E402
from composer_replication.sandbox.sandbox import SLOTS  # noqa: E402
from composer_replication.trainer.rewards import EnvReward  # noqa: E402


def _call(name: str, **args) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call><|im_end|>"


def feature_deletion_case(tok, work: Path):
    env = textkit_env(work / "tasks")
    tasks = env.tasks("train")[:4]
    rows = [env.row(t) for t in tasks for _ in range(2)]
    scripts = {}
    for t in tasks:
        key = f"`{t.data['symbol']}` in `{t.data['file']}`"
        fix = _call("replace_in_file", path=t.data["file"], old=STUB_LINE, new="    return None")
        scripts[key] = [_call("run_tests"), fix, _call("run_tests"), _call("submit"),
                        "Done.<|im_end|>"]  # fmt: skip
    tools = bounded_tools(env.tools_class(), 8)
    trainer = scripted_trainer(tok, rows, tools, EnvReward(env), 4, str(work / "fd"), scripts)
    return trainer, rows


def openenv_case(tok, work: Path, url: str):
    env = CalculatorEnv(per_kind=50)
    rows = [r for r in env.rows("train")[:4] for _ in range(2)]
    tools = bounded_tools(openenv_tools_class(url), 4)
    reward = OpenEnvReward("calculator")
    trainer = scripted_trainer(tok, rows, tools, reward, 1, str(work / "oe"), {"": [CALL, ANSWER]})
    return trainer, rows


def _step(trainer: ScriptedTrainer, rows, concurrent: bool, remote: bool) -> tuple[float, float]:
    trainer.concurrent_tools = concurrent
    if remote:
        CONNECTIONS.set_limit(32 if concurrent else 1)
    trainer.loop_s = 0.0
    t0 = time.perf_counter()
    trainer._generate_and_score_completions(rows)
    return time.perf_counter() - t0, trainer.loop_s


def measure(trainer, rows, rounds: int, remote: bool) -> dict[str, list[tuple[float, float]]]:
    times: dict[str, list[tuple[float, float]]] = {"sequential": [], "concurrent": []}
    for name in times:  # warm-up: pools of instances, sessions, caches
        _step(trainer, rows, name == "concurrent", remote)
    for r in range(rounds):
        order = list(times) if r % 2 == 0 else list(times)[::-1]
        for name in order:
            times[name].append(_step(trainer, rows, name == "concurrent", remote))
    return times


def report(title: str, batch: int, times) -> None:
    med = {k: (statistics.median(s for s, _ in v), statistics.median(t for _, t in v))
           for k, v in times.items()}  # fmt: skip
    print(f"\n{title} ({batch} rollouts; medians of {len(times['sequential'])} rounds)")
    print("| variant | step s | tool loop s | episodes/min | step ratio | tool-loop ratio |")
    print("| --- | --- | --- | --- | --- | --- |")
    base_s, base_t = med["sequential"]
    for name, (s, t) in med.items():
        print(f"| {name} | {s:.2f} | {t:.2f} | {60 * batch / s:.1f} | {s / base_s:.2f}x | "
              f"{t / base_t:.2f}x |")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", choices=["both", "feature_deletion", "openenv"], default="both")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--slots", type=int, default=2, help="sandbox slots (2 = this machine)")
    ap.add_argument("--delay", type=float, default=0.2, help="seconds added to each reply")
    ns = ap.parse_args()
    tok = load_tokenizer(DEFAULT_MODEL)
    ensure_tool_template(tok)
    SLOTS.set_limit(ns.slots)
    with tempfile.TemporaryDirectory(prefix="cr-bench-rollouts-") as tmp:
        work = Path(tmp)
        if ns.case in ("both", "feature_deletion"):
            trainer, rows = feature_deletion_case(tok, work)
            times = measure(trainer, rows, ns.rounds, remote=False)
            report(f"feature_deletion, {ns.slots} sandbox slots", len(rows), times)
        if ns.case in ("both", "openenv"):
            with served(CalculatorEnv(per_kind=50)) as url, delayed(url, ns.delay) as slow:
                trainer, rows = openenv_case(tok, work, slow)
                times = measure(trainer, rows, ns.rounds, remote=True)
            report(f"openenv calculator, +{ns.delay:g} s per reply", len(rows), times)


if __name__ == "__main__":
    main()
