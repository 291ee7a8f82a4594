"""The hack telemetry's pure parts (envs/telemetry.py): invalid calls, questions, the
likely-fail / likely-pass split by the run's estimates."""

from __future__ import annotations

from composer_replication.envs.telemetry import ends_with_question, hack_metrics, invalid_calls


def _call(*names):
    return {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": n, "arguments": {}}}
                           for n in names]}  # fmt: skip


def _result(text):
    return {"role": "tool", "content": text}


def test_invalid_calls_counts_unknown_tools_and_error_results_not_cut_off_turns():
    messages = [
        _call("read_file", "nope"),
        _result("    1  x"),
        _result("{'error': 'x'}"),
        _call("run_tests"),
        _result("error: the path is bad"),
        _call("read_file"),
        _result("<tool_use_error>no</tool_use_error>"),
        _call("submit"),
    ]  # fmt: skip  (the last call has no result: cut off)
    assert invalid_calls(messages, ["read_file", "run_tests", "submit"]) == (3, 4)


def test_ends_with_question():
    assert ends_with_question([_call("read_file"), _result("x"),
                               {"role": "assistant", "content": "Which behaviour do you want?"}])  # fmt: skip
    assert ends_with_question([{"role": "assistant", "content": "Should I keep the old API."}])
    assert not ends_with_question([{"role": "assistant", "content": "Done."}])
    assert not ends_with_question([_call("submit"), _result("submitted")])


def test_invalid_call_rate_is_split_by_estimates_with_enough_rollouts():
    bad = [_call("nope"), _result("{'error': 'x'}")]
    good = [_call("submit"), _result("submitted")]
    estimates = {"hard": (0.1, 20), "easy": (0.9, 20), "new": (0.1, 2)}
    out = hack_metrics(["hard", "easy", "new"], [bad, good, bad], [{}, {}, {}], ["submit"],
                       estimates.__getitem__)  # fmt: skip
    assert out["env/hack/invalid_call_rate_likely_fail"] == 1.0  # "new" has too few rollouts
    assert out["env/hack/invalid_call_rate_likely_pass"] == 0.0
    assert out["env/hack/invalid_call_rate"] == 2 / 3
    no_split = hack_metrics(["new"], [bad], [{}], ["submit"], estimates.__getitem__)
    assert not any("likely" in k for k in no_split)
