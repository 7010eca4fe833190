"""Diagnostics of Multi-Adversary GDRO (Panaganti et al., arXiv 2601.19280, section 4;
docs/algorithms.md section 1): the weighted standard error (eq. 33), the variance proxy the
square-root law minimises (eq. 28) and the lead-lag of the adversary's weights (eq. 32).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def weighted_standard_error(
    shares: Sequence[float], sigmas: Sequence[float], rollouts: Sequence[float]
) -> float:
    """Eq. 33: WSE = sum_b q_b sigma_b / sqrt(n_b) over bins with n_b > 0."""
    total = 0.0
    for q, sigma, n in zip(shares, sigmas, rollouts, strict=True):
        if n > 0:
            total += q * sigma / math.sqrt(n)
    return total


def variance_proxy(
    shares: Sequence[float], variances: Sequence[float], rollouts: Sequence[float]
) -> float:
    """Eq. 28: VarProxy = sum_b q_b v_b / n_b over groups with n_b > 0, the quantity the square-root
    law minimises (Theorem 4.2; WSE above is minimised by n proportional to sigma^(2/3)
    instead)."""
    total = 0.0
    for q, v, n in zip(shares, variances, rollouts, strict=True):
        if n > 0:
            total += q * v / n
    return total


def lead_lag(data_shares: Sequence[float], weights: Sequence[float]) -> tuple[float, float, float]:
    """Eq. 32: mu_data = sum_b b q_b, mu_weight = sum_b b w_hat_b (weights normalised to sum 1),
    and their difference (positive: the adversary leans to easier bins than the data)."""
    q = np.asarray(data_shares, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    idx = np.arange(len(q))
    mu_data = float((idx * q).sum() / max(q.sum(), 1e-12))
    mu_weight = float((idx * w).sum() / max(w.sum(), 1e-12))
    return mu_data, mu_weight, mu_weight - mu_data


def step_metrics(
    *,
    bins: Sequence[int],
    counts: Sequence[int],
    row_bins: np.ndarray,
    reward: np.ndarray,
    bin_weights: np.ndarray,
    held_out: Sequence[float],
    mean_budget: float,
    num_bins: int,
    state_names: Sequence[str],
    mu: float,
) -> dict[str, float]:
    """The ``curriculum/*`` metrics of one step, describing the allocation and weights it used.

    Per prompt of the global batch: its group ``bins[i]`` (difficulty bins 0..num_bins-1, then the
    unseen state if any; one name per group in ``state_names``), its rollouts ``counts[i]`` and its
    held-out variance ``held_out[i]`` (history before this step). Per row: its prompt's group
    ``row_bins`` and its ``reward``. ``bin_weights``: Prompt-GDRO's q_b per group; ``mu``:
    Rollout-GDRO's shadow price."""
    states = len(state_names)
    metrics: dict[str, float] = {}
    shares = np.bincount(np.asarray(bins, dtype=int), minlength=states) / max(len(bins), 1)
    rollouts = np.bincount(row_bins, minlength=states)
    sigmas = np.array(
        [reward[row_bins == b].std() if (row_bins == b).any() else 0.0 for b in range(states)]
    )
    per_prompt_n = np.array(
        [
            np.mean([counts[i] for i in range(len(bins)) if bins[i] == b]) if shares[b] else 0.0
            for b in range(states)
        ]
    )
    q = bin_weights
    for b, name in enumerate(state_names):
        metrics[f"curriculum/prompts_bin_{name}"] = float(shares[b] * len(bins))
        metrics[f"curriculum/rollouts_bin_{name}"] = float(rollouts[b])
        metrics[f"curriculum/weight_bin_{name}"] = float(q[b])
    # Eq. 33 with this step's in-sample sigma (the earlier diagnostic, kept comparable) ...
    metrics["curriculum/wse"] = weighted_standard_error(shares, sigmas, per_prompt_n)
    metrics["curriculum/wse_uniform"] = weighted_standard_error(
        shares, sigmas, [mean_budget if s else 0 for s in shares]
    )
    # ... and from held-out per-prompt estimates, with the quantity the square-root law
    # minimises, eq. 28: every prompt is its own stratum of share 1/N.
    each = [1.0 / max(len(bins), 1)] * len(bins)
    uniform = [mean_budget] * len(bins)
    sigma_x = np.sqrt(held_out)
    metrics["curriculum/var_proxy"] = variance_proxy(each, held_out, counts)
    metrics["curriculum/var_proxy_uniform"] = variance_proxy(each, held_out, uniform)
    metrics["curriculum/wse_heldout"] = weighted_standard_error(each, sigma_x, counts)
    metrics["curriculum/wse_heldout_uniform"] = weighted_standard_error(each, sigma_x, uniform)
    # Lead-lag over the difficulty bins only (the unseen state has no place in their order).
    present = shares[:num_bins] > 0
    mu_data, mu_weight, delta = lead_lag(shares[:num_bins], q[:num_bins] * present)
    metrics.update(
        {
            "curriculum/mu_data": mu_data,
            "curriculum/mu_weight": mu_weight,
            "curriculum/lead_lag": delta,
            "curriculum/mu": mu,
        }
    )
    return metrics
