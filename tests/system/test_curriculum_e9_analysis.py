"""benchmarks/curriculum_e9_analysis.py: the frozen analysis of the curriculum experiment on
synthetic data, against hand-computed values and scipy."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from scipy import stats

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "curriculum_e9_analysis.py"


@pytest.fixture(scope="module")
def an() -> ModuleType:
    spec = importlib.util.spec_from_file_location("curriculum_e9_analysis", PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["curriculum_e9_analysis"] = module
    spec.loader.exec_module(module)
    return module


def test_budget_average_is_the_trapezoid_over_the_tokens(an: ModuleType) -> None:
    # (0.2 + 0.4) / 2 * 10 + (0.4 + 0.6) / 2 * 10 = 8, over 20 tokens.
    assert an.budget_average([0, 10, 20], [0.2, 0.4, 0.6]) == pytest.approx(0.4)
    # Uneven steps: (0 + 1) / 2 * 10 + 1 * 20 = 25, over 30.
    assert an.budget_average([0, 10, 30], [0.0, 1.0, 1.0]) == pytest.approx(25 / 30)
    # Two evaluations after one step: a zero-width segment, (0.5 * 10 + 0 + 0.5 * 10) / 20.
    assert an.budget_average([0, 10, 10, 20], [0.0, 1.0, 0.5, 0.5]) == pytest.approx(0.5)
    for tokens in ([5, 10], [0, 10, 5], [0, 0]):
        with pytest.raises(ValueError, match="non-decreasing tokens from 0"):
            an.budget_average(tokens, [0.1] * len(tokens))


def test_paired_t_by_hand_and_against_scipy(an: ModuleType) -> None:
    # Differences 1, 2, 3: mean 2, sd 1, t = 2 / (1 / sqrt 3).
    got = an.paired_t([1.0, 2.0, 3.0])
    assert got["mean"] == 2.0 and got["sd"] == pytest.approx(1.0)
    assert got["t"] == pytest.approx(2 * math.sqrt(3))
    assert got["low"] == pytest.approx(2 - 4.302653 / math.sqrt(3), abs=1e-5)
    rng = np.random.default_rng(3)
    a, b = rng.normal(0.5, 0.05, 14), rng.normal(0.48, 0.05, 14)
    got = an.paired_t(a - b)
    ref = stats.ttest_rel(a, b, alternative="greater")
    assert got["t"] == pytest.approx(ref.statistic)
    assert got["p_one_sided"] == pytest.approx(ref.pvalue)
    low, high = stats.ttest_rel(a, b).confidence_interval(0.95)
    assert (got["low"], got["high"]) == pytest.approx((low, high))
    assert an.welch_p(a, b) == pytest.approx(
        stats.ttest_ind(a, b, equal_var=False, alternative="greater").pvalue
    )


def test_geometric_mean_ratio_by_hand(an: ModuleType) -> None:
    # Ratios 2, 1, 4: geometric mean 8^(1/3) = 2; logs ln2, 0, ln4 have mean ln2 and sd ln2.
    got = an.geometric_mean_ratio([2.0, 0.5, 4.0], [1.0, 0.5, 1.0])
    assert got["ratio"] == pytest.approx(2.0)
    half = 4.302653 * math.log(2) / math.sqrt(3)
    assert got["low"] == pytest.approx(2 * math.exp(-half), rel=1e-5)
    assert got["high"] == pytest.approx(2 * math.exp(half), rel=1e-5)


def test_boundary_values_and_calibration(an: ModuleType) -> None:
    # 2.246 x sqrt(20 / n) at 8, 14 and 20 seeds.
    got = [an.efficacy_boundary(n) for n in (8, 14, 20)]
    assert got == pytest.approx([3.5513, 2.6845, 2.246], abs=1e-4)
    # The constant is what the simulation gives (Monte Carlo error about 0.02 at 20,000).
    assert an.calibrate_boundary() == pytest.approx(an.BOUNDARY_C, abs=0.04)


def test_the_looks_keep_a_one_sided_error_of_0_025(an: ModuleType) -> None:
    # Under no effect, the share of experiments that "pay" at some look is 0.025 (one-sided),
    # futility and all (stopping early for futility can only lower it).
    rng = np.random.default_rng(5)
    reps = 6000
    pays = sum(an.decide(rng.normal(0, 0.05, 20), 0.04)["state"] == an.PAYS for _ in range(reps))
    assert pays / reps == pytest.approx(0.025, abs=0.007)


def test_warp_gain_by_hand(an: ModuleType) -> None:
    # A straight rise 0 -> 1 over 20 tokens averages 0.5; 1.5x faster it reads 0.75 at 10 and
    # (held past the budget) 1 at 20: average (0.375 + 0.875) * 10 / 20 = 0.625.
    assert an.warp_gain([0, 10, 20], [0.0, 0.5, 1.0], 1.5) == pytest.approx(0.125)
    # A curve that has risen by the first evaluation gains nothing on this grid.
    assert an.warp_gain([0, 10, 20], [0.0, 1.0, 1.0], 2.0) == pytest.approx(0.0)
    assert an.warp_gain([0, 10, 20], [0.0, 0.5, 1.0], 1.0) == 0.0


def test_tokens_to_reach_and_the_speedup_at_half_budget_by_hand(an: ModuleType) -> None:
    grid = [0, 10, 20, 30, 40]
    # Linear between evaluations: 0.2 -> 0.6 over 10..20 reaches 0.5 at 17.5.
    assert an.tokens_to_reach(grid, [0.1, 0.2, 0.6, 0.6, 0.6], 0.5) == pytest.approx(17.5)
    assert an.tokens_to_reach(grid, [0.5, 0.2, 0.2, 0.2, 0.2], 0.5) == 0.0
    assert an.tokens_to_reach(grid, [0.1, 0.2, 0.3, 0.3, 0.3], 0.5) == math.inf
    # Uniform rises 0 -> 0.8 linearly: its level at half the budget (20) is 0.4, reached at 20.
    # A curriculum twice as fast reaches 0.4 at 10: 2x; one that never gets there: 0.
    uniform = [0.0, 0.2, 0.4, 0.6, 0.8]
    assert an.speedup_at_half_budget(grid, uniform, [0.0, 0.4, 0.8, 0.8, 0.8]) == pytest.approx(2)
    assert an.speedup_at_half_budget(grid, uniform, uniform) == pytest.approx(1.0)
    assert an.speedup_at_half_budget(grid, uniform, [0.0, 0.1, 0.2, 0.3, 0.3]) == 0.0


def test_implied_speedup_bootstraps_the_seeds_with_both_arms(an: ModuleType) -> None:
    grid = [0, 10, 20, 30, 40]
    uniform = np.array([[0.0, 0.2, 0.4, 0.6, 0.8]] * 5)
    # Every seed the same: every resample gives the estimate, 2x.
    same = an.implied_speedup(grid, uniform, np.array([[0.0, 0.4, 0.8, 0.8, 0.8]] * 5), reps=50)
    assert same["estimate"] == pytest.approx(2) and same["low"] == same["high"] == same["estimate"]
    # Seeds differ: the interval holds the estimate, and resampling the pairs (not each arm
    # alone) keeps a seed's curriculum run with its own uniform run.
    rng = np.random.default_rng(1)
    u = uniform + rng.normal(0, 0.03, uniform.shape)
    c = np.array([[0.0, 0.4, 0.8, 0.8, 0.8]] * 5) + rng.normal(0, 0.03, uniform.shape)
    out = an.implied_speedup(grid, u, c, reps=400)
    assert out["low"] <= out["estimate"] <= out["high"]
    assert out["estimate"] == pytest.approx(an.speedup_at_half_budget(grid, u.mean(0), c.mean(0)))


def with_t(n: int, t: float, sd: float = 0.05, seed: int = 0) -> np.ndarray:
    """n values whose mean and sd give exactly the t statistic ``t``."""
    z = np.random.default_rng(seed).normal(size=n)
    z = (z - z.mean()) / z.std(ddof=1)
    return t * sd / math.sqrt(n) + sd * z


def test_decide_every_branch(an: ModuleType) -> None:
    gain = 0.04
    # Fewer seeds than the first look: continue, nothing decided.
    early = an.decide(with_t(5, 3.0), gain)
    assert early["state"] == an.CONTINUE and early["look"] is None and early["next_look"] == 8
    # Pays at the first look: t 4.0 > 3.551.
    paid = an.decide(with_t(8, 4.0), gain)
    assert paid["state"] == an.PAYS and paid["look"] == 8
    # t 3.0 at 8 seeds does not cross 3.551: continue to 14.
    waiting = an.decide(np.concatenate([with_t(8, 3.0), [0.05, 0.05]]), gain)
    assert waiting["state"] == an.CONTINUE and waiting["look"] == 8 and waiting["next_look"] == 14
    assert waiting["test"]["t"] == pytest.approx(3.0)
    # Eight seeds at t 1, then six that pull t below 0.5 at 14: futility stops it there.
    d = np.concatenate([with_t(8, 1.0, seed=1), [-0.06] * 6])
    test14 = an.paired_t(d[:14])
    assert an.paired_t(d[:8])["t"] == pytest.approx(1.0) and test14["t"] < 0.5
    futile = an.decide(d, gain)
    assert futile["look"] == 14 and futile["state"] == an.NOT_135
    assert test14["high"] < gain
    # The same data with a 1.35x gain below the interval's upper end: undecided.
    assert an.decide(d, test14["high"] - 1e-6)["state"] == an.UNDECIDED
    # t between 0.5 and the boundary at every look: runs to 20, then judged by the interval.
    d = with_t(20, 1.5, sd=0.05, seed=2)
    for n in (8, 14):
        assert 0.5 < an.paired_t(d[:n])["t"] < an.efficacy_boundary(n)
    last = an.decide(d, gain)
    final = an.paired_t(d)
    assert last["look"] == 20 and last["state"] == (
        an.NOT_135 if final["high"] < gain else an.UNDECIDED
    )
    assert an.decide(d, final["high"] + 1e-6)["state"] == an.NOT_135
    assert an.decide(d, final["high"] - 1e-6)["state"] == an.UNDECIDED
    # Crossing at the last look: t 2.3 > 2.246.
    crossed = an.decide(with_t(20, 2.3, seed=3), gain)
    assert an.paired_t(with_t(20, 2.3, seed=3)[:14])["t"] < an.efficacy_boundary(14)
    assert crossed["state"] == an.PAYS and crossed["look"] == 20


def test_spread_alarm(an: ModuleType) -> None:
    # sd of 0, 0.2 (Bessel): 0.1414 > 1.5 x 0.07 = 0.105.
    assert an.spread_alarm([0.0, 0.2])["alarm"]
    assert not an.spread_alarm([0.40, 0.45, 0.50])["alarm"]  # sd 0.05


def fake_run(arm: str, seed: int, accs: list[float], inform: float, budget: int = 100) -> dict:
    points = []
    for k, a in enumerate(accs, start=1):
        correct = round(a * 128)
        points.append({"mark": k / len(accs), "tokens": budget * k / len(accs),
                       "sampled": [1] * correct + [0] * (128 - correct)})  # fmt: skip
    return {"arm": arm, "seed": seed, "budget": budget, "points": points,
            "informative_per_rollout": inform}  # fmt: skip


def test_analyse_pairs_by_seed_and_decides(an: ModuleType) -> None:
    rng = np.random.default_rng(0)
    runs = []
    for seed in range(1, 9):
        base = 0.25 + 0.02 * rng.normal()
        runs.append(fake_run("uniform", seed, [base, 0.5, 0.5, 0.5], 0.1))
        # select: well ahead in every seed (pays at the first look).
        runs.append(fake_run("select", seed, [base + 0.25, 0.6, 0.6, 0.6], 0.2))
        # rollout_gdro: the same as uniform up to noise of one problem.
        runs.append(fake_run("rollout_gdro_level", seed,
                             [base + rng.choice([-1, 1]) / 128, 0.5, 0.5, 0.5], 0.1))  # fmt: skip
    warm = 0.25
    out = an.analyse(runs, warm, ["select", "rollout_gdro_level"])
    select = out["curricula"]["select"]
    assert select["state"] == an.PAYS and select["look"] == 8 and select["seeds"] == 8
    assert select["informative"]["ratio"] == pytest.approx(2.0)
    # Endpoint by hand for one uniform run: grid 0, 25, 50, 75, 100.
    u1 = next(r for r in runs if r["arm"] == "uniform" and r["seed"] == 1)
    tokens, acc = an.run_curve(u1, warm)
    assert tokens.tolist() == [0, 25, 50, 75, 100]
    a1 = acc[1]
    assert an.endpoint(u1, warm) == pytest.approx(((0.25 + a1) / 2 + (a1 + 0.5) / 2 + 1.0) / 4)
    # The 1.35x gain is computed on uniform's mean curve of the seeds at the look.
    uniform = [r for r in runs if r["arm"] == "uniform"]
    grid, mean = an.uniform_mean_curve(uniform, warm)
    assert select["gain_135"] == pytest.approx(an.warp_gain(grid, mean, 1.35))
    # The implied speed-up: tokens to uniform's half-budget level, on the mean curves over seeds.
    picked = [r for r in runs if r["arm"] == "select"]
    _, select_mean = an.uniform_mean_curve(picked, warm)  # (the same averaging for any arm)
    implied = select["implied_speedup"]
    assert implied["estimate"] == pytest.approx(an.speedup_at_half_budget(grid, mean, select_mean))
    assert implied["estimate"] > 1 and implied["low"] <= implied["estimate"] <= implied["high"]
    gdro = out["curricula"]["rollout_gdro_level"]
    assert gdro["state"] == an.CONTINUE and gdro["next_look"] == 14
    assert not out["spread"]["alarm"]
    # Unpaired runs wait: a curriculum with no runs is at "continue", look None.
    alone = an.analyse(uniform, warm, ["select"])
    assert alone["curricula"]["select"]["state"] == an.CONTINUE
