import json

import numpy as np
import pytest

from streamrl.rewards import exact_match, get_reward, numeric, prefix_match
from streamrl.spec import TaskSpec
from streamrl.tasks import PromptCursor, addition_prompts, counting_prompts, jsonl_prompts, load_prompts


@pytest.mark.parametrize("make", [counting_prompts, addition_prompts])
def test_builtin_tasks_have_long_tailed_answer_lengths(make):
    lengths = np.array([len(p.answer) + 1 for p in make(4000, seed=3)])  # + EOS, char tokens
    assert np.percentile(lengths, 99) / np.percentile(lengths, 50) >= 5


def test_counting_answers_are_correct():
    for p in counting_prompts(200, seed=0):
        a, b = map(int, p.text.rstrip(":").split(".."))
        assert p.answer.split() == [str(x) for x in range(a, b + 1)]
        assert 0 <= a < b <= 99


def test_addition_answers_are_correct():
    for p in addition_prompts(200, seed=0):
        x, y = p.text.rstrip("=").split("+")
        assert int(p.answer) == int(x) + int(y)


def test_builtin_tasks_are_deterministic_per_seed():
    assert counting_prompts(50, 7) == counting_prompts(50, 7)
    assert counting_prompts(50, 7) != counting_prompts(50, 8)


def test_jsonl_prompts_load_and_errors_name_the_line(tmp_path):
    path = tmp_path / "p.jsonl"
    lines = [json.dumps({"prompt": "2+2=", "answer": 4}), "", json.dumps({"prompt": "1+1=", "answer": "2"})]
    path.write_text("\n".join(lines))
    prompts = load_prompts(TaskSpec(name="jsonl", path=str(path)))
    assert [(p.index, p.text, p.answer) for p in prompts] == [(0, "2+2=", "4"), (1, "1+1=", "2")]
    path.write_text(json.dumps({"prompt": "a", "answer": "b"}) + "\n{oops\n")
    with pytest.raises(ValueError, match=r"p.jsonl:2: not JSON"):
        jsonl_prompts(path)
    path.write_text(json.dumps({"question": "a"}) + "\n")
    with pytest.raises(ValueError, match=r"p.jsonl:1: expected"):
        jsonl_prompts(path)


def test_cursor_walks_whole_epochs_reproducibly():
    prompts = counting_prompts(10, 0)
    a, b = PromptCursor(prompts, 1), PromptCursor(prompts, 1)
    first = a.take(10)
    assert sorted(p.index for p in first) == list(range(10))
    assert [p.index for p in first] == [p.index for p in b.take(10)]
    assert a.epoch == 0
    a.take(1)
    assert a.epoch == 1


def test_curriculum_walks_each_epoch_shortest_answer_first():
    prompts = counting_prompts(200, 0)
    cursor = PromptCursor(prompts, 1, curriculum=True)
    lengths = [len(p.answer) for p in cursor.take(200)]
    assert lengths == sorted(lengths) and lengths[0] < lengths[-1]
    assert sorted(p.index for p in prompts) == sorted(p.index for p in PromptCursor(prompts, 1, True).take(200))
    assert len(cursor.take(1)[0].answer) == lengths[0]  # the next epoch starts short again
    # Ties are shuffled by the seed, reproducibly.
    assert [p.index for p in PromptCursor(prompts, 2, True).take(50)] == \
        [p.index for p in PromptCursor(prompts, 2, True).take(50)]
    assert [p.index for p in PromptCursor(prompts, 2, True).take(50)] != \
        [p.index for p in PromptCursor(prompts, 3, True).take(50)]


def test_registered_rewards():
    assert exact_match(" 1 2 3 ", "1 2 3") == 1.0
    assert exact_match("1 2", "1 2 3") == 0.0
    assert numeric("The answer is 42", "42") == 1.0
    assert numeric("0.5", "1/2") == 1.0
    assert numeric("41", "42") == 0.0
    assert prefix_match("1 2 9", "1 2 3 4") == 0.5
    assert prefix_match("1 2 3 4 5", "1 2 3 4") == 0.75


def test_user_reward_by_module_function_and_clear_errors():
    assert get_reward("streamrl.rewards:exact_match") is exact_match
    with pytest.raises(ValueError, match="not a registered reward"):
        get_reward("fuzzy")
    with pytest.raises(ValueError, match="cannot import"):
        get_reward("no_such_module_xyz:f")
    with pytest.raises(ValueError, match="has no callable"):
        get_reward("streamrl.rewards:nope")


def test_counting_ramp_spreads_spans_evenly():
    from streamrl.tasks import counting_ramp_prompts

    prompts = counting_ramp_prompts(300, 0)
    spans = [len(p.answer.split()) - 1 for p in prompts]
    assert min(spans) == 1 and max(spans) == 30
    assert all(abs(spans.count(s) - 10) <= 1 for s in range(1, 31))  # no long tail: ~10 of each
    for p in prompts:
        a, b = p.text.rstrip(":").split("..")
        assert p.answer == " ".join(str(x) for x in range(int(a), int(b) + 1)) and int(b) <= 99
