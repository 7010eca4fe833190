"""The square-root rollout allocation law of Multi-Adversary GDRO (Panaganti et al.,
arXiv 2601.19280, Theorem 4.2, eq. 30; docs/algorithms.md section 1) and the shrunk per-prompt
success rate its variances come from.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def sqrt_allocation(
    bin_ids: Sequence[int],
    variances: Sequence[float],
    mean_budget: float,
    n_min: int,
    n_max: int,
) -> list[int]:
    """Closed-form Rollout-GDRO (Theorem 4.2, eq. 30): n_b = n_bar sqrt(v_b) / sum_j q_j sqrt(v_j).

    ``bin_ids``: one bin per prompt; ``variances``: v_b per bin index (e.g. p_b (1 - p_b)).
    Bounds are enforced by water-filling (the scale s in n_b = clip(s sqrt(v_b), n_min, n_max) is
    chosen so the real-valued total is exact), then each prompt's real target is floored and the
    remaining units go to the largest fractional parts, so prompts of one bin differ by at most 1
    and the total is exactly ``len(bin_ids) * mean_budget`` (rounded) whenever it is reachable
    within the bounds (otherwise the nearest reachable total). All-zero variances give the
    uniform allocation."""
    if not 1 <= n_min <= n_max:
        raise ValueError(f"need 1 <= n_min <= n_max, got {n_min}, {n_max}")
    count = len(bin_ids)
    if count == 0:
        return []
    total = min(max(round(count * mean_budget), count * n_min), count * n_max)
    roots = np.sqrt(np.maximum(np.asarray(variances, dtype=np.float64), 0.0))
    weight = roots[np.asarray(bin_ids, dtype=int)]
    if weight.sum() == 0:
        weight = np.ones(count)

    def real_total(scale: float) -> float:
        return float(np.clip(scale * weight, n_min, n_max).sum())

    low, high = 0.0, 1.0
    while real_total(high) < total:
        high *= 2
        if high > 1e12:
            break
    for _ in range(200):  # bisection on the monotone total
        mid = (low + high) / 2
        if real_total(mid) < total:
            low = mid
        else:
            high = mid
    target = np.clip(high * weight, n_min, n_max)
    deficit = total - target.sum()
    if deficit > 1e-9:
        # Every prompt with v_b > 0 is at n_max: the rest of the exact budget goes evenly to
        # the zero-variance prompts (no variance to reduce there, but the budget is fixed).
        zero = weight == 0
        target[zero] = np.minimum(target[zero] + deficit / max(zero.sum(), 1), n_max)
    base = np.floor(target + 1e-9).astype(int)
    remaining = total - int(base.sum())
    frac = target - base
    # Stable sort keeps prompt order for ties, so equal targets in one bin differ by at most 1.
    order = sorted(range(count), key=lambda i: -frac[i])
    for i in order:
        if remaining <= 0:
            break
        if base[i] < n_max:
            base[i] += 1
            remaining -= 1
    for i in order[::-1]:  # float slack the other way (only if the bisection overshot)
        if remaining >= 0:
            break
        if base[i] > n_min:
            base[i] -= 1
            remaining += 1
    return base.tolist()


def shrunk_rate(successes: float, trials: float, prior_rate: float, prior_strength: float) -> float:
    """Posterior-mean success rate (s + k p0) / (n + k): ``prior_strength`` k pseudo-rollouts at
    ``prior_rate`` p0 (a Beta(k p0, k (1 - p0)) prior); p0 when n + k = 0."""
    if trials + prior_strength <= 0:
        return prior_rate
    return (successes + prior_strength * prior_rate) / (trials + prior_strength)
