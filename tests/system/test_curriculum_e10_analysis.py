"""benchmarks/curriculum_e10_analysis.py: E10's endpoints by hand, its graph, and the decision
path on made-up runs (a curriculum that pays at the first look passes its level on; one with
no effect stops for futility; one in between continues)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def an() -> ModuleType:
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("curriculum_e10_analysis",
                                                  BENCH / "curriculum_e10_analysis.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["curriculum_e10_analysis"] = module
    spec.loader.exec_module(module)
    return module


def test_average_over_by_hand(an: ModuleType) -> None:
    seconds, acc = [0, 10, 20], [0.2, 0.4, 0.6]
    assert an.average_over(seconds, acc, 20) == pytest.approx((3 + 5) / 20)
    # Past its end the curve holds its last value; before, it is cut at the horizon.
    assert an.average_over(seconds, acc, 30) == pytest.approx((3 + 5 + 6) / 30)
    assert an.average_over(seconds, acc, 15) == pytest.approx((3 + 0.45 * 5) / 15)
    with pytest.raises(ValueError, match="positive horizon"):
        an.average_over(seconds, acc, 0)


def run(arm: str, seed: int, accuracy: float, seconds: float = 20.0) -> dict:
    ones = round(accuracy * 100)
    sampled = [1] * ones + [0] * (100 - ones)
    return {"part": "p", "arm": arm, "seed": seed, "step_seconds": seconds, "budget": 200,
            "points": [{"tokens": 100, "seconds": seconds / 2, "sampled": sampled},
                       {"tokens": 200, "seconds": seconds, "sampled": sampled}],
            "greedy_two": sampled, "pass_counts": [8 * ones // 100] * 4,
            "sampled_one": [1, 1], "informative_per_rollout": 0.5}  # fmt: skip


def test_endpoints_by_hand(an: ModuleType) -> None:
    r = run("c", 1, 0.5, seconds=40)
    # Tokens: from the warm 0.3 at 0 to 0.5 at 100, then 0.5: (40 + 50) / 200.
    assert an.token_endpoint(r, 0.3) == pytest.approx(0.45)
    # Cut at the budget: a run that overshoots is averaged over the same tokens as the others.
    assert an.token_endpoint({**r, "budget": 150}, 0.3) == pytest.approx((40 + 25) / 150)
    # Wall-clock over a baseline's 80 s: 0.3 -> 0.5 over 20 s, 0.5 for the other 60 s.
    assert an.wall_endpoint(r, 0.3, 80) == pytest.approx((8 + 30) / 80)
    base = {1: run("b", 1, 0.4, seconds=80)}
    d = an.differences({1: r}, base, [1], "wall", 0.3)
    assert d == [pytest.approx((8 + 30) / 80 - (14 + 16) / 80)]


def test_graph_token_first_then_wall_clock(an: ModuleType) -> None:
    weights, transitions = an.graph([("c1", "b"), ("c2", "b")])
    t1, t2 = an.name(("c1", "b"), "tokens"), an.name(("c2", "b"), "tokens")
    w1, w2 = an.name(("c1", "b"), "wall"), an.name(("c2", "b"), "wall")
    assert weights == {t1: 0.5, t2: 0.5, w1: 0.0, w2: 0.0}
    assert transitions[t1] == {w1: 1.0} and transitions[w1] == {t2: 1.0}
    assert transitions[t2] == {w2: 1.0} and transitions[w2] == {t1: 1.0}
    w, g = an.graph([("c1", "b")])
    assert w[an.name(("c1", "b"), "tokens")] == 1.0
    assert g[an.name(("c1", "b"), "wall")] == {}


def test_decisions_on_made_up_runs(an: ModuleType) -> None:
    warm = 0.3
    runs = []
    for s, noise in zip((1, 2, 3), (0.0, 0.01, 0.01), strict=True):
        runs.append(run("base", s, 0.40))
        runs.append(run("strong", s, 0.50 + noise))  # about +0.1: pays at the first look
        runs.append(run("none", s, 0.40 + (0.01, -0.01, 0.0)[s - 1]))  # t 0: futility
        runs.append(run("some", s, 0.40 + (0.01, 0.05, 0.03)[s - 1]))  # t about 2.6: continue
    hyps = [("strong", "base"), ("none", "base"), ("some", "base")]
    out = an.analyse_part(runs, warm, hyps)
    h = out["hypotheses"]
    strong = h[an.name(hyps[0], "tokens")]
    assert strong["state"] == an.PAYS and strong["rejected_at_look"] == 1
    assert strong["level"] == pytest.approx(0.025 / 3)
    lo, hi = strong["estimates"]["repeated_ci"]
    assert strong["estimates"]["look"] == 1
    assert lo < strong["naive"]["mean"] < hi and hi - lo > strong["naive"]["high"] - strong[
        "naive"]["low"]  # wider than the naive interval at the look  # fmt: skip
    assert sum(strong["spent_alpha"]) == pytest.approx(0.025 / 3)
    # Its wall-clock twin (same times, same effect) inherits its level and is rejected; its level
    # then goes to the other token hypotheses.
    assert h[an.name(hyps[0], "wall")]["state"] == an.PAYS
    none = h[an.name(hyps[1], "tokens")]
    assert none["state"] == an.NOT_SHOWN and none["futility_at_look"] == 1
    some = h[an.name(hyps[2], "tokens")]
    assert some["state"] == an.CONTINUE and some["level"] == pytest.approx(0.025 / 2)
    assert some["secondary"]["greedy_at_budget"]["mean"] == pytest.approx(0.03)
    assert h[an.name(hyps[2], "wall")]["level"] == 0.0  # not tested until its token twin is
    needed = an.arms_needed({"parts": {"p": out}}, {"p": hyps})
    assert needed == {"p": {"some", "base"}}
    lines = an.summary({"parts": {"p": out}})
    assert len(lines) == 6 and "pays" in lines[0] and "continue" in lines[4]


def test_a_stop_at_a_boundary_is_shrunk(an: ModuleType) -> None:
    # Rejected at the second look: the median-unbiased estimate is below the naive mean, the
    # stage-wise p below the hypothesis' level.
    runs = []
    diffs = [0.02, 0.08, 0.05, 0.07, 0.06]
    for s, d in enumerate(diffs, start=1):
        runs += [run("base", s, 0.40), run("c", s, 0.40 + d)]
    out = an.analyse_part(runs, 0.3, [("c", "base")])
    h = out["hypotheses"][an.name(("c", "base"), "tokens")]
    assert h["looks"] == 2 and h["state"] == an.PAYS and h["rejected_at_look"] == 2
    assert h["estimates"]["median_unbiased"] < h["naive"]["mean"]
    assert h["estimates"]["stagewise_p"] < 0.025


def test_e9_reread_first_crossing_by_hand() -> None:
    spec = importlib.util.spec_from_file_location("curriculum_e9_reread",
                                                  BENCH / "curriculum_e9_reread.py")
    reread = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reread)
    import numpy as np

    ts = [np.array([4.0, 1.0, 1.0, 9.0]), np.array([0.0, 3.0, 1.0, 0.0])]
    assert reread.first_crossing(ts, [3.5, 2.5]).tolist() == [0, 1, 2, 0]


def test_power_is_the_level_under_no_effect_and_grows(an: ModuleType) -> None:
    # One look: the fixed-sample t test, rejected with probability alpha when there is no effect.
    assert an.power(0.0, 1.0, 0.025, looks=(5,), reps=40_000) == pytest.approx(0.025, abs=0.003)
    # Two looks with futility: at most alpha.
    assert an.power(0.0, 1.0, 0.025, reps=40_000) <= 0.025 + 0.003
    powers = [an.power(d, 0.06, 0.0125) for d in (0.04, 0.085, 0.15)]
    assert powers == sorted(powers) and powers[-1] > 0.85
    out = an.design(0.06, [0.0125], [0.1])
    assert sum(out["0.01250"]["spent_alpha"]) == pytest.approx(0.0125)
    assert out["0.01250"]["t"][0] > out["0.01250"]["t"][1]


def test_a_pair_runs_while_either_endpoint_is_undecided(an: ModuleType) -> None:
    h = ("c", "b")
    state = {"parts": {"p": {"hypotheses": {an.name(h, "tokens"): {"state": an.PAYS},
                                            an.name(h, "wall"): {"state": an.CONTINUE}}}}}
    assert an.arms_needed(state, {"p": [h]}) == {"p": {"c", "b"}}
    state["parts"]["p"]["hypotheses"][an.name(h, "wall")]["state"] = an.NOT_SHOWN
    assert an.arms_needed(state, {"p": [h]}) == {"p": set()}


def test_no_level_means_no_test_even_for_an_infinite_t(an: ModuleType) -> None:
    # All differences equal and positive give t = inf; a hypothesis with no level yet (a
    # wall-clock twin whose token hypothesis stands) must still not be rejected.
    weights, transitions = an.graph([("c", "b")])
    tok, wall = an.name(("c", "b"), "tokens"), an.name(("c", "b"), "wall")
    out = an.seq.graphical_sequential_test({tok: [0.1], wall: [float("inf")]},
                                           {tok: [2], wall: [2]}, weights, transitions,
                                           0.025, [0.6, 1.0])  # fmt: skip
    assert not out[tok].rejected and not out[wall].rejected and out[wall].local_alpha == 0
