"""E9's results read with its looks in mind (no new run): the alpha its boundary spends per
look, the textbook boundary beside it, intervals valid at any look, the estimates adjusted for
stopping, stage-wise p-values with Holm, the implied speed-up at every level of uniform's
curve, and the differences at the budget alone. Reads ``results_curriculum/e9/runs.jsonl``;
writes ``results_curriculum/e9/reread.json``.

    python benchmarks/curriculum_e9_reread.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from scipy.optimize import brentq

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import curriculum_e9_analysis as e9a  # noqa: E402
import curriculum_e10_stats as seq  # noqa: E402

RESULTS = HERE / "results_curriculum" / "e9"
PATHS = 400_000  # simulated experiments per figure
STOPPED = {"select": 8, "rollout_gdro_level": 14}  # seeds per arm where each crossed


def null_t_paths(looks: tuple[int, ...], rng: np.random.Generator, shift: float = 0.0,
                 sd: float = 1.0) -> tuple[list[np.ndarray], list[np.ndarray]]:  # fmt: skip
    """Means and paired t at each look of ``PATHS`` simulated experiments whose per-seed
    differences are normal(shift, sd)."""
    d = shift + sd * rng.standard_normal((PATHS, looks[-1]))
    means, ts = [], []
    for n in looks:
        x = d[:, :n]
        means.append(x.mean(1))
        ts.append(x.mean(1) / (x.std(1, ddof=1) / np.sqrt(n)))
    return means, ts


def first_crossing(ts: list[np.ndarray], bounds: list[float]) -> np.ndarray:
    """The look (0-based) at which each path first crosses; len(bounds) if never."""
    out = np.full(len(ts[0]), len(bounds))
    for k in reversed(range(len(bounds))):
        out[ts[k] >= bounds[k]] = k
    return out


def main() -> dict:
    runs = [json.loads(line) for line in (RESULTS / "runs.jsonl").read_text().splitlines()]
    warm = json.loads((RESULTS / "warm.json").read_text())["sampled_accuracy"]
    by = {(r["arm"], r["seed"]): r for r in runs}
    looks = e9a.LOOKS
    bounds = [e9a.efficacy_boundary(n) for n in looks]
    rng = np.random.default_rng(0)
    _, ts = null_t_paths(looks, rng)
    cross = first_crossing(ts, bounds)
    out: dict = {"boundaries_t": bounds,
                 "spent_alpha": [float(np.mean(cross == k)) for k in range(len(looks))]}
    fractions = [n / looks[-1] for n in looks]
    z = seq.z_boundaries(fractions, 0.025)
    out["lan_demets_obf"] = {"z": z, "t": seq.t_boundaries(z, [n - 1 for n in looks])}
    grid = [0.0] + list(e9a_marks())
    for arm, n in STOPPED.items():
        seeds = range(1, n + 1)
        d = [e9a.endpoint(by[arm, s], warm) - e9a.endpoint(by["uniform", s], warm) for s in seeds]
        test = e9a.paired_t(d)
        k = looks.index(n)
        # Stage-wise p: crossing at an earlier look, or at this one with t at least as large.
        earlier = cross < k
        p = float(np.mean(earlier | ((cross >= k) & (ts[k] >= test["t"]))))


        u = np.mean([curve(by["uniform", s], warm) for s in seeds], 0)
        c = np.mean([curve(by[arm, s], warm) for s in seeds], 0)
        by_level = {}
        for f in (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0):
            level = float(np.interp(f, grid, u))
            by_level[f] = e9a.tokens_to_reach(grid, u, level) / e9a.tokens_to_reach(grid, c, level)
        at_budget = {
            key: e9a.paired_t([fn(by[arm, s]) - fn(by["uniform", s]) for s in seeds])
            for key, fn in (("greedy", lambda r: float(np.mean(r["greedy_two"]))),
                            ("sampled", lambda r: float(np.mean(r["points"][-1]["sampled"]))))
        }  # fmt: skip
        out[arm] = {
            "seeds": n, "naive": test, "stagewise_p": p,
            "repeated_ci": list(seq.repeated_ci(test["mean"], test["se"], bounds[k])),
            "bias_adjusted": brentq(stopped_excess, 0.0, 0.15, xtol=1e-4,
                                    args=(looks, bounds, k, test["sd"], test["mean"])),
            "speedup_by_uniform_level": by_level, "at_budget": at_budget,
        }  # fmt: skip
    ps = sorted((out[arm]["stagewise_p"], arm) for arm in STOPPED)
    for i, (_, arm) in enumerate(ps):
        out[arm]["holm_p"] = max(min(1.0, (len(ps) - j) * ps[j][0]) for j in range(i + 1))
    (RESULTS / "reread.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))
    return out


def stopped_mean(shift: float, looks: tuple[int, ...], bounds: list[float], k: int,
                 sd: float) -> float:  # fmt: skip
    """The mean estimate among simulated experiments (per-seed differences normal(shift, sd))
    that first cross at look ``k``: the conditional bias-adjusted estimate is the shift at which
    it equals the observed mean."""
    means, t_paths = null_t_paths(looks, np.random.default_rng(1), shift, sd)
    return float(means[k][first_crossing(t_paths, bounds) == k].mean())


def stopped_excess(shift: float, looks: tuple[int, ...], bounds: list[float], k: int,
                   sd: float, observed: float) -> float:  # fmt: skip
    return stopped_mean(shift, looks, bounds, k, sd) - observed


def e9a_marks() -> list[float]:
    return [round(0.1 * k, 1) for k in range(1, 11)]


def curve(run: dict, warm: float) -> list[float]:
    return [warm] + [float(np.mean(p["sampled"])) for p in run["points"]]


if __name__ == "__main__":
    main()
