import itertools
import json
import math

import pytest

from groupwise.algo.advantages import pass_at_k
from groupwise.evaluation import (
    EvalConfig,
    PromptResult,
    aggregate,
    compare,
    default_ks,
    evaluate_model,
    format_comparison,
    format_table,
    save_json,
)


def brute_force_pass_at_k(n: int, c: int, k: int) -> float:
    # Samples 0..c-1 are the correct ones; count the k-subsets holding at least one of them.
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


def result(pid, correct, **kw) -> PromptResult:
    return PromptResult(prompt_id=pid, correct=[bool(x) for x in correct], **kw)


# Hand-made results: n = 4 samples per prompt.
HAND = [
    result(
        "p1",
        [1, 0, 0, 0],
        rewards={"acc": 0.25},
        mean_length=10.0,
        truncated_rate=0.0,
        format_rate=0.5,
        difficulty=3,
        task="add",
        greedy_correct=True,
    ),
    result(
        "p2",
        [0, 0, 0, 0],
        rewards={"acc": 0.0},
        mean_length=20.0,
        truncated_rate=0.5,
        format_rate=1.0,
        difficulty=3,
        task="mul",
        greedy_correct=False,
    ),
    result(
        "p3",
        [1, 1, 1, 1],
        rewards={"acc": 1.0},
        mean_length=30.0,
        truncated_rate=0.25,
        format_rate=0.0,
        difficulty=10,
        task="add",
        greedy_correct=True,
    ),
]


def assert_metrics(got: dict, expected: dict) -> None:
    assert set(got) == set(expected), (sorted(got), sorted(expected))
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, abs=1e-12), key


# ------------------------------------------------------------------------------------------
# pass@k


@pytest.mark.parametrize("n", range(1, 7))
def test_pass_at_k_matches_brute_force_enumeration(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            expected = brute_force_pass_at_k(n, c, k)
            assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12), (n, c, k)
            # aggregate() over a single prompt is that prompt's pass@k.
            summary = aggregate([result("x", [1] * c + [0] * (n - c))], [k])
            assert summary["overall"][f"pass@{k}"] == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_mean_over_prompts_matches_brute_force():
    rows = [result(f"p{c}", [0] * (6 - c) + [1] * c) for c in range(7)]
    for k in range(1, 7):
        expected = sum(brute_force_pass_at_k(6, c, k) for c in range(7)) / 7
        assert aggregate(rows, [k])["overall"][f"pass@{k}"] == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("ks", [[0], [5], [1, 5], [-1], [1.5], [True]])
def test_invalid_k_is_a_clear_error(ks):
    with pytest.raises(ValueError, match="k"):
        EvalConfig(n=4, ks=ks)
    with pytest.raises(ValueError, match="k"):
        aggregate(HAND, ks)
    with pytest.raises(ValueError, match="k"):
        compare(HAND, HAND, ks)


def test_eval_config_defaults_and_validation():
    assert EvalConfig(n=8).ks == [1, 2, 4, 8]
    assert EvalConfig(n=6, ks=[4, 1, 4]).ks == [1, 4]
    assert default_ks(1) == [1]
    assert default_ks(6) == [1, 2, 4, 6]
    with pytest.raises(ValueError, match="nothing to evaluate"):
        EvalConfig(n=0)
    with pytest.raises(ValueError, match="temperature"):
        EvalConfig(n=4, temperature=0.0)
    assert EvalConfig(n=0, greedy=True).ks == []


# ------------------------------------------------------------------------------------------
# aggregate


def test_aggregate_overall_and_breakdowns_hand_computed():
    summary = aggregate(HAND, [1, 2, 4])
    assert summary["ks"] == [1, 2, 4]
    # pass@2 of (n=4, c=1) = 1 - C(3,2)/C(4,2) = 0.5. mean@k uses the first k samples.
    assert_metrics(
        summary["overall"],
        {
            "num_prompts": 3,
            "pass@1": 1.25 / 3,
            "pass@2": 1.5 / 3,
            "pass@4": 2 / 3,
            "mean@1": 2 / 3,
            "mean@2": 1.5 / 3,
            "mean@4": 1.25 / 3,
            "accuracy": 1.25 / 3,
            "format_rate": 0.5,
            "mean_length": 20.0,
            "truncated_rate": 0.25,
            "greedy_accuracy": 2 / 3,
            "rewards/acc": 1.25 / 3,
        },
    )
    # Numeric levels sort numerically: "3" before "10".
    assert list(summary["by_difficulty"]) == ["3", "10"]
    assert_metrics(
        summary["by_difficulty"]["3"],
        {
            "num_prompts": 2,
            "pass@1": 0.125,
            "pass@2": 0.25,
            "pass@4": 0.5,
            "mean@1": 0.5,
            "mean@2": 0.25,
            "mean@4": 0.125,
            "accuracy": 0.125,
            "format_rate": 0.75,
            "mean_length": 15.0,
            "truncated_rate": 0.25,
            "greedy_accuracy": 0.5,
            "rewards/acc": 0.125,
        },
    )
    assert_metrics(
        summary["by_difficulty"]["10"],
        {
            "num_prompts": 1,
            "pass@1": 1.0,
            "pass@2": 1.0,
            "pass@4": 1.0,
            "mean@1": 1.0,
            "mean@2": 1.0,
            "mean@4": 1.0,
            "accuracy": 1.0,
            "format_rate": 0.0,
            "mean_length": 30.0,
            "truncated_rate": 0.25,
            "greedy_accuracy": 1.0,
            "rewards/acc": 1.0,
        },
    )
    assert list(summary["by_task"]) == ["add", "mul"]
    assert_metrics(
        summary["by_task"]["add"],
        {
            "num_prompts": 2,
            "pass@1": 0.625,
            "pass@2": 0.75,
            "pass@4": 1.0,
            "mean@1": 1.0,
            "mean@2": 0.75,
            "mean@4": 0.625,
            "accuracy": 0.625,
            "format_rate": 0.25,
            "mean_length": 20.0,
            "truncated_rate": 0.125,
            "greedy_accuracy": 1.0,
            "rewards/acc": 0.625,
        },
    )
    assert summary["by_task"]["mul"]["pass@4"] == 0.0
    assert summary["by_task"]["mul"]["greedy_accuracy"] == 0.0


def test_aggregate_skips_missing_groups_and_nan_and_accepts_dicts():
    rows = [
        result("a", [1, 1], rewards={"acc": math.nan}, difficulty=None, task=None),
        result("b", [0, 0], rewards={"acc": 0.5}, difficulty="hard", task=None),
    ]
    summary = aggregate([r.to_dict() for r in rows], [2])
    assert list(summary["by_difficulty"]) == ["hard"]
    assert summary["by_difficulty"]["hard"]["num_prompts"] == 1
    assert summary["by_task"] == {}
    # NaN (a reward None for every sample of a prompt) is skipped, not averaged as 0.
    assert summary["overall"]["rewards/acc"] == 0.5
    assert math.isnan(summary["overall"]["format_rate"])
    assert "greedy_accuracy" not in summary["overall"]
    with pytest.raises(ValueError, match="disagrees"):
        aggregate([{**rows[0].to_dict(), "c": 0}], [1])


# ------------------------------------------------------------------------------------------
# output


def test_format_table_aligned_with_every_group():
    table = format_table(aggregate(HAND, [1, 4]))
    lines = table.splitlines()
    assert lines[0].split()[:4] == ["group", "prompts", "pass@1", "pass@4"]
    labels = [line.split()[0] for line in lines[2:]]
    assert labels == ["all", "difficulty=3", "difficulty=10", "task=add", "task=mul"]
    assert len({len(line) for line in lines}) == 1, table  # right-aligned columns
    assert "0.417" in lines[2]  # overall pass@1 = 1.25 / 3
    nan_table = format_table(aggregate([result("a", [1], format_rate=math.nan)], [1]))
    assert " -" in nan_table.splitlines()[2]


def test_save_json_atomic_and_strict(tmp_path):
    summary = aggregate(HAND, [1, 2])
    summary["overall"]["extra"] = math.nan
    path = tmp_path / "sub" / "eval.json"
    save_json(summary, path)
    loaded = json.loads(path.read_text())
    assert loaded["overall"]["pass@2"] == pytest.approx(0.5)
    assert loaded["overall"]["extra"] is None
    assert loaded["by_difficulty"]["10"]["accuracy"] == 1.0
    save_json({"x": 1}, path)  # overwrite in place
    assert json.loads(path.read_text()) == {"x": 1}
    assert sorted(p.name for p in path.parent.iterdir()) == ["eval.json"]  # no temp files left


# ------------------------------------------------------------------------------------------
# compare


def test_compare_identical_is_exactly_zero():
    out = compare(HAND, [PromptResult.from_dict(r.to_dict()) for r in HAND], [1, 2, 4])
    assert set(out["metrics"]) == {"pass@1", "pass@2", "pass@4", "accuracy", "greedy_accuracy"}
    for name, m in out["metrics"].items():
        assert (m["diff"], m["ci_low"], m["ci_high"]) == (0.0, 0.0, 0.0), name
        assert m["a"] == m["b"]


def test_compare_detects_known_shift():
    a = [result(f"p{i}", [0, 0, 0], greedy_correct=False) for i in range(5)]
    b = [result(f"p{i}", [1, 1, 1], greedy_correct=True) for i in range(5)]
    out = compare(a, b, [1, 3])
    for m in out["metrics"].values():
        assert (m["diff"], m["ci_low"], m["ci_high"]) == (1.0, 1.0, 1.0)
    back = compare(b, a, [1])["metrics"]["accuracy"]
    assert (back["diff"], back["ci_low"], back["ci_high"]) == (-1.0, -1.0, -1.0)
    assert "+1.000" in format_comparison(out)


def test_compare_mixed_shift_ci_brackets_difference_and_is_seeded():
    # Half the prompts improve from 0/2 to 2/2 correct, half stay: diff 0.5, CI strictly inside.
    a = [result(f"p{i}", [0, 0]) for i in range(20)]
    b = [result(f"p{i}", [1, 1] if i % 2 else [0, 0]) for i in range(20)]
    out = compare(a, b, [1], n_boot=500, seed=3)["metrics"]["accuracy"]
    assert out["diff"] == 0.5
    assert 0.0 < out["ci_low"] < 0.5 < out["ci_high"] < 1.0
    assert compare(a, b, [1], n_boot=500, seed=3)["metrics"]["accuracy"] == out


def test_compare_rejects_mismatched_prompts():
    other = [result(r.prompt_id, r.correct) for r in HAND]
    with pytest.raises(ValueError, match="same prompts"):
        compare(HAND, other[:2], [1])
    with pytest.raises(ValueError, match="position 0"):
        compare(HAND, [result("zz", [0, 0, 0, 0])] + other[1:], [1])
    with pytest.raises(ValueError, match="same prompts"):
        compare(HAND, list(reversed(other)), [1])


# ------------------------------------------------------------------------------------------
# end to end with the tiny model


ROWS = [
    {"prompt": "What is 1 + 1?", "answer": "2", "difficulty": 1, "task": "add"},
    {"prompt": "What is 2 * 3?", "answer": "6", "difficulty": 2, "task": "mul"},
    {"prompt": "What is 9 - 4?", "answer": "5", "difficulty": 1, "task": "sub"},
]


def make_rewards(seen: list):
    def first_token_even(completions, completion_ids, answer, **kwargs):
        seen.append([list(ids) for ids in completion_ids])
        assert len(answer) == len(completions)  # dataset columns reach the functions
        return [1.0 if ids and ids[0] % 2 == 0 else 0.0 for ids in completion_ids]

    def format_reward(completion_ids, **kwargs):
        return [1.0 if len(ids) >= 4 else None for ids in completion_ids]

    return [first_token_even, format_reward]


def test_evaluate_model_end_to_end(tiny_model, tokenizer):
    seen: list = []
    config = EvalConfig(
        n=4, ks=[1, 2, 4], max_completion_length=5, greedy=True, batch_size=2, seed=7
    )
    res = evaluate_model(tiny_model, tokenizer, ROWS, make_rewards(seen), config)
    assert res.summary["correct_reward"] == "first_token_even"
    assert res.summary["format_reward"] == "format_reward"
    assert len(res.per_prompt) == 3
    # Two batches (2 + 1 prompts) of sampled rows, then greedy rows, alternating.
    sampled = seen[0][:8] + seen[2]
    greedy = seen[1] + seen[3]
    assert [len(s) for s in seen] == [8, 2, 4, 1]
    for p, r in enumerate(res.per_prompt):
        assert r.n == 4
        ids = sampled[4 * p : 4 * p + 4]
        assert r.correct == [i[0] % 2 == 0 for i in ids]
        assert r.rewards["first_token_even"] == pytest.approx(r.c / 4)
        assert r.mean_length == pytest.approx(sum(len(i) for i in ids) / 4)
        assert r.greedy_correct == (greedy[p][0] % 2 == 0)
        assert r.difficulty == ROWS[p]["difficulty"] and r.task == ROWS[p]["task"]
        assert 0.0 <= r.truncated_rate <= 1.0 and 0.0 <= r.format_rate <= 1.0
    overall = res.summary["overall"]
    for key in ("pass@1", "pass@2", "pass@4", "mean@4", "accuracy", "greedy_accuracy"):
        assert 0.0 <= overall[key] <= 1.0, key
    assert overall["accuracy"] == pytest.approx(sum(r.c for r in res.per_prompt) / 12)
    assert list(res.summary["by_difficulty"]) == ["1", "2"]
    assert list(res.summary["by_task"]) == ["add", "mul", "sub"]

    # Same seed: identical samples and results; compare() on them is exactly zero.
    seen_again: list = []
    again = evaluate_model(tiny_model, tokenizer, ROWS, make_rewards(seen_again), config)
    assert seen_again == seen
    assert [r.to_dict() for r in again.per_prompt] == [r.to_dict() for r in res.per_prompt]
    cmp = compare(res.per_prompt, again.per_prompt, [1, 4])
    for m in cmp["metrics"].values():
        assert (m["diff"], m["ci_low"], m["ci_high"]) == (0.0, 0.0, 0.0)

    # Another seed draws other samples.
    seen_other: list = []
    evaluate_model(tiny_model, tokenizer, ROWS, make_rewards(seen_other), config, seed=8)
    assert seen_other[0] != seen[0]
    assert seen_other[1] == seen[1]  # greedy does not depend on the seed


def test_evaluate_model_needs_a_correctness_reward(tiny_model, tokenizer):
    def a(completions, **kwargs):
        return [1.0] * len(completions)

    def b(completions, **kwargs):
        return [0.0] * len(completions)

    with pytest.raises(ValueError, match="correct_reward"):
        evaluate_model(tiny_model, tokenizer, ROWS, [a, b], n=2, ks=[1])
    with pytest.raises(ValueError, match="not one of"):
        evaluate_model(tiny_model, tokenizer, ROWS, [a, b], n=2, ks=[1], correct_reward="c")


def test_evaluate_model_correctness_is_the_flagged_reward(tiny_model, tokenizer):
    from groupwise.rewards import accuracy_reward, format_reward

    def pays(completions, **kwargs):
        return [1.0] * len(completions)

    def judge(completions, **kwargs):
        return [0.0] * len(completions)

    def judge_too(completions, **kwargs):
        return [1.0] * len(completions)

    judge.is_correctness = judge_too.is_correctness = True
    quick = dict(n=2, ks=[1], max_completion_length=2)
    res = evaluate_model(tiny_model, tokenizer, ROWS, [pays, judge, judge_too], **quick)
    assert res.summary["correct_reward"] == "judge"  # the first flagged, whatever its name
    assert res.summary["overall"]["accuracy"] == 0.0
    res = evaluate_model(tiny_model, tokenizer, ROWS, [pays, judge], correct_reward="pays", **quick)
    assert res.summary["correct_reward"] == "pays"  # correct_reward still overrides
    assert res.summary["overall"]["accuracy"] == 1.0
    res = evaluate_model(tiny_model, tokenizer, ROWS, [format_reward, accuracy_reward], **quick)
    assert res.summary["correct_reward"] == "accuracy_reward"
