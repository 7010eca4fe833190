"""benchmarks/curriculum_e10_stats.py: group-sequential boundaries, the graphical multiple test
and inference after stopping, against closed forms, published gsDesign values, hand-worked
graphs and seeded Monte Carlo."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from scipy import stats

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "curriculum_e10_stats.py"
ALPHA = 0.025
THIRDS = (1 / 3, 2 / 3, 1.0)


@pytest.fixture(scope="module")
def st() -> ModuleType:
    spec = importlib.util.spec_from_file_location("curriculum_e10_stats", PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["curriculum_e10_stats"] = module
    spec.loader.exec_module(module)
    return module


def simulate_z(fractions, theta: float, n: int, seed: int) -> np.ndarray:
    """Z_1..Z_K of n trials: cumulative normal increments of the score, Cov(Z_j, Z_k) =
    sqrt(t_j / t_k), E[Z_k] = theta sqrt(t_k)."""
    fr = np.asarray(fractions, float)
    var = np.diff(fr, prepend=0.0)
    rng = np.random.default_rng(seed)
    score = np.cumsum(rng.normal(theta * var, np.sqrt(var), size=(n, len(fr))), axis=1)
    return score / np.sqrt(fr)


def first_crossing(z: np.ndarray, bounds) -> np.ndarray:
    """1-based look of first crossing per trial, 0 if never."""
    crossed = z >= np.asarray(bounds)
    return np.where(crossed.any(axis=1), crossed.argmax(axis=1) + 1, 0)


# ----------------------------------------------------------------------------------------------
# Spending and boundaries


def test_spending_functions_by_hand(st: ModuleType) -> None:
    # alpha(1) = alpha for both; alpha(0) = 0.
    for f in (st.obf_spending, st.pocock_spending):
        assert f(1.0, ALPHA) == pytest.approx(ALPHA, abs=1e-15)
        assert f(0.0, ALPHA) == 0.0
    # OBF at t = 1/2: 2 - 2 Phi(1.959964 * sqrt(2)) = 2 * (1 - Phi(2.771808)) = 0.0055746.
    assert st.obf_spending(0.5, 0.05) == pytest.approx(2 * stats.norm.sf(1.959964 * 2**0.5))
    assert st.obf_spending(0.5, 0.05) == pytest.approx(0.0055746, abs=2e-7)
    # Pocock at t = 1/2: 0.025 ln((1 + e) / 2) = 0.025 * 0.620115.
    assert st.pocock_spending(0.5, ALPHA) == pytest.approx(0.025 * 0.6201145, rel=1e-6)
    increments = st.spent_alpha(THIRDS, ALPHA)
    assert len(increments) == 3 and sum(increments) == pytest.approx(ALPHA, abs=1e-15)
    assert increments[0] == pytest.approx(st.obf_spending(1 / 3, ALPHA))
    assert all(x > 0 for x in increments)


def test_one_look_is_the_fixed_sample_test(st: ModuleType) -> None:
    assert st.z_boundaries([1.0], ALPHA) == [pytest.approx(1.959964, abs=1e-6)]
    assert st.z_boundaries([1.0], 0.05) == [pytest.approx(1.644854, abs=1e-6)]


def test_obf_boundaries_match_gsdesign(st: ModuleType) -> None:
    # gsDesign(k = 3, test.type = 1, alpha = 0.025, sfu = sfLDOF): 3.7103, 2.5114, 1.9930.
    assert st.z_boundaries(THIRDS, ALPHA) == pytest.approx([3.7103, 2.5114, 1.9930], abs=2e-3)
    assert st.z_boundaries((0.4, 0.7, 1.0), ALPHA) == pytest.approx([3.35, 2.44, 2.00], abs=0.01)
    # Two equal looks: 2.9626 (closed form, first look) and 1.9686.
    assert st.z_boundaries((0.5, 1.0), ALPHA) == pytest.approx([2.9626, 1.9686], abs=2e-3)


def test_boundaries_spend_exactly_their_increments(st: ModuleType) -> None:
    for fractions, spending in ((THIRDS, st.obf_spending), ((0.2, 0.5, 0.8, 1.0), st.obf_spending),
                                ((0.5, 1.0), st.pocock_spending)):  # fmt: skip
        bounds = st.z_boundaries(fractions, ALPHA, spending)
        assert np.all(np.diff(bounds) < 0) or spending is st.pocock_spending
        got = st.crossing_probabilities(bounds, fractions)
        assert got == pytest.approx(st.spent_alpha(fractions, ALPHA, spending), abs=1e-9)


def test_boundaries_are_grid_converged(st: ModuleType, monkeypatch) -> None:
    coarse = st.z_boundaries((0.25, 0.6, 1.0), ALPHA / 6)
    monkeypatch.setattr(st, "POINTS_PER_SD", 96)
    monkeypatch.setattr(st, "TAIL_SD", 12.0)
    assert st.z_boundaries((0.25, 0.6, 1.0), ALPHA / 6) == pytest.approx(coarse, abs=1e-6)


def test_pocock_boundaries_by_monte_carlo(st: ModuleType) -> None:
    fractions = (0.5, 1.0)
    bounds = st.z_boundaries(fractions, ALPHA, st.pocock_spending)
    assert bounds[0] == pytest.approx(stats.norm.isf(st.pocock_spending(0.5, ALPHA)), abs=1e-9)
    look = first_crossing(simulate_z(fractions, 0.0, 400_000, seed=1), bounds)
    assert np.mean(look > 0) == pytest.approx(ALPHA, abs=0.002)
    assert np.mean(look == 1) == pytest.approx(st.pocock_spending(0.5, ALPHA), abs=0.0015)
    # Repeating the first boundary at the second look (a lower bar) spends more than alpha.
    repeated = sum(st.crossing_probabilities([bounds[0]] * 2, fractions))
    assert repeated > ALPHA + 0.0008
    naive = first_crossing(simulate_z(fractions, 0.0, 400_000, seed=1), [bounds[0]] * 2)
    assert np.mean(naive > 0) == pytest.approx(repeated, abs=0.0008)


def test_obf_boundaries_by_monte_carlo(st: ModuleType) -> None:
    bounds = st.z_boundaries(THIRDS, ALPHA)
    look = first_crossing(simulate_z(THIRDS, 0.0, 400_000, seed=2), bounds)
    assert np.mean(look > 0) == pytest.approx(ALPHA, abs=0.0015)
    assert np.mean(look == 2) == pytest.approx(st.spent_alpha(THIRDS, ALPHA)[1], abs=0.0008)
    # Power under a drift: the integration against the simulation.
    power = sum(st.crossing_probabilities(bounds, THIRDS, theta=2.5))
    look = first_crossing(simulate_z(THIRDS, 2.5, 200_000, seed=3), bounds)
    assert np.mean(look > 0) == pytest.approx(power, abs=0.004)


def test_t_boundaries_at_equal_p(st: ModuleType) -> None:
    assert st.t_boundaries([1.959964], [1e9]) == [pytest.approx(1.959964, abs=1e-5)]
    assert st.t_boundaries([1.959964], [7]) == [pytest.approx(2.364624, abs=1e-5)]
    assert st.t_boundaries([math.inf, 1.959964], [7, 7])[0] == math.inf
    t = st.t_boundaries([3.7103, 2.5114, 1.9930], [6, 13, 20])
    zs, dfs = [3.7103, 2.5114, 1.9930], [6, 13, 20]
    expected = [stats.t.ppf(stats.norm.cdf(z), df) for z, df in zip(zs, dfs, strict=True)]
    assert t == pytest.approx(expected)
    assert st.t_to_z(2.364624, 7) == pytest.approx(1.959964, abs=1e-5)


# ----------------------------------------------------------------------------------------------
# Graphical multiple testing


def p_to_t(p: float) -> float:
    return float(stats.t.isf(p, 1e9))


def test_holm_with_one_look_by_hand(st: ModuleType) -> None:
    # Holm at 0.025: the smaller p against 0.0125, then the other against 0.025.
    weights, transitions = st.holm_graph(["a", "b"])
    assert weights == {"a": 0.5, "b": 0.5} and transitions["a"] == {"a": 0.0, "b": 1.0}
    for (pa, pb), expected in (((0.010, 0.020), (True, True)), ((0.010, 0.030), (True, False)),
                               ((0.015, 0.015), (False, False)),
                               ((0.030, 0.012), (False, True))):  # fmt: skip
        out = st.graphical_sequential_test({"a": [p_to_t(pa)], "b": [p_to_t(pb)]},
                                           {"a": [1e9], "b": [1e9]}, weights, transitions,
                                           ALPHA, [1.0])  # fmt: skip
        assert (out["a"].rejected, out["b"].rejected) == expected, (pa, pb)
    # Both rejected: the second at the full level, the first at half.
    out = st.graphical_sequential_test({"a": [p_to_t(0.01)], "b": [p_to_t(0.02)]},
                                       {"a": [1e9], "b": [1e9]}, weights, transitions, ALPHA,
                                       [1.0])  # fmt: skip
    assert out["a"].local_alpha == pytest.approx(0.0125)
    assert out["b"].local_alpha == pytest.approx(0.025) and out["b"].look == 1
    assert out["b"].t_bounds == [pytest.approx(stats.norm.isf(0.025), abs=1e-4)]


def test_fixed_sequence_graph(st: ModuleType) -> None:
    # w = (1, 0), G[1][2] = 1: H2 is tested at the full alpha only once H1 is rejected.
    weights = {"h1": 1.0, "h2": 0.0}
    transitions = {"h1": {"h2": 1.0}, "h2": {"h1": 0.0}}
    dfs = {"h1": [1e9], "h2": [1e9]}
    out = st.graphical_sequential_test({"h1": [p_to_t(0.03)], "h2": [p_to_t(0.0001)]}, dfs,
                                       weights, transitions, ALPHA, [1.0])  # fmt: skip
    assert not out["h1"].rejected and not out["h2"].rejected
    assert out["h2"].local_alpha == 0.0 and out["h2"].t_bounds == [math.inf]
    out = st.graphical_sequential_test({"h1": [p_to_t(0.024)], "h2": [p_to_t(0.024)]}, dfs,
                                       weights, transitions, ALPHA, [1.0])  # fmt: skip
    assert out["h1"].rejected and out["h2"].rejected
    assert out["h2"].local_alpha == pytest.approx(ALPHA)
    w, g = st.update_graph(weights, transitions, "h1")
    assert w == {"h2": 1.0} and g == {"h2": {"h2": 0.0}}


def test_graph_update_by_hand(st: ModuleType) -> None:
    # Holm over three (Bretz et al. 2009): rejecting H1 leaves Holm over two.
    w, g = st.update_graph(*st.holm_graph(["1", "2", "3"]), "1")
    assert w == pytest.approx({"2": 0.5, "3": 0.5})
    assert g["2"] == pytest.approx({"2": 0.0, "3": 1.0})
    assert g["3"] == pytest.approx({"2": 1.0, "3": 0.0})
    # An asymmetric graph, by hand: w = (1/2, 1/2, 0); G1 = (0, 1/2, 1/2), G2 = (1, 0, 0),
    # G3 = (1/2, 1/2, 0). Rejecting H1: w2 = 1/2 + 1/4, w3 = 1/4;
    # G23 = (0 + 1 * 1/2) / (1 - 1 * 1/2) = 1; G32 = (1/2 + 1/2 * 1/2) / (1 - 1/2 * 1/2) = 1.
    weights = {"1": 0.5, "2": 0.5, "3": 0.0}
    transitions = {"1": {"2": 0.5, "3": 0.5}, "2": {"1": 1.0}, "3": {"1": 0.5, "2": 0.5}}
    w, g = st.update_graph(weights, transitions, "1")
    assert w == pytest.approx({"2": 0.75, "3": 0.25})
    assert g["2"]["3"] == pytest.approx(1.0) and g["3"]["2"] == pytest.approx(1.0)
    assert g["2"]["2"] == 0.0 and g["3"]["3"] == 0.0
    # The final graph does not depend on the order of rejection (Bretz et al. 2009).
    transitions["2"] = {"1": 0.7, "3": 0.3}
    w12, g12 = st.update_graph(*st.update_graph(weights, transitions, "1"), "2")
    w21, g21 = st.update_graph(*st.update_graph(weights, transitions, "2"), "1")
    assert w12 == pytest.approx(w21) and w12 == pytest.approx({"3": 1.0})
    assert g12 == g21 == {"3": {"3": 0.0}}


def test_a_raised_level_rejects_at_an_earlier_look(st: ModuleType) -> None:
    # Holm over three, two looks. A crosses at its last look; its weight lifts B from 1/3 to
    # 1/2 of alpha, and B's first-look t, short of the 1/3 boundary, clears the 1/2 boundary.
    fractions = (0.5, 1.0)
    dfs = [9.0, 19.0]
    third = st.t_boundaries(st.z_boundaries(fractions, ALPHA / 3), dfs)
    half = st.t_boundaries(st.z_boundaries(fractions, ALPHA / 2), dfs)
    assert half[0] < third[0]
    t_b1 = (half[0] + third[0]) / 2
    weights, transitions = st.holm_graph(["A", "B", "C"])
    t_paths = {"A": [1.0, third[1] + 0.5], "B": [t_b1, 0.0], "C": [0.5, 1.5]}
    out = st.graphical_sequential_test(t_paths, {k: dfs for k in t_paths}, weights, transitions,
                                       ALPHA, fractions)  # fmt: skip
    assert out["A"].rejected and out["A"].look == 2
    assert out["A"].local_alpha == pytest.approx(ALPHA / 3)
    assert out["B"].rejected and out["B"].look == 1
    assert out["B"].local_alpha == pytest.approx(ALPHA / 2)
    assert out["B"].t_bounds == pytest.approx(half)
    # C inherits everything and still falls short.
    assert not out["C"].rejected and out["C"].look is None
    assert out["C"].local_alpha == pytest.approx(ALPHA)
    assert out["C"].t_bounds == pytest.approx(st.t_boundaries(st.z_boundaries(fractions, ALPHA),
                                                              dfs))  # fmt: skip
    # Without A's rejection, B stays unrejected.
    t_paths["A"] = [1.0, 1.0]
    out = st.graphical_sequential_test(t_paths, {k: dfs for k in t_paths}, weights, transitions,
                                       ALPHA, fractions)  # fmt: skip
    assert not any(r.rejected for r in out.values())
    # A hypothesis stopped at its first look has one t value and one t boundary.
    t_paths = {"A": [1.0, third[1] + 0.5], "B": [t_b1], "C": [0.5, 1.5]}
    out = st.graphical_sequential_test(t_paths, {"A": dfs, "B": dfs[:1], "C": dfs}, weights,
                                       transitions, ALPHA, fractions)  # fmt: skip
    assert out["B"].rejected and out["B"].look == 1 and len(out["B"].t_bounds) == 1


def test_graphical_test_controls_familywise_error(st: ModuleType) -> None:
    # Two true nulls, Holm, three looks, independent normal statistics: the chance of any
    # rejection is at most alpha (and near it: Holm on independent tests spends almost all).
    weights, transitions = st.holm_graph(["a", "b"])
    half = st.z_boundaries(THIRDS, ALPHA / 2)
    full = st.z_boundaries(THIRDS, ALPHA)
    za, zb = simulate_z(THIRDS, 0.0, 200_000, 4), simulate_z(THIRDS, 0.0, 200_000, 5)
    # Holm as the loop runs it, vectorised: one at the half level lifts the other to the full.
    ra, rb = (za >= half).any(axis=1), (zb >= half).any(axis=1)
    any_rejection = ra | rb
    assert np.mean(any_rejection) <= ALPHA + 0.001
    assert np.mean(any_rejection) == pytest.approx(ALPHA - (ALPHA / 2) ** 2, abs=0.0012)
    # Spot-check the loop against the vectorised rule on trials where it matters.
    both = np.flatnonzero(ra & ~rb & (zb >= full).any(axis=1))[:3]
    for i in both:
        out = st.graphical_sequential_test({"a": list(za[i]), "b": list(zb[i])},
                                           {"a": [1e9] * 3, "b": [1e9] * 3}, weights,
                                           transitions, ALPHA, THIRDS)  # fmt: skip
        assert out["a"].rejected and out["b"].rejected


# ----------------------------------------------------------------------------------------------
# Inference after stopping


def test_repeated_ci(st: ModuleType) -> None:
    # One look: the usual 95% t interval.
    low, high = st.repeated_ci(1.0, 0.2, st.t_boundaries([st.z_boundaries([1.0], ALPHA)[0]],
                                                         [9])[0])  # fmt: skip
    assert (low, high) == pytest.approx(stats.t.interval(0.95, 9, loc=1.0, scale=0.2))
    # Three looks: the lower ends hold at every look together with probability 1 - alpha.
    bounds = st.z_boundaries(THIRDS, ALPHA)
    theta = 1.7
    z = simulate_z(THIRDS, theta, 200_000, seed=6)
    se = 1 / np.sqrt(THIRDS)  # on the theta scale, mean_k = Z_k se_k
    lows = [st.repeated_ci(z[:, k] * se[k], se[k], bounds[k])[0] for k in range(3)]
    cover = np.all(np.stack(lows, axis=1) <= theta, axis=1)
    assert np.mean(cover) == pytest.approx(1 - ALPHA, abs=0.0015)


def test_stagewise_p_value(st: ModuleType) -> None:
    bounds = st.z_boundaries((0.5, 1.0), ALPHA)
    p1 = st.stagewise_p_value(1, 3.1, bounds, (0.5, 1.0))
    assert p1 == pytest.approx(stats.norm.sf(3.1), abs=1e-12)
    # At the last boundary it is alpha.
    assert st.stagewise_p_value(2, bounds[1], bounds, (0.5, 1.0)) == pytest.approx(ALPHA, abs=1e-9)
    # Look 2 below its boundary: alpha(1/2) + P(no crossing at 1, Z_2 >= 1.5).
    p = st.stagewise_p_value(2, 1.5, bounds, (0.5, 1.0))
    z = simulate_z((0.5, 1.0), 0.0, 400_000, seed=7)
    mc = np.mean(z[:, 0] >= bounds[0]) + np.mean((z[:, 0] < bounds[0]) & (z[:, 1] >= 1.5))
    assert p == pytest.approx(mc, abs=3e-3)
    assert p == pytest.approx(st.obf_spending(0.5, ALPHA)
                              + stats.multivariate_normal([0, 0], [[1, 0.5**0.5], [0.5**0.5, 1]])
                              .cdf([bounds[0], np.inf], lower_limit=[-np.inf, 1.5]),
                              abs=1e-5)  # fmt: skip
    # Increasing in the drift.
    ps = [st.stagewise_p_value(2, 1.5, bounds, (0.5, 1.0), theta) for theta in (-1, 0, 1, 2)]
    assert np.all(np.diff(ps) > 0)


def test_median_unbiased_estimate_by_hand(st: ModuleType) -> None:
    # One look: theta = z, and the mean-difference estimate is the mean, whatever the df.
    assert st.median_unbiased_estimate(1, 2.3, [1.96], [1.0]) == pytest.approx(2.3, abs=1e-8)
    for df in (7, 1e9):
        est = st.mean_difference_estimate(1, 0.05, 0.07, 8, [1.96], [1.0], df)
        assert est == pytest.approx(0.05, abs=1e-6)
    # Stopping at look 1: in the stage-wise ordering only the first look counts, so the
    # estimate is the naive Z / sqrt(t_1) (Jennison & Turnbull ch. 8).
    bounds = st.z_boundaries(THIRDS, ALPHA)
    theta = st.median_unbiased_estimate(1, bounds[0] + 0.05, bounds, THIRDS)
    assert theta == pytest.approx((bounds[0] + 0.05) / math.sqrt(1 / 3), abs=1e-8)
    # Stopping at look 2 just above its boundary: below the naive estimate, since
    # P_naive(cross at 1 or Z_2 >= z) > P_naive(Z_2 >= z) = 1/2.
    # Small under O'Brien-Fleming (a first-look crossing is rare), larger under Pocock.
    naive = (bounds[1] + 0.05) / math.sqrt(2 / 3)
    theta = st.median_unbiased_estimate(2, bounds[1] + 0.05, bounds, THIRDS)
    assert naive - 0.002 < theta < naive - 5e-4
    n, sd, df = 14, 0.07, 13
    t_cross = st.t_boundaries(bounds[1:2], [df])[0] + 0.05
    mean = t_cross * sd / math.sqrt(n)
    assert st.mean_difference_estimate(2, mean, sd, n, bounds, THIRDS) < mean - 1e-5
    pocock = st.z_boundaries(THIRDS, ALPHA, st.pocock_spending)
    naive = (pocock[1] + 0.05) / math.sqrt(2 / 3)
    assert st.median_unbiased_estimate(2, pocock[1] + 0.05, pocock, THIRDS) < naive - 0.05
    # Normal statistic: delta = theta sd / sqrt(n_K), n_K = n / t_k.
    z_obs = 2.8
    theta = st.median_unbiased_estimate(2, z_obs, bounds, THIRDS)
    n = 16
    mean = z_obs * sd / math.sqrt(n)
    est = st.mean_difference_estimate(2, mean, sd, n, bounds, THIRDS, df=1e9)
    assert est == pytest.approx(theta * sd / math.sqrt(n / (2 / 3)), rel=1e-5)


def test_median_unbiased_estimate_by_monte_carlo(st: ModuleType) -> None:
    # The estimate is monotone in the stage-wise ordering, so its median over trials is the
    # estimate at the median outcome; that should be the true drift.
    bounds = st.z_boundaries(THIRDS, ALPHA)
    theta = 2.5
    z = simulate_z(THIRDS, theta, 4001, seed=8)
    look = first_crossing(z, bounds)
    look = np.where(look == 0, 3, look)
    z_stop = z[np.arange(len(z)), look - 1]
    # Sort key: earlier crossing is more extreme; within a look, larger Z.
    order = np.lexsort((z_stop, np.where(look < 3, 3 - look, 0)))
    median = order[len(order) // 2]
    estimate = st.median_unbiased_estimate(int(look[median]), float(z_stop[median]), bounds,
                                           THIRDS)  # fmt: skip
    assert estimate == pytest.approx(theta, abs=0.1)
    # Monotone along the ordering: look-3 outcomes < look-2 crossings < look-1 crossings.
    outcomes = [(3, 1.0), (3, 2.5), (2, bounds[1]), (2, 3.5), (1, bounds[0]), (1, 4.5)]
    estimates = [st.median_unbiased_estimate(k, zz, bounds, THIRDS) for k, zz in outcomes]
    assert np.all(np.diff(estimates) > 0)
    # The naive estimate Z / sqrt(t) at stopping is biased upward at this drift.
    naive = np.median(z_stop / np.sqrt(np.asarray(THIRDS)[look - 1]))
    assert naive > estimate + 0.05


def test_futility_stop(st: ModuleType) -> None:
    assert st.futility_stop(0.3, 1, 3) and st.futility_stop(0.49, 2, 3)
    assert not st.futility_stop(0.5, 2, 3) and not st.futility_stop(-1.0, 3, 3)
    assert st.futility_stop(0.9, 1, 3, threshold=1.0)


def test_bad_inputs_are_refused(st: ModuleType) -> None:
    for fractions in ((0.5, 0.5, 1.0), (0.0, 1.0), (0.5, 1.2), ()):
        with pytest.raises(ValueError, match="strictly increasing"):
            st.z_boundaries(fractions, ALPHA)
    with pytest.raises(ValueError, match="alpha"):
        st.z_boundaries((0.5, 1.0), 1.5)
    with pytest.raises(ValueError, match="weights"):
        st.graphical_sequential_test({"a": [1.0]}, {"a": [9]}, {"a": 1.2}, {}, ALPHA, [1.0])
