"""Tests for groupwise.rewards: format and accuracy rewards, answer parsing, names and the
correctness flag (the name -> function factory is tested in tests/wiring/test_build.py)."""

import pytest

from groupwise.rewards import (
    accuracy_reward,
    code_reward,
    code_reward_binary,
    completion_text,
    correctness_index,
    format_reward,
    parse_number,
    reward_func_name,
)


def conv(text):
    return [{"role": "assistant", "content": text}]


# ---------------------------------------------------------------------------------------------
# format_reward
# ---------------------------------------------------------------------------------------------

FORMAT_CASES = [
    ("<think> a </think> <answer> 7 </answer>", 1.0),
    ("<think>a</think><answer>7</answer>", 1.0),
    ("  \n<think> a </think>\n\n<answer> 7 </answer>\n  ", 1.0),
    ("<think>\nline one\nline two\n</think>\n<answer>\n7\n</answer>", 1.0),
    ("<answer> 7 </answer>", 0.0),  # missing think
    ("<think> a </think>", 0.0),  # missing answer
    ("<think> a </think> <answer> 7 </answer> <answer> 8 </answer>", 0.0),  # two answers
    ("<think> a </think> <answer> 7 </answer> done", 0.0),  # text after </answer>
    ("so <think> a </think> <answer> 7 </answer>", 0.0),  # text before <think>
    ("<think> a </think> hmm <answer> 7 </answer>", 0.0),  # text between blocks
    ("<think> <think> a </think> </think> <answer> 7 </answer>", 0.0),  # nested think
    ("<think> a </think> <think> b </think> <answer> 7 </answer>", 0.0),  # duplicated think
    ("<think> a </think> </think> <answer> 7 </answer>", 0.0),  # stray closing tag
    ("<answer> 7 </answer> <think> a </think>", 0.0),  # answer before think
    ("<think> a <answer> 7 </answer> </think>", 0.0),  # answer inside think
    ("<think> a </think> <answer> 7", 0.0),  # unclosed answer
    ("", 0.0),
]


@pytest.mark.parametrize("text, expected", FORMAT_CASES)
def test_format_reward_plain(text, expected):
    assert format_reward(["p"], [text]) == [expected]


@pytest.mark.parametrize("text, expected", FORMAT_CASES)
def test_format_reward_conversational(text, expected):
    assert format_reward([[{"role": "user", "content": "p"}]], [conv(text)]) == [expected]


def test_format_reward_batch_keeps_order():
    completions = [
        "<think>x</think><answer>1</answer>",
        "nothing",
        conv("<think>y</think><answer>2</answer>"),
    ]
    assert format_reward([None] * 3, completions) == [1.0, 0.0, 1.0]


def test_completion_text():
    assert completion_text("abc") == "abc"
    assert completion_text(conv("xyz")) == "xyz"
    # The last message is the completion.
    assert (
        completion_text(
            [{"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]
        )
        == "b"
    )
    with pytest.raises(TypeError):
        completion_text([])
    with pytest.raises(TypeError):
        completion_text(7)


# ---------------------------------------------------------------------------------------------
# parse_number
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("7", 7.0),
        ("-3", -3.0),
        ("+5", 5.0),
        ("  42  ", 42.0),
        ("1,024", 1024.0),
        ("1,000,000", 1000000.0),
        ("2.50", 2.5),
        (".5", 0.5),
        ("7.", 7.0),
        ("0", 0.0),
        ("1e3", 1000.0),
    ],
)
def test_parse_number_numbers(text, expected):
    value = parse_number(text)
    assert value == expected
    assert type(value) is float


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "abc",
        "seven",
        "7x",
        "x7",
        "3/4",
        "--3",
        "1.2.3",
        "nan",
        "inf",
        "1e999",
        "$7",
        "7 apples",
        ".",
    ],
)
def test_parse_number_rejects(text):
    assert parse_number(text) is None


# ---------------------------------------------------------------------------------------------
# accuracy_reward
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "completion, truth, expected",
    [
        ("<think>.</think><answer> 7 </answer>", "7", 1.0),
        ("<answer> 7 </answer>", "7", 1.0),
        ("<answer>-3</answer>", "-3", 1.0),
        ("<answer>3</answer>", "-3", 0.0),
        ("<answer>1,024</answer>", "1024", 1.0),
        ("<answer>1024</answer>", "1,024", 1.0),
        ("<answer>7.0</answer>", "7", 1.0),
        ("<answer>7</answer>", "7.0", 1.0),
        ("<answer>8</answer>", "7", 0.0),
        ("7", "7", 0.0),  # no answer tag
        ("the answer is 7", "7", 0.0),
        ("<answer>seven</answer>", "7", 0.0),  # non-numeric content
        ("<answer>7 or 8</answer>", "7", 0.0),
        ("<answer></answer>", "7", 0.0),
        ("<answer>8</answer> <answer>7</answer>", "7", 0.0),  # several answer tags: no credit
        ("<answer>7</answer> <answer>8</answer>", "7", 0.0),
        ("<answer>7</answer>", 7, 1.0),  # non-string ground truth
        ("<answer>7</answer>", "seven", 0.0),  # a word gold is compared as text
        ("<answer>7</answer>", "", None),
    ],
)
def test_accuracy_reward_cases(completion, truth, expected):
    assert accuracy_reward(["p"], [completion], answer=[truth]) == [expected]


def test_accuracy_reward_batch_conversational_and_extra_columns():
    completions = [conv("<answer>216</answer>"), conv("<answer>215</answer>"), conv("none")]
    scores = accuracy_reward(
        [None] * 3, completions, answer=["216", "216", ""], difficulty=[13, 13, 13]
    )
    assert scores == [1.0, 0.0, None]


def test_accuracy_reward_length_mismatch():
    with pytest.raises(ValueError):
        accuracy_reward(["p", "p"], ["<answer>1</answer>", "<answer>2</answer>"], answer=["1"])


def test_accuracy_reward_requires_answer_column():
    with pytest.raises(TypeError):
        accuracy_reward(["p"], ["<answer>1</answer>"])


def test_accuracy_reward_large_integers_exact():
    # Reachable with the built-in task: digits=4, 3 operands, "*" gives answers ~1e11.
    assert accuracy_reward(["p"], ["<answer>1000000001</answer>"], answer=["1000000000"]) == [0.0]


# ---------------------------------------------------------------------------------------------
# Names and the correctness flag
# ---------------------------------------------------------------------------------------------


def test_reward_func_name():
    def length_reward(prompts, completions, **kwargs):
        return [float(len(c)) for c in completions]

    assert reward_func_name(length_reward) == "length_reward"
    assert reward_func_name(format_reward) == "format_reward"


def test_correctness_flag_on_the_task_success_rewards_only():
    from groupwise.rewards import (
        make_accuracy_reward,
        make_code_reward,
        make_length_penalty,
        make_repetition_penalty,
        soft_format_reward,
    )

    flagged = [
        accuracy_reward,
        make_accuracy_reward(fallback_last_number=True, answer_column="solution"),
        code_reward,
        code_reward_binary,
        make_code_reward(binary=True, timeout_s=1.0),
    ]
    for func in flagged:
        assert func.is_correctness is True, reward_func_name(func)
    shaping = [
        format_reward,
        soft_format_reward,
        make_length_penalty(64, 16),
        make_repetition_penalty(),
    ]
    for func in shaping:
        assert getattr(func, "is_correctness", False) is False, reward_func_name(func)


def test_correctness_index_picks_the_first_flagged_function():
    def mine(prompts, completions, **kwargs):
        return [1.0] * len(completions)

    def judged(prompts, completions, **kwargs):
        return [1.0] * len(completions)

    judged.is_correctness = True
    assert correctness_index([format_reward, accuracy_reward]) == 1
    assert correctness_index([format_reward, judged, accuracy_reward]) == 1
    assert correctness_index([code_reward, accuracy_reward]) == 0
    assert correctness_index([format_reward, mine]) is None  # a name is not a flag
    assert correctness_index([]) is None
    mine.is_correctness = "yes"  # only True marks it
    assert correctness_index([mine]) is None
