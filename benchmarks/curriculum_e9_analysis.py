"""The analysis of the curriculum experiment E9 (``benchmarks/curriculum_e9.py``), frozen before
any of its runs: the endpoint, the tests, the group-sequential looks and the decision rule.
Plain numpy and scipy; the runs' records in, numbers and verdicts out.

- **Primary endpoint (per run).** Held-out 2-digit accuracy sampled at temperature 1: a fixed
  set of 128 problems, one sample each, at every tenth of the generated-token budget, the warm
  start's point (at 0 tokens) measured once and shared by every run from it. A run's value is
  the accuracy averaged over the budget: the trapezoid area under (tokens, accuracy) from 0 to
  the last evaluation, divided by its tokens (:func:`budget_average`).
- **Comparison.** Each curriculum against uniform, paired by seed (both arms of a seed share
  its prompt pool): a paired t test on the per-seed difference of the endpoint
  (:func:`paired_t`), one-sided at 0.025 per curriculum (familywise one-sided 0.05 for the
  two). Welch's test on the same values is printed beside it as a sensitivity check.
- **Looks.** After ``LOOKS`` = 8, 14 and 20 seeds per arm. Efficacy boundary of O'Brien-Fleming
  shape on the paired t: ``t > BOUNDARY_C * sqrt(20 / n)`` = 3.551, 2.685, 2.246
  (:func:`efficacy_boundary`); ``BOUNDARY_C`` = 2.246 is the constant for which the largest
  |t| / sqrt(20 / n) over the three looks exceeds it with probability 0.05 under no effect
  (two-sided 0.05, of which only the upper side is used: one-sided 0.025), calibrated by
  simulation (:func:`calibrate_boundary` reproduces it). A curriculum that crosses stops.
  Futility, non-binding: from the second look on, a curriculum whose t is below
  ``FUTILITY_T`` (0.5) stops (stopping it never raises the chance of a false "pays").
- **Decision rule, stated in advance** (:func:`decide`):
  - *pays*: the curriculum crosses the efficacy boundary at a look;
  - *does not pay 1.35x*: where it stops without crossing (the last look, or futility), the
    upper end of the 95% t interval of the mean difference is below the gain that a 1.35x
    time-warp of uniform's mean curve gives (:func:`warp_gain`: the curve uniform would have
    drawn had it needed 1/1.35 of its tokens for every accuracy, held at its last value past the
    budget, on the same evaluation grid);
  - otherwise *undecided*.
  Between looks the state is *continue*.
- **Spread check** (:func:`spread_alarm`): at the first look, if the blinded standard deviation
  of the endpoint (every run of every arm, arm labels ignored) exceeds 1.5 times the planning
  value (0.07), the experiment has far less power than planned; the report says so, and the
  experiment stops there without a claim.
- **Secondary.** Informative groups per rollout, curriculum / uniform, as the geometric mean of
  the per-seed ratios with a t interval on their logs (:func:`geometric_mean_ratio`); informative
  2-digit groups per run; greedy 2-digit accuracy and sampled 4-digit accuracy at the budget.
  The implied token speed-up (:func:`implied_speedup`): the tokens uniform's mean curve needs
  to reach its own level at half the budget, over the tokens the curriculum's mean curve needs
  to reach that level, with a 95% seed-bootstrap interval (seeds resampled with both arms,
  ``BOOTSTRAP`` times).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats

LOOKS = (8, 14, 20)  # seeds per arm at each look
BOUNDARY_C = 2.246  # efficacy boundary on the paired t at the last look (see calibrate_boundary)
FUTILITY_T = 0.5  # from the second look on, a curriculum with t below this stops (non-binding)
ALPHA_ONE_SIDED = 0.025  # per curriculum
SPEEDUP = 1.35  # the speed-up whose gain decides "does not pay"
PLANNING_SD = 0.07  # the endpoint's planned per-run standard deviation (upper planning value)
SPREAD_ALARM = 1.5  # times PLANNING_SD at the first look: stop without a claim
BOOTSTRAP = 2000  # seed-bootstrap resamples of the implied token speed-up
PAYS, NOT_135, UNDECIDED, CONTINUE = "pays", "does not pay 1.35x", "undecided", "continue"


def budget_average(tokens: Sequence[float], accuracy: Sequence[float]) -> float:
    """The accuracy averaged over the budget: trapezoid area of (tokens, accuracy), the first
    point at 0 tokens (the warm start), divided by the last point's tokens. Two evaluations
    after the same step (a step that crossed two marks) share their tokens: a segment of width
    0, which adds nothing."""
    t, a = np.asarray(tokens, float), np.asarray(accuracy, float)
    if len(t) < 2 or t[0] != 0.0 or np.any(np.diff(t) < 0) or t[-1] <= 0:
        raise ValueError(f"need non-decreasing tokens from 0, got {t.tolist()}")
    return float(np.sum((a[1:] + a[:-1]) / 2 * np.diff(t)) / t[-1])


def paired_t(differences: Sequence[float]) -> dict[str, float]:
    """Paired t test of the per-seed differences (curriculum - uniform): mean, sd, t, its
    one-sided p (H1: mean > 0) and the 95% two-sided t interval."""
    d = np.asarray(differences, float)
    n = len(d)
    if n < 2:
        raise ValueError(f"a paired t test needs 2 or more seeds, got {n}")
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    se = sd / math.sqrt(n)
    t = mean / se if se > 0 else math.copysign(math.inf, mean) if mean else 0.0
    half = float(stats.t.ppf(0.975, n - 1)) * se
    return {"n": n, "mean": mean, "sd": sd, "se": se, "t": t, "df": n - 1,
            "p_one_sided": float(stats.t.sf(t, n - 1)), "low": mean - half,
            "high": mean + half}  # fmt: skip


def welch_p(curriculum: Sequence[float], uniform: Sequence[float]) -> float:
    """One-sided p of Welch's unpaired t test (H1: the curriculum's mean is larger)."""
    return float(stats.ttest_ind(curriculum, uniform, equal_var=False,
                                 alternative="greater").pvalue)  # fmt: skip


def geometric_mean_ratio(curriculum: Sequence[float], uniform: Sequence[float]) -> dict:
    """Per seed ratio curriculum / uniform (informative groups per rollout): the geometric mean,
    and its 95% interval from a t interval on the log ratios."""
    logs = np.log(np.asarray(curriculum, float) / np.asarray(uniform, float))
    out = {"n": len(logs), "ratio": float(math.exp(logs.mean()))}
    if len(logs) > 1:
        half = float(stats.t.ppf(0.975, len(logs) - 1)) * logs.std(ddof=1) / math.sqrt(len(logs))
        out.update(low=math.exp(logs.mean() - half), high=math.exp(logs.mean() + half))
    return out


def efficacy_boundary(n: int, n_max: int = LOOKS[-1], c: float = BOUNDARY_C) -> float:
    """The O'Brien-Fleming-shaped boundary on the paired t after ``n`` seeds per arm."""
    return c * math.sqrt(n_max / n)


def calibrate_boundary(
    looks: Sequence[int] = LOOKS, alpha: float = 0.05, reps: int = 20_000, seed: int = 11
) -> float:
    """The constant c for which max over the looks of |t_n| / sqrt(n_max / n) exceeds c with
    probability ``alpha`` when the paired differences are pure noise (standard normal; the t
    statistic does not depend on their scale), by ``reps`` simulated experiments."""
    rng = np.random.default_rng(seed)
    n_max = looks[-1]
    d = rng.normal(size=(reps, n_max))
    worst = np.zeros(reps)
    for n in looks:
        part = d[:, :n]
        t = part.mean(1) / (part.std(1, ddof=1) / math.sqrt(n))
        worst = np.maximum(worst, np.abs(t) / math.sqrt(n_max / n))
    return float(np.quantile(worst, 1 - alpha))


def warp_gain(tokens: Sequence[float], mean_accuracy: Sequence[float],
              speedup: float = SPEEDUP) -> float:  # fmt: skip
    """The endpoint's gain from a ``speedup``-times faster uniform: the warped curve at tokens t
    is uniform's mean curve at min(speedup * t, budget) (linear between evaluations; past the
    budget it holds the last value, which makes the gain, and so a "does not pay" verdict,
    conservative), averaged over the budget on the same grid minus uniform's own average."""
    t, a = np.asarray(tokens, float), np.asarray(mean_accuracy, float)
    warped = np.interp(np.minimum(speedup * t, t[-1]), t, a)
    return budget_average(t, warped) - budget_average(t, a)


def tokens_to_reach(tokens: Sequence[float], accuracy: Sequence[float], level: float) -> float:
    """The tokens at which the curve (linear between evaluations) first reaches ``level``;
    ``math.inf`` if it never does within the budget."""
    t, a = np.asarray(tokens, float), np.asarray(accuracy, float)
    if a[0] >= level:
        return float(t[0])
    for i in range(1, len(t)):
        if a[i] >= level:
            return float(t[i - 1] + (level - a[i - 1]) / (a[i] - a[i - 1]) * (t[i] - t[i - 1]))
    return math.inf


def speedup_at_half_budget(tokens: Sequence[float], uniform: Sequence[float],
                           curriculum: Sequence[float]) -> float:  # fmt: skip
    """Tokens uniform's curve needs to reach its own level at half the budget, over the tokens
    the curriculum's curve (same grid) needs to reach it: 0 when it never does."""
    t = np.asarray(tokens, float)
    level = float(np.interp(t[-1] / 2, t, np.asarray(uniform, float)))
    mine = tokens_to_reach(t, curriculum, level)
    return 0.0 if mine == math.inf else tokens_to_reach(t, uniform, level) / max(mine, 1e-12)


def implied_speedup(tokens: Sequence[float], uniform: np.ndarray, curriculum: np.ndarray,
                    reps: int = BOOTSTRAP, seed: int = 0) -> dict[str, float]:  # fmt: skip
    """The implied token speed-up of the curriculum's mean curve over uniform's
    (:func:`speedup_at_half_budget`), from per-seed curves (rows: seeds in the same order in
    both arrays, columns: the evaluation grid ``tokens``), and its 95% percentile interval from
    ``reps`` resamples of the seed indices (both arms together, as the pairs are)."""
    u, c = np.asarray(uniform, float), np.asarray(curriculum, float)
    estimate = speedup_at_half_budget(tokens, u.mean(0), c.mean(0))
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(u), size=(reps, len(u)))
    boot = [speedup_at_half_budget(tokens, u[k].mean(0), c[k].mean(0)) for k in picks]
    low, high = np.quantile(boot, [0.025, 0.975])
    return {"estimate": estimate, "low": float(low), "high": float(high), "reps": reps}


def decide(differences: Sequence[float], gain_135: float, looks: Sequence[int] = LOOKS) -> dict:
    """The decision for one curriculum from its per-seed differences in seed order (only the
    looks reached so far count): the state (``PAYS``, ``NOT_135``, ``UNDECIDED`` or
    ``CONTINUE``), the look it was reached at, and that look's test."""
    d = list(differences)
    last: dict = {"state": CONTINUE, "look": None, "next_look": looks[0]}
    for k, n in enumerate(looks):
        if len(d) < n:
            return {**last, "next_look": n}
        test = paired_t(d[:n])
        boundary = efficacy_boundary(n, looks[-1])
        base = {"look": n, "test": test, "boundary": boundary, "gain_135": gain_135}
        if test["t"] > boundary:
            return {**base, "state": PAYS, "reason": "crossed the efficacy boundary"}
        futile = k >= 1 and test["t"] < FUTILITY_T
        if n == looks[-1] or futile:
            why = f"futility (t below {FUTILITY_T})" if futile else "the last look"
            if test["high"] < gain_135:
                return {**base, "state": NOT_135, "reason": f"stopped at {why}; the interval's "
                        f"upper end {test['high']:+.4f} < the 1.35x gain {gain_135:+.4f}"}
            return {**base, "state": UNDECIDED, "reason": f"stopped at {why}; the interval's "
                    f"upper end {test['high']:+.4f} >= the 1.35x gain {gain_135:+.4f}"}
        last = {**base, "state": CONTINUE, "next_look": looks[k + 1]}
    return last


def spread_alarm(endpoints: Sequence[float]) -> dict:
    """The blinded spread check of the first look: the standard deviation of the endpoint over
    every run (arms pooled, labels ignored) against SPREAD_ALARM x PLANNING_SD."""
    sd = float(np.std(np.asarray(endpoints, float), ddof=1))
    return {"sd": sd, "limit": SPREAD_ALARM * PLANNING_SD, "alarm": sd > SPREAD_ALARM * PLANNING_SD}


# --------------------------------------------------------------------------------------------
# From the runs' records


def run_curve(run: dict, warm_accuracy: float) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, sampled 2-digit accuracy) of a run record, from the warm start's measured point
    at 0 tokens."""
    tokens = [0.0] + [float(p["tokens"]) for p in run["points"]]
    acc = [warm_accuracy] + [float(np.mean(p["sampled"])) for p in run["points"]]
    return np.array(tokens), np.array(acc)


def endpoint(run: dict, warm_accuracy: float) -> float:
    return budget_average(*run_curve(run, warm_accuracy))


def nominal_curve(run: dict, warm_accuracy: float) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, sampled 2-digit accuracy) of a run on the nominal grid: every tenth of the
    budget, the warm start's point at 0."""
    tokens = [0.0] + [p["mark"] * run["budget"] for p in run["points"]]
    acc = [warm_accuracy] + [float(np.mean(p["sampled"])) for p in run["points"]]
    return np.array(tokens), np.array(acc)


def uniform_mean_curve(runs: Sequence[dict], warm_accuracy: float) -> tuple[np.ndarray, ...]:
    """Uniform's mean curve on the nominal grid (:func:`nominal_curve`): the mean over runs of
    the accuracy at each evaluation."""
    curves = [nominal_curve(r, warm_accuracy) for r in runs]
    return curves[0][0], np.mean([acc for _, acc in curves], axis=0)


def analyse(runs: Sequence[dict], warm_accuracy: float, curricula: Sequence[str],
            looks: Sequence[int] = LOOKS) -> dict:  # fmt: skip
    """Every curriculum's decision from the runs recorded so far: seeds count once both arms
    (the curriculum and uniform) of the seed are in; seeds are taken in increasing order."""
    by = {(r["arm"], r["seed"]): r for r in runs}
    out: dict = {"curricula": {}}
    uniform_seeds = sorted(s for a, s in by if a == "uniform")
    first = [s for s in uniform_seeds if all((c, s) in by for c in curricula)][: looks[0]]
    if len(first) >= looks[0]:
        pooled = [endpoint(by[(a, s)], warm_accuracy) for s in first
                  for a in ("uniform", *curricula)]  # fmt: skip
        out["spread"] = spread_alarm(pooled)
    for arm in curricula:
        seeds = [s for s in uniform_seeds if (arm, s) in by]
        if not seeds:
            out["curricula"][arm] = {"state": CONTINUE, "look": None, "next_look": looks[0],
                                     "seeds": 0}  # fmt: skip
            continue
        diffs = [endpoint(by[(arm, s)], warm_accuracy) - endpoint(by[("uniform", s)],
                 warm_accuracy) for s in seeds]  # fmt: skip
        # Where it stops does not depend on the 1.35x gain; the gain comes from uniform's runs
        # of that look's seed indices (of every one so far before the first look).
        look = decide(diffs, 0.0, looks).get("look") or len(seeds)
        used = seeds[:look]
        curve = uniform_mean_curve([by[("uniform", s)] for s in used], warm_accuracy)
        gain = warp_gain(*curve)
        result = {**decide(diffs, gain, looks), "gain_135": gain}
        if result.get("test"):
            grid = curve[0]
            per_seed = {a: np.array([nominal_curve(by[(a, s)], warm_accuracy)[1] for s in used])
                        for a in ("uniform", arm)}  # fmt: skip
            result["implied_speedup"] = implied_speedup(grid, per_seed["uniform"], per_seed[arm])
        result["seeds"] = len(seeds)
        result["mean_difference"] = float(np.mean(diffs[:look]))
        arm_values = [endpoint(by[(arm, s)], warm_accuracy) for s in used]
        uniform_values = [endpoint(by[("uniform", s)], warm_accuracy) for s in used]
        if len(used) > 1:
            result["welch_p"] = welch_p(arm_values, uniform_values)
        result["informative"] = geometric_mean_ratio(
            [by[(arm, s)]["informative_per_rollout"] for s in used],
            [by[("uniform", s)]["informative_per_rollout"] for s in used],
        )
        out["curricula"][arm] = result
    return out
