"""Group statistics of rewards, as pure functions on tensors.

Group-relative advantages (and TRL's other ``scale_rewards`` and ``multi_objective_aggregation``
options), the per-group std and zero-variance fraction logged each step, GDRO's equal-prompt
factors, the one definition of an informative group, and the unbiased pass@k estimator. Nothing
here holds state or touches a model. Section numbers refer to docs/algorithms.md, which quotes
the papers and the TRL / verl code these functions follow.
"""

import operator
from collections.abc import Sequence

import torch
from torch import Tensor

from ..runtime.distributed import DistributedContext, all_gather_objects

SCALE_MODES = ("group", "batch", "none")


def _group_stats(rewards: Tensor, group_ids: Tensor) -> dict[str, Tensor]:
    """Per-group count, mean, Bessel std and constancy over the non-NaN rewards, vectorised.

    Group ids are arbitrary (unsorted, non-contiguous); ``torch.unique`` maps them to 0..G-1.
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {tuple(rewards.shape)}")
    if group_ids.shape != rewards.shape:
        raise ValueError(
            f"group_ids shape {tuple(group_ids.shape)} != rewards shape {tuple(rewards.shape)}"
        )
    # Integer or half-precision rewards: do the statistics in at least float32.
    r = rewards.to(torch.promote_types(rewards.dtype, torch.float32))
    valid = ~torch.isnan(r)
    uniq, inverse = torch.unique(group_ids, return_inverse=True)
    num_groups = uniq.numel()

    count = r.new_zeros(num_groups).index_add_(0, inverse, valid.to(r.dtype))
    total = r.new_zeros(num_groups).index_add_(0, inverse, torch.where(valid, r, 0.0))
    mean = total / count.clamp(min=1)
    # Two-pass variance (sum of squared deviations) is stable where E[r^2] - E[r]^2 is not.
    dev = torch.where(valid, r - mean[inverse], 0.0)
    sq = r.new_zeros(num_groups).index_add_(0, inverse, dev * dev)
    std = torch.where(count > 1, (sq / (count - 1).clamp(min=1)).sqrt(), 0.0)

    # A group whose valid rewards are all equal has std exactly 0 in exact arithmetic, but the
    # rounded mean can leave ~1e-17 deviations; detect it exactly so such groups give exact zeros.
    inf = torch.full_like(r, float("inf"))
    gmax = r.new_zeros(num_groups).scatter_reduce(
        0, inverse, torch.where(valid, r, -inf), "amax", include_self=False
    )
    gmin = r.new_zeros(num_groups).scatter_reduce(
        0, inverse, torch.where(valid, r, inf), "amin", include_self=False
    )
    constant = (count <= 1) | (gmax == gmin)
    std = torch.where(constant, 0.0, std)
    return {
        "r": r,
        "valid": valid,
        "inverse": inverse,
        "count": count,
        "mean": mean,
        "std": std,
        "constant": constant,
    }


def group_advantages(
    rewards: Tensor, group_ids: Tensor, scale: str = "group", eps: float = 1e-4
) -> Tensor:
    """Group-relative advantages, one per completion.

    Outcome supervision of DeepSeekMath (arXiv 2402.03300, Sec. 4.1.2; algorithms.md §2):
    ``A_i = (r_i - mean(r_group)) / (std(r_group) + eps)``, with TRL's ``scale_rewards`` options
    (algorithms.md §3.5):

    - ``"group"``: divide by the std of the completion's own group.
    - ``"batch"``: divide by the std of all non-NaN rewards in the batch (still centred on the
      group mean).
    - ``"none"``: ``r_i - mean(r_group)`` only, as in Dr. GRPO (algorithms.md §3.1).

    std is the unbiased (Bessel, n-1) estimate, as in TRL and verl, and eps = 1e-4 is TRL's.
    NaN rewards are left out of every statistic and get advantage 0. So does every member of a
    group with fewer than two valid rewards, or whose valid rewards are all equal: such a group
    carries no learning signal.

    Args:
        rewards: [N] rewards; NaN marks "no reward".
        group_ids: [N] integer ids; completions with the same id share a prompt. Ids need not be
            sorted or contiguous, and groups may differ in size.
        scale: one of "group", "batch", "none".
        eps: added to the std before dividing.

    Returns:
        [N] advantages in float32 (or the rewards' dtype, if wider).
    """
    if scale not in SCALE_MODES:
        raise ValueError(f"scale must be one of {SCALE_MODES}, got {scale!r}")
    s = _group_stats(rewards, group_ids)
    r, valid, inverse = s["r"], s["valid"], s["inverse"]

    centered = r - s["mean"][inverse]
    if scale == "group":
        adv = centered / (s["std"][inverse] + eps)
    elif scale == "batch":
        n = valid.sum()
        batch_mean = torch.where(valid, r, 0.0).sum() / n.clamp(min=1)
        batch_sq = torch.where(valid, (r - batch_mean) ** 2, 0.0).sum()
        batch_std = torch.where(n > 1, (batch_sq / (n - 1).clamp(min=1)).sqrt(), 0.0)
        adv = centered / (batch_std + eps)
    else:
        adv = centered
    no_signal = ~valid | s["constant"][inverse]
    return torch.where(no_signal, 0.0, adv)


AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")


def normalize_then_sum(
    per_func: Tensor, group_ids: Tensor, weights: Tensor, eps: float = 1e-4
) -> Tensor:
    """TRL's ``multi_objective_aggregation="normalize_then_sum"``, first half: each reward
    function's rewards normalised within their group, ``(r_ik - mean_g r_k) / (std_g r_k +
    eps)`` (Bessel std, NaN left out; 0 in a group with fewer than two valid values), then the
    weighted sum over functions, ``sum_k w_k r'_ik``, so that no function dominates by its
    scale. [N, F] -> [N]; NaN where every function returned None. Feed the result to
    :func:`batch_normalize`."""
    if per_func.dim() != 2 or per_func.shape[1] != weights.numel():
        raise ValueError(
            f"per_func must be [N, F] with F = {weights.numel()} weights, got "
            f"{tuple(per_func.shape)}"
        )
    columns = []
    for k in range(per_func.shape[1]):
        s = _group_stats(per_func[:, k], group_ids)
        inverse = s["inverse"]
        columns.append((s["r"] - s["mean"][inverse]) / (s["std"][inverse] + eps))
    normalised = torch.stack(columns, dim=1)
    total = torch.nansum(normalised * weights.to(normalised.dtype), dim=1)
    return torch.where(torch.isnan(per_func).all(dim=1), float("nan"), total)


def batch_normalize(rewards: Tensor, eps: float = 1e-4) -> Tensor:
    """``(r - mean) / (std + eps)`` over the whole batch (Bessel std; NaN rewards left out of
    the statistics and given 0): the advantage of ``normalize_then_sum`` (TRL)."""
    r = rewards.to(torch.promote_types(rewards.dtype, torch.float32))
    valid = ~torch.isnan(r)
    n = valid.sum()
    mean = torch.where(valid, r, 0.0).sum() / n.clamp(min=1)
    sq = torch.where(valid, (r - mean) ** 2, 0.0).sum()
    std = torch.where(n > 1, (sq / (n - 1).clamp(min=1)).sqrt(), 0.0)
    return torch.where(valid, (r - mean) / (std + eps), 0.0)


def group_reward_std(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """Per-element Bessel std of the non-NaN rewards of its group, for logging.

    The denominator of ``group_advantages(scale="group")`` (algorithms.md §2). It is 0 for groups
    with fewer than two valid rewards and exactly 0 for groups whose valid rewards are all equal.
    NaN-reward elements still get their group's std.
    """
    s = _group_stats(rewards, group_ids)
    return s["std"][s["inverse"]]


def zero_std_groups_fraction(rewards: Tensor, group_ids: Tensor) -> float:
    """Fraction of groups whose non-NaN rewards are all equal, so that every advantage is 0.

    These are the groups that DAPO's dynamic sampling drops (algorithms.md §3.2). Groups with
    fewer than two valid rewards count as zero-std. This counts groups, not completions; TRL's
    ``frac_reward_zero_std`` counts completions, which agrees when all groups are the same size.
    Equality is tested exactly (max == min), not as std < tolerance, so float rounding in the
    mean cannot flip the answer.
    """
    constant = _group_stats(rewards, group_ids)["constant"]
    if constant.numel() == 0:
        return 0.0
    return constant.sum().item() / constant.numel()


def equal_prompt_factors(counts: Sequence[int]) -> list[float]:
    """Row-weight factor per prompt that turns the row mean into GDRO's prompt mean under
    variable rollout counts (arXiv 2601.19280 eqs. 17-18; algorithms.md §1.4).

    A loss that averages over the N rows of a batch of P prompts weighs prompt x by its count
    n_x: ``(1/N) sum_x sum_j l_xj``. Eq. 17 averages within a prompt first and eq. 18 over
    prompts: ``(1/P) sum_x (1/n_x) sum_j l_xj``. Weighting each of x's rows by
    ``f_x = nbar / n_x`` with ``nbar = N / P`` makes the first the second exactly (and the
    factors have mean 1 over rows: ``sum_x n_x f_x = N``). All 1.0 when the counts are equal.
    """
    if not counts or min(counts) < 1:
        raise ValueError(f"every prompt needs at least one rollout, got counts {list(counts)}")
    mean = sum(counts) / len(counts)
    return [mean / n for n in counts]


INFORMATIVE_STD_TOL = 1e-6


def informative_groups(
    correctness: Tensor,
    group_ids: Tensor,
    tol: float = INFORMATIVE_STD_TOL,
    num_groups: int | None = None,
) -> Tensor:
    """Bool [num_groups]: whether group g is informative, the one definition every part of
    groupwise uses (the ``compute/informative_groups`` metric, DAPO dynamic sampling, the
    curricula): at least two non-NaN **correctness** scores (``Scores.correctness``: the reward
    that declares correctness, the total only when none does) whose population std (verl's
    ``np.std``, as DAPO's filter) exceeds ``tol``. A tolerance, not ``!= 0``: scores that differ
    only by float rounding (``0.1 + 0.2`` vs ``0.3``, ``[1, 1 + 1e-9]``) are zero variance.

    ``group_ids`` are 0-based positions; ``num_groups`` defaults to ``max(group_ids) + 1``, and a
    group without rows is not informative."""
    ids = group_ids.detach().cpu().long()
    values = correctness.detach().cpu().double()
    if num_groups is None:
        num_groups = int(ids.max()) + 1 if ids.numel() else 0
    valid = ~torch.isnan(values)
    zeros = torch.zeros(num_groups, dtype=torch.float64)
    count = zeros.index_add(0, ids, valid.double())
    total = zeros.index_add(0, ids, torch.where(valid, values, 0.0))
    mean = total / count.clamp(min=1)
    dev = torch.where(valid, values - mean[ids], 0.0)
    var = zeros.index_add(0, ids, dev * dev) / count.clamp(min=1)
    return (count >= 2) & (var.sqrt() > tol)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021; algorithms.md §4).

    ``1 - C(n-c, k) / C(n, k)``, in the numerically stable product form of openai/human-eval:
    1.0 if n - c < k, else ``1 - prod_{i=n-c+1}^{n} (1 - k/i)``.
    """
    n, c, k = operator.index(n), operator.index(c), operator.index(k)
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def global_group_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, scale: str, ctx: DistributedContext
) -> torch.Tensor:
    """Group-relative advantages (advantages.group_advantages) of this rank's rows. Groups never
    straddle ranks, so group statistics are local; ``scale="batch"`` divides by the std of the
    global batch, every rank's rewards gathered."""

    if not (ctx.enabled and scale == "batch"):
        return group_advantages(rewards, group_ids, scale=scale)
    gathered = all_gather_objects((rewards.tolist(), group_ids.tolist()), ctx)
    all_rewards, all_ids, start, offset = [], [], 0, 0
    for rank, (r, g) in enumerate(gathered):
        if rank == ctx.rank:
            start = len(all_rewards)
        all_rewards += r
        all_ids += [offset + i for i in g]
        offset += max(g, default=-1) + 1
    advantages = group_advantages(
        torch.tensor(all_rewards, dtype=rewards.dtype), torch.tensor(all_ids), scale="batch"
    )
    return advantages[start : start + len(rewards)]


def global_normalize_then_sum(
    per_func: torch.Tensor, group_ids: torch.Tensor, weights: torch.Tensor, ctx: DistributedContext
) -> torch.Tensor:
    """TRL's ``normalize_then_sum`` advantages of this rank's rows: per-function group
    normalisation (groups are local), the weighted sum, then normalisation over the global
    batch, every rank's sums gathered (advantages.normalize_then_sum,
    advantages.batch_normalize)."""

    summed = normalize_then_sum(per_func, group_ids, weights)
    if not ctx.enabled:
        return batch_normalize(summed)
    gathered = all_gather_objects(summed.tolist(), ctx)
    start = sum(len(part) for part in gathered[: ctx.rank])
    everyone = torch.tensor([v for part in gathered for v in part], dtype=summed.dtype)
    return batch_normalize(everyone)[start : start + len(summed)]
