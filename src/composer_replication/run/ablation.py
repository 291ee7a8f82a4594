"""``composer-replication ablate``: train each arm (plain GRPO, +SDPO, +replay, all three, and
TRL's SDPOTrainer as a peer) for every seed on the same model, task and held-out set; write a
table with means and 95% CIs over seeds, and a PNG of held-out score vs step per arm."""

from __future__ import annotations

import json
import math
import re
import shutil
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from composer_replication.config import (
    AblationArm,
    AblationConfig,
    ConfigError,
    RunConfig,
    UserError,
    check_output_dir,
    load_config,
    resolve_config_path,
    saved_config_diffs,
)
from composer_replication.run.context_report import context_markdown, context_signal
from composer_replication.run.paired import (
    RunCurve,
    analysis_markdown,
    mean_known,
    paired_differences,
    plot_differences,
    step_analysis,
    t_interval,
    with_interval,
)

FINAL_EVAL = "final_eval.json"
"""An arm/seed run's final held-out result; its presence marks the run as finished."""

BASE_EVAL = "base_eval.json"
"""The untrained model's held-out result, in ``output_dir`` (:func:`base_result`)."""


TRAIN_REWARD_KEYS = ("reward", "self_distillation/reward_mean")
"""A step's mean training reward in metrics.jsonl: our trainer's key, then TRL SDPOTrainer's."""

FLAT_GROUP_KEYS = ("frac_reward_zero_std", "self_distillation/flat_group_fraction")
"""A step's fraction of groups whose rewards are all equal (advantage 0 for every rollout):
TRL GRPOTrainer's key (our trainer logs it), then TRL SDPOTrainer's."""


def _first_key(row: dict[str, Any], keys: tuple[str, ...]) -> str | None:
    return next((k for k in keys if k in row), None)


def training_signal(run_dir: Path) -> dict[str, Any]:
    """What a run's training rollouts earned, read from its ``metrics.jsonl``: the mean reward
    over its steps (``train_reward``), the first step in which any rollout was rewarded
    (``first_rewarded_step``; None if none was) and the number of steps in which every group
    was flat (``flat_steps``: all its rollouts had one reward, so GRPO's gradient was exactly 0
    and only another channel moved the policy). On a sparse task GRPO learns nothing before
    the first rewarded step, so it tells a seed that never took off from an arm that failed.
    A key is missing when the run did not log what it is read from."""
    from composer_replication.trainer.callbacks import METRICS_FILE, read_metrics

    rewards: list[tuple[int, float]] = []
    flat: list[bool] = []
    for row in read_metrics(run_dir / METRICS_FILE):
        if (key := _first_key(row, TRAIN_REWARD_KEYS)) is not None:
            rewards.append((int(row["step"]), float(row[key])))
        if (key := _first_key(row, FLAT_GROUP_KEYS)) is not None:
            flat.append(float(row[key]) >= 1.0)
    out: dict[str, Any] = {}
    if rewards:
        out["train_reward"] = statistics.fmean(r for _, r in rewards)
        out["first_rewarded_step"] = next((s for s, r in rewards if r > 0), None)
    if flat:
        out["flat_steps"] = sum(flat)
    return out


def load_result(final_eval: Path) -> dict[str, Any]:
    """A finished run's result (its ``final_eval.json``) with its training signal and, when it
    used a context strategy, its training reward by number of summaries."""
    run = final_eval.parent
    return {**json.loads(final_eval.read_text()), **training_signal(run), **context_signal(run)}


def markers(section: str) -> tuple[str, str]:
    """The begin/end comments around an experiment's section of a results file."""
    return f"<!-- {section}:begin -->", f"<!-- {section}:end -->"


def arm_dir(acfg: AblationConfig, arm: str) -> Path:
    """Where an arm's seed runs go: the arm's name with every run of characters other than
    letters, digits and ``._=+-`` replaced by one ``-`` (``trl-sdpo (peer)`` ->
    ``trl-sdpo-peer``), so paths need no quoting."""
    return Path(acfg.output_dir) / (re.sub(r"[^A-Za-z0-9._=+-]+", "-", arm).strip("-") or "arm")


def seed_dir(acfg: AblationConfig, arm: str, seed: int) -> Path:
    """The run directory of one arm and seed (its ``output_dir``)."""
    return arm_dir(acfg, arm) / f"seed{seed}"


def record_files() -> tuple[str, ...]:
    """The small files of a finished run that ``records_dir`` keeps (tens of kB; no weights):
    enough to reuse it (``check_reusable``), tabulate it and draw its curves, and the episodes
    it logged for a person to read; named where they are written."""
    from composer_replication.run.preflight import CONFIG_FILE
    from composer_replication.trainer.callbacks import EPISODES_FILE, HELDOUT_FILE, METRICS_FILE

    return (CONFIG_FILE, FINAL_EVAL, HELDOUT_FILE, METRICS_FILE, EPISODES_FILE, TRL_SDPO_SETTINGS)


def sync_records(acfg: AblationConfig) -> tuple[int, int]:
    """With ``records_dir``: copy the :func:`record_files` of every finished run under
    ``output_dir`` that its record lacks or holds differently into the record, and restore every
    recorded finished run that ``output_dir`` lacks (whatever an unfinished attempt left there is
    replaced: the record is the finished run). Returns ``(recorded, restored)``."""
    if acfg.records_dir is None:
        return 0, 0
    recorded = restored = 0
    names = record_files()
    if (Path(acfg.output_dir) / BASE_EVAL).is_file():
        _copy_record(Path(acfg.output_dir), Path(acfg.records_dir), (BASE_EVAL,))
    else:
        _copy_record(Path(acfg.records_dir), Path(acfg.output_dir), (BASE_EVAL,))
    for arm in acfg.arms:
        for seed in acfg.seeds:
            run = seed_dir(acfg, arm.name, seed)
            record = Path(acfg.records_dir) / run.relative_to(acfg.output_dir)
            if (run / FINAL_EVAL).is_file():
                recorded += _copy_record(run, record, names)
            elif (record / FINAL_EVAL).is_file():
                restored += _copy_record(record, run, names)
    return recorded, restored


def _copy_record(src: Path, dst: Path, names: tuple[str, ...]) -> int:
    """Copy the files of ``names`` that ``src`` holds into ``dst`` (final_eval.json last, as it
    marks a run finished); 1 if any file changed in ``dst``."""
    from composer_replication.lm.models import write_atomic

    changed = 0
    for name in sorted(names, key=lambda n: n == FINAL_EVAL):
        if not (src / name).is_file():
            continue
        data = (src / name).read_bytes()
        if (dst / name).is_file() and (dst / name).read_bytes() == data:
            continue
        dst.mkdir(parents=True, exist_ok=True)
        write_atomic(dst / name, data)
        changed = 1
    return changed


def arm_config(acfg: AblationConfig, arm: AblationArm, seed: int) -> RunConfig:
    out = seed_dir(acfg, arm.name, seed)
    cfg = _arm_run_config(acfg, arm, seed, out)
    if acfg.checkpoint_every % cfg.grpo.num_iterations:
        raise ConfigError(
            f"arm {arm.name!r}: checkpoint_every={acfg.checkpoint_every} is not a multiple of "
            f"grpo.num_iterations={cfg.grpo.num_iterations}: a run resumed between two "
            "generations would regenerate early and not continue as the same run"
        )
    if arm.trainer == "trl_sdpo" and not cfg.sdpo.enabled:
        raise ConfigError(
            f"arm {arm.name!r}: the TRL SDPO peer takes its distillation weight from "
            "sdpo.weight, which is 0 (the peer would not distill); set e.g. sdpo.weight=0.1"
        )
    return cfg


def check_arm_inputs(acfg: AblationConfig) -> None:
    """What each arm with a run still to train reads that can be checked without loading a
    model: model references, output directory, preference data, harness and the distill
    teachers' tokenizers (`run.preflight`). A `ConfigError` names the arm, before the first arm
    trains. An arm whose every seed has finished is only reused: a teacher deleted since does
    not stop the table."""
    from composer_replication.run.preflight import check_data, check_model_sources, check_teachers

    for arm in acfg.arms:
        todo = [s for s in acfg.seeds if not (seed_dir(acfg, arm.name, s) / FINAL_EVAL).is_file()]
        if not todo:
            continue
        cfg = arm_config(acfg, arm, todo[0])
        try:
            check_model_sources(cfg)
            check_output_dir(cfg.output_dir, "output_dir")
            check_data(cfg)
            check_teachers(cfg)
        except UserError as err:
            raise ConfigError(f"arm {arm.name!r}: {err}") from None


def _arm_run_config(acfg: AblationConfig, arm: AblationArm, seed: int, out: Path) -> RunConfig:
    if acfg.checkpoint_every:  # resumable: full state, the newest only
        saving = [f"save_steps={acfg.checkpoint_every}", "save_only_model=false",
                  "save_total_limit=1"]  # fmt: skip
    else:  # an unfinished arm starts over; finished arms are reused
        saving = ["save_steps=0", "save_only_model=true"]
    return load_config(
        resolve_config_path(acfg.base_config),
        [
            *acfg.base_overrides,
            *arm.overrides,
            f"seed={seed}",
            f"output_dir={out}",
            "eval.before_and_after=false",
            *saving,
        ],
    )


def _resume_point(acfg: AblationConfig, cfg: RunConfig) -> tuple[RunConfig, str | None, float]:
    """Where an unfinished run goes on from: ``(cfg, checkpoint, spent_s)``, ``spent_s`` the
    wall seconds it had spent up to the checkpoint (``time/elapsed_s`` of its last kept metrics
    row). The checkpoint is the newest whole one (run/preflight.py; saves cut short are set
    aside): at ``max_steps`` training is over (the process died in the final evaluation), and
    the caller only evaluates it; before that, with ``checkpoint_every``, ``cfg`` comes back
    with ``resume_from`` set. ``(cfg, None, 0)``: start over."""
    from composer_replication.run.preflight import check_resume, newest_checkpoint
    from composer_replication.trainer.callbacks import METRICS_FILE, read_metrics

    ckpt = newest_checkpoint(Path(cfg.output_dir))
    if ckpt is None:
        return cfg, None, 0.0
    step = int(ckpt.name.split("-")[1])
    if step < cfg.max_steps:
        if not acfg.checkpoint_every or not (ckpt / "optimizer.pt").is_file():
            return cfg, None, 0.0
        check_reusable(cfg)
        cfg = cfg.model_copy(update={"resume_from": str(ckpt)})
        check_resume(cfg)
    else:
        check_reusable(cfg)
    rows = [r for r in read_metrics(Path(cfg.output_dir, METRICS_FILE)) if r["step"] <= step]
    return cfg, str(ckpt), float(rows[-1].get("time/elapsed_s", 0.0)) if rows else 0.0


def run_arm(
    acfg: AblationConfig, arm: AblationArm, seed: int, console=None
) -> dict[str, Any] | None:
    """Train one arm/seed; returns its final held-out result and timing, or None when another
    ``ablate`` process holds the run (a lock beside its directory), so that several processes
    on one config (one per GPU, say) each take the next run no other holds."""
    from filelock import FileLock, Timeout

    cfg = arm_config(acfg, arm, seed)
    out = Path(cfg.output_dir)
    done = out / FINAL_EVAL
    if done.is_file():  # finished by an earlier, interrupted `ablate`: keep it
        return _reuse(cfg, arm, seed, console)
    out.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(out.parent / f".{out.name}.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        if console is not None:
            console.print(f"[dim]{arm.name} seed {seed}: another process is training it")
        return None
    try:
        if done.is_file():  # that other process finished it just now
            return _reuse(cfg, arm, seed, console)
        return _train_arm(acfg, arm, seed, cfg, console)
    finally:
        lock.release()


def _reuse(cfg: RunConfig, arm: AblationArm, seed: int, console) -> dict[str, Any]:
    check_reusable(cfg)
    if console is not None:
        console.print(f"[dim]{arm.name} seed {seed}: reusing {Path(cfg.output_dir, FINAL_EVAL)}")
    return load_result(Path(cfg.output_dir, FINAL_EVAL))


def _train_arm(
    acfg: AblationConfig, arm: AblationArm, seed: int, cfg: RunConfig, console
) -> dict[str, Any]:
    from composer_replication.run.train import (
        build_trainer,
        eval_turn_tokens,
        evaluate_run,
        prepare,
    )
    from composer_replication.trainer.callbacks import HeldoutEvalCallback

    done = Path(cfg.output_dir, FINAL_EVAL)
    cfg, resume, spent_s = _resume_point(acfg, cfg)
    trained = resume is not None and cfg.resume_from is None  # killed in the final evaluation
    if resume is not None and console is not None:
        what = "evaluating the trained" if trained else "resuming from"
        console.print(f"[dim]{arm.name} seed {seed}: {what} {resume}")
    t0 = time.monotonic() - spent_s
    model, tokenizer, env = prepare(cfg)
    if arm.trainer == "trl_sdpo":
        trainer = build_trl_sdpo_trainer(cfg, model, tokenizer, env)
    else:
        trainer = build_trainer(cfg, model, tokenizer, env, console)
    trainer.add_callback(
        HeldoutEvalCallback(
            cfg.output_dir,
            env,
            tokenizer,
            acfg.eval_every,
            acfg.eval_n_during,
            eval_turn_tokens(cfg),
            cfg.eval.batch_size,
            max_turns=cfg.rollout.max_turns,
            max_tool_calls=cfg.rollout.max_tool_calls,
            shared_prefix=cfg.generation.shared_prefix,
            context=cfg.rollout.context,
        )
    )
    if trained:
        trainer.load_checkpoint(resume)  # the weights it ended with; nothing to train
    else:
        trainer.train(resume_from_checkpoint=cfg.resume_from)
    final = evaluate_run(cfg, model, tokenizer, env, f"{arm.name} seed {seed}", console)
    result = {
        "arm": arm.name,
        "seed": seed,
        **final.summary(),
        "wall_s": time.monotonic() - t0,
        "run_dir": cfg.output_dir,
        **({"resumed_from": resume} if resume else {}),  # trained: its weights were evaluated
    }
    done.write_text(json.dumps(result, indent=2))
    if not acfg.keep_checkpoints:
        for ckpt in Path(cfg.output_dir).glob("checkpoint-*"):
            shutil.rmtree(ckpt)
    return {**result, **training_signal(done.parent)}


def check_reusable(cfg: RunConfig) -> None:
    """A finished run is reused (an unfinished one resumed) only if it was trained with ``cfg``
    (its ``config.yaml``, read with today's defaults, equal but for :data:`SAVING_FIELDS`);
    else ConfigError naming what differs.
    So two experiments may share runs by pointing at one directory, and an edited arm is never
    silently answered by its old run."""
    saved = Path(cfg.output_dir, "config.yaml")
    if not saved.is_file():
        raise ConfigError(f"{saved}: missing; cannot tell what {cfg.output_dir} was trained with")
    diffs = saved_config_diffs(saved, cfg)
    if diffs:
        raise ConfigError(
            f"{cfg.output_dir} was trained with another config (saved -> this arm):\n  "
            + "\n  ".join(diffs[:10])
            + "\nrename the arm or move that run directory away"
        )


def base_result(acfg: AblationConfig, console=None) -> dict[str, Any]:
    """The untrained model on the same held-out set as the arms' final evaluation (cached)."""
    from composer_replication.lm.models import fill_once, write_atomic
    from composer_replication.run.train import evaluate_run, prepare

    path = Path(acfg.output_dir) / BASE_EVAL

    def fill() -> None:  # once, whichever of several `ablate` processes gets here first
        cfg = arm_config(acfg, acfg.arms[0], acfg.seeds[0])
        model, tokenizer, env = prepare(cfg)
        result = {
            "arm": "base (untrained)",
            **evaluate_run(cfg, model, tokenizer, env, "base", console).summary(),
        }
        write_atomic(path, json.dumps(result, indent=2))  # whole or absent for a reader

    fill_once(path, path, fill)
    return json.loads(path.read_text())


TRL_SDPO_MAPPING: tuple[tuple[str, str, str], ...] = (
    ("`sdpo.weight` (alpha; total = policy + alpha * sdpo)",
     "`distillation_weight` = alpha / (1 + alpha)",
     "TRL's total is (1 - w) * policy + w * sdpo: the same mix, the whole loss scaled by "
     "1 / (1 + alpha)"),
    ("`sdpo.loss` jsd `beta`", "`distillation_mode=full_logits`, `distillation_alpha` = beta",
     "the same generalized JSD over the full vocabulary (beta 0 forward KL, 1 reverse KL); TAID "
     "and entropy_opd have no TRL counterpart (the peer then uses full-logit JSD, alpha 0.5)"),
    ("`sdpo.loss` `temperature`, `token_clip`", "-",
     "no counterpart; TRL clips the importance ratio instead (`distillation_is_clip` 2.0)"),
    ("`sdpo.teacher` live / ema / initial", "`teacher_model_kind` live / ema / base",
     "ema: `teacher_update_rate` = 1 - `sdpo.ema_decay`, synced every step"),
    ("`sdpo.hint_sources` feedback", "`include_environment_feedback=True`",
     "TRL takes feedback per prompt (`privileged_context`: the task's reference answer), ours "
     "per failed completion (the verifier's message on it)"),
    ("`sdpo.hint_sources` sibling", "`use_successful_as_teacher=True`",
     "a successful rollout of the same prompt as the demonstration"),
    ("`sdpo.hint_sources` model", "-", "no counterpart (not used by the peer)"),
    ("`sdpo.feedback_template`, `sibling_template`", "`feedback_template`, `solution_template`",
     "our `{feedback}` / `{sibling}` become TRL's `{feedback_raw}` / "
     "`{successful_previous_attempt}`"),
    ("hints only for failed completions", "`dont_reprompt_on_self_success=True`", "same"),
    ("`sdpo.feedback_form` verifier", "`privileged_context` = the task's reference answer",
     "other forms (direction, digits, ...) depend on the completion, and TRL's feedback is per "
     "prompt: refused"),
    ("`sdpo.route_failures`", "-", "no counterpart: refused"),
    ("`sdpo.contrast` placebo", "-", "no counterpart: refused"),
)  # fmt: skip
"""How the ablation's TRL SDPOTrainer peer takes its settings from our run config: (ours, TRL's
SDPOConfig, how). One source of truth for :func:`trl_sdpo_kwargs` and the table in
docs/results.md (a test checks that the docs carry :func:`trl_sdpo_mapping_markdown`)."""


TRL_SDPO_SETTINGS = "trl_sdpo_config.json"
"""The peer's run directory records every SDPOConfig field it was given (mapped + GRPO's)."""


def trl_sdpo_kwargs(cfg: RunConfig) -> dict[str, Any]:
    """TRL ``SDPOConfig`` fields that carry our ``sdpo`` settings (see TRL_SDPO_MAPPING)."""
    sd = cfg.sdpo
    if "feedback" in sd.hint_sources and sd.feedback_form != "verifier":
        raise ConfigError(
            f"sdpo.feedback_form={sd.feedback_form!r}: TRL's SDPO takes feedback per prompt "
            "(privileged_context), not per completion; the peer supports 'verifier' only"
        )
    if sd.route_failures:
        raise ConfigError("sdpo.route_failures: TRL's SDPO has no routing; drop it for the peer")
    if sd.contrast != "none":
        raise ConfigError(
            f"sdpo.contrast={sd.contrast!r}: TRL's SDPO has no contrast teacher; drop it for the peer"
        )
    loss = sd.loss
    alpha = loss.beta if loss.type == "jsd" else 0.5
    kind = {"live": "live", "ema": "ema", "initial": "base"}[sd.teacher]
    template = sd.feedback_template.replace("{feedback}", "{feedback_raw}")
    return {
        "distillation_weight": sd.weight / (1.0 + sd.weight),
        "distillation_mode": "full_logits",
        "distillation_alpha": alpha,
        "teacher_model_kind": kind,
        "teacher_update_rate": 1.0 - sd.ema_decay,
        "teacher_sync_steps": 1,
        "include_environment_feedback": "feedback" in sd.hint_sources,
        "use_successful_as_teacher": "sibling" in sd.hint_sources,
        "dont_reprompt_on_self_success": True,
        "feedback_template": "\n" + template + "\n",
        "solution_template": "\n"
        + sd.sibling_template.replace("{sibling}", "{successful_previous_attempt}")
        + "\n",
    }


def trl_sdpo_mapping_markdown() -> str:
    """The mapping as a Markdown table (what docs/results.md shows)."""
    rows = ["| ours | TRL `SDPOConfig` | how |", "| --- | --- | --- |"]
    rows += [f"| {a} | {b} | {c} |" for a, b, c in TRL_SDPO_MAPPING]
    return "\n".join(rows)


def build_trl_sdpo_trainer(cfg: RunConfig, model, tokenizer, env):
    """TRL's experimental SDPOTrainer on the same model, task, data, steps and seed, with the
    self-distillation settings of ``cfg.sdpo`` mapped by :func:`trl_sdpo_kwargs`.

    TRL's SDPO takes environment feedback only as a per-prompt ``privileged_context`` column,
    not per completion; we give it the task's reference answer there (the same information
    our arithmetic feedback carries).
    """
    import dataclasses
    import os

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from trl.experimental.sdpo import SDPOConfig, SDPOTrainer

    from composer_replication.run.train import build_grpo_args, build_reward_funcs
    from composer_replication.trainer.callbacks import MetricsJsonlCallback
    from composer_replication.trainer.data import build_prompt_dataset

    grpo = build_grpo_args(cfg).to_dict()
    fields = {f.name for f in dataclasses.fields(SDPOConfig)}
    derived = ("loss_type", "generation_batch_size", "steps_per_generation")  # set in post-init
    kwargs = {k: v for k, v in grpo.items() if k in fields and k not in derived}
    kwargs.update(trl_sdpo_kwargs(cfg), save_strategy="no")
    args = SDPOConfig(**kwargs)
    Path(cfg.output_dir).mkdir(parents=True, exist_ok=True)
    Path(cfg.output_dir, TRL_SDPO_SETTINGS).write_text(json.dumps(kwargs, indent=1, default=str))
    ds = build_prompt_dataset(env, "train", cfg.env.num_train, cfg.env.seed, conversational=True)
    tasks = {t.task_id: t for t in env.tasks("train")}
    ds = ds.add_column(
        "privileged_context", [env.privileged_context(tasks[t]) for t in ds["task_id"]]
    )
    return SDPOTrainer(
        model=model,
        reward_funcs=build_reward_funcs(cfg, env),
        args=args,
        train_dataset=ds,
        processing_class=tokenizer,
        callbacks=[MetricsJsonlCallback(cfg.output_dir)],
    )


def summarize(
    results: list[dict[str, Any]], arms: list[str], reference: str | None = None
) -> list[dict[str, Any]]:
    """Per arm: mean final pass rate over seeds with a t-interval, per-seed values, and the
    per-seed paired difference to ``reference`` (default: the first arm) with its t-interval.
    Every per-seed list is in seed order, whatever order the runs finished in;
    ``vs_first_per_seed`` has one entry per seed of the arm (None where the reference has no
    run), ``vs_first`` only the paired seeds (the interval's sample)."""
    ref = reference or arms[0]
    ref_rates = final_rates(results).get(ref, {})
    rows = []
    for arm in arms:
        rs = sorted((r for r in results if r["arm"] == arm), key=lambda r: r["seed"])
        vals = [r["pass_rate"] for r in rs]
        mean, lo, hi = t_interval(vals)
        diffs = _paired_by_seed(results, arm, ref)
        d_mean, d_lo, d_hi = t_interval(diffs) if diffs else (math.nan,) * 3
        rows.append(
            {
                "arm": arm,
                "mean": mean,
                # a pass rate lives in [0, 1]; with 3 seeds the t-interval can leave it
                "ci95_low": max(0.0, lo),
                "ci95_high": min(1.0, hi),
                "reference": ref,
                "vs_first": diffs,
                "vs_first_per_seed": [_minus(r, ref_rates) for r in rs],
                "paired_mean": d_mean,
                "paired_ci95": (d_lo, d_hi),
                "per_seed": vals,
                "n_heldout": rs[0]["n"] if rs else 0,
                "reward": statistics.fmean(r["mean_reward"] for r in rs),
                "train_reward": mean_known(r.get("train_reward") for r in rs),
                "first_rewarded": [_first_rewarded(r) for r in rs],
                "flat_steps": [r.get("flat_steps") for r in rs],
                "wall_s": statistics.fmean(r["wall_s"] for r in rs),
            }
        )
    return rows


def _minus(result: dict[str, Any], ref_rates: dict[int, float]) -> float | None:
    """A run's final pass rate minus the reference's on its seed (None: no reference run)."""
    ref = ref_rates.get(result["seed"])
    return None if ref is None else result["pass_rate"] - ref


def _num(value: float | None) -> str:
    """A table number with 3 decimals, "-" when unknown."""
    return "-" if value is None else f"{value:.3f}"


def _counts(values: list[int | None]) -> str:
    """Per-seed counts for a table cell, "-" for a seed that did not record one."""
    return ", ".join("-" if v is None else str(v) for v in values)


def _first_rewarded(result: dict[str, Any]) -> str:
    """A run's first rewarded training step, "never", or "-" (no metrics recorded)."""
    if "first_rewarded_step" not in result:
        return "-"
    step = result["first_rewarded_step"]
    return "never" if step is None else str(step)


def pick_learning_rates(rows: list[dict[str, Any]], default: float = 1e-5) -> dict[str, float]:
    """The pre-registered learning-rate pick of a tuning run whose arms are named
    ``"<arm> lr=<rate>"``: per arm, the rate with the best mean final pass rate; a tie goes to
    the rate closest (in log scale) to ``default``."""
    by_arm: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        name, sep, lr = r["arm"].rpartition(" lr=")
        if not sep:
            raise ValueError(f"tuning arm {r['arm']!r} is not named '<arm> lr=<rate>'")
        by_arm.setdefault(name, []).append((float(lr), r["mean"]))
    return {
        arm: max(cands, key=lambda c: (c[1], -abs(math.log(c[0] / default))))[0]
        for arm, cands in by_arm.items()
    }


def plot_curves(acfg: AblationConfig, curves: dict[str, dict[int, RunCurve]], out: Path) -> Path:
    """Held-out pass rate vs step, mean over the finished seeds, one line per arm (``curves``:
    :func:`finished_curves`, so a killed run's partial curve is left out)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for arm, by_seed in curves.items():
        by_step: dict[int, list[float]] = {}
        for curve in by_seed.values():
            for step, rate in curve.scores.items():
                by_step.setdefault(step, []).append(rate)
        if by_step:
            steps = sorted(by_step)
            ax.plot(steps, [statistics.fmean(by_step[s]) for s in steps], marker="o", label=arm)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(f"held-out pass@1 (first {acfg.eval_n_during}, mean over seeds)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _paired_by_seed(results: list[dict[str, Any]], arm: str, ref: str) -> list[float]:
    """``arm`` minus ``ref`` final pass rate for each seed both ran (same seed = same first
    rollouts), in seed order."""
    by_seed = final_rates(results)
    return paired_differences(by_seed.get(arm, {}), by_seed.get(ref, {}))


def final_rates(results: list[dict[str, Any]]) -> dict[str, dict[int, float]]:
    """Final held-out pass rate by arm, then seed."""
    out: dict[str, dict[int, float]] = {}
    for r in results:
        out.setdefault(r["arm"], {})[r["seed"]] = r["pass_rate"]
    return out


def markdown_table(
    rows: list[dict[str, Any]],
    acfg: AblationConfig,
    command: str,
    wall_s: float,
    plot: Path,
    base: dict[str, Any] | None = None,
    done: tuple[int, int] | None = None,
    extra: str | None = None,
) -> str:
    """The section of ``results_md``; ``done`` = (finished runs, planned runs) marks a partial
    report (``ablate --report``) in its heading; ``extra`` (the per-step analysis) follows the
    table and its plot."""
    begin, end = markers(acfg.section)
    ref = rows[0]["reference"] if rows else "first arm"
    partial = done is not None and done[0] < done[1]
    heading = f" (in progress: {done[0]} of {done[1]} runs finished)" if partial else ""
    wall = "sum of the finished runs' wall times" if partial else "total wall time"
    base_note = ""
    if base is not None:  # base_result evaluates with the first arm's config
        base_note = (" The base row is the untrained model evaluated with the first arm's "
                     f"settings (`{acfg.arms[0].name}`).")  # fmt: skip
    lines = [
        begin,
        f"## {acfg.title}{heading}",
        "",
        f"Command: `{command}` (config `{acfg.base_config}` + {acfg.base_overrides}); "
        f"seeds {acfg.seeds}; {wall} {wall_s / 60:.1f} min on this machine.{base_note}",
        "",
        f"| arm | final held-out pass@1, mean over seeds [95% t-CI] | per seed | minus {ref}, "
        "per seed | minus " + ref + ", mean [95% t-CI] | held-out mean reward | "
        "training reward, mean over steps | first rewarded training step, per seed | "
        "steps with every group flat (GRPO gradient 0), per seed | wall s/run |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    if base is not None:
        lines.append(
            f"| {base['arm']} | {base['pass_rate']:.1%} [{base['pass_ci95_low']:.1%}, "
            f"{base['pass_ci95_high']:.1%}] (Wilson) | - | - | - | {base['mean_reward']:.3f} "
            "| - | - | - | - |"
        )
    for r in rows:
        seeds = ", ".join(f"{v:.1%}" for v in r["per_seed"])
        per_seed = r.get("vs_first_per_seed", r.get("vs_first", []))
        deltas = ", ".join("-" if v is None else f"{v:+.1%}" for v in per_seed) or "-"
        paired = "-"
        if r["arm"] != ref and r.get("vs_first"):
            paired = with_interval(r["paired_mean"], r["paired_ci95"], len(r["vs_first"]), "+")
        mean = with_interval(r["mean"], (r["ci95_low"], r["ci95_high"]), len(r["per_seed"]))
        lines.append(
            f"| {r['arm']} | {mean} | {seeds} | {deltas} | {paired} | {r['reward']:.3f} | "
            f"{_num(r['train_reward'])} | {', '.join(r['first_rewarded'])} | "
            f"{_counts(r.get('flat_steps', []))} | {r['wall_s']:.0f} |"
        )
    if rows and all(" lr=" in r["arm"] for r in rows):
        picks = pick_learning_rates(rows)
        so_far = " so far (final once every rate has run)" if partial else ""
        lines += ["", f"Learning rate per arm by the pre-registered rule{so_far} (best mean "
                  "final pass@1; ties: closest to 1e-5): "
                  + ", ".join(f"{a} {lr:g}" for a, lr in picks.items()) + "."]  # fmt: skip
    lines += ["", f"![held-out score vs step]({plot.as_posix()})", ""]
    if extra is not None:
        lines += [extra, ""]
    lines.append(end)
    return "\n".join(lines)


def write_results(md_path: Path, section: str, name: str = "ablation") -> None:
    """Replace experiment ``name``'s section of a markdown file (or append it)."""
    begin, end = markers(name)
    text = md_path.read_text() if md_path.is_file() else "# Results\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        tail = rest.split(end, 1)[1]
        text = head + section + tail
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    md_path.parent.mkdir(parents=True, exist_ok=True)
    md_path.write_text(text)


def finished_results(acfg: AblationConfig) -> list[dict[str, Any]]:
    """The final results of the arm/seed runs already finished under ``output_dir``."""
    out = []
    for seed in acfg.seeds:
        for arm in acfg.arms:
            path = seed_dir(acfg, arm.name, seed) / FINAL_EVAL
            if path.is_file():
                out.append(load_result(path))
    return out


def selected_arms(acfg: AblationConfig, only: list[str] | None) -> list[AblationArm]:
    """The arms named in ``only`` (all when None), in the config's order; an unknown name is a
    ConfigError listing the arms there are."""
    names = [a.name for a in acfg.arms]
    unknown = [n for n in only or [] if n not in names]
    if unknown:
        raise ConfigError(f"--arm {unknown[0]!r}: no such arm; the arms are {names}")
    return [a for a in acfg.arms if only is None or a.name in only]


def run_ablation(
    acfg: AblationConfig,
    command: str,
    console=None,
    train: bool = True,
    only: list[str] | None = None,
) -> list[dict[str, Any]]:
    """Every arm x seed (interleaved by seed so a noisy machine hits all arms alike), then the
    table. ``train=False`` (``ablate --report``) trains nothing: it tabulates the runs already
    finished, marked as partial when some are missing (the wall time is then their sum).
    ``only`` (``ablate --arm``) trains just those arms, so that two processes can share one
    experiment without racing for the same run; the table then holds every finished run. So
    does a process that found runs held by others: several processes may run one config at
    once, each training the runs no other holds (:func:`run_arm`)."""
    arms = selected_arms(acfg, only)
    elsewhere = 0  # runs another process held
    t0 = time.monotonic()
    out = Path(acfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    _sync_and_say(acfg, console)
    if train:
        base = base_result(acfg, console)
        results = []
        order = [(seed, arm) for seed in acfg.seeds for arm in arms]
        for k, (seed, arm) in enumerate(order, 1):
            if console is not None:
                console.rule(f"[bold]{arm.name} / seed {seed}[/] ({k} of {len(order)})")
            result = run_arm(acfg, arm, seed, console)
            if result is None:  # another process holds it
                elsewhere += 1
                continue
            results.append(result)
            _sync_and_say(acfg, console)
            if only is None:
                (out / "results.json").write_text(json.dumps(results, indent=2))
        if only is not None or elsewhere:  # the table is of every finished run, as --report's
            results = finished_results(acfg)
        if not results:  # every run is still being trained by other processes
            if console is not None:
                console.print(f"no run finished yet ({elsewhere} held by other processes)")
            return []
    else:
        base_path = out / BASE_EVAL
        base = json.loads(base_path.read_text()) if base_path.is_file() else None
        results = finished_results(acfg)
        if not results:
            raise ConfigError(f"ablate --report: no finished run under {out}")
    names = [a.name for a in acfg.arms if any(r["arm"] == a.name for r in results)]
    rows = summarize(results, names, acfg.reference_arm)
    (out / "summary.json").write_text(json.dumps(rows, indent=2))
    curves = finished_curves(acfg, names)
    plots = [plot_curves(acfg, curves, out / "heldout_vs_step.png")]
    analysis = None
    if acfg.report is not None:
        ref = acfg.reference_arm or names[0]
        analysis = step_analysis(curves, final_rates(results), ref, acfg.report, acfg.eval_every)
        (out / "step_analysis.json").write_text(json.dumps(asdict(analysis), indent=1))
        plots.append(plot_differences(analysis, out / "difference_vs_step.png"))
    whole = train and only is None and not elsewhere  # else wall time is the runs' sum
    wall = time.monotonic() - t0 if whole else sum(r.get("wall_s", 0.0) for r in results)
    done = (len(results), len(acfg.arms) * len(acfg.seeds))

    context = context_markdown(results, names)

    def render(paths: list[Path]) -> str:
        parts = [analysis_markdown(analysis, paths[1]) if analysis is not None else None, context]
        extra = "\n\n".join(p for p in parts if p is not None) or None
        return markdown_table(rows, acfg, command, wall, paths[0], base, done, extra)

    publish(acfg, out, plots, render)
    return rows


def _sync_and_say(acfg: AblationConfig, console) -> None:
    recorded, restored = sync_records(acfg)
    if console is not None and (recorded or restored):
        console.print(
            f"[dim]records in {acfg.records_dir}: {recorded} finished run(s) kept, "
            f"{restored} restored into {acfg.output_dir}"
        )


def finished_curves(acfg: AblationConfig, arms: list[str]) -> dict[str, dict[int, RunCurve]]:
    """The held-out curves and step times of the finished runs (with ``final_eval.json``) of
    ``arms``, by arm, then seed."""
    out: dict[str, dict[int, RunCurve]] = {}
    for arm in arms:
        for seed in acfg.seeds:
            run = arm_dir(acfg, arm) / f"seed{seed}"
            if (run / FINAL_EVAL).is_file():
                out.setdefault(arm, {})[seed] = RunCurve.read(run)
    return out


def publish(acfg: AblationConfig, out: Path, plots: list[Path], render) -> None:
    """Write the section, ``render(plot paths relative to the Markdown file)``, into
    ``out/results.md`` (the plots are beside it) and into ``results_md`` with each plot copied
    next to it as ``{section}_{plot name}``."""
    write_results(out / "results.md", render([Path(p.name) for p in plots]), acfg.section)
    if acfg.results_md:
        md = Path(acfg.results_md)
        md.parent.mkdir(parents=True, exist_ok=True)
        copies = []
        for plot in plots:
            copy = md.parent / f"{acfg.section}_{plot.name}"
            copy.write_bytes(plot.read_bytes())
            copies.append(Path(copy.name))
        write_results(md, render(copies), acfg.section)
