"""The training-curves PNG: the held-out markers draw for every score, the degenerate ones
included (a run that scores exactly 0 or 1 once ended in matplotlib's "'yerr' must not contain
negative values")."""

import json

import orjson
import pytest

from composer_replication.evaluation import EvalResult
from composer_replication.trainer.callbacks import EVAL_FILE, METRICS_FILE, plot_metrics


def _summary(passed: list[bool]) -> dict:
    return EvalResult(
        "arithmetic", "heldout", [str(i) for i in range(len(passed))], passed,
        [float(p) for p in passed],
    ).summary()  # fmt: skip


def _run_dir(tmp_path, base: dict, trained: dict):
    rows = [{"step": s, "reward": 0.1 * s, "loss": 0.01} for s in (1, 2)]
    (tmp_path / METRICS_FILE).write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    (tmp_path / EVAL_FILE).write_text(json.dumps({"base": base, "trained": trained}))
    return tmp_path / METRICS_FILE


@pytest.mark.parametrize(
    ("base", "trained"),
    [
        ([False] * 3, [False] * 3),  # 0 of 3: the lower bound came out 5.6e-17 above 0
        ([True] * 50, [True] * 50),  # exactly 1
        ([False] * 200, [True] * 200),  # 0 -> 1
        ([True] + [False] * 199, [True] * 199 + [False]),  # one from each end
    ],
)
def test_plot_draws_heldout_scores_of_exactly_0_and_1(tmp_path, base, trained):
    png = plot_metrics(_run_dir(tmp_path, _summary(base), _summary(trained)))
    assert png is not None and png.stat().st_size > 1000


def test_plot_tolerates_an_interval_that_misses_its_rate(tmp_path):
    """An eval.json written before the interval was clamped (lower bound 2.8e-17 above a 0.0
    rate, as in the failing Feature Deletion run) still draws."""
    s = _summary([False] * 10) | {"pass_ci95_low": 2.8e-17}
    t = _summary([True] * 10) | {"pass_ci95_high": 1.0 - 1e-16}
    png = plot_metrics(_run_dir(tmp_path, s, t))
    assert png is not None and png.stat().st_size > 1000


def test_step_lines_name_step_reward_loss_seconds_and_eta():
    from transformers import TrainerState

    from composer_replication.trainer.callbacks import StepLineCallback

    lines: list[str] = []
    cb = StepLineCallback(lines.append)
    state = TrainerState(global_step=10, max_steps=14)  # resumed at step 10
    cb.on_train_begin(None, state, None)
    for step in (11, 12):
        state.global_step = step
        cb.on_log(None, state, None, logs={"reward": 0.25, "loss": 0.0123})
    cb.on_log(None, state, None, logs={"train_runtime": 3.0})  # the summary record: no line
    assert [line.split("  ")[:3] for line in lines] == [
        ["step 11/14", "reward 0.250", "loss 0.0123"],
        ["step 12/14", "reward 0.250", "loss 0.0123"],
    ]
    assert all(line.split("  ")[3].endswith(" s") for line in lines)
    assert all(line.split("  ")[4].startswith("ETA ") for line in lines)


def test_heldout_rows_after_a_resumed_checkpoint_are_dropped_and_a_restart_starts_over(
    tmp_path, monkeypatch
):
    """Resumed at step 2: rows 3 and 4 of the killed attempt go, 0-2 stay, nothing is
    evaluated; started over (step 0): the earlier attempt's rows all go and step 0 is
    evaluated once."""
    from types import SimpleNamespace

    from composer_replication import evaluation
    from composer_replication.trainer.callbacks import HeldoutEvalCallback

    calls = []

    def fake_evaluate(*args, **kwargs):
        calls.append(1)
        return EvalResult("arithmetic", "heldout", ["0", "1"], [True, False], [1.0, 0.0])

    monkeypatch.setattr(evaluation, "evaluate", fake_evaluate)
    cb = HeldoutEvalCallback(tmp_path, None, None, 1, 2, 4, 2, max_turns=1, max_tool_calls=0)
    earlier = b"".join(orjson.dumps({"step": s, "pass_rate": 0.1 * s}) + b"\n" for s in range(5))
    model = SimpleNamespace(training=True, train=lambda mode: None)

    cb.path.write_bytes(earlier)
    cb.on_train_begin(
        None, SimpleNamespace(global_step=2, is_world_process_zero=True), None, model=model
    )
    assert [r["step"] for r in map(orjson.loads, cb.path.read_bytes().splitlines())] == [0, 1, 2]
    assert calls == []

    cb.path.write_bytes(earlier)
    cb.on_train_begin(
        None, SimpleNamespace(global_step=0, is_world_process_zero=True), None, model=model
    )
    rows = [orjson.loads(x) for x in cb.path.read_bytes().splitlines()]
    assert [(r["step"], r["pass_rate"]) for r in rows] == [(0, 0.5)] and calls == [1]


def test_resumed_metrics_and_episode_logs_keep_one_history(tmp_path):
    """Resumed at step 2: metrics.jsonl and episodes.jsonl lose the killed attempt's steps 3-4
    (an episode line without a step, from before steps were logged, stays), and the next row's
    ``time/elapsed_s`` goes on from the kept row's 20 s instead of restarting at 0."""
    from types import SimpleNamespace

    from composer_replication.trainer.callbacks import EPISODES_FILE, MetricsJsonlCallback

    def write(name, rows):
        (tmp_path / name).write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))

    write(METRICS_FILE, [{"step": s, "time/elapsed_s": 10.0 * s} for s in (1, 2, 3, 4)])
    write(EPISODES_FILE, [{"task_id": "old"}, *({"step": s, "task_id": str(s)} for s in (1, 3))])
    cb = MetricsJsonlCallback(tmp_path)
    state = SimpleNamespace(global_step=2, is_world_process_zero=True)
    cb.on_train_begin(None, state, None)
    cb.on_log(None, SimpleNamespace(global_step=3, is_world_process_zero=True), None,
              logs={"loss": 0.5})  # fmt: skip
    rows = [orjson.loads(x) for x in (tmp_path / METRICS_FILE).read_bytes().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[2]["time/elapsed_s"] >= 20.0
    episodes = [orjson.loads(x) for x in (tmp_path / EPISODES_FILE).read_bytes().splitlines()]
    assert [e["task_id"] for e in episodes] == ["old", "1"]


def test_a_row_cut_short_by_a_kill_is_dropped_and_the_run_resumes(tmp_path):
    """The process was killed while appending step 3's row: its last line has no newline and is
    not JSON. Before, every reader (resume's ``on_train_begin``, the Ctrl-C summary, ``ablate``)
    died on it with a JSONDecodeError, so the run could not be resumed; now that torn row is
    left out, the rows before it are kept, and the resume rewrites the file whole."""
    from types import SimpleNamespace

    from composer_replication.trainer.callbacks import MetricsJsonlCallback, read_metrics

    path = tmp_path / METRICS_FILE
    path.write_bytes(b'{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.4}\n{"step": 3, "lo')
    assert [r["step"] for r in read_metrics(path)] == [1, 2]
    cb = MetricsJsonlCallback(tmp_path)
    cb.on_train_begin(None, SimpleNamespace(global_step=2, is_world_process_zero=True), None)
    cb.on_log(None, SimpleNamespace(global_step=3, is_world_process_zero=True), None,
              logs={"loss": 0.3})  # fmt: skip
    assert [r["step"] for r in read_metrics(path)] == [1, 2, 3]


@pytest.mark.parametrize(
    "text, where",
    [
        (b'{"step": 1}\n{"step": 2, "lo\n{"step": 3}\n', ":2: not a JSON object"),
        (b'{"step": 1}\n[2]\n', ":2: not a JSON object"),
        (b'{"step": 1}\n\xff\xfe\n', ":2: not a JSON object"),
    ],
)
def test_a_damaged_row_inside_the_file_names_its_line(tmp_path, text, where):
    """A bad line with rows after it is not a kill's torn write: an error naming file:line."""
    from composer_replication.config import UserError
    from composer_replication.trainer.callbacks import read_metrics

    path = tmp_path / METRICS_FILE
    path.write_bytes(text)
    with pytest.raises(UserError, match=f"^{path}{where}"):
        read_metrics(path)


def test_sampler_metrics_get_the_task_mix_panel(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    made = []
    subplots = plt.subplots
    monkeypatch.setattr(plt, "subplots", lambda *a, **k: made.append(subplots(*a, **k)) or made[-1])
    rows = [{"step": s, "reward": 0.1, "loss": 0.0, "sampler/signal_frac": 0.2 * s,
             "sampler/sampled_pass_rate_mean": 0.5, "sampler/retired_frac": 0.1} for s in (1, 2)]  # fmt: skip
    (tmp_path / METRICS_FILE).write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    assert plot_metrics(tmp_path / METRICS_FILE) is not None
    panel = next(ax for ax in made[0][1] if ax.get_title() == "task mix (data.sampler)")
    labels = {line.get_label() for line in panel.get_lines()}
    assert labels == {"sampler/signal_frac", "sampler/sampled_pass_rate_mean",
                      "sampler/retired_frac"}  # fmt: skip


def test_machine_failures_get_a_panel_only_when_the_machine_failed(tmp_path):
    from composer_replication.trainer.callbacks import infra_keys

    quiet = [{"step": 1, "env/infra_failed_frac": 0.0, "env/infra_failed/sandbox_start": 0.0}]
    assert infra_keys(quiet) == []
    rows = quiet + [{"step": 2, "env/infra_failed_frac": 0.5,
                     "env/infra_failed/sandbox_start": 0.0, "env/infra_failed/slot_timeout": 2.0}]  # fmt: skip
    assert infra_keys(rows) == ["env/infra_failed_frac", "env/infra_failed/slot_timeout"]


def test_hack_metrics_get_their_panel(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    made = []
    subplots = plt.subplots
    monkeypatch.setattr(plt, "subplots", lambda *a, **k: made.append(subplots(*a, **k)) or made[-1])
    rows = [{"step": s, "reward": 0.1, "loss": 0.0, "env/hack/cache_read_frac": 0.1 * s,
             "env/hack/invalid_call_rate_likely_fail": 0.5} for s in (1, 2)]  # fmt: skip
    (tmp_path / METRICS_FILE).write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    assert plot_metrics(tmp_path / METRICS_FILE) is not None
    panel = next(ax for ax in made[0][1] if ax.get_title() == "hack telemetry (per step)")
    labels = {line.get_label() for line in panel.get_lines()}
    assert labels == {"env/hack/cache_read_frac", "env/hack/invalid_call_rate_likely_fail"}
