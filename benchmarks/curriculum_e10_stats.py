"""Group-sequential statistics for the curriculum experiment E10: one-sided tests of
"curriculum better than baseline" on paired t statistics over random seeds, looked at after
n_1 < n_2 < ... < n_K seeds (information fraction t_k = n_k / n_K). Plain numpy and scipy.

- **Spending.** Lan-DeMets alpha-spending functions (Lan & DeMets 1983): O'Brien-Fleming type
  (:func:`obf_spending`) and Pocock type (:func:`pocock_spending`); the per-look increments
  (:func:`spent_alpha`).
- **Boundaries.** One-sided efficacy boundaries on the Z scale (:func:`z_boundaries`), by the
  recursive numerical integration of Armitage, McPherson & Rowe (1969) as set out in Jennison &
  Turnbull (2000, "Group Sequential Methods", ch. 19), each look's boundary solved so that the
  null probability of first crossing there is that look's increment. Futility is non-binding,
  so it plays no part in the computation (:func:`futility_stop` only reports it). Mapped to the
  t scale at equal nominal p (:func:`t_boundaries`).
- **Several hypotheses.** The graphical procedure of Bretz, Maurer, Brannath & Posch (2009, "A
  graphical approach to sequentially rejective multiple test procedures") run group-sequentially
  as in Maurer & Bretz (2013, "Multiple testing in group sequential trials using graphical
  approaches"): :func:`graphical_sequential_test`, with :func:`update_graph` (Bretz et al. 2009,
  Algorithm 1) and Holm's graph (:func:`holm_graph`).
- **Inference after stopping.** Repeated confidence intervals (:func:`repeated_ci`; Jennison &
  Turnbull ch. 9), the stage-wise ordering p-value (:func:`stagewise_p_value`; ch. 8) and the
  median-unbiased estimate of the drift (:func:`median_unbiased_estimate`) and of the mean
  difference (:func:`mean_difference_estimate`).

Scale: with the information at look k taken as I_k = t_k (so I_K = 1), the score is
S_k = Z_k sqrt(I_k); under drift theta, S_k has independent normal increments with mean
theta (I_k - I_{k-1}) and variance I_k - I_{k-1}, so E[Z_k] = theta sqrt(t_k) and
Cov(Z_j, Z_k) = sqrt(t_j / t_k) for j <= k (Jennison & Turnbull ch. 3). For a paired mean
difference delta with per-seed sd sigma, theta = delta sqrt(n_K) / sigma.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import optimize, special, stats

Spending = Callable[[float, float], float]

TAIL_SD = 9.0  # grid reaches this many standard deviations of S_k below its mean
POINTS_PER_SD = 24  # grid points per standard deviation of the smallest increment
XTOL = 1e-10  # root-finding tolerance on Z and on theta


# ----------------------------------------------------------------------------------------------
# Spending functions


def obf_spending(fraction: float, alpha: float) -> float:
    """Lan-DeMets O'Brien-Fleming-type spending, one-sided level alpha (Lan & DeMets 1983):
    alpha(t) = 2 - 2 Phi(Phi^{-1}(1 - alpha / 2) / sqrt(t)), so alpha(1) = alpha."""
    if fraction <= 0:
        return 0.0
    return float(2.0 * stats.norm.sf(stats.norm.isf(alpha / 2) / math.sqrt(fraction)))


def pocock_spending(fraction: float, alpha: float) -> float:
    """Lan-DeMets Pocock-type spending (Lan & DeMets 1983): alpha(t) = alpha ln(1 + (e - 1) t)."""
    if fraction <= 0:
        return 0.0
    return float(alpha * math.log1p((math.e - 1.0) * fraction))


def _check(fractions: Sequence[float], alpha: float | None = None) -> np.ndarray:
    fr = np.asarray(fractions, float)
    if fr.ndim != 1 or len(fr) == 0 or fr[0] <= 0 or fr[-1] > 1 or np.any(np.diff(fr) <= 0):
        raise ValueError(f"need strictly increasing fractions in (0, 1], got {fr.tolist()}")
    if alpha is not None and not 0 < alpha < 1:
        raise ValueError(f"need 0 < alpha < 1, got {alpha}")
    return fr


def spent_alpha(
    fractions: Sequence[float], alpha: float, spending: Spending = obf_spending
) -> list[float]:
    """The alpha spent at each look: alpha(t_k) - alpha(t_{k-1}), with alpha(t_0 = 0) = 0; they
    sum to alpha(t_K), which is alpha when t_K = 1."""
    fr = _check(fractions, alpha)
    cumulative = [0.0] + [spending(float(t), alpha) for t in fr]
    return [b - a for a, b in zip(cumulative[:-1], cumulative[1:], strict=True)]


# ----------------------------------------------------------------------------------------------
# Recursive numerical integration (Armitage, McPherson & Rowe 1969; Jennison & Turnbull ch. 19)


@dataclass(frozen=True)
class _SubDensity:
    """The sub-density of S_k on the continuation region {S_j < b_j sqrt(I_j), j <= k}, held as
    grid points and Simpson masses (density times Simpson weight), so an integral of g(S_k)
    over the region is ``mass @ g(s)``."""

    s: np.ndarray
    mass: np.ndarray
    info: float


def _step(fractions: np.ndarray) -> float:
    """Grid spacing: a fraction of the standard deviation of the smallest increment of S."""
    return float(np.sqrt(np.diff(fractions, prepend=0.0)).min()) / POINTS_PER_SD


def _simpson_grid(low: float, high: float, h: float) -> tuple[np.ndarray, np.ndarray]:
    """Points and composite Simpson weights on [low, high], spacing at most h."""
    if high <= low:
        return np.empty(0), np.empty(0)
    n = max(2, math.ceil((high - low) / h))
    n += n % 2
    s = np.linspace(low, high, n + 1)
    w = np.ones(n + 1)
    w[1:-1:2], w[2:-1:2] = 4.0, 2.0
    return s, w * (high - low) / (3 * n)


def _upper_tail(prev: _SubDensity | None, info: float, z: float, theta: float) -> float:
    """P_theta(no crossing before this look, Z >= z at this look), with information ``info``:
    the continuation sub-density of the last look convolved with the normal increment
    (Jennison & Turnbull ch. 19), or 1 - Phi(z - theta sqrt(I_1)) at the first look."""
    if math.isinf(z):
        return 0.0 if z > 0 else (1.0 if prev is None else float(prev.mass.sum()))
    if prev is None:
        return float(special.ndtr(theta * math.sqrt(info) - z))
    d = info - prev.info
    x = (z * math.sqrt(info) - prev.s - theta * d) / math.sqrt(d)
    return float(prev.mass @ special.ndtr(-x))


def _advance(
    prev: _SubDensity | None, info: float, z_bound: float, theta: float, h: float
) -> _SubDensity:
    """The sub-density at this look on the continuation region S < z_bound sqrt(I): normal at
    the first look, else the last look's sub-density convolved with the normal increment of
    variance I_k - I_{k-1} (Jennison & Turnbull ch. 19). The grid runs from TAIL_SD standard
    deviations below the mean of S to the boundary (or TAIL_SD above the mean if lower)."""
    mean, sd = theta * info, math.sqrt(info)
    s, w = _simpson_grid(mean - TAIL_SD * sd, min(z_bound * sd, mean + TAIL_SD * sd), h)
    if prev is None:
        dens = np.exp(-0.5 * ((s - mean) / sd) ** 2) / (sd * math.sqrt(2 * math.pi))
    else:
        d = info - prev.info
        x = (s[:, None] - prev.s[None, :] - theta * d) / math.sqrt(d)
        dens = np.exp(-0.5 * x**2) @ prev.mass / math.sqrt(2 * math.pi * d)
    return _SubDensity(s, dens * w, info)


def crossing_probabilities(
    z_bounds: Sequence[float], fractions: Sequence[float], theta: float = 0.0
) -> list[float]:
    """P_theta(first crossing of the efficacy boundary at look k), k = 1..K, with no futility
    stop (Jennison & Turnbull ch. 19); under theta = 0 these are the spent alphas, and their sum
    is the power under theta."""
    fr = _check(fractions)
    if len(z_bounds) != len(fr):
        raise ValueError(f"{len(z_bounds)} boundaries for {len(fr)} looks")
    h, prev, out = _step(fr), None, []
    for k, (info, b) in enumerate(zip(fr, z_bounds, strict=True)):
        out.append(_upper_tail(prev, float(info), float(b), theta))
        if k < len(fr) - 1:
            prev = _advance(prev, float(info), float(b), theta, h)
    return out


def _solve_boundary(prev: _SubDensity | None, info: float, increment: float) -> float:
    """The Z boundary b with P_0(no crossing before, Z >= b) = increment (brentq)."""
    if increment <= 0:
        return math.inf
    if prev is None:
        return float(stats.norm.isf(increment))

    def excess(z: float) -> float:
        return _upper_tail(prev, info, z, 0.0) - increment

    high = float(stats.norm.isf(increment))  # P(no crossing before, Z >= b) <= P(Z >= b)
    while excess(high) > 0:
        high += 0.5
    low = high - 1.0
    while excess(low) < 0:
        low -= 1.0
        if low < -50:
            raise ValueError(f"cannot spend {increment} at this look: too little mass left")
    return float(optimize.brentq(excess, low, high, xtol=XTOL))


def z_boundaries(
    fractions: Sequence[float], alpha: float, spending: Spending = obf_spending
) -> list[float]:
    """One-sided efficacy boundaries on the Z scale with P_0(first crossing at look k) =
    alpha(t_k) - alpha(t_{k-1}) (Lan & DeMets 1983), solved look by look by brentq on the
    recursive integration of Jennison & Turnbull ch. 19; no futility boundary enters (futility
    is non-binding). A look that spends nothing gets an infinite boundary."""
    fr = _check(fractions, alpha)
    increments = spent_alpha(fr, alpha, spending)
    h, prev, bounds = _step(fr), None, []
    for k, (info, inc) in enumerate(zip(fr, increments, strict=True)):
        bounds.append(_solve_boundary(prev, float(info), inc))
        if k < len(fr) - 1:
            prev = _advance(prev, float(info), bounds[-1], 0.0, h)
    return bounds


def t_boundaries(z_bounds: Sequence[float], dfs: Sequence[float]) -> list[float]:
    """Each Z boundary on the t scale with df degrees of freedom at equal nominal one-sided p:
    t_{df}^{-1}(Phi(z)), computed from the upper tail for precision."""
    if len(z_bounds) != len(dfs):
        raise ValueError(f"{len(z_bounds)} boundaries for {len(dfs)} dfs")
    return [float(stats.t.isf(stats.norm.sf(z), df)) for z, df in zip(z_bounds, dfs, strict=True)]


def t_to_z(t_obs: float, df: float) -> float:
    """A t statistic on the Z scale at equal one-sided p: Phi^{-1}(F_{t,df}(t))."""
    return float(stats.norm.isf(stats.t.sf(t_obs, df)))


# ----------------------------------------------------------------------------------------------
# Graphical multiple testing (Bretz et al. 2009; Maurer & Bretz 2013)

Weights = dict[str, float]
Transitions = dict[str, dict[str, float]]


def holm_graph(names: Sequence[str]) -> tuple[Weights, Transitions]:
    """Holm's procedure as a graph (Bretz et al. 2009): equal weights 1/m, and a
    rejected hypothesis' weight split equally over the others, G[i][j] = 1 / (m - 1)."""
    m = len(names)
    weights = {name: 1.0 / m for name in names}
    edge = 1.0 / (m - 1) if m > 1 else 0.0
    transitions = {i: {j: (0.0 if i == j else edge) for j in names} for i in names}
    return weights, transitions


def update_graph(
    weights: Mapping[str, float], transitions: Mapping[str, Mapping[str, float]], rejected: str
) -> tuple[Weights, Transitions]:
    """Remove a rejected hypothesis i from the graph (Bretz et al. 2009, Algorithm 1):
    w_j <- w_j + w_i G[i][j]; G[j][k] <- (G[j][k] + G[j][i] G[i][k]) / (1 - G[j][i] G[i][j])
    for j != k (0 when j == k or the denominator is 0). Returns new dicts."""
    i = rejected
    rest = [j for j in weights if j != i]

    def g(a: str, b: str) -> float:
        return float(transitions.get(a, {}).get(b, 0.0))

    new_w = {j: weights[j] + weights[i] * g(i, j) for j in rest}
    new_g: Transitions = {}
    for j in rest:
        new_g[j] = {}
        for k in rest:
            denom = 1.0 - g(j, i) * g(i, j)
            ok = j != k and denom > 0
            new_g[j][k] = (g(j, k) + g(j, i) * g(i, k)) / denom if ok else 0.0
    return new_w, new_g


@dataclass(frozen=True)
class HypothesisResult:
    rejected: bool
    look: int | None  # 1-based look of rejection
    local_alpha: float  # w_i * alpha in the final graph (at rejection, if rejected)
    z_bounds: list[float]  # at local_alpha, every planned look
    t_bounds: list[float]  # at local_alpha, the looks this hypothesis reached


def graphical_sequential_test(
    t_paths: Mapping[str, Sequence[float]],
    dfs_paths: Mapping[str, Sequence[float]],
    weights: Mapping[str, float],
    transitions: Mapping[str, Mapping[str, float]],
    alpha: float,
    fractions: Sequence[float],
    spending: Spending = obf_spending,
) -> dict[str, HypothesisResult]:
    """The graphical group-sequential procedure (Maurer & Bretz 2013): each hypothesis i is
    tested at local level w_i alpha with its own spending-function boundaries on the planned
    fractions, mapped to t with the df at each look; any observed t at a look reached so far on
    or above its boundary rejects i (first such look recorded). On a rejection the graph is
    updated (Bretz et al. 2009, Algorithm 1) and every remaining hypothesis is tested again,
    its earlier looks included, at its new level, until nothing more is rejected. Controls the
    familywise error at alpha (one-sided) when w sums to at most 1 and G's rows to at most 1."""
    fr = _check(fractions, alpha)
    names = list(weights)
    if sum(weights.values()) > 1 + 1e-12 or any(w < 0 for w in weights.values()):
        raise ValueError(f"need non-negative weights summing to at most 1, got {dict(weights)}")
    for name in names:
        if len(t_paths[name]) != len(dfs_paths[name]) or len(t_paths[name]) > len(fr):
            raise ValueError(f"{name}: {len(t_paths[name])} t values, "
                             f"{len(dfs_paths[name])} dfs, {len(fr)} planned looks")  # fmt: skip
    cache: dict[float, list[float]] = {}

    def bounds_at(level: float) -> list[float]:
        if level <= 0:
            return [math.inf] * len(fr)
        if level not in cache:
            cache[level] = z_boundaries(fr, level, spending)
        return cache[level]

    w: Weights = {name: float(weights[name]) for name in names}
    g: Transitions = {i: {j: float(transitions.get(i, {}).get(j, 0.0)) for j in names}
                      for i in names}  # fmt: skip
    done: dict[str, tuple[int, float]] = {}  # name -> (look, local alpha at rejection)
    while True:
        hit = None
        for name in w:
            level = min(w[name], 1.0) * alpha
            if level <= 0:  # no level: not tested (an infinite t must not meet an infinite bound)
                continue
            tb = t_boundaries(bounds_at(level)[: len(t_paths[name])], dfs_paths[name])
            looks = [k for k, (t, b) in enumerate(zip(t_paths[name], tb, strict=True))
                     if math.isfinite(b) and t >= b]  # fmt: skip
            if looks:
                hit = name
                done[name] = (looks[0] + 1, level)
                break
        if hit is None:
            break
        w, g = update_graph(w, g, hit)

    results = {}
    for name in names:
        look, level = done.get(name, (None, min(w.get(name, 0.0), 1.0) * alpha))
        zb = bounds_at(level)
        tb = t_boundaries(zb[: len(t_paths[name])], dfs_paths[name])
        results[name] = HypothesisResult(look is not None, look, level, zb, tb)
    return results


# ----------------------------------------------------------------------------------------------
# Inference at and after stopping (Jennison & Turnbull ch. 8 and 9)


def repeated_ci(mean: float, se: float, t_bound: float) -> tuple[float, float]:
    """Repeated confidence interval at a look (Jennison & Turnbull ch. 9): mean -/+ t_bound se
    with that look's boundary; the lower ends over all looks hold together with probability at
    least 1 - alpha, whenever one stops."""
    return mean - t_bound * se, mean + t_bound * se


def stagewise_p_value(
    look: int,
    z_obs: float,
    z_bounds: Sequence[float],
    fractions: Sequence[float],
    theta: float = 0.0,
) -> float:
    """P_theta of an outcome at least as extreme as (look, z_obs) in the stage-wise ordering
    (Jennison & Turnbull ch. 8): crossing at an earlier look, or reaching this look with
    Z >= z_obs. Under theta = 0 it is the stage-wise p-value; it increases with theta."""
    fr = _check(fractions)
    if not 1 <= look <= len(fr) or len(z_bounds) != len(fr):
        raise ValueError(f"look {look} of {len(fr)}, {len(z_bounds)} boundaries")
    h, prev, p = _step(fr), None, 0.0
    for k in range(look - 1):
        p += _upper_tail(prev, float(fr[k]), float(z_bounds[k]), theta)
        prev = _advance(prev, float(fr[k]), float(z_bounds[k]), theta, h)
    return p + _upper_tail(prev, float(fr[look - 1]), float(z_obs), theta)


def median_unbiased_estimate(
    look: int, z_obs: float, z_bounds: Sequence[float], fractions: Sequence[float]
) -> float:
    """The drift theta (E[Z_k] = theta sqrt(t_k)) at which the observed outcome is the median
    of the stage-wise ordering: P_theta(at least as extreme) = 1/2 (Jennison & Turnbull
    ch. 8), by brentq. With one look it is z_obs itself."""
    fr = _check(fractions)

    def excess(theta: float) -> float:
        return stagewise_p_value(look, z_obs, z_bounds, fr, theta) - 0.5

    naive = z_obs / math.sqrt(fr[look - 1])
    low, high = naive - 1.0, naive + 1.0
    while excess(low) > 0:
        low -= 1.0
    while excess(high) < 0:
        high += 1.0
    return float(optimize.brentq(excess, low, high, xtol=XTOL))


def mean_difference_estimate(
    look: int,
    mean: float,
    sd: float,
    n: int,
    z_bounds: Sequence[float],
    fractions: Sequence[float],
    df: float | None = None,
) -> float:
    """Median-unbiased estimate of the paired mean difference after stopping at ``look`` with
    n seeds: t = mean / (sd / sqrt(n)) goes to Z at equal p (df = n - 1 unless given), theta is
    :func:`median_unbiased_estimate`, and the estimate is the mean less the correction on the
    Z scale in standard errors: mean - (z - theta sqrt(t_k)) sd / sqrt(n). With a normal
    statistic (z = t) this is theta sd / sqrt(n_K), n_K = n / t_k; with one look, the mean."""
    fr = _check(fractions)
    se = sd / math.sqrt(n)
    z = t_to_z(mean / se, n - 1 if df is None else df)
    theta = median_unbiased_estimate(look, z, z_bounds, fr)
    return mean - (z - theta * math.sqrt(fr[look - 1])) * se


def futility_stop(t_obs: float, look: int, n_looks: int, threshold: float = 0.5) -> bool:
    """Non-binding futility: stop when t < threshold at a look before the last. Stopping never
    raises the chance of a false rejection, since the boundaries ignore it."""
    return look < n_looks and t_obs < threshold
