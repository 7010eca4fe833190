"""Tests for groupwise.rewards.shaping: strict and soft format, length and repetition penalties.

Every expected value is computed by hand and written out as a number.
"""

import math

import pytest

from groupwise.rewards import basic
from groupwise.rewards.shaping import (
    format_reward,
    make_format_reward,
    make_length_penalty,
    make_repetition_penalty,
    soft_format_reward,
)


def conv(text):
    return [{"role": "assistant", "content": text}]


CONV_PROMPT = [{"role": "user", "content": "p"}]


def both_forms(func, texts, **kwargs):
    """Scores of ``texts`` as plain completions; asserts the conversational form agrees."""
    plain = func(["p"] * len(texts), list(texts), **kwargs)
    conversational = func([CONV_PROMPT] * len(texts), [conv(t) for t in texts], **kwargs)
    assert conversational == plain
    return plain


# ---------------------------------------------------------------------------------------------
# format_reward (strict)
# ---------------------------------------------------------------------------------------------

STRICT_CASES = [
    ("<think> 3 * 4 = 12 </think> <answer> 12 </answer>", 1.0),
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
    # The guard: blocks made of nothing (or only whitespace) earn no format credit.
    ("<think></think><answer></answer>", 0.0),
    ("<think> </think> <answer> 7 </answer>", 0.0),  # empty think
    ("<think> a </think> <answer> \n\t </answer>", 0.0),  # empty answer
    ("<think>\n</think>\n<answer>\n</answer>", 0.0),
]


@pytest.mark.parametrize("text, expected", STRICT_CASES)
def test_format_reward(text, expected):
    assert both_forms(format_reward, [text]) == [expected]


def test_format_reward_batch_keeps_order_and_ignores_columns():
    texts = ["<think>x</think><answer>1</answer>", "nothing", "<think></think><answer></answer>"]
    assert both_forms(format_reward, texts, answer=["1", "2", "3"]) == [1.0, 0.0, 0.0]


def test_format_reward_agrees_with_unguarded_except_for_the_guard():
    # The guard changes only completions whose blocks are empty.
    guarded = {
        "<think></think><answer></answer>",
        "<think> </think> <answer> 7 </answer>",
        "<think> a </think> <answer> \n\t </answer>",
        "<think>\n</think>\n<answer>\n</answer>",
    }
    for text, expected in STRICT_CASES:
        old = make_format_reward(require_content=False)(["p"], [text])
        assert old == ([1.0] if text in guarded else [expected]), text


def test_make_format_reward_guard_switch():
    assert make_format_reward() is format_reward
    assert make_format_reward(require_content=True) is format_reward
    unguarded = make_format_reward(require_content=False)
    assert unguarded.__name__ == "format_reward"
    texts = [
        "<think></think><answer></answer>",
        "<think> </think> <answer> 7 </answer>",
        "<think> a </think> <answer> 7 </answer>",
        "<think> a </think> <answer> 7 </answer> done",
    ]
    assert both_forms(unguarded, texts) == [1.0, 1.0, 1.0, 0.0]
    assert both_forms(format_reward, texts) == [0.0, 0.0, 1.0, 0.0]
    with pytest.raises(TypeError, match="require_content"):
        make_format_reward(require_content="no")


# ---------------------------------------------------------------------------------------------
# soft_format_reward
# ---------------------------------------------------------------------------------------------

SOFT_CASES = [
    # all four tags, once each, in order
    ("<think> a </think> <answer> 7 </answer>", 1.0),
    ("<think>\na\n</think>\n<answer>\n7\n</answer>", 1.0),
    # soft does not look at text outside the blocks (strict format_reward does)
    ("so <think> a </think> then <answer> 7 </answer> done", 1.0),
    # content anywhere lifts the tags-only guard, even if one block is empty
    ("<think></think><answer>7</answer>", 1.0),
    ("<think> a </think>", 0.5),  # <think>, </think>
    ("<think> a", 0.25),  # <think> only
    ("<think> a </think> <answer> 7", 0.75),  # no </answer>
    ("<answer> 7 </answer>", 0.25),  # </answer> after <answer>; <answer> has no </think>
    # <think> .25, </think> after <think> .25, <answer> not after </think> 0, </answer> .25
    ("<answer> 7 </answer> <think> a </think>", 0.75),
    # <think> .25, </think> before <think> 0, <answer> after </think> .25, </answer> .25
    ("</think> a <think> b <answer> 7 </answer>", 0.75),
    # duplicated think block: <think> x2, </think> x2 -> 0; <answer> lacks a unique </think>
    # -> 0; </answer> after <answer> .25
    ("<think> a </think> <think> b </think> <answer> 7 </answer>", 0.25),
    # duplicated answer block: <think> .25, </think> .25, <answer> x2 0, </answer> x2 0
    ("<think> a </think> <answer> 7 </answer> <answer> 8 </answer>", 0.5),
    # nested think: <think> x2 0, </think> x2 0, <answer> 0, </answer> after <answer> .25
    ("<think> <think> a </think> </think> <answer> 7 </answer>", 0.25),
    # </answer> before <answer>: <think> .25, </think> .25, <answer> .25, </answer> 0
    ("<think> a </think> </answer> 7 <answer>", 0.75),
    ("just text, no tags", 0.0),
    # guard: nothing but tags and whitespace
    ("<think></think><answer></answer>", 0.0),
    ("  <think> </think>\n<answer>\t</answer>\n", 0.0),
    ("<think></think>", 0.0),
    ("<think><think></think></think><answer></answer><answer></answer>", 0.0),
    ("", 0.0),
    ("   \n ", 0.0),
]


@pytest.mark.parametrize("text, expected", SOFT_CASES)
def test_soft_format_reward(text, expected):
    assert both_forms(soft_format_reward, [text]) == [expected]


def test_soft_format_reward_batch_keeps_order():
    texts = ["<think> a", "<think></think><answer></answer>", "<think> a </think> <answer> 7"]
    assert both_forms(soft_format_reward, texts, answer=["1", "2", "3"]) == [0.25, 0.0, 0.75]


# ---------------------------------------------------------------------------------------------
# make_length_penalty (DAPO soft overlong punishment)
# ---------------------------------------------------------------------------------------------


def ids(n):
    return list(range(n))


@pytest.mark.parametrize(
    "length, expected",
    [
        (0, 0.0),
        (15, 0.0),  # = Lmax - Lcache
        (16, -0.2),  # (15 - 16) / 5
        (17, -0.4),  # (15 - 17) / 5
        (19, -0.8),
        (20, -1.0),  # = Lmax
        (21, -1.0),  # beyond Lmax: -factor
        (100, -1.0),
    ],
)
def test_length_penalty_values(length, expected):
    length_penalty = make_length_penalty(20, 5)
    text = "x " * length
    scores = both_forms(length_penalty, [text], completion_ids=[ids(length)])
    assert scores == [pytest.approx(expected, abs=1e-12)]


def test_length_penalty_counts_tokens_not_characters():
    length_penalty = make_length_penalty(20, 5)
    # A short text with many tokens and a long text with few: only the token count matters.
    scores = length_penalty(["p", "p"], ["ab", "x" * 1000], completion_ids=[ids(17), ids(3)])
    assert scores == [pytest.approx(-0.4), 0.0]


def test_length_penalty_factor_and_batch():
    length_penalty = make_length_penalty(20, 5, penalty_factor=0.5)
    scores = both_forms(
        length_penalty,
        ["a", "b", "c", "d"],
        completion_ids=[ids(15), ids(17), ids(20), ids(21)],
        answer=["1", "2", "3", "4"],
    )
    assert scores == pytest.approx([0.0, -0.2, -0.5, -0.5])


def test_length_penalty_buffer_equal_to_max():
    length_penalty = make_length_penalty(10, 10)
    scores = length_penalty(
        ["p"] * 4, ["a"] * 4, completion_ids=[ids(0), ids(5), ids(10), [7] * 11]
    )
    assert scores == pytest.approx([0.0, -0.5, -1.0, -1.0])


def test_length_penalty_accepts_tuples_of_ids():
    length_penalty = make_length_penalty(8, 4, penalty_factor=2.0)
    # threshold 4: L=6 -> (4 - 6) / 4 * 2 = -1.0
    assert length_penalty(["p"], ["a"], completion_ids=[(1, 2, 3, 4, 5, 6)]) == [-1.0]


def test_length_penalty_name():
    assert make_length_penalty(20, 5).__name__ == "length_penalty"
    assert basic.reward_func_name(make_length_penalty(20, 5)) == "length_penalty"


def test_length_penalty_requires_completion_ids():
    length_penalty = make_length_penalty(20, 5)
    with pytest.raises(ValueError, match="completion_ids"):
        length_penalty(["p"], ["a"])
    with pytest.raises(ValueError, match="completion_ids"):
        length_penalty(["p"], ["a"], completion_ids=None)
    with pytest.raises(ValueError, match="2 completion_ids for 1 completions"):
        length_penalty(["p"], ["a"], completion_ids=[ids(1), ids(2)])


@pytest.mark.parametrize(
    "args, kwargs, error, name",
    [
        ((0, 1), {}, ValueError, "max_completion_length"),
        ((-5, 1), {}, ValueError, "max_completion_length"),
        ((20.0, 5), {}, TypeError, "max_completion_length"),
        ((True, 1), {}, TypeError, "max_completion_length"),
        ((20, 0), {}, ValueError, "overlong_buffer_len"),
        ((20, -1), {}, ValueError, "overlong_buffer_len"),
        ((20, 21), {}, ValueError, "overlong_buffer_len"),
        ((20, 5.0), {}, TypeError, "overlong_buffer_len"),
        ((20, None), {}, TypeError, "overlong_buffer_len"),
        ((20, 5), {"penalty_factor": -1.0}, ValueError, "penalty_factor"),
        ((20, 5), {"penalty_factor": math.nan}, ValueError, "penalty_factor"),
        ((20, 5), {"penalty_factor": math.inf}, ValueError, "penalty_factor"),
        ((20, 5), {"penalty_factor": "1"}, TypeError, "penalty_factor"),
    ],
)
def test_length_penalty_argument_errors(args, kwargs, error, name):
    with pytest.raises(error, match=f"^{name} must be"):
        make_length_penalty(*args, **kwargs)


def test_length_penalty_argument_edges_accepted():
    # The smallest valid buffer and a zero factor (a no-op, e.g. for ablations) are accepted.
    assert make_length_penalty(1, 1)(["p"], ["a"], completion_ids=[ids(1)]) == [-1.0]
    zero = make_length_penalty(20, 5, penalty_factor=0)
    scores = zero(["p", "p"], ["a", "b"], completion_ids=[ids(17), ids(30)])
    assert scores == [0.0, 0.0]
    assert [math.copysign(1.0, s) for s in scores] == [1.0, 1.0]  # no -0.0 in the logs


# ---------------------------------------------------------------------------------------------
# make_repetition_penalty
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, n, max_penalty, expected",
    [
        # 2-grams ab bc ca ab bc: 5 total, 3 unique -> (1 - 3/5) * -1
        ("a b c a b c", 2, -1.0, -0.4),
        # 3-grams abc bca cab abc: 4 total, 3 unique -> (1 - 3/4) * -1
        ("a b c a b c", 3, -1.0, -0.25),
        ("a b c a b c", 2, -2.0, -0.8),
        # 1-grams a a a a: 4 total, 1 unique -> (1 - 1/4) * -1
        ("a a a a", 1, -1.0, -0.75),
        # any whitespace splits: a b a b -> 2-grams ab ba ab: 3 total, 2 unique
        ("a\nb\ta   b", 2, -1.0, -1 / 3),
        # case folded: A b a B -> a b a b, the same as above
        ("A b a B", 2, -1.0, -1 / 3),
        ("a b c d", 2, -1.0, 0.0),  # no repeated 2-gram
        ("a b c", 3, -1.0, 0.0),  # exactly n words: one n-gram
        ("a b", 3, -1.0, 0.0),  # fewer than n words
        ("a a", 3, -1.0, 0.0),
        ("", 1, -1.0, 0.0),
        ("   ", 1, -1.0, 0.0),
        ("a b c a b c", 2, 0.0, 0.0),  # max_penalty 0 turns it off
    ],
)
def test_repetition_penalty_values(text, n, max_penalty, expected):
    repetition_penalty = make_repetition_penalty(ngram_size=n, max_penalty=max_penalty)
    assert both_forms(repetition_penalty, [text]) == [pytest.approx(expected, abs=1e-12)]


def test_repetition_penalty_no_negative_zero():
    repetition_penalty = make_repetition_penalty(2, -1.0)
    (score,) = repetition_penalty(["p"], ["a b c d"])
    assert math.copysign(1.0, score) == 1.0


def test_repetition_penalty_defaults_and_batch():
    repetition_penalty = make_repetition_penalty()  # n=3, max_penalty=-1
    texts = [
        "the cat sat the cat sat",  # the-cat-sat cat-sat-the sat-the-cat the-cat-sat: 1 - 3/4
        "one two three four",  # 2 distinct 3-grams
        "too short",
    ]
    scores = both_forms(repetition_penalty, texts, completion_ids=[[1], [2], [3]], answer=[1, 2, 3])
    assert scores == pytest.approx([-0.25, 0.0, 0.0])


def test_repetition_penalty_name():
    assert make_repetition_penalty().__name__ == "repetition_penalty"
    assert basic.reward_func_name(make_repetition_penalty(2, -0.5)) == "repetition_penalty"


@pytest.mark.parametrize(
    "kwargs, error, name",
    [
        ({"ngram_size": 0}, ValueError, "ngram_size"),
        ({"ngram_size": -2}, ValueError, "ngram_size"),
        ({"ngram_size": 2.0}, TypeError, "ngram_size"),
        ({"ngram_size": True}, TypeError, "ngram_size"),
        ({"max_penalty": 0.5}, ValueError, "max_penalty"),
        ({"max_penalty": 1}, ValueError, "max_penalty"),
        ({"max_penalty": -math.inf}, ValueError, "max_penalty"),
        ({"max_penalty": math.nan}, ValueError, "max_penalty"),
        ({"max_penalty": "-1"}, TypeError, "max_penalty"),
    ],
)
def test_repetition_penalty_argument_errors(kwargs, error, name):
    with pytest.raises(error, match=f"^{name} must be"):
        make_repetition_penalty(**kwargs)


# ---------------------------------------------------------------------------------------------
# The trainer's call: everything by keyword, with completion_ids and dataset columns
# ---------------------------------------------------------------------------------------------


def test_all_functions_accept_the_trainers_keyword_call():
    texts = ["<think> a </think> <answer> 7 </answer>", "a b a b a b"]
    kwargs = {
        "prompts": [CONV_PROMPT, CONV_PROMPT],
        "completions": [conv(t) for t in texts],
        "completion_ids": [ids(4), ids(19)],
        "answer": ["7", "8"],
    }
    assert format_reward(**kwargs) == [1.0, 0.0]
    assert soft_format_reward(**kwargs) == [1.0, 0.0]
    assert make_length_penalty(20, 5)(**kwargs) == [0.0, pytest.approx(-0.8)]
    # "a b a b a b", n=2: ab ba ab ba ab -> 5 total, 2 unique -> (1 - 2/5) * -1
    assert make_repetition_penalty(2)(**kwargs) == [0.0, pytest.approx(-0.6)]
