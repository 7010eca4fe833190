"""TRL's reward functions (groupwise.rewards.trl_rewards): TRL 1.16's documented outputs (the
examples in trl/rewards/*.py docstrings) and hand-worked values of each formula."""

from __future__ import annotations

import math
import pickle
import threading

import pytest

from groupwise.rewards.trl_rewards import (
    accuracy_reward,
    get_cosine_scaled_reward,
    get_repetition_penalty_reward,
    get_soft_overlong_punishment,
    reasoning_accuracy_reward,
    think_format_reward,
)


def _chat(*texts: str) -> list[list[dict[str, str]]]:
    return [[{"role": "assistant", "content": t}] for t in texts]


def test_accuracy_reward_trl_example_and_unparseable_gold():
    # TRL's docstring: [1.0, 0.0].
    completions = _chat(r"My answer is \boxed{\frac{1}{3}}", r"My answer is \boxed{\frac{1}{2}}")
    assert accuracy_reward(completions, [r"\frac{1}{3}", r"\frac{1}{3}"]) == [1.0, 0.0]
    # Equal values written otherwise are equal (0.5 = 1/2); a gold with no math is skipped.
    assert accuracy_reward(_chat(r"\boxed{0.5}", r"\boxed{2}"), ["$1/2$", "no math here"]) == [
        1.0,
        None,
    ]
    # No LaTeX answer at all (plain text is not extracted: try_extract_without_anchor=False).
    assert accuracy_reward(_chat("the answer is one third"), [r"\frac{1}{3}"]) == [0.0]


def test_accuracy_reward_logs_extra_columns_and_reads_plain_text():
    logged: dict[str, list] = {}
    out = accuracy_reward([r"\boxed{3}"], ["3"], log_extra=lambda k, v: logged.__setitem__(k, v))
    assert out == [1.0]
    assert logged["solution"] == ["3"] and logged["answer_parsed"][0] != "[unparseable]"
    assert set(logged) == {"solution", "gold_parsed", "answer_parsed"}
    with pytest.raises(ValueError):  # one solution per completion (zip strict, as TRL)
        accuracy_reward(_chat("a", "b"), ["1"])


def test_accuracy_reward_off_the_main_thread():
    # math-verify's SIGALRM timeouts only work on the main thread; elsewhere they are off.
    result: list = []
    worker = threading.Thread(
        target=lambda: result.append(accuracy_reward(_chat(r"\boxed{4}"), ["4"]))
    )
    worker.start()
    worker.join()
    assert result == [[1.0]]


def test_reasoning_accuracy_reward_trl_example():
    # TRL's docstring: [1.0, 0.0, 0.0].
    solutions = [r"\frac{1}{3}"] * 3
    completions = _chat(
        r"<think> Reasoning content </think> The final answer is \boxed{\frac{1}{3}}",
        r"<think> Reasoning content </think> The final answer is \boxed{\frac{1}{2}}",
        r"<think> Reasoning content with partial answers \boxed{\frac{1}{3}} but no final answer",
    )
    assert reasoning_accuracy_reward(completions, solutions, ["</think>"]) == [1.0, 0.0, 0.0]
    # Only the text after the delimiter counts: a right answer inside the reasoning and a wrong
    # one after it scores 0; another delimiter is honoured; an unparseable gold gives None.
    assert reasoning_accuracy_reward(
        _chat(r"<think>\boxed{5}</think> \boxed{6}", r"x ### \boxed{5}", r"</think>\boxed{1}"),
        ["5", "5", "words"],
        reasoning_delimiters=["###", "</think>"],
    ) == [0.0, 1.0, None]


def test_think_format_reward_trl_example_and_edge_cases():
    # TRL's docstring: [1.0, 0.0].
    completions = _chat(
        "<think>\nThis is my reasoning.\n</think>\nThis is my answer.",
        "<think>\nThis is my reasoning.\nThis is my answer.",
    )
    assert think_format_reward(completions) == [1.0, 0.0]
    assert think_format_reward(_chat(
        " <think>a</think>b",  # must start with <think>
        "<think>a<think>b</think>c",  # a second <think>
        "<think></think>",  # empty reasoning, nothing after: fine
    )) == [0.0, 0.0, 1.0]  # fmt: skip


def test_soft_overlong_punishment_dapo_eq13():
    # TRL's docstring: L_max=100, L_cache=20, 90 tokens -> (80 - 90) / 20 = -0.5.
    punish = get_soft_overlong_punishment(max_completion_len=100, soft_punish_cache=20)
    assert punish([[1] * 90]) == [-0.5]
    # Boundaries: <= 80 -> 0; 81 -> -1/20; 100 -> -1; 101 -> -1 (beyond L_max).
    assert punish([[1] * 80, [1] * 81, [1] * 100, [1] * 101]) == [0.0, -0.05, -1.0, -1.0]
    assert punish.__name__ == "soft_overlong_punishment_reward"
    assert pickle.loads(pickle.dumps(punish))([[1] * 90]) == [-0.5]


def test_repetition_penalty_trl_example_and_hand_values():
    # TRL's docstring: [0.0, -0.75]: [5]*5 has 4 bigrams, 1 unique -> (1 - 1/4) * -1.
    penalty = get_repetition_penalty_reward(ngram_size=2, max_penalty=-1.0)
    assert penalty([[1, 2, 3, 4], [5, 5, 5, 5, 5]]) == [0.0, -0.75]
    # Trigrams of [1,2,3,1,2,3]: (1,2,3),(2,3,1),(3,1,2),(1,2,3): 3 unique of 4 -> -0.5 * 0.25.
    assert get_repetition_penalty_reward(3, -0.5)([[1, 2, 3, 1, 2, 3], [1, 2]]) == [-0.125, 0.0]
    with pytest.raises(ValueError, match="max_penalty"):
        get_repetition_penalty_reward(max_penalty=0.5)


def test_cosine_scaled_reward_trl_example_and_hand_values():
    # TRL's docstring: 50 of 100 tokens: cos(pi/2) = 0 -> midpoints 0.75 and -0.75.
    cosine = get_cosine_scaled_reward(max_len=100)
    completions = _chat(r"\boxed{\frac{1}{3}}", r"\boxed{\frac{1}{2}}")
    solution = [r"\frac{1}{3}", r"\frac{1}{3}"]
    assert cosine(completions, solution, [[1] * 50, [1] * 50]) == pytest.approx([0.75, -0.75])
    # 0 tokens: cos 0 = 1 -> the v_max of each: 1.0 (correct), -1.0 (wrong, bounds swapped);
    # 25 tokens: 0.5 + 0.25 (1 + cos(pi/4)); beyond max_len: clamped at the long bound.
    c = math.cos(math.pi / 4)
    out = cosine(completions * 3, solution * 3, [[], [], [1] * 25, [1] * 25, [1] * 300, [1] * 300])
    assert out == pytest.approx([1.0, -1.0, 0.5 + 0.25 * (1 + c), -0.5 - 0.25 * (1 + c), 0.5, -0.5])
    assert cosine(_chat(r"\boxed{1}"), ["no math"], [[1]]) == [None]
