"""benchmarks/curriculum.py: the experiment's estimators and endpoints against hand-computed
values (the runs themselves take hours and are not tested here)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "curriculum.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("curriculum_bench", PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["curriculum_bench"] = module
    spec.loader.exec_module(module)
    return module


def test_informative_estimate_is_the_u_statistic(bench: ModuleType) -> None:
    # 8 of 16 correct: P(4 drawn without replacement all alike) = 2 * C(8,4) / C(16,4) = 140/1820.
    got = bench.informative_estimate(np.array([8, 0, 16, 3]), 16)
    assert got[0] == pytest.approx(1 - 140 / 1820)
    assert got[1] == 0.0 and got[2] == 0.0
    assert got[3] == pytest.approx(1 - 0 - math.comb(13, 4) / math.comb(16, 4))
    # Unbiased: averaged over binomial draws it equals 1 - p^4 - (1-p)^4.
    rng = np.random.default_rng(0)
    draws = rng.binomial(16, 0.3, size=200_000)
    assert bench.informative_estimate(draws, 16).mean() == pytest.approx(
        1 - 0.3**4 - 0.7**4, abs=2e-3
    )


def test_selection_ceiling_on_a_known_pool(bench: ModuleType) -> None:
    # 48 prompts always wrong, 16 at 8/16: uniform rate = 16/64 * (1 - 280/1820); the best
    # quarter (16 prompts) is exactly the informative ones, whatever the split of their samples
    # (every half of an all-wrong prompt stays all wrong), so the ratio is near 4 (the split
    # halves of an 8/16 prompt are informative at a lower rate than the full 16, hence below 4).
    counts = [0] * 48 + [8] * 16
    ceiling = bench.selection_ceiling(counts, 16)
    assert ceiling["uniform_informative"] == pytest.approx(16 / 64 * (1 - 140 / 1820))
    assert ceiling["best_quarter_ratio_plug_in"] == pytest.approx(4.0)
    assert 2.5 < ceiling["best_quarter_ratio"] <= 4.0
    assert ceiling["share_all_wrong"] == pytest.approx(0.75)
    # A pool of identical prompts: no selector beats uniform.
    flat = bench.selection_ceiling([8] * 64, 16)
    assert flat["best_quarter_ratio_plug_in"] == pytest.approx(1.0)
    assert flat["best_quarter_ratio"] == pytest.approx(1.0, abs=0.15)


def test_tokens_to_target_interpolates_and_censors(bench: ModuleType) -> None:
    def run(accs: list[float]) -> dict:
        points = []
        for k, a in enumerate(accs, start=1):
            correct = round(a * 128)
            points.append({"tokens": 1000 * k, "greedy": [1] * correct + [0] * (128 - correct)})
        return {"budget": 1000 * len(accs), "points": points}

    # From 0.25 at 0 tokens: 0.375 at 1000, 0.625 at 2000; 0.5 is crossed half way: 1500.
    assert bench.tokens_to(run([0.375, 0.625]), 0.5, 0.25) == (1500.0, True)
    # Reached at the start already: 0 tokens.
    assert bench.tokens_to(run([0.75]), 0.5, 0.5) == (0.0, True)
    # Never reached: counted at the budget, flagged.
    assert bench.tokens_to(run([0.25, 0.375, 0.25]), 0.5, 0.25) == (3000.0, False)


def test_curve_mean_is_the_trapezoid_area_over_the_tokens(bench: ModuleType) -> None:
    size = 400 + bench.ONE_DIGIT_EVAL + 100
    points = [{"mark": 0.5, "tokens": 1000, "greedy": [1] * 64 + [0] * (size - 64)},
              {"mark": 1.0, "tokens": 2000, "greedy": [1] * 64 + [0] * (size - 64)}]  # fmt: skip
    # From 0.25 at 0 tokens to 0.5 at 1000 and 2000: (0.375 * 1000 + 0.5 * 1000) / 2000.
    assert bench.curve_mean({"points": points}, 0.25) == pytest.approx(0.4375)


def test_difference_spread_splits_problems_from_training(bench: ModuleType) -> None:
    # Seed 1: differences [1, 1, 0, 0], mean 0.5, sample variance 1/3; seed 2: all 0.
    # Between seeds: stdev(0.5, 0) = sqrt(0.125). Problems: sqrt(mean(1/3 / 4, 0)) = sqrt(1/24).
    # Training: sqrt(0.125 - 1/24) = sqrt(1/12).
    spread = bench.difference_spread([np.array([1.0, 1, 0, 0]), np.zeros(4)])
    assert spread["between"] == pytest.approx(0.125**0.5)
    assert spread["problems"] == pytest.approx((1 / 24) ** 0.5)
    assert spread["training"] == pytest.approx((1 / 12) ** 0.5)
    # Seeds that agree exactly while problems disagree: all of it is the problems', none training's.
    spread = bench.difference_spread([np.array([1.0, -1]), np.array([-1.0, 1])])
    assert spread["between"] == 0.0 and spread["training"] == 0.0
    assert spread["problems"] == pytest.approx(1.0)


def test_paired_statistics(bench: ModuleType) -> None:
    t = bench.t_test([0.1, 0.3])
    # mean 0.2, sd 0.1414, se 0.1, t(1) 12.706 -> half width 1.2706
    assert t["mean"] == pytest.approx(0.2)
    assert t["high"] - t["mean"] == pytest.approx(1.2706, abs=1e-4)
    # Power of the paired t-test against the noncentral t's exact values (scipy.stats.nct,
    # two-sided 5%): 8 pairs at spread 0.2 for a 1.35x speed-up (the design's 95%), 8 at 0.3,
    # and 3 pairs at spread 0.656, where a normal approximation gives 0.0002.
    assert bench.power(math.log(1.35), 0.2, 8) == pytest.approx(0.9511, abs=0.004)
    assert bench.power(math.log(1.35), 0.3, 8) == pytest.approx(0.6811, abs=0.004)
    assert bench.power(math.log(1.35), 0.656, 3) == pytest.approx(0.0786, abs=0.004)
    assert bench.power(-math.log(1 / 0.6), 0.656, 3) == pytest.approx(0.1306, abs=0.004)
    assert math.isnan(bench.power(0.3, 0.2, 1))
    assert bench.parse_seeds("1-3,7") == [1, 2, 3, 7]
    with pytest.raises(SystemExit, match="pilot"):
        bench.parse_seeds("0-2")


def test_verdict_meets_rules_out_or_waits(bench: ModuleType) -> None:
    # Fewer tokens is better: met needs the estimate at most the goal and the interval below 1.
    assert bench.verdict(0.5, 0.4, 0.8, 0.6, lower_is_better=True).startswith("met")
    assert bench.verdict(0.5, 0.3, 1.2, 0.6, lower_is_better=True).startswith("not met yet")
    assert bench.verdict(0.7, 0.5, 0.9, 0.6, lower_is_better=True).startswith("not met yet")
    ruled = bench.verdict(1.45, 0.70, 3.01, 0.6, lower_is_better=True)
    assert ruled.startswith("not met, and ruled out") and "above 0.60x" in ruled
    # More informative groups is better: the interval's high end decides ruling out.
    assert bench.verdict(1.6, 1.2, 2.0, 1.5, lower_is_better=False).startswith("met")
    assert bench.verdict(1.25, 0.8, 1.7, 1.5, lower_is_better=False).startswith("not met yet")
    assert bench.verdict(1.6, 0.9, 2.3, 1.5, lower_is_better=False).startswith("not met yet")
    ruled = bench.verdict(1.1, 0.9, 1.3, 1.5, lower_is_better=False)
    assert ruled.startswith("not met, and ruled out") and "below 1.50x" in ruled
    # With the planned pairs all in, an undecided interval is a final "not met", while met and
    # ruled out read as before.
    final = bench.verdict(0.63, 0.39, 1.01, 0.6, lower_is_better=True, complete=True)
    assert final.startswith("not met (0.63x") and "complete" in final and "yet" not in final
    assert bench.verdict(0.5, 0.4, 0.8, 0.6, True, complete=True).startswith("met")
    assert bench.verdict(1.1, 0.9, 1.3, 1.5, False, complete=True).startswith("not met, and ruled")


def test_replay_levels_uniform_spreads_and_select_follows_the_informative_level(
    bench: ModuleType,
) -> None:
    # Level pass rates 0.5 / 0.0 / 1.0: only the first level can give an informative group
    # (P = 1 - 2 * 0.5^4 = 0.875 for a group of 4), the others never do.
    pass_rate = np.repeat([0.5, 0.0, 1.0], bench.POOL_PER_LEVEL)
    uniform = bench.replay_levels(pass_rate, "uniform", seed=0, steps=48)
    assert uniform["share"] == pytest.approx([1 / 3] * 3)  # whole epochs of 192 prompts / 4
    assert uniform["informative"][1:] == [0.0, 0.0]
    assert uniform["informative"][0] == pytest.approx(64 * 0.875, abs=12)
    select = bench.replay_levels(pass_rate, "select", seed=0, steps=48)
    assert select["informative"][1:] == [0.0, 0.0]
    # best_k on the level posterior takes the informative level whenever one is among the 16
    # candidates, so it trains there far more than a third of the time.
    assert select["share"][0] > 0.6
    assert select["informative_per_rollout"] > 1.5 * uniform["informative_per_rollout"]


def test_step_groups_records_level_rollouts_and_correct(bench: ModuleType) -> None:
    import types

    import torch

    rows = [{"difficulty": 32}, {"difficulty": 22}, {"difficulty": 12}]
    records = types.SimpleNamespace(
        last_batch=(
            rows,
            None,
            torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0]),
            None,
            None,
            torch.tensor([0, 0, 0, 2, 2, 2, 2]),  # prompt 1 got no rows (not in this rank's share)
            None,
        )
    )
    budget = bench.TokenBudget(1000, [])  # 10 tokens: below the first mark, no evaluation
    budget.trainer = types.SimpleNamespace(records=records)
    assert budget.step_groups() == [[3, 3, 1], [1, 4, 3]]
    # One record per step: the end-of-training row, which repeats the last step, adds nothing.
    logs = {"compute/generated_tokens_total": 10.0, "time/step": 2.0}
    control = types.SimpleNamespace(should_training_stop=False)
    for step in (1, 2, 2):
        budget.on_log(None, types.SimpleNamespace(global_step=step), control, logs=logs)
    assert len(budget.groups) == 2 and budget.step_seconds == 4.0


def test_worked_answer_and_supervised_batch_mask_the_prompt(bench: ModuleType) -> None:
    row = {"expression": "7 + 5", "answer": "12"}
    assert bench.worked_answer(row) == "<think> 7 + 5 = 12 </think> <answer> 12 </answer>"
    batch = bench.supervised_batch([([1, 2, 3], [4, 5]), ([6], [7, 8, 9])], pad_id=0)
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    # The loss sees the completion tokens only: neither the prompt nor the padding.
    assert batch["labels"].tolist() == [[-100, -100, -100, 4, 5], [-100, 7, 8, 9, -100]]


def test_supervised_order_is_seeded_epochs_without_replacement(bench: ModuleType) -> None:
    order = bench.supervised_order(10, steps=5, batch=4, seed=3)
    assert [len(b) for b in order] == [4] * 5
    flat = [i for b in order for i in b]
    # 20 draws from 10 examples: two whole epochs, each a permutation.
    assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:]) == list(range(10))
    assert order == bench.supervised_order(10, steps=5, batch=4, seed=3)
    assert order != bench.supervised_order(10, steps=5, batch=4, seed=4)


def test_built_once_builds_records_and_notices_a_different_rebuild(
    bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    def build(content: bytes):
        def write(folder: Path) -> dict:
            folder.mkdir()
            (folder / "config.json").write_text("{}")
            (folder / "model.safetensors").write_bytes(content)
            return {"steps": 3}

        return write

    first = bench.built_once(tmp_path / "a", None, build(b"one"))
    assert first["steps"] == 3 and len(first["digest"]) == 16
    # Present: the record is returned, nothing is rebuilt.
    assert bench.built_once(tmp_path / "a", first, build(b"never")) is first
    with pytest.raises(SystemExit, match="remove"):
        bench.built_once(tmp_path / "a", None, build(b"one"))
    # Rebuilt elsewhere with other weights: the first record is kept, with a warning.
    again = bench.built_once(tmp_path / "b", first, build(b"two"))
    assert again is first
    assert "differs" in capsys.readouterr().out


def test_problems_are_non_negative_distinct_and_fixed_by_seed(bench: ModuleType) -> None:
    one = bench.problems(None, "eval", 7, 1)
    # The task is addition: the held-out 1-digit split is every one of the 100 additions whose
    # expression hashes to it.
    assert len(one) == bench.ONE_DIGIT_EVAL and 0 < len(one) < 100
    assert all(" + " in r["expression"] for r in one + bench.eval_rows() + bench.pool_rows(3))
    # The warm start is fine-tuned on 1-digit +/- with a non-negative result, none held out.
    warm_rows = bench.problems(None, "train", bench.WARM_SEED, 1, bench.WARM_OPS)
    assert any(" - " in r["expression"] for r in warm_rows)
    assert all(float(r["answer"]) >= 0 for r in warm_rows)
    assert not {r["expression"] for r in warm_rows} & {r["expression"] for r in bench.eval_rows()}
    pool = bench.pool_rows(3)
    assert len(pool) == 3 * bench.POOL_PER_LEVEL
    assert all(float(r["answer"]) >= 0 for r in pool)
    assert len({r["expression"] for r in pool}) == len(pool)
    assert [r["difficulty"] // 10 for r in pool] == [1] * 64 + [2] * 64 + [3] * 64
    assert pool == bench.pool_rows(3) and pool != bench.pool_rows(4)
    # Training and evaluation problems never share an expression.
    held_out = {r["expression"] for r in bench.eval_rows()}
    assert not held_out & {r["expression"] for r in pool}
    with pytest.raises(ValueError, match="non-negative"):
        bench.problems(200, "train", 0, 1)
    # The whole evaluation: 400 two-digit, the one-digit ones, 100 three-digit; a regime with
    # all 43 held-out one-digit problems is read with the same function.
    size = len(bench.eval_rows())
    assert size == 500 + bench.ONE_DIGIT_EVAL
    assert bench.level_part(1, size) == slice(400, 400 + bench.ONE_DIGIT_EVAL)
    assert bench.level_part(3, 543) == slice(443, 543)
    run = {"points": [{"mark": 1.0, "greedy": [1] * 400 + [0] * 43 + [1, 0] * 50}]}
    assert bench.accuracy_at(run, 1.0, 2).mean() == 1.0
    assert bench.accuracy_at(run, 1.0, 1).sum() == 0 and len(bench.accuracy_at(run, 1.0, 1)) == 43
    assert bench.accuracy_at(run, 1.0, 3).mean() == 0.5


def test_report_pairs_runs_from_the_same_warm_start(bench: ModuleType, tmp_path, capsys) -> None:
    """A warm start rebuilt on another CPU differs from the recorded one: runs pair only with
    runs from the same weights, and each curve starts at its own warm start's accuracy."""
    import json

    size = 400 + bench.ONE_DIGIT_EVAL + 100

    def run(arm: str, seed: int, warm: str | None, accs: list[float]) -> dict:
        points = []
        for k, (mark, a) in enumerate(zip(bench.MARKS, accs, strict=True), start=1):
            correct = round(a * 128)
            greedy = [1] * correct + [0] * (size - correct)
            points.append({"mark": mark, "tokens": 1000 * k, "greedy": greedy})
        line = {"arm": arm, "seed": seed, "budget": 10_000, "points": points,
                "informative_per_rollout": 0.1, "optimizer_steps": 10}  # fmt: skip
        return line if warm is None else {**line, "warm": warm}

    fast, slow = [0.75] * 10, [0.625] * 10
    runs = [
        run("uniform", 1, None, slow),  # recorded before digests were kept: the recorded warm
        run("select", 1, "rebuilt", fast),
        run("uniform", 1, "rebuilt", slow),
        run("select", 2, "rebuilt", fast),
    ]
    (tmp_path / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
    meta = {"one_digit": {"digest": "recorded"}, "eval": {"frequent": 0.25},
            "rebuilds": {"rebuilt": {"frequent": 0.5}}}  # fmt: skip
    (tmp_path / "warm.json").write_text(json.dumps(meta))
    pilot = {"ceiling": {}, "target": 0.6, "go": {"proceed": True}}
    (tmp_path / "pilot.json").write_text(json.dumps(pilot))
    bench.command_report(tmp_path)
    out = capsys.readouterr().out
    assert "runs without their pair yet: select 2 (warm rebuilt), uniform 1 (warm recorded)" in out
    assert "pairs (seed, warm start): [(1, 'rebuilt')]" in out
    # From 0.5 (the rebuilt warm start's accuracy) to 0.6: select crosses at 1000 * 0.1/0.25 =
    # 400 tokens, uniform at 1000 * 0.1/0.125 = 800. From the recorded 0.25 it would be
    # 700 / 933 (0.75x).
    assert "tokens to target, select / uniform: 0.500x" in out
    # Areas from 0.5: select (0.625 * 1000 + 0.75 * 9000) / 10000 = 0.7375, uniform
    # (0.5625 * 1000 + 0.625 * 9000) / 10000 = 0.61875.
    assert "under the 128-problem curve), select - uniform: +0.119" in out
    assert bench.run_start(runs[0], meta) == 0.25 and bench.run_start(runs[1], meta) == 0.5


def test_run_accepts_a_rebuild_by_behaviour_and_refuses_one_too_far(
    bench: ModuleType, tmp_path, monkeypatch, capsys
) -> None:
    import json

    # 0.320 recorded; 0.344 is 3 of 128 problems away (accepted), 0.578 is 33 away (refused).
    meta = {"supervised": {"digest": "recorded"}, "eval": {"frequent": 0.32},
            "tokens_per_step": 400.0,
            "rebuilds": {"near": {"frequent": 0.34375}, "far": {"frequent": 0.578125}}}  # fmt: skip
    (tmp_path / "pilot.json").write_text(json.dumps({"go": {"proceed": True}, "target": 0.516}))
    monkeypatch.setattr(bench, "RESULTS", tmp_path)
    monkeypatch.setattr(bench, "warm_start", lambda work: (tmp_path / "warm", meta))
    monkeypatch.setattr(bench, "weights_digest", lambda folder: "far")
    with pytest.raises(SystemExit, match=r"digest far, .* accuracy 0\.578\) is not the "
                                         r"recorded one .*target 0\.516: more than 4"):  # fmt: skip
        bench.command_run(tmp_path, [1], ["uniform"], force=False)
    bench.command_run(tmp_path, [], ["uniform"], force=True)  # no seeds: nothing runs
    assert "running anyway (--force)" in capsys.readouterr().out
    monkeypatch.setattr(bench, "weights_digest", lambda folder: "near")
    bench.command_run(tmp_path, [], ["uniform"], force=False)
    assert "so it is used" in capsys.readouterr().out
    # The recorded weights run without a word.
    monkeypatch.setattr(bench, "weights_digest", lambda folder: "recorded")
    bench.command_run(tmp_path, [], ["uniform"], force=False)
    assert capsys.readouterr().out == ""
    # A rebuild not measured yet is measured once and recorded with its CPU's kernels.
    monkeypatch.setattr(bench, "weights_digest", lambda folder: "new")
    monkeypatch.setattr(bench, "load_model_and_tokenizer", lambda path: (None, None))
    monkeypatch.setattr(bench, "greedy_correct", lambda m, t, rows: [1] * 41 + [0] * 87)
    bench.command_run(tmp_path, [], ["uniform"], force=False)
    assert meta["rebuilds"]["new"]["frequent"] == 41 / 128
    assert json.loads((tmp_path / "warm.json").read_text())["rebuilds"]["new"]["frequent"] == (
        41 / 128
    )


def test_rebuild_reports_what_run_would_decide(
    bench: ModuleType, tmp_path, monkeypatch, capsys
) -> None:
    import json

    meta = {"supervised": {"digest": "recorded"}, "eval": {"frequent": 41 / 128}}
    (tmp_path / "warm.json").write_text(json.dumps(meta))
    monkeypatch.setattr(bench, "RESULTS", tmp_path)
    monkeypatch.setattr(bench, "warm_start", lambda work: (tmp_path / "warm", meta))
    monkeypatch.setattr(bench, "load_model_and_tokenizer", lambda path: (None, None))
    for digest, correct, verdict in (("near", 45, "accepted"), ("far", 46, "refused")):
        # 45 of 128 is 4 problems above the recorded 41: the edge; 46 is past it.
        monkeypatch.setattr(bench, "weights_digest", lambda folder, d=digest: d)
        greedy = [1] * correct + [0] * (128 - correct)
        monkeypatch.setattr(bench, "greedy_correct", lambda m, t, rows, g=greedy: g)
        bench.command_rebuild(tmp_path)
        out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert out["digest"] == digest and out["frequent"] == correct / 128
        assert out["run"] == verdict
    assert set(json.loads((tmp_path / "warm.json").read_text())["rebuilds"]) == {"near", "far"}


def test_level_counts_by_hand(bench: ModuleType) -> None:
    # [digits, rollouts, correct]: a group is informative when its correctness is not all alike.
    steps = [[[1, 4, 4], [2, 4, 1]], [[3, 4, 0], [2, 5, 5], [2, 3, 2]]]
    groups, inform = bench.level_counts(steps)
    assert groups.tolist() == [1, 3, 1]
    assert inform.tolist() == [0, 2, 0]
