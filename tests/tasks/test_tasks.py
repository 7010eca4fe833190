import ast
import json
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction

import pytest

from groupwise.rewards.code import run_tests
from groupwise.tasks import (
    LEVELS,
    TASKS,
    answer_block,
    answer_rewards,
    build_task,
    task_reward_func,
    task_reward_funcs,
)
from groupwise.tasks.countdown import (
    check_solution,
    countdown_dataset,
    countdown_problem,
    countdown_reward,
    evaluate,
)
from groupwise.tasks.mixed import mixed_dataset, rank_weights, task_reward
from groupwise.tasks.python_tasks import load_problems, python_dataset, split_problems
from groupwise.tasks.reasoning_gym_tasks import reasoning_gym_dataset, reasoning_gym_reward


def _answer(text: str) -> str:
    return f"<think> working </think> <answer> {text} </answer>"


def _key(row):
    return row["prompt"][-1]["content"]


# ---------------------------------------------------------------- registry


@pytest.mark.parametrize("name", [t for t in TASKS if t != "mixed"])
def test_rows_have_common_columns_and_are_deterministic(name):
    rows = build_task(name, 6, "train", seed=3)
    assert len(rows) == 6
    for row in rows:
        assert row["task"] == name
        assert isinstance(row["answer"], str) and row["answer"]
        assert isinstance(row["difficulty"], int)
        roles = [m["role"] for m in row["prompt"]]
        assert roles == ["system", "user", "assistant", "user"]
        assert "<think>" in row["prompt"][0]["content"]
        assert "<answer>" in row["prompt"][2]["content"]
    assert build_task(name, 6, "train", seed=3) == rows
    no_shot = build_task(name, 2, "train", seed=3, few_shot=False)
    assert [m["role"] for m in no_shot[0]["prompt"]] == ["system", "user"]


@pytest.mark.parametrize("name", ["arithmetic", "countdown", "gsm", "logic", "python"])
def test_train_and_eval_never_overlap(name):
    n = 12 if name == "python" else 40
    train = {_key(r) for s in (0, 1) for r in build_task(name, n, "train", seed=s)}
    evals = {_key(r) for s in (0, 1) for r in build_task(name, 8, "eval", seed=s)}
    assert train and evals
    assert not train & evals


def test_mixed_splits_never_overlap():
    train = {_key(r) for r in build_task("mixed", 60, "train")}
    evals = {_key(r) for r in build_task("mixed", 30, "eval")}
    assert not train & evals


def test_reward_names_and_errors():
    assert task_reward_funcs("countdown") == ["format", "countdown"]
    assert task_reward_funcs("python") == ["code"]
    assert task_reward_funcs("mixed") == ["format", "task"]
    assert task_reward_func("countdown") is countdown_reward
    assert task_reward_func("task") is task_reward
    with pytest.raises(ValueError, match="unknown task"):
        build_task("nope", 1, "train")
    with pytest.raises(ValueError, match="split"):
        build_task("countdown", 1, "test")
    with pytest.raises(ValueError, match="difficulty"):
        build_task("countdown", 1, "train", difficulty=9)


def test_each_tasks_own_builder_is_build_task_of_that_task():
    assert countdown_dataset(5, "eval", 1, 5, False) == build_task(
        "countdown", 5, "eval", 1, 5, False
    )
    assert python_dataset(4, seed=2, difficulty=1) == build_task("python", 4, seed=2, difficulty=1)
    assert reasoning_gym_dataset("logic", 2, "train", 0, 3) == build_task("logic", 2, "train", 0, 3)
    with pytest.raises(ValueError, match="not a reasoning-gym task: 'countdown'"):
        reasoning_gym_dataset("countdown", 2)
    # Every task's options are checked once, in the registry.
    with pytest.raises(ValueError, match=r"python task: difficulty must be one of \(1, 2, 3\)"):
        python_dataset(1, difficulty=9)
    with pytest.raises(ValueError, match="num_problems must be >= 0, got -1"):
        countdown_dataset(-1)
    with pytest.raises(ValueError, match="split must be 'train' or 'eval', got 'test'"):
        reasoning_gym_dataset("gsm", 1, "test")


def test_answer_rewards_score_only_rows_with_values_and_an_answer():
    completions = [_answer("7"), "no block", _answer("5"), _answer("6")]

    def score(answer, want, weight):
        return weight if answer == want else 0.0

    wants, weights = ["7", "7", None, "7"], [0.5, 1.0, 1.0, 2.0]
    assert answer_rewards(completions, [wants, weights], score) == [0.5, 0.0, None, 0.0]
    assert answer_rewards(completions, [wants, None], score) == [None] * 4
    # reasoning-gym rows of no dataset (None or "") are not scored
    no_dataset = reasoning_gym_reward(
        [None] * 2, ["x", "y"], rg_dataset=["", None], rg_entry=["{}"] * 2
    )
    assert no_dataset == [None, None]


def test_answer_block():
    assert answer_block("<think> <answer> 1 </answer> </think> <answer> 2 </answer>") == "2"
    assert answer_block("<answer> 1 </answer> <answer> 2 </answer>") is None
    assert answer_block("<answer> </answer>") is None
    assert answer_block("<answer> 3") is None


def test_arithmetic_difficulty_levels():
    rows = build_task("arithmetic", 5, "train", difficulty=23)
    assert {r["difficulty"] for r in rows} == {23}
    assert all(len(r["expression"].split()) == 5 for r in rows)


# ---------------------------------------------------------------- countdown


def test_countdown_valid_solution():
    assert check_solution("(3 + 5) * 2", [2, 3, 5], 16)
    assert check_solution("(3 + 5) * 2 = 16", [2, 3, 5], 16)
    assert not check_solution("(3 + 5) * 2 = 17", [2, 3, 5], 16)
    assert not check_solution("3 + 5 + 2", [2, 3, 5], 16)  # wrong value


@pytest.mark.parametrize(
    "expression",
    ["3 + 5", "(3 + 5) * 2 * 1", "(3 + 3) * 2 + 4", "(3 + 5) * 2 + 5 - 5", "(35) * 2"],
    ids=["missing", "extra", "reused", "reused-cancelled", "concatenated"],
)
def test_countdown_wrong_number_use(expression):
    assert evaluate(expression) is not None
    assert not check_solution(expression, [2, 3, 5], 16)


@pytest.mark.parametrize(
    "expression",
    [
        "4 / (2 - 2)",
        "2 ** 4",
        "x + 1",
        "abs(-16)",
        "__import__('os')",
        "16.0",
        "True * 16",
        "16 if 1 else 2",
        "9 ** 9 ** 9 ** 9",
        "99999 * 99999 * 99999 * 99999",
        "(" * 150 + "1" + ")" * 150,
        "1" * 300,
        "",
        "16 16",
    ],
)
def test_countdown_rejects_unsafe_or_invalid(expression):
    assert evaluate(expression) is None
    assert not check_solution(expression, [16], 16)


def test_countdown_exact_fractions():
    assert evaluate("(1 / 3) * 3") == (Fraction(1), [1, 3, 3])
    # a non-integer intermediate is fine when the final value equals the target
    assert check_solution("(1 / 2 + 3) * 4", [1, 2, 3, 4], 14)
    assert check_solution("8 / (3 - 8 / 3)", [8, 3, 8, 3], 24)


def test_countdown_generator_is_solvable():
    import random

    for count in (3, 4, 5, 6):
        rng = random.Random(count)
        for _ in range(50):
            numbers, target, solution = countdown_problem(rng, count)
            assert len(numbers) == count and 1 <= target <= 999
            assert check_solution(solution, numbers, target)
    for row in build_task("countdown", 20, "eval", difficulty=6):
        assert row["difficulty"] == len(row["numbers"]) == 6
        assert check_solution(row["answer"], row["numbers"], row["target"])


def test_countdown_reward():
    rows = build_task("countdown", 2, "train", difficulty=3)
    completions = [_answer(rows[0]["answer"]), "<think> x </think> " + rows[1]["answer"]]
    scores = countdown_reward(
        [r["prompt"] for r in rows],
        completions,
        numbers=[r["numbers"] for r in rows],
        target=[r["target"] for r in rows],
    )
    assert scores == [1.0, 0.0]
    assert countdown_reward([None], ["x"], numbers=[None], target=[None]) == [None]


# ---------------------------------------------------------------- python


def test_python_problem_bank():
    problems = load_problems()
    assert len(problems) >= 40
    assert len({p["name"] for p in problems}) == len(problems)
    for p in problems:
        assert p["difficulty"] in (1, 2, 3)
        assert 3 <= len(p["tests"]) <= 6
        function = next(n for n in ast.parse(p["solution"]).body if isinstance(n, ast.FunctionDef))
        assert function.name == p["name"]
        assert f"`{function.name}(" in p["prompt"]
    assert split_problems("train") and split_problems("eval")


def test_python_reference_solutions_pass_all_tests():
    problems = load_problems()

    def run(p):
        return run_tests(p["solution"], p["tests"], timeout_s=10.0)

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(run, problems))
    failed = [
        (p["name"], r.error) for p, r in zip(problems, results, strict=True) if not r.all_passed
    ]
    assert not failed


def test_python_wrong_solution_fails():
    p = next(p for p in load_problems() if p["name"] == "is_palindrome")
    assert not run_tests("def is_palindrome(s):\n    return True\n", p["tests"]).all_passed


def test_python_rows_cycle_and_filter():
    rows = build_task("python", 70, "train", difficulty=2)
    assert {r["difficulty"] for r in rows} == {2}
    names = Counter(r["entry_point"] for r in rows)
    assert len(names) == len(split_problems("train", 2))
    assert max(names.values()) - min(names.values()) <= 1


# ---------------------------------------------------------------- reasoning gym


@pytest.mark.parametrize("name", ["gsm", "logic"])
def test_reasoning_gym_gold_scores_one(name):
    rows = build_task(name, 5, "eval", seed=1)
    for row in rows:
        entry = json.loads(row["rg_entry"])
        assert entry["answer"] == row["answer"]
    completions = [_answer(r["answer"]) for r in rows] + ["<answer> nonsense </answer>"]
    rows = rows + rows[:1]
    scores = reasoning_gym_reward(
        [r["prompt"] for r in rows],
        completions,
        rg_dataset=[r["rg_dataset"] for r in rows],
        rg_entry=[r["rg_entry"] for r in rows],
    )
    assert scores == [1.0] * 5 + [0.0]


def test_logic_difficulty_is_people_count():
    rows = build_task("logic", 3, "train", difficulty=4)
    assert all(r["difficulty"] == 4 for r in rows)
    assert all(len(json.loads(r["rg_entry"])["metadata"]["names"]) == 4 for r in rows)


# ---------------------------------------------------------------- mixed


def test_mixed_difficulty_is_heavy_tailed():
    rows = mixed_dataset(1000, "train", seed=0)
    levels = Counter(r["level"] for r in rows)
    counts = [levels[k] for k in range(1, 7)]
    weights = rank_weights()
    expected = [round(1000 * w) for w in weights]  # 547, 193, 105, 68, 49, 37
    assert expected == [547, 193, 105, 68, 49, 37]
    assert counts == [527, 207, 117, 59, 59, 31]
    assert all(abs(c - e) < 25 for c, e in zip(counts, expected, strict=True))
    assert Counter(r["task"] for r in rows).keys() == set(LEVELS)
    keys = set(rows[0])
    assert all(set(r) == keys for r in rows)
    for r in rows:
        levels_of_task = LEVELS[r["task"]]
        assert r["difficulty"] == levels_of_task[min(r["level"], len(levels_of_task)) - 1]


def test_task_reward_dispatches_by_task():
    pick = {}
    for row in mixed_dataset(200, "eval", seed=2):
        pick.setdefault(row["task"], row)
    rows = [pick[t] for t in ("arithmetic", "countdown", "gsm", "logic", "python")]
    code = rows[4]["answer"]
    good = [_answer(r["answer"]) for r in rows[:4]]
    good.append(f"<think> ok </think> <answer>\n```python\n{code}```\n</answer>")
    bad = [_answer("-12345")] * 4 + ["<answer>\n```python\nx = 1\n```\n</answer>"]
    other = dict(rows[0], task="unknown")
    batch = rows + rows + [other]
    columns = {k: [r[k] for r in batch] for k in batch[0] if k != "prompt"}
    scores = task_reward([r["prompt"] for r in batch], good + bad + [good[0]], **columns)
    assert scores == [1.0] * 5 + [0.0] * 5 + [None]
