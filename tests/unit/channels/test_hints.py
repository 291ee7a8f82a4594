import pytest

from composer_replication.channels.hints import HintTemplates, build_hints, insert_hint
from composer_replication.envs.arithmetic import grade_answer


def _group(replies, expected=19):
    return replies, [grade_answer(r, expected) for r in replies]


def test_feedback_hint_for_failures_only():
    comps, results = _group(["19", "12 + 7 = 8", "no idea", "19"])
    hints = build_hints(comps, results, group_size=4, sources=["feedback"])
    assert hints[0] is None and hints[3] is None
    assert hints[1].source == "feedback" and "expected 19, got 8" in hints[1].text
    assert "no number" in hints[2].text


def test_sibling_hint_uses_best_passing_sibling_of_the_same_group():
    comps, results = _group(["12 + 7 = 19", "8", "19", "3"])
    comps2, results2 = _group(["5", "6", "7", "8"], expected=40)  # second group: nobody passed
    hints = build_hints(comps + comps2, results + results2, 4, sources=["sibling"])
    assert hints[1].source == "sibling" and hints[1].text.endswith(
        "\n19"
    )  # ties on reward: the concise one
    assert hints[3].text == hints[1].text
    assert all(h is None for h in hints[4:])  # no sibling succeeded, no other source


def test_sources_fall_through_in_order():
    comps, results = _group(["19", "8"])
    hints = build_hints(comps, results, 2, sources=["sibling", "feedback"])
    assert hints[1].source == "sibling"
    comps, results = _group(["7", "8"])
    hints = build_hints(comps, results, 2, sources=["sibling", "feedback"])
    assert [h.source for h in hints] == ["feedback", "feedback"]


def test_model_hint_is_called_with_prompt_completion_feedback():
    seen = []

    def hint_model(prompt, completion, feedback):
        seen.append((prompt, completion, feedback))
        return "carry the one"

    comps, results = _group(["8", "19"])
    hints = build_hints(
        comps,
        results,
        2,
        sources=["model"],
        prompts=["What is 12 + 7?"] * 2,
        hint_model=hint_model,
        templates=HintTemplates(model="Hint: {hint}"),
    )
    assert hints[0].text == "Hint: carry the one" and hints[1] is None
    assert seen == [("What is 12 + 7?", "8", "expected 19, got 8")]


def test_bad_arguments():
    comps, results = _group(["8", "19", "1"])
    with pytest.raises(ValueError, match="groups of 2"):
        build_hints(comps, results, 2)
    with pytest.raises(ValueError, match="unknown hint sources"):
        build_hints(comps[:2], results[:2], 2, sources=["oracle"])
    with pytest.raises(ValueError, match="hint_model"):
        build_hints(comps[:2], results[:2], 2, sources=["model"])


def test_insert_hint_goes_after_the_problem_in_the_last_user_turn():
    msgs = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "A1"},
        {"role": "user", "content": "Q2"},
    ]
    out = insert_hint(msgs, "HINT")
    assert out[3]["content"] == "Q2\n\nHINT"
    assert msgs[3]["content"] == "Q2"  # input untouched
    assert out[:3] == msgs[:3]
    with pytest.raises(ValueError, match="no user turn"):
        insert_hint([{"role": "system", "content": "S"}], "h")
