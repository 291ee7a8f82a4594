"""The ablation runner end to end on a tiny random model saved to disk: every arm (ours and
TRL's SDPOTrainer peer) trains, is evaluated on the same held-out problems, and the table,
curves and markdown section are written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from composer_replication.config import AblationConfig, ConfigError, load_ablation_config
from composer_replication.run.ablation import markdown_table, run_ablation, summarize, write_results


@pytest.fixture
def tiny_dir(tmp_path, tokenizer, tiny_model):
    path = tmp_path / "tiny"
    tiny_model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_ablation_runs_every_arm_and_writes_results(tmp_path, tiny_dir):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(
        json.dumps({"prompt": "What is 1 + 1?", "chosen": "2", "rejected": "3"}) + "\n"
    )
    cfg_path = tmp_path / "ablation.yaml"
    cfg_path.write_text(
        yaml.safe_dump(
            {
                "base_config": "quickstart.yaml",
                "base_overrides": [
                    f"model.name={tiny_dir}",
                    "max_steps=2",
                    "generation.num_generations=2",
                    "generation.prompts_per_step=2",
                    "generation.max_completion_length=4",
                    "eval.n=6",
                    "eval.max_new_tokens=4",
                    "env.levels=[1]",
                    "env.num_train=8",
                ],
                "seeds": [0],
                "eval_every": 1,
                "eval_n_during": 4,
                "output_dir": str(tmp_path / "out"),
                "results_md": str(tmp_path / "docs" / "results.md"),
                "arms": [
                    {"name": "grpo"},
                    {
                        "name": "all",
                        "overrides": [
                            "alpha_sdpo=0.1",
                            "beta_replay=0.05",
                            f"replay.dataset={pairs}",
                        ],
                    },
                    {"name": "trl-sdpo", "trainer": "trl_sdpo", "overrides": ["sdpo.weight=0.1"]},
                ],
            }
        )
    )
    acfg = load_ablation_config(cfg_path)
    rows = run_ablation(acfg, "composer-replication ablate --config test.yaml")
    assert [r["arm"] for r in rows] == ["grpo", "all", "trl-sdpo"]
    assert all(r["n_heldout"] == 6 and 0.0 <= r["mean"] <= 1.0 for r in rows)
    for arm in ("grpo", "all", "trl-sdpo"):
        steps = [
            json.loads(x)["step"]
            for x in (tmp_path / "out" / arm / "seed0" / "heldout.jsonl").read_text().splitlines()
        ]
        assert steps == [0, 1, 2]
    md = (tmp_path / "docs" / "results.md").read_text()
    assert "| grpo |" in md and "| trl-sdpo |" in md
    assert (tmp_path / "docs" / "ablation_heldout_vs_step.png").stat().st_size > 5000
    metrics = (tmp_path / "out" / "all" / "seed0" / "metrics.jsonl").read_text()
    assert "sdpo/active" in metrics and "replay/loss" in metrics
    assert "| base (untrained) |" in md
    assert f"evaluated with the first arm's settings (`{acfg.arms[0].name}`)" in md
    run_md = (tmp_path / "out" / "results.md").read_text()  # always written in the run dir
    assert "| grpo |" in run_md and "heldout_vs_step.png" in run_md
    assert not list((tmp_path / "out").glob("*/seed0/checkpoint-*"))  # not kept by default

    # an interrupted ablation resumes: finished arm/seeds are reused, not retrained
    first = (tmp_path / "out" / "grpo" / "seed0" / "final_eval.json").read_text()
    (tmp_path / "out" / "all" / "seed0" / "final_eval.json").unlink()
    rows2 = run_ablation(acfg, "composer-replication ablate --config test.yaml")
    assert (tmp_path / "out" / "grpo" / "seed0" / "final_eval.json").read_text() == first
    assert (tmp_path / "out" / "all" / "seed0" / "final_eval.json").is_file()
    assert [r["arm"] for r in rows2] == ["grpo", "all", "trl-sdpo"]

    # a finished run is reused only for the config it was trained with
    edited = acfg.model_copy(deep=True)
    edited.arms[0].overrides.append("optim.learning_rate=3e-5")
    with pytest.raises(ConfigError, match=r"optim.learning_rate: 1e-05 -> 3e-05"):
        run_ablation(edited, "composer-replication ablate --config test.yaml")


def test_summary_t_interval_hand_worked():
    """Three seeds 0.2, 0.3, 0.4: mean 0.3, sd 0.1, half-width 4.303 * 0.1 / sqrt(3) = 0.2484."""
    results = [
        {"arm": "a", "seed": s, "pass_rate": p, "n": 10, "mean_reward": 0.0, "wall_s": 1.0}
        for s, p in enumerate((0.2, 0.3, 0.4))
    ]
    (row,) = summarize(results, ["a"])
    assert row["mean"] == pytest.approx(0.3)
    assert row["ci95_high"] - row["mean"] == pytest.approx(0.2484, abs=1e-4)


def test_summary_clips_interval_and_pairs_arms_by_seed():
    """Seeds (0.1, 0.9) for arm a: mean 0.5, half-width 12.706 * 0.566 / sqrt(2) = 5.08, clipped
    to [0, 1]; arm b (0.3, 0.8) minus a on the same seeds: +0.2, -0.1."""
    results = [
        {"arm": arm, "seed": s, "pass_rate": p, "n": 10, "mean_reward": 0.0, "wall_s": 1.0}
        for arm, ps in (("a", (0.1, 0.9)), ("b", (0.3, 0.8)))
        for s, p in enumerate(ps)
    ]
    a, b = summarize(results, ["a", "b"])
    assert (a["ci95_low"], a["ci95_high"]) == (0.0, 1.0)
    assert b["vs_first"] == pytest.approx([0.2, -0.1])


def test_summary_per_seed_columns_line_up_by_seed():
    """Runs listed seed 3 before seed 1 (a config with ``seeds: [3, 1]``), and the reference
    has no run of seed 2: every per-seed cell of a row is in seed order (1, 2, 3) and the
    unpaired seed shows "-" in the differences, so each difference sits under its own seed.
    b minus a: seed 1 0.5 - 0.2 = +30.0%, seed 3 0.6 - 0.4 = +20.0%."""

    def run(arm, seed, rate, flat):
        return {"arm": arm, "seed": seed, "pass_rate": rate, "n": 10, "mean_reward": rate,
                "wall_s": 1.0, "first_rewarded_step": seed, "flat_steps": flat}  # fmt: skip

    results = [run("a", 3, 0.4, 30), run("b", 3, 0.6, 33), run("a", 1, 0.2, 10),
               run("b", 1, 0.5, 11), run("b", 2, 0.9, 22)]  # fmt: skip
    a, b = summarize(results, ["a", "b"])
    assert a["per_seed"] == [0.2, 0.4] and b["per_seed"] == [0.5, 0.9, 0.6]
    assert b["flat_steps"] == [11, 22, 33] and b["first_rewarded"] == ["1", "2", "3"]
    assert b["vs_first"] == pytest.approx([0.3, 0.2])
    assert b["vs_first_per_seed"][1] is None
    acfg = AblationConfig(arms=[{"name": "a"}, {"name": "b"}], seeds=[3, 1, 2])
    table = markdown_table([a, b], acfg, "cmd", 1.0, Path("p.png"))
    row = next(line for line in table.splitlines() if line.startswith("| b |"))
    assert "| 50.0%, 90.0%, 60.0% | +30.0%, -, +20.0% |" in row
    assert "| 11, 22, 33 |" in row


def test_paired_difference_interval_against_the_reference_arm():
    """Arm b minus reference a over 5 seeds: +0.1, +0.2, 0.0, +0.1, +0.1 -> mean 0.1, sd 0.0707,
    half-width 2.776 * 0.0707 / sqrt(5) = 0.0878; the reference arm need not be first."""
    a = (0.3, 0.2, 0.5, 0.4, 0.3)
    b = (0.4, 0.4, 0.5, 0.5, 0.4)
    results = [
        {"arm": arm, "seed": s, "pass_rate": p, "n": 10, "mean_reward": 0.0, "wall_s": 1.0}
        for arm, ps in (("b", b), ("a", a))
        for s, p in enumerate(ps)
    ]
    rb, ra = summarize(results, ["b", "a"], reference="a")
    assert rb["paired_mean"] == pytest.approx(0.1)
    lo, hi = rb["paired_ci95"]
    assert hi - rb["paired_mean"] == pytest.approx(0.0878, abs=1e-4)
    assert lo == pytest.approx(0.1 - 0.0878, abs=1e-4)
    assert ra["paired_mean"] == 0.0


def test_learning_rate_pick_follows_the_preregistered_rule():
    from composer_replication.run.ablation import pick_learning_rates

    rows = [
        {"arm": "grpo lr=5.0e-6", "mean": 0.90},
        {"arm": "grpo lr=1.0e-5", "mean": 0.95},
        {"arm": "grpo lr=2.0e-5", "mean": 0.93},
        {"arm": "grpo+sdpo lr=5.0e-6", "mean": 0.80},  # tie with 2e-5: 5e-6 and 2e-5 are
        {"arm": "grpo+sdpo lr=2.0e-5", "mean": 0.80},  # equally far from 1e-5 in log scale,
        {"arm": "grpo+sdpo lr=4.0e-6", "mean": 0.70},
        {"arm": "peer lr=3.0e-5", "mean": 0.5},
        {"arm": "peer lr=8.0e-6", "mean": 0.5},  # closer to 1e-5 than 3e-5: picked
    ]
    picks = pick_learning_rates(rows)
    assert picks["grpo"] == 1e-5 and picks["peer"] == 8e-6
    assert picks["grpo+sdpo"] in (5e-6, 2e-5)
    with pytest.raises(ValueError, match="lr=<rate>"):
        pick_learning_rates([{"arm": "grpo", "mean": 1.0}])


def test_ablation_config_refuses_an_unknown_reference_and_duplicate_arms():
    from pydantic import ValidationError

    from composer_replication.config import AblationConfig

    with pytest.raises(ValidationError, match="reference_arm 'x' is not an arm"):
        AblationConfig(arms=[{"name": "a"}], reference_arm="x")
    with pytest.raises(ValidationError, match="unique"):
        AblationConfig(arms=[{"name": "a"}, {"name": "a"}])


def test_two_experiments_share_one_results_file(tmp_path):
    md = tmp_path / "results.md"
    write_results(md, "<!-- one:begin -->\nA\n<!-- one:end -->", "one")
    write_results(md, "<!-- two:begin -->\nB\n<!-- two:end -->", "two")
    write_results(md, "<!-- one:begin -->\nC\n<!-- one:end -->", "one")
    text = md.read_text()
    assert "\nA\n" not in text and "C" in text and "B" in text


def test_results_section_is_replaced_not_duplicated(tmp_path):
    md = tmp_path / "results.md"
    md.write_text("# Results\n\nquickstart numbers\n")
    write_results(md, "<!-- ablation:begin -->\nA\n<!-- ablation:end -->")
    write_results(md, "<!-- ablation:begin -->\nB\n<!-- ablation:end -->")
    text = md.read_text()
    assert "quickstart numbers" in text and "B" in text and "\nA\n" not in text
    assert text.count("ablation:begin") == 1


def test_trl_peer_takes_its_sdpo_settings_from_the_run_config():
    """Non-default settings of ours arrive in TRL's SDPOConfig (built, not trained)."""
    import os

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from trl.experimental.sdpo import SDPOConfig

    from composer_replication.config import load_config
    from composer_replication.run.ablation import trl_sdpo_kwargs

    cfg = load_config(None, ["sdpo.weight=0.25", "sdpo.loss.beta=0.3", "sdpo.teacher=ema",
                             "sdpo.ema_decay=0.9", "sdpo.hint_sources=[feedback]"])  # fmt: skip
    kw = trl_sdpo_kwargs(cfg)
    args = SDPOConfig(output_dir="/tmp/x", **kw, report_to="none", use_cpu=True)
    assert args.distillation_weight == pytest.approx(0.2)  # 0.25 / 1.25
    assert args.distillation_mode == "full_logits" and args.distillation_alpha == 0.3
    assert args.teacher_model_kind == "ema" and args.teacher_update_rate == pytest.approx(0.1)
    assert args.include_environment_feedback and not args.use_successful_as_teacher
    assert "{feedback_raw}" in args.feedback_template
    assert "{successful_previous_attempt}" in args.solution_template
    initial = trl_sdpo_kwargs(load_config(None, ["sdpo.weight=0.1", "sdpo.teacher=initial"]))
    assert initial["teacher_model_kind"] == "base" and initial["use_successful_as_teacher"]

    with pytest.raises(ConfigError, match="per prompt"):
        trl_sdpo_kwargs(load_config(None, ["sdpo.weight=0.1", "sdpo.feedback_form=direction"]))
    with pytest.raises(ConfigError, match="routing"):
        trl_sdpo_kwargs(load_config(None, ["sdpo.weight=0.1", "sdpo.route_failures=true"]))
    with pytest.raises(ConfigError, match="contrast"):
        trl_sdpo_kwargs(load_config(None, ["sdpo.weight=0.1", "sdpo.contrast=placebo"]))


def test_peer_arm_without_a_distillation_weight_is_refused(tmp_path):
    from composer_replication.config import AblationArm, AblationConfig, ConfigError
    from composer_replication.run.ablation import arm_config

    acfg = AblationConfig(arms=[AblationArm(name="peer", trainer="trl_sdpo")],
                          output_dir=str(tmp_path))  # fmt: skip
    with pytest.raises(ConfigError, match="sdpo.weight, which is 0"):
        arm_config(acfg, acfg.arms[0], 0)


def test_docs_show_the_mapping_table():
    from composer_replication.run.ablation import trl_sdpo_mapping_markdown

    docs = (Path(__file__).resolve().parents[3] / "docs" / "results.md").read_text()
    assert trl_sdpo_mapping_markdown() in docs


def test_heldout_curve_of_a_tool_env_uses_the_runs_rollout_budget(tmp_path, monkeypatch):
    """The score-vs-step points of an agent run are episodes under the run's rollout budget,
    like its final evaluation (not evaluate()'s defaults)."""
    import composer_replication.evaluation as evaluation
    from composer_replication.trainer.callbacks import HeldoutEvalCallback

    seen = {}

    class Res:
        pass_rate, mean_reward, n = 0.5, 0.5, 2

        def pass_ci(self):
            return 0.1, 0.9

    def fake_evaluate(*args, **kwargs):
        seen.update(kwargs)
        return Res()

    monkeypatch.setattr(evaluation, "evaluate", fake_evaluate)
    cb = HeldoutEvalCallback(tmp_path, None, None, 5, 2, 48, 8, max_turns=2, max_tool_calls=1)

    class Model:
        training = True

        def train(self, mode):
            self.training = mode

    cb._eval(Model(), 0)
    assert (seen["max_turns"], seen["max_tool_calls"]) == (2, 1)
    assert json.loads((tmp_path / "heldout.jsonl").read_text())["pass_rate"] == 0.5


def test_report_tabulates_the_finished_runs_without_training(tmp_path):
    """`ablate --report` on a half-done experiment: the finished arm/seeds only, marked as
    partial; nothing trains (a killed run without final_eval.json is not counted)."""
    from typer.testing import CliRunner

    from composer_replication.cli import app

    out, md = tmp_path / "out", tmp_path / "results.md"
    cfg_path = tmp_path / "a.yaml"
    cfg_path.write_text(yaml.safe_dump({
        "seeds": [1, 2], "output_dir": str(out), "results_md": str(md), "section": "ev",
        "arms": [{"name": "grpo"}, {"name": "sd", "overrides": ["sdpo.weight=0.1"]}],
    }))  # fmt: skip
    finished = {("grpo", 1): 0.5, ("grpo", 2): 0.7, ("sd", 1): 0.6}
    for (arm, seed), rate in finished.items():
        run = out / arm / f"seed{seed}"
        run.mkdir(parents=True)
        res = {"arm": arm, "seed": seed, "pass_rate": rate, "n": 10, "mean_reward": rate,
               "wall_s": 60.0}  # fmt: skip
        (run / "final_eval.json").write_text(json.dumps(res))
        (run / "heldout.jsonl").write_text(json.dumps({"step": 0, "pass_rate": rate}) + "\n")
    killed = out / "sd" / "seed2"
    killed.mkdir(parents=True)
    (killed / "heldout.jsonl").write_text(json.dumps({"step": 0, "pass_rate": 0.0}) + "\n")
    r = CliRunner().invoke(app, ["ablate", "--config", str(cfg_path), "--report"])
    assert r.exit_code == 0, r.output
    text = md.read_text()
    assert "(in progress: 3 of 4 runs finished)" in text
    assert "sum of the finished runs' wall times 3.0 min" in text
    assert "| sd | 60.0% (1 seed) | 60.0% | +10.0% | +10.0% (1 seed) |" in text
    assert "| grpo | 60.0% [0.0%, 100.0%] | 50.0%, 70.0% |" in text  # 12.706 * 0.1 clipped
    empty = tmp_path / "b.yaml"
    empty.write_text(cfg_path.read_text().replace(str(out), str(tmp_path / "none")))
    r = CliRunner().invoke(app, ["ablate", "--config", str(empty), "--report"])
    assert r.exit_code != 0 and "no finished run" in r.output


def test_arm_option_trains_only_the_named_arms(tmp_path, monkeypatch):
    """`ablate --arm sd`: only `sd` trains; the table holds every finished run (here the
    earlier `grpo` one too); an unknown arm is refused with the names there are."""
    from typer.testing import CliRunner

    from composer_replication.cli import app
    from composer_replication.run import ablation

    out, md = tmp_path / "out", tmp_path / "results.md"
    cfg_path = tmp_path / "a.yaml"
    cfg_path.write_text(yaml.safe_dump({
        "seeds": [1], "output_dir": str(out), "results_md": str(md), "section": "ev",
        "arms": [{"name": "grpo"}, {"name": "sd", "overrides": ["sdpo.weight=0.1"]},
                 {"name": "other", "overrides": ["sdpo.weight=0.2"]}],
    }))  # fmt: skip
    trained = []

    def fake_run_arm(acfg, arm, seed, console=None):  # records the call, writes a result
        trained.append(arm.name)
        res = {"arm": arm.name, "seed": seed, "pass_rate": 0.25, "n": 8, "mean_reward": 0.25,
               "wall_s": 30.0}  # fmt: skip
        run = out / arm.name / f"seed{seed}"
        run.mkdir(parents=True)
        (run / "final_eval.json").write_text(json.dumps(res))
        (run / "heldout.jsonl").write_text(json.dumps({"step": 0, "pass_rate": 0.25}) + "\n")
        return res

    monkeypatch.setattr(ablation, "run_arm", fake_run_arm)
    monkeypatch.setattr(ablation, "base_result", lambda acfg, console=None: None)
    acfg = load_ablation_config(cfg_path)
    fake_run_arm(acfg, acfg.arms[0], 1)  # grpo finished earlier
    trained.clear()
    r = CliRunner().invoke(app, ["ablate", "--config", str(cfg_path), "--arm", "sd"])
    assert r.exit_code == 0, r.output
    assert trained == ["sd"]
    text = md.read_text()
    assert "(in progress: 2 of 3 runs finished)" in text
    assert "| grpo |" in text and "| sd |" in text and "| other |" not in text
    r = CliRunner().invoke(app, ["ablate", "--config", str(cfg_path), "--arm", "nope"])
    assert r.exit_code != 0 and "'nope': no such arm" in r.output and "'other'" in r.output
    assert trained == ["sd"]


def test_training_signal_reads_both_trainers_metrics(tmp_path):
    """Rewards 0, 0, 0.25, 0 -> mean 0.0625, first rewarded step 3 (our trainer's ``reward``);
    TRL SDPOTrainer's ``self_distillation/reward_mean`` the same way; all-zero -> None (never);
    no metrics.jsonl -> nothing known. Flat steps count the steps whose every group was flat
    (fraction 1.0, in either trainer's key); 0.5 (one of two groups) is not flat."""
    from composer_replication.run.ablation import training_signal

    def write(name, key, rewards, flat_key=None, flat=()):
        run = tmp_path / name
        run.mkdir()
        rows = [{"step": i + 1, key: r, "loss": 0.0} for i, r in enumerate(rewards)]
        for row, f in zip(rows, flat, strict=False):  # no flat key: no rows touched
            row[flat_key] = f
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return run

    ours = training_signal(
        write("ours", "reward", [0.0, 0.0, 0.25, 0.0], "frac_reward_zero_std", [1, 1.0, 0.5, 1])
    )
    assert ours == {"train_reward": pytest.approx(0.0625), "first_rewarded_step": 3,
                    "flat_steps": 3}  # fmt: skip
    trl = training_signal(write("trl", "self_distillation/reward_mean", [0.0, 0.5],
                                "self_distillation/flat_group_fraction", [1.0, 0.0]))  # fmt: skip
    assert trl == {"train_reward": pytest.approx(0.25), "first_rewarded_step": 2, "flat_steps": 1}
    never = training_signal(write("never", "reward", [0.0, 0.0]))
    assert never == {"train_reward": 0.0, "first_rewarded_step": None}  # no flat key logged
    assert training_signal(tmp_path / "missing") == {}


def test_report_shows_each_seeds_training_signal(tmp_path):
    """The table gives the mean training reward over steps and, per seed, the first rewarded
    step: "never" for a seed whose rollouts were never rewarded, "-" where no metrics exist."""
    from composer_replication.run.ablation import run_ablation

    out = tmp_path / "out"
    acfg = AblationConfig.model_validate(
        {"seeds": [1, 2, 3], "output_dir": str(out), "section": "ev", "arms": [{"name": "a"}]}
    )
    for seed, rewards in ((1, [0.0, 0.5]), (2, [0.0, 0.0]), (3, None)):
        run = out / "a" / f"seed{seed}"
        run.mkdir(parents=True)
        res = {"arm": "a", "seed": seed, "pass_rate": 0.5, "n": 10, "mean_reward": 0.5,
               "wall_s": 60.0}  # fmt: skip
        (run / "final_eval.json").write_text(json.dumps(res))
        if rewards is not None:
            rows = [{"step": i + 1, "reward": r, "frac_reward_zero_std": float(r == 0)}
                    for i, r in enumerate(rewards)]  # fmt: skip
            (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run_ablation(acfg, "ablate --report", train=False)
    text = (out / "results.md").read_text()
    # (0.25 + 0.0) / 2 seeds known; seed 1 had one flat step, seed 2 two, seed 3 no metrics
    assert "| 0.500 | 0.125 | 2, never, - | 1, 2, - | 60 |" in text


def test_arm_directories_need_no_quoting():
    from composer_replication.run.ablation import arm_dir

    acfg = AblationConfig(arms=[{"name": "a"}], output_dir="o")
    assert arm_dir(acfg, "trl-sdpo (peer)") == Path("o/trl-sdpo-peer")
    assert arm_dir(acfg, "grpo+sdpo routed lr=1.0e-5") == Path("o/grpo+sdpo-routed-lr=1.0e-5")


def _finish_fake_run(acfg, arm, seed, rate: float) -> Path:
    """Write what a finished run leaves (its real config, results, metrics, a checkpoint)."""
    from composer_replication.config import dump_config
    from composer_replication.run.ablation import arm_config, seed_dir

    run = seed_dir(acfg, arm.name, seed)
    (run / "checkpoint-3").mkdir(parents=True)
    (run / "checkpoint-3" / "model.safetensors").write_bytes(b"weights")
    (run / "config.yaml").write_text(dump_config(arm_config(acfg, arm, seed)))
    (run / "heldout.jsonl").write_text(json.dumps({"step": 0, "pass_rate": rate}) + "\n")
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward": rate}) + "\n")
    res = {"arm": arm.name, "seed": seed, "pass_rate": rate, "n": 10, "mean_reward": rate,
           "wall_s": 60.0}  # fmt: skip
    (run / "final_eval.json").write_text(json.dumps(res))
    return run


def test_records_dir_keeps_finished_runs_and_a_fresh_clone_resumes_from_them(tmp_path, monkeypatch):
    """With ``records_dir`` a finished run's small files (no weights) are copied there as soon
    as it finishes; from an empty ``output_dir`` (a fresh clone), ``ablate`` restores them,
    reuses those runs (only the missing one trains) and the report holds them all; a record
    replaces an unfinished attempt of the same run."""
    from typer.testing import CliRunner

    from composer_replication.cli import app
    from composer_replication.run import ablation

    out, rec, md = tmp_path / "out", tmp_path / "records", tmp_path / "results.md"
    cfg_path = tmp_path / "a.yaml"
    cfg_path.write_text(yaml.safe_dump({
        "seeds": [1], "output_dir": str(out), "records_dir": str(rec), "results_md": str(md),
        "section": "ev",
        "arms": [{"name": "grpo"}, {"name": "sd", "overrides": ["sdpo.weight=0.1"]}],
    }))  # fmt: skip
    acfg = load_ablation_config(cfg_path)
    first = _finish_fake_run(acfg, acfg.arms[0], 1, 0.5)
    base = {"arm": "base (untrained)", "n": 10, "pass_rate": 0.1, "pass_ci95_low": 0.0,
            "pass_ci95_high": 0.4, "mean_reward": 0.1}  # fmt: skip
    (out / "base_eval.json").write_text(json.dumps(base))
    r = CliRunner().invoke(app, ["ablate", "--config", str(cfg_path), "--report"])
    assert r.exit_code == 0, r.output
    kept = rec / "grpo" / "seed1"
    assert sorted(p.name for p in kept.iterdir()) == [
        "config.yaml", "final_eval.json", "heldout.jsonl", "metrics.jsonl"]  # fmt: skip
    assert (kept / "config.yaml").read_bytes() == (first / "config.yaml").read_bytes()
    assert (rec / "base_eval.json").is_file()

    trained = []

    def fake_train_arm(acfg, arm, seed, cfg, console):  # the real run_arm, training faked
        trained.append(arm.name)
        _finish_fake_run(acfg, arm, seed, 0.75)
        return ablation.load_result(Path(cfg.output_dir, "final_eval.json"))

    monkeypatch.setattr(ablation, "_train_arm", fake_train_arm)
    monkeypatch.setattr(ablation, "base_result", lambda acfg, console=None: None)
    import shutil

    shutil.rmtree(out)  # a fresh clone: only the records are there
    (out / "sd" / "seed1").mkdir(parents=True)  # ... and an unfinished attempt of `sd`
    (out / "sd" / "seed1" / "metrics.jsonl").write_text("{}\n")
    r = CliRunner().invoke(app, ["ablate", "--config", str(cfg_path)])
    assert r.exit_code == 0, r.output
    assert trained == ["sd"]  # grpo was restored and reused, not trained again
    assert (out / "grpo" / "seed1" / "final_eval.json").is_file()
    assert json.loads((rec / "sd" / "seed1" / "final_eval.json").read_text())["pass_rate"] == 0.75
    assert not (rec / "sd" / "seed1" / "checkpoint-3").exists()
    text = md.read_text()
    assert "| grpo |" in text and "| sd |" in text and "in progress" not in text
    assert json.loads((out / "base_eval.json").read_text()) == base  # restored too
    r = CliRunner().invoke(app, ["ablate", "--config", str(cfg_path), "--report"])
    assert r.exit_code == 0, r.output
    assert "| base (untrained) | 10.0%" in md.read_text()

    shutil.rmtree(out / "sd")  # an unfinished attempt beside a record: the record wins
    (out / "sd" / "seed1").mkdir(parents=True)
    (out / "sd" / "seed1" / "metrics.jsonl").write_text("{}\n")
    assert ablation.sync_records(acfg) == (0, 1)
    assert (out / "sd" / "seed1" / "metrics.jsonl").read_text() == json.dumps(
        {"step": 1, "reward": 0.75}) + "\n"  # fmt: skip


def test_records_dir_must_not_be_the_output_dir(tmp_path):
    with pytest.raises(ValueError, match="records_dir is output_dir"):
        AblationConfig.model_validate(
            {
                "output_dir": str(tmp_path / "o"),
                "records_dir": str(tmp_path / "o" / "."),
                "arms": [{"name": "a"}],
            }  # fmt: skip
        )
