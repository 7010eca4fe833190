"""Tests for groupwise.rewards.math: answer extraction, its reward-hacking guards, mathematical
equivalence (fast path and math-verify worker), the hard timeout, and the reward function."""

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from groupwise.rewards.math import (
    _WORKER,
    HARD_KILL_GRACE_S,
    _Verdict,
    _verdict,
    accuracy_reward,
    extract_final_answer,
    make_accuracy_reward,
    verify_answer,
)
from groupwise.tasks.arithmetic import arithmetic_dataset


def conv(text):
    return [{"role": "assistant", "content": text}]


def score(completion, gold, reward=accuracy_reward):
    return reward(["p"], [completion], answer=[gold])[0]


# ---------------------------------------------------------------------------------------------
# The table: (completion, ground truth, expected reward), all through accuracy_reward
# ---------------------------------------------------------------------------------------------

ACCURACY_CASES = [
    # The built-in arithmetic task.
    ("<think> 3 * 4 = 12 </think> <answer> 12 </answer>", "12", 1.0),
    ("<think> 3 * -4 = -12 </think> <answer> -12 </answer>", "-12", 1.0),
    ("<think> 3 * -4 = -12 </think> <answer> 12 </answer>", "-12", 0.0),
    ("<answer>13</answer>", "12", 0.0),
    ("<answer>+12</answer>", "12", 1.0),
    ("<answer>12.</answer>", "12", 1.0),
    # Integers are exact, also beyond float precision.
    ("<answer>12.0</answer>", "12", 1.0),
    ("<answer>12.0000001</answer>", "12", 0.0),
    ("<answer>1000000001</answer>", "1000000000", 0.0),
    ("<answer>123456789012345678901</answer>", "123456789012345678900", 0.0),
    # Decimals, with a relative tolerance of 1e-6 when the ground truth is not an integer.
    ("<answer>0.5</answer>", "5", 0.0),
    ("<answer>2.5</answer>", "2.50", 1.0),
    ("<answer>.5</answer>", "0.5", 1.0),
    ("<answer>0.1</answer>", "0.10000001", 1.0),
    ("<answer>0.1</answer>", "0.1001", 0.0),
    ("<answer>1.5e-8</answer>", "1.6e-8", 0.0),  # math-verify's 6-decimal rounding says equal
    # Fractions.
    ("<answer>1/2</answer>", "0.5", 1.0),
    ("<answer>1/2</answer>", "2", 0.0),
    (r"<answer>\frac{1}{2}</answer>", "0.5", 1.0),
    (r"<answer>\dfrac12</answer>", "1/2", 1.0),
    (r"<answer>-\frac{3}{4}</answer>", "-0.75", 1.0),
    ("<answer>2/4</answer>", r"\frac{1}{2}", 1.0),
    ("<answer>0.3333333</answer>", r"\frac{1}{3}", 1.0),
    ("<answer>0.33</answer>", r"\frac{1}{3}", 0.0),
    ("<answer>333333/1000000</answer>", "1/3", 0.0),  # exact fractions: no tolerance
    # Percentages: x% reads as x or x/100 when one side has the sign.
    ("<answer>50%</answer>", "0.5", 1.0),
    (r"<answer>50\%</answer>", "50", 1.0),
    ("<answer>50</answer>", r"50\%", 1.0),
    ("<answer>0.5</answer>", r"50\%", 1.0),
    ("<answer>50</answer>", "0.5", 0.0),
    ("<answer>12.5%</answer>", "12.5", 1.0),
    ("<answer>5000%</answer>", "50%", 0.0),
    ("<answer>50 percent</answer>", "0.5", 1.0),
    ("<answer>50% of the class</answer>", "0.5", 1.0),
    # Scientific notation.
    ("<answer>1e3</answer>", "1000", 1.0),
    (r"<answer>1.5 \times 10^{3}</answer>", "1500", 1.0),
    (r"<answer>1.5 \cdot 10^3</answer>", "1,500", 1.0),
    ("<answer>2.5e-3</answer>", "0.0025", 1.0),
    ("<answer>1e3</answer>", "100", 0.0),
    # Thousands separators.
    ("<answer>1,024</answer>", "1024", 1.0),
    ("<answer>1024</answer>", "1,024", 1.0),
    ("<answer>1{,}024</answer>", "1024", 1.0),
    (r"<answer>10,\!000</answer>", "10000", 1.0),
    ("<answer>1,000,000</answer>", "10^6", 1.0),
    # Units, currency, degrees, assignments.
    ("<answer>5 cm</answer>", "5", 1.0),
    (r"<answer>5 \text{ meters}</answer>", "5", 1.0),
    (r"<answer>100 \text{ cm}^2</answer>", "100", 1.0),
    ("<answer>12 apples</answer>", "12", 1.0),
    (r"<answer>30^\circ</answer>", "30", 1.0),
    (r"<answer>\$5</answer>", "5", 1.0),
    ("<answer>5 million</answer>", "5", 0.0),  # a number word is not a unit
    ("<answer>x = 12</answer>", "12", 1.0),
    # A numeric ground truth needs a number or an equivalent closed form (as math-verify), not
    # arithmetic left undone.
    ("<answer>3 * 4</answer>", "12", 0.0),
    (r"<answer>\sqrt{4}</answer>", "2", 1.0),
    ("<answer>2^{10}</answer>", "1024", 1.0),
    (r"<answer>\sqrt{5}</answer>", "2", 0.0),
    ("<answer>2^{10}</answer>", "1000", 0.0),
    # Symbolic answers (math-verify).
    ("<answer>x+1</answer>", "1+x", 1.0),
    ("<answer>x+1</answer>", "x-1", 0.0),
    ("<answer>x^2+2x+1</answer>", "(x+1)^2", 1.0),
    (r"<answer>\frac{\sqrt{2}}{2}</answer>", r"\frac{1}{\sqrt{2}}", 1.0),
    ("<answer>1.4142136</answer>", r"\sqrt{2}", 1.0),
    ("<answer>1.41</answer>", r"\sqrt{2}", 0.0),
    (r"<answer>2\pi</answer>", r"\pi + \pi", 1.0),
    ("<answer>y = 2x + 1</answer>", "2x+1", 1.0),
    # Intervals and sets.
    ("<answer>[1, 2)</answer>", "[1,2)", 1.0),
    ("<answer>(1, 2)</answer>", "[1,2]", 0.0),
    (r"<answer>\{1, 2\}</answer>", r"\{2, 1\}", 1.0),
    (r"<answer>\{1, 2\}</answer>", r"\{1, 2, 3\}", 0.0),
    (r"<answer>(-\infty, 3]</answer>", r"x \le 3", 1.0),
    (r"<answer>x \le 3</answer>", r"(-\infty, 3]", 1.0),
    ("<answer>-2, 1</answer>", "1, -2", 1.0),  # a listed ground truth allows a list
    ("<answer>-2, 2</answer>", "1, -2", 0.0),
    # Text answers: case-insensitive strings, not products of symbols (math-verify reads
    # "listen" and "silent" both as E*i*l*n*s*t, and "evelyn" differs from "Evelyn").
    (r"<answer>\text{Evelyn}</answer>", "Evelyn", 1.0),
    ("<answer>evelyn</answer>", r"\text{Evelyn}", 1.0),
    ("<answer>evelyn</answer>", "Evelyn", 1.0),
    ("<answer>Nevely</answer>", "Evelyn", 0.0),
    ("<answer>silent</answer>", "listen", 0.0),
    # Reward-hacking guards.
    ("<think> 12 </think> <answer></answer>", "12", 0.0),
    ("<answer>   </answer>", "12", 0.0),
    ("<answer>11</answer> <answer>12</answer>", "12", 0.0),
    ("<answer>12</answer> <answer>12</answer>", "12", 0.0),
    ("<answer>12 or 13</answer>", "12", 0.0),
    ("<answer>12, 13</answer>", "12", 0.0),
    ("<answer>12; 13</answer>", "12", 0.0),
    ("<answer>A) 12 B) 13</answer>", "12", 0.0),
    ("<answer>3 4</answer>", "7", 0.0),  # math-verify would read "3 4" as 7
    ("<answer>12\n13</answer>", "12", 0.0),
    (r"<answer>x + 1 \text{ or } x - 1</answer>", "x+1", 0.0),
    (r"<answer>\boxed{11} \boxed{12}</answer>", "12", 0.0),
    ("<think> the answer is <answer>12</answer> </think>", "12", 0.0),
    (r"<think> so \boxed{12} </think> I am not sure.", "12", 0.0),
    ("<answer> 12", "12", 0.0),
    # Boxed answers, used when there is no answer tag.
    (r"The answer is \boxed{\frac{1}{2}}.", "0.5", 1.0),
    (r"First \boxed{3}, then corrected: \boxed{4}", "4", 1.0),
    (r"First \boxed{3}, then corrected: \boxed{4}", "3", 0.0),
    (r"\fbox{7}", "7", 1.0),
    (r"\boxed{\{1, 2\}}", r"\{1,2\}", 1.0),
    (r"<answer>\boxed{12}</answer>", "12", 1.0),
    (r"<think>\boxed{5}</think> \boxed{12}", "12", 1.0),
    (r"\boxed{}", "12", 0.0),
    # No final answer: the last number does not count by default.
    ("The answer is 12", "12", 0.0),
    ("12", "12", 0.0),
    (r"$\frac{1}{2}$", "1/2", 0.0),
]


@pytest.mark.parametrize("completion, gold, expected", ACCURACY_CASES)
def test_accuracy_reward_table(completion, gold, expected):
    assert score(completion, gold) == expected


def test_table_is_large_and_balanced():
    assert len(ACCURACY_CASES) >= 60
    rewards = [expected for _, _, expected in ACCURACY_CASES]
    assert rewards.count(1.0) >= 30 and rewards.count(0.0) >= 30


@pytest.mark.parametrize("completion, gold, expected", ACCURACY_CASES[:20])
def test_accuracy_reward_conversational(completion, gold, expected):
    assert accuracy_reward(
        [[{"role": "user", "content": "p"}]], [conv(completion)], answer=[gold]
    ) == [expected]


# ---------------------------------------------------------------------------------------------
# Fallback to the last number
# ---------------------------------------------------------------------------------------------

FALLBACK_CASES = [
    ("The answer is 12", "12", 1.0),
    ("so 5-3 = 2.", "2", 1.0),
    ("x = -3", "-3", 1.0),
    ("in total 1,024 items", "1024", 1.0),
    ("it is 2.5e3", "2500", 1.0),
    ("<answer>13</answer> but maybe 12", "12", 0.0),  # an answer tag always wins
    ("<answer>12 or 13</answer> 12", "12", 0.0),  # a rejected answer does not fall back
    ("<think> 12 </think> I don't know", "12", 0.0),  # numbers in the reasoning don't count
    ("no numbers here", "12", 0.0),
]


@pytest.mark.parametrize("completion, gold, expected", FALLBACK_CASES)
def test_fallback_last_number_on(completion, gold, expected):
    assert score(completion, gold, make_accuracy_reward(fallback_last_number=True)) == expected


@pytest.mark.parametrize("completion, gold, _", FALLBACK_CASES[:5])
def test_fallback_last_number_off_by_default(completion, gold, _):
    assert score(completion, gold) == 0.0


# ---------------------------------------------------------------------------------------------
# Unparsable ground truth, stats, configuration
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("gold", ["", "   ", None, float("nan"), r"\frac{", "}{", r"\text{}"])
def test_unparsable_gold_gives_none(gold):
    reward = make_accuracy_reward()
    assert reward(["p"] * 2, ["<answer>7</answer>", "no answer"], answer=[gold, gold]) == [
        None,
        None,
    ]
    assert reward.stats.gold_unparsable == 2


def test_verify_answer_unparsable_gold_is_none():
    assert verify_answer("7", "") is None
    assert verify_answer("7", r"\frac{") is None
    assert verify_answer("7", "7") is True


def test_stats_count_each_outcome_and_reset():
    reward = make_accuracy_reward()
    completions = [
        "<answer>12</answer>",
        "<answer>13</answer>",
        "<answer></answer>",
        "nothing",
        "<answer>12</answer>",
    ]
    assert reward(["p"] * 5, completions, answer=["12", "12", "12", "12", ""]) == [
        1.0,
        0.0,
        0.0,
        0.0,
        None,
    ]
    assert reward.stats.as_dict() == {
        "completions": 5,
        "no_answer": 2,
        "gold_unparsable": 1,
        "timeouts": 0,
        "restated": 0,
    }
    reward.stats.reset()
    assert reward.stats.as_dict() == {
        "completions": 0,
        "no_answer": 0,
        "gold_unparsable": 0,
        "timeouts": 0,
        "restated": 0,
    }


def test_each_reward_function_has_its_own_stats():
    first, second = make_accuracy_reward(), make_accuracy_reward()
    first(["p"], ["x"], answer=["1"])
    assert (first.stats.completions, second.stats.completions) == (1, 0)


def test_names_and_answer_column():
    assert accuracy_reward.__name__ == "accuracy_reward"
    assert make_accuracy_reward(fallback_last_number=True).__name__ == "accuracy_reward_last_number"
    custom = make_accuracy_reward(answer_column="solution")
    assert custom.__name__ == "accuracy_reward_solution"
    assert custom(["p"], ["<answer>4</answer>"], solution=["4"], answer=["5"]) == [1.0]
    with pytest.raises(TypeError, match="'solution'"):
        custom(["p"], ["<answer>4</answer>"], answer=["4"])


def test_missing_answer_column_and_length_mismatch():
    with pytest.raises(TypeError):
        accuracy_reward(["p"], ["<answer>1</answer>"])
    with pytest.raises(ValueError):
        accuracy_reward(["p", "p"], ["<answer>1</answer>", "<answer>2</answer>"], answer=["1"])


def test_invalid_timeout():
    with pytest.raises(ValueError):
        make_accuracy_reward(timeout_s=0)
    with pytest.raises(ValueError):
        verify_answer("1", "1", timeout_s=-1.0)


def test_extra_columns_and_non_string_gold():
    scores = accuracy_reward(
        [None] * 3,
        [conv("<answer>216</answer>"), conv("<answer>215</answer>"), "<answer>0.5</answer>"],
        answer=[216, "216", 0.5],
        difficulty=[13, 13, 13],
    )
    assert scores == [1.0, 0.0, 1.0]


def test_gold_given_as_a_solution_uses_its_last_box():
    assert score("<answer>3</answer>", r"so \boxed{2}, no: \boxed{3}") == 1.0
    assert score("<answer>2</answer>", r"so \boxed{2}, no: \boxed{3}") == 0.0


# ---------------------------------------------------------------------------------------------
# The built-in arithmetic task scores exactly as before, without starting the sympy worker
# ---------------------------------------------------------------------------------------------


def test_arithmetic_task_unchanged_and_fast():
    rows = arithmetic_dataset(60, digits=3, min_operands=2, max_operands=3)
    golds = [row["answer"] for row in rows]
    assert any(gold.startswith("-") for gold in golds)
    completions, expected = [], []
    for row in rows:
        value = int(row["answer"])
        expr = row["expression"]
        completions += [
            f"<think> {expr} = {value} </think> <answer> {value} </answer>",
            f"<think> {expr} = {value + 1} </think> <answer> {value + 1} </answer>",
            f"<think> {expr} = {-value} </think> <answer> {-value} </answer>",
            f"<think> easy </think> <answer> {expr} </answer>",  # restating the question
        ]
        expected += [1.0, 0.0, 1.0 if value == 0 else 0.0, 0.0]
    answers = [gold for gold in golds for _ in range(4)]
    starts = _WORKER.starts
    started = time.perf_counter()
    new_scores = accuracy_reward([None] * len(completions), completions, answer=answers)
    elapsed = time.perf_counter() - started
    assert new_scores == expected
    assert _WORKER.starts == starts  # number literals never need sympy
    assert elapsed < 1.0


# ---------------------------------------------------------------------------------------------
# verify_answer directly
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "prediction, gold, expected",
    [
        ("1,024", "1024", True),
        ("3,4", "34", False),  # not a thousands-grouped number
        ("3 4", "34", False),
        ("1 024", "1024", False),
        ("1e999999999", "1", False),  # no 10^999999999 Fraction on the fast path
        ("1/0", "1", False),
        ("x+1", "x+1", True),
        ("0.5", r"\frac{1}{2}", True),
        ("12 x", "12", False),  # a lone letter after a number is a variable, not a unit
        ("5 m", "5", True),  # ... unless it is a unit symbol
        (r"\infty", "infinity", True),
        ("A", "a", True),
    ],
)
def test_verify_answer(prediction, gold, expected):
    assert verify_answer(prediction, gold) is expected


def test_verify_answer_tolerance_parameter():
    assert verify_answer("0.1001", "0.1", float_rel_tol=1e-2) is True
    assert verify_answer("0.1001", "0.1", float_rel_tol=1e-6) is False
    assert verify_answer("1.4143", r"\sqrt{2}", float_rel_tol=1e-3) is True
    assert verify_answer("1.4143", r"\sqrt{2}", float_rel_tol=1e-6) is False


# ---------------------------------------------------------------------------------------------
# Extraction
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<think> a </think> <answer> 7 </answer>", "7"),
        ("<answer>\n -3 \n</answer>", "-3"),
        (r"<answer>\boxed{7}</answer>", "7"),
        (r"<answer>The answer is \boxed{7}.</answer>", "7"),
        ("<answer></answer>", None),
        ("<answer>1</answer> <answer>2</answer>", None),
        ("<answer>1</answer> </answer>", None),
        ("</answer> 1 <answer>", None),
        ("<answer> 7", None),
        ("<think> <answer>7</answer> </think>", None),
        ("<think> <answer>7</answer> </think> <answer>8</answer>", "8"),
        ("reasoning in the prompt's think </think> <answer>8</answer>", "8"),
        ("<answer>8</answer> <think> truncated reasoning", "8"),
        ("<think> truncated reasoning <answer>8</answer>", None),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"\boxed{\frac{\sqrt{3}}{2}} is it", r"\frac{\sqrt{3}}{2}"),
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),
        (r"\boxed {5}", "5"),
        (r"\fbox{x^{2}}", "x^{2}"),
        (r"\boxed{1} and finally \boxed{2}", "2"),
        (r"\boxed{\boxed{3}}", r"\boxed{3}"),
        (r"\boxed{1} and \boxed{2", None),  # the last box is never closed
        (r"\boxed{}", None),
        ("no answer 12", None),
        ("<answer>1,024</answer>", "1,024"),
        ("<answer>1,000,000.5</answer>", "1,000,000.5"),
        ("<answer>3,4</answer>", None),
        ("<answer>1,0245</answer>", None),
        ("<answer>(1, 2)</answer>", "(1, 2)"),
        ("<answer>[1, 2)</answer>", "[1, 2)"),
        (r"<answer>\{1, 2\}</answer>", r"\{1, 2\}"),
        (r"<answer>3 \\ 4</answer>", None),
        (r"<answer>3 \quad 4</answer>", None),
        ("<answer>3 or 4</answer>", None),
        ("<answer>3 OR 4</answer>", None),
        (r"<answer>p \lor q</answer>", None),
        ("<answer>(a) 1 (b) 2</answer>", None),
        ("<answer>(B)</answer>", "(B)"),
        ("<answer>f(a) + f(b)</answer>", "f(a) + f(b)"),
        (r"<answer>\text{color}</answer>", r"\text{color}"),
        ("<answer>" + "1+" * 600 + "1</answer>", None),  # longer than MAX_ANSWER_CHARS
    ],
)
def test_extract_final_answer(text, expected):
    assert extract_final_answer(text) == expected


def test_extract_keeps_matrices():
    # The \\ row separators and the & are inside a LaTeX environment, not between answers.
    text = r"<answer>\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}</answer>"
    assert extract_final_answer(text) == r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}"


def test_extract_allow_list():
    assert extract_final_answer("<answer>-2, 1</answer>") is None
    assert extract_final_answer("<answer>-2, 1</answer>", allow_list=True) == "-2, 1"
    assert extract_final_answer("<answer>-2 or 1</answer>", allow_list=True) is None


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The answer is 12", "12"),
        ("12 then 13.", "13"),
        ("5-3 = 2", "2"),
        ("it is -3", "-3"),
        ("x=-3", "-3"),
        ("about 1,024 items", "1,024"),
        ("about 3.25 units", "3.25"),
        ("1e3 grams", "1e3"),
        ("half is 1/2", "2"),
        ("<think> 12 </think> none", None),
        ("no digits", None),
        ("<answer>7</answer> 12", "7"),
    ],
)
def test_extract_fallback_last_number(text, expected):
    assert extract_final_answer(text, fallback_last_number=True) == expected
    if "<answer>" not in text:
        assert extract_final_answer(text) is None


# ---------------------------------------------------------------------------------------------
# Hard timeout
# ---------------------------------------------------------------------------------------------

ADVERSARIAL = [
    # Both are decided by math-verify in seconds to hours, or never; the worker stops at 1 s.
    (r"\{2^{2^{2^{2^{2^{20}}}}}\}", r"\{5\}"),
    ("(x+1)^{100000}", "(x+1)^{99999}"),
]


@pytest.fixture()
def warm_worker():
    assert verify_answer("x-2", "-2+x") is True  # starts the worker outside the timed region
    _verdict.cache_clear()  # timeouts are cached; every test here must really run
    yield
    _verdict.cache_clear()


@pytest.mark.parametrize("prediction, gold", ADVERSARIAL)
def test_adversarial_input_times_out(warm_worker, prediction, gold):
    timeout_s = 1.0
    started = time.perf_counter()
    assert verify_answer(prediction, gold, timeout_s=timeout_s) is False
    elapsed = time.perf_counter() - started
    assert 0.5 * timeout_s <= elapsed <= timeout_s + 2.0  # it really timed out, and promptly


def test_timeout_counted_in_stats_and_worker_survives(warm_worker):
    reward = make_accuracy_reward(timeout_s=1.0)
    prediction, gold = ADVERSARIAL[0]
    starts = _WORKER.starts
    assert reward(["p"], [f"<answer>{prediction}</answer>"], answer=[gold]) == [0.0]
    assert reward.stats.timeouts == 1
    assert reward(["p"], ["<answer>2x</answer>"], answer=["x+x"]) == [1.0]
    assert _WORKER.starts == starts  # the worker stopped itself at its alarm: no restart


def test_timeout_in_a_worker_thread(warm_worker):
    # math-verify's own signal-based timeout raises outside the main thread; ours works.
    prediction, gold = ADVERSARIAL[1]
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=1) as pool:
        result = pool.submit(verify_answer, prediction, gold, 1.0).result()
        assert pool.submit(verify_answer, "x+1", "1+x").result() is True
    assert result is False
    assert time.perf_counter() - started <= 1.0 + 2.0 + 1.0


def test_hard_kill_when_the_alarm_cannot_fire(warm_worker):
    # Simulate code that never returns to the interpreter: the worker blocks its alarm and
    # sleeps. The parent must kill it at timeout + grace, and the next call must start afresh.
    request = {
        "pred": "1",
        "gold": "x",
        "pred_percent": False,
        "gold_percent": False,
        "float_rel_tol": 1e-6,
        "timeout_s": 0.5,
        "_test_block_alarm_s": 60,
    }
    starts = _WORKER.starts
    started = time.perf_counter()
    assert _WORKER.verdict(request, hard_timeout_s=0.5 + HARD_KILL_GRACE_S) is _Verdict.TIMEOUT
    assert time.perf_counter() - started <= 0.5 + HARD_KILL_GRACE_S + 1.0
    assert verify_answer(r"\frac{x}{2}", "0.5x") is True
    assert _WORKER.starts == starts + 1


def test_verify_answer_gives_the_worker_timeout_plus_grace(monkeypatch):
    seen = {}

    def fake_verdict(request, hard_timeout_s):
        seen.update(request, hard_timeout_s=hard_timeout_s)
        return _Verdict.TIMEOUT

    monkeypatch.setattr(_WORKER, "verdict", fake_verdict)
    _verdict.cache_clear()
    try:
        assert verify_answer("y^2", "y^3", timeout_s=2.5) is False
    finally:
        _verdict.cache_clear()
    assert seen["timeout_s"] == 2.5
    assert seen["hard_timeout_s"] == 2.5 + HARD_KILL_GRACE_S
    assert (seen["pred"], seen["gold"]) == ("y^2", "y^3")


def test_unsupported_math_does_not_raise():
    # Garbage that math-verify cannot parse as a prediction is simply wrong.
    assert verify_answer(r"\frac{{{", "x+1") is False
    assert score(r"<answer>\frac{{{</answer>", "x+1") == 0.0


def test_a_closed_form_that_restates_the_prompt_earns_nothing():
    prompts = [
        "What is the square root of 4?",
        "Compute $2^{10}$.",
        "What is 2 to the power 10?",
        [{"role": "user", "content": "Compute 2^{ 10 }"}],
        r"Let $y = \sqrt{4}$. What is $y$?",
    ]
    answers = [r"\sqrt{4}", "2^{10}", "2^{10}", "2^10", r"\sqrt{4}"]
    golds = ["2", "1024", "1024", "1024", "2"]
    reward = make_accuracy_reward()
    completions = [f"<answer>{a}</answer>" for a in answers]
    assert reward(prompts, completions, answer=golds) == [1.0, 0.0, 1.0, 0.0, 0.0]
    assert reward.stats.restated == 3
    # The literal answer is never a restatement, even where the prompt holds the number.
    assert reward(["Compute 2^{10} = 1024?"], ["<answer>1024</answer>"], answer=["1024"]) == [1.0]
