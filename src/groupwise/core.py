"""The exact math of GRPO and its variants, as pure functions on tensors.

Group-relative advantages, the k3 KL estimator, the clipped policy loss with its four
aggregations (and GSPO's sequence-level ratio), and the unbiased pass@k estimator. Nothing here
holds state or touches a model. Section numbers refer to docs/algorithms.md, which quotes the
papers and the TRL / verl code these functions follow.
"""

import inspect
import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

SCALE_MODES = ("group", "batch", "none")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
ROLLOUT_CORRECTION_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def masked_mean(x: Tensor, mask: Tensor, dim: int | tuple[int, ...] | None = None) -> Tensor:
    """Mean of ``x`` over the positions where ``mask`` (0/1, float or bool) is set.

    ``mask`` must broadcast to ``x``. Masked-out entries are ignored completely, even NaN or inf
    padding. An empty selection gives 0 rather than NaN: the count is clamped at 1, as in TRL.
    """
    keep = mask.bool().expand_as(x)
    total = torch.where(keep, x, 0.0).sum(dim)
    return total / keep.sum(dim).clamp(min=1)


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


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(pi_theta || pi_ref), DeepSeekMath eq. (4) (algorithms.md §2).

    ``exp(ref - logp) - (ref - logp) - 1``: unbiased for samples from pi_theta, and >= 0 because
    e^x >= 1 + x. Exact, with no clamping (verl clamps ref - logp to +-20). Same shape as inputs.
    """
    log_ratio = ref_logprobs - logprobs
    return torch.exp(log_ratio) - log_ratio - 1


def rollout_correction_weights(
    old_logprobs: Tensor,
    sampling_logprobs: Tensor,
    mask: Tensor,
    *,
    mode: str = "sequence_mask",
    clip_min: float | None = None,
    clip_max: float | None = 3.0,
) -> Tensor:
    """Importance weights for the mismatch between the engine that sampled the completions and
    the trainer (algorithms.md §3.5; TRL's ``vllm_importance_sampling_*`` options).

    The rollout engine (bf16 generation here, vLLM elsewhere) samples from pi_rollout, which
    differs from the trainer's pi_old by numerics, so the surrogate is reweighted by
    ``rho = pi_old / pi_rollout``: per token, ``exp(old_t - sampling_t)``; per sequence,
    ``exp(sum_t (old_t - sampling_t))`` over unmasked tokens. ``*_truncate`` clamps rho to
    [clip_min, clip_max] (TIS); ``*_mask`` zeroes the weights outside it (MIS). A bound of None
    is open. Returns [B, T] (token modes) or [B, 1] (sequence modes), without gradient; masked
    positions and NaN sampling log-probs contribute a log-ratio of 0.
    """
    if mode not in ROLLOUT_CORRECTION_MODES:
        raise ValueError(f"mode must be one of {ROLLOUT_CORRECTION_MODES}, got {mode!r}")
    if old_logprobs.shape != sampling_logprobs.shape or old_logprobs.shape != mask.shape:
        raise ValueError(
            f"shapes differ: old {tuple(old_logprobs.shape)}, sampling "
            f"{tuple(sampling_logprobs.shape)}, mask {tuple(mask.shape)}"
        )
    with torch.no_grad():
        diff = torch.where(mask.bool(), old_logprobs - sampling_logprobs, 0.0)
        diff = torch.nan_to_num(diff, nan=0.0)
        if mode.startswith("sequence"):
            diff = diff.sum(dim=1, keepdim=True)
        rho = torch.exp(diff)
        low = -math.inf if clip_min is None else clip_min
        high = math.inf if clip_max is None else clip_max
        if mode.endswith("truncate"):
            return rho.clamp(min=low, max=high)
        return torch.where((rho < low) | (rho > high), 0.0, rho)


# ----------------------------------------------------------------------------------------------
# Loss variants: a registry of (per-token surrogate, aggregation) pairs (algorithms.md §3.5).


@dataclass(frozen=True)
class BatchCounts:
    """What a micro-batch's loss is normalised by: the whole step's batch, over every rank.

    ``rows`` completions, ``tokens`` unmasked tokens and ``micro_batches`` micro-batches in the
    global batch; ``world_size`` ranks whose gradients are averaged (DDP/FSDP divide the summed
    gradient by it, which :meth:`LossVariant.share` undoes)."""

    rows: int
    tokens: Tensor  # a 0-d tensor: shares are computed in the mask's dtype
    micro_batches: int
    world_size: int = 1


class LossVariant:
    """A GRPO loss variant: how each token's loss is formed (:meth:`token_loss`), how a
    micro-batch's tokens are reduced to one number (:meth:`reduce`), and that micro-batch's
    share of the global batch (:meth:`share`), so that the sum of ``share * reduce`` over
    micro-batches and ranks is the loss of the whole batch. Register one with
    :func:`register_loss`; ``loss_type`` picks it by name."""

    name = ""

    def token_loss(
        self,
        logprobs: Tensor,
        ratio: Tensor,
        advantages: Tensor,
        epsilon_low: float,
        epsilon_high: float,
        *,
        delta: float | None = None,
        mask: Tensor | None = None,
    ) -> Tensor:
        """The policy term per token (to minimise): PPO's clipped surrogate, DeepSeekMath eq. 3,
        ``-min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A)``. ``ratio`` is [B, T] or [B, 1]
        (GSPO), ``advantages`` [B, 1]. ``delta`` (INTELLECT-2, arXiv 2505.07291; TRL's
        ``delta``): two-sided clipping, the unclipped term's ratio capped at delta, which bounds
        the loss of a negative-advantage token whose ratio explodes. ``mask`` [B, T]: the
        completion tokens (for variants that need them)."""
        clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
        unclipped = ratio if delta is None else torch.clamp(ratio, max=delta)
        return -torch.minimum(unclipped * advantages, clipped * advantages)

    def clipped(
        self, ratio: Tensor, advantages: Tensor, epsilon_low: float, epsilon_high: float
    ) -> tuple[Tensor, Tensor]:
        """Where the clip binds (logged as clip_ratio/low_mean and /high_mean): below
        1 - eps_low with A < 0, above 1 + eps_high with A > 0."""
        low = (ratio < 1 - epsilon_low) & (advantages < 0)
        high = (ratio > 1 + epsilon_high) & (advantages > 0)
        return low, high

    def reduce(self, token_sum: Tensor, keep: Tensor, max_completion_length: int | None) -> Tensor:
        """One micro-batch's loss from its masked per-token losses [B, T]."""
        raise NotImplementedError

    def share(self, rows: int, tokens: Tensor, counts: BatchCounts) -> float | Tensor:
        """The weight of a micro-batch of ``rows`` completions and ``tokens`` unmasked tokens
        (a float, or a 0-d tensor when it depends on ``tokens``)."""
        raise NotImplementedError


LOSSES: dict[str, LossVariant] = {}


def register_loss(name: str) -> Callable[[type[LossVariant]], type[LossVariant]]:
    """Class decorator: ``@register_loss("my_loss")`` makes ``loss_type: my_loss`` available."""

    def add(cls: type[LossVariant]) -> type[LossVariant]:
        variant = cls()
        variant.name = name
        LOSSES[name] = variant
        return cls

    return add


def get_loss(name: str) -> LossVariant:
    if name not in LOSSES:
        raise ValueError(f"loss_type must be one of {list(LOSSES)}, got {name!r}")
    return LOSSES[name]


@register_loss("grpo")
class SequenceMeanLoss(LossVariant):
    """DeepSeekMath eq. 3: ``(1/B) sum_i (1/L_i) sum_t loss_it``; each micro-batch weighs its
    share of the global batch's rows."""

    def reduce(self, token_sum: Tensor, keep: Tensor, max_completion_length: int | None) -> Tensor:
        return (token_sum.sum(1) / keep.sum(1).clamp(min=1)).mean()

    def share(self, rows: int, tokens: Tensor, counts: BatchCounts) -> float:
        return rows / counts.rows * counts.world_size


class TokenMeanLoss(LossVariant):
    """The token mean of a micro-batch: ``sum_it loss_it / sum_i L_i`` (DAPO, §3.2)."""

    def reduce(self, token_sum: Tensor, keep: Tensor, max_completion_length: int | None) -> Tensor:
        return token_sum.sum() / keep.sum().clamp(min=1)


@register_loss("bnpo")
class MicroBatchTokenMeanLoss(TokenMeanLoss):
    """BNPO (TRL): the token mean of each micro-batch, micro-batches averaged."""

    def share(self, rows: int, tokens: Tensor, counts: BatchCounts) -> float:
        return counts.world_size / counts.micro_batches


@register_loss("dapo")
class GlobalTokenMeanLoss(TokenMeanLoss):
    """DAPO: the token mean over the whole batch (TRL's dapo: the token count of the whole
    accumulated batch, every rank's): each micro-batch weighs its share of the tokens."""

    def share(self, rows: int, tokens: Tensor, counts: BatchCounts) -> float | Tensor:
        # A 0-d tensor on the loss's device: reading it as a float would wait for the GPU.
        return tokens / counts.tokens * counts.world_size


@register_loss("dr_grpo")
class ConstantNormaliserLoss(SequenceMeanLoss):
    """Dr. GRPO (§3.1): ``sum_it loss_it / (B * max_completion_length)`` (T when None)."""

    def reduce(self, token_sum: Tensor, keep: Tensor, max_completion_length: int | None) -> Tensor:
        batch, length = token_sum.shape
        normaliser = length if max_completion_length is None else max_completion_length
        return token_sum.sum() / (batch * normaliser)


@register_loss("cispo")
class CISPOLoss(GlobalTokenMeanLoss):
    """CISPO (MiniMax-M1, arXiv 2506.13585, eq. 4): REINFORCE weighted by the clipped, detached
    importance weight, ``-sg(min(rho, epsilon_high)) A log pi``, as a token mean over the
    batch. No token's gradient is switched off (PPO's clip zeroes it outside the region), and
    on-policy the gradient is REINFORCE's. ``epsilon_high`` is the weight's cap itself (TRL's
    meaning, e.g. 5.0); the config refuses a cap below 1."""

    def token_loss(
        self,
        logprobs: Tensor,
        ratio: Tensor,
        advantages: Tensor,
        _low: float,
        high: float,
        **_: Any,
    ) -> Tensor:
        weight = torch.clamp(ratio, max=high).detach()
        return -weight * advantages * logprobs

    def clipped(
        self, ratio: Tensor, advantages: Tensor, epsilon_low: float, epsilon_high: float
    ) -> tuple[Tensor, Tensor]:
        """Only the cap binds: the weight is ``epsilon_high`` where rho exceeds it."""
        high = (ratio > epsilon_high) & torch.ones_like(advantages, dtype=torch.bool)
        return torch.zeros_like(high), high


@register_loss("luspo")
class LengthWeightedSequenceLoss(SequenceMeanLoss):
    """LUSPO (Length-Unbiased Sequence Policy Optimization, arXiv 2602.05261; TRL's luspo): the
    clipped surrogate, each sequence's token *sum* averaged over sequences,
    ``(1/B) sum_i sum_t loss_it``. With GSPO's sequence ratio (the paper's setting,
    ``importance_sampling_level: sequence``) that is ``(1/B) sum_i L_i loss_i``: every sequence
    weighs its length, which removes GSPO's bias towards short completions."""

    def reduce(self, token_sum: Tensor, keep: Tensor, max_completion_length: int | None) -> Tensor:
        return token_sum.sum(1).mean()


@register_loss("sapo")
class SoftGateLoss(SequenceMeanLoss):
    """SAPO (Soft Adaptive Policy Optimization, arXiv 2511.20347; TRL's sapo): instead of a hard
    clip, a smooth gate of the ratio, ``-(4 / tau) sigmoid(tau (rho - 1)) A``, with temperature
    ``tau = sapo_temperature_pos`` where A > 0, else ``sapo_temperature_neg``. Its gradient is
    ``sigmoid'(tau (rho - 1)) * 4 = 1`` at rho = 1 (the on-policy gradient) and decays smoothly
    as rho leaves 1; aggregated per sequence as grpo. Nothing is clipped (clip metrics are 0)."""

    def token_loss(
        self,
        logprobs: Tensor,
        ratio: Tensor,
        advantages: Tensor,
        epsilon_low: float,
        epsilon_high: float,
        *,
        temperature_pos: float = 1.0,
        temperature_neg: float = 1.05,
        **_: Any,
    ) -> Tensor:
        tau = torch.where(advantages > 0, temperature_pos, temperature_neg).to(ratio.dtype)
        return -torch.sigmoid(tau * (ratio - 1)) * 4 / tau * advantages

    def clipped(
        self, ratio: Tensor, advantages: Tensor, epsilon_low: float, epsilon_high: float
    ) -> tuple[Tensor, Tensor]:
        none = torch.zeros_like(ratio * advantages, dtype=torch.bool)
        return none, none


# VESPO's bounds of the sequence log-ratio: per token +-20 (exp stays finite), the sum at
# log(1e-8) below and 20 above (TRL's, after the VESPO reference code).
_VESPO_TOKEN_LOG_CLAMP = 20.0
_VESPO_LOG_W_MIN = math.log(1e-8)


def vespo_weights(
    log_ratio: Tensor,
    mask: Tensor,
    advantages: Tensor,
    *,
    k_pos: float = 2.0,
    lambda_pos: float = 3.0,
    k_neg: float = 3.0,
    lambda_neg: float = 2.0,
) -> Tensor:
    """VESPO's gamma weight of each sequence [B, 1], without gradient (arXiv 2602.10693; TRL's
    ``get_gamma_weights``): ``phi(w) = exp(lambda + k log w - lambda w)`` = ``e^lambda w^k
    e^(-lambda w)``, so phi(1) = 1, with w the sequence importance ratio ``exp(sum_t log
    rho_t)`` (a product, not GSPO's geometric mean) and (k, lambda) chosen by the advantage's
    sign (A >= 0: the ``_pos`` pair). phi rises as w^k below 1 and decays as e^(-lambda w)
    above it: stale sequences of either kind are smoothly down-weighted. ``log_ratio`` [B, T],
    ``mask`` [B, T], ``advantages`` [B, 1]."""
    with torch.no_grad():
        per_token = torch.clamp(log_ratio, -_VESPO_TOKEN_LOG_CLAMP, _VESPO_TOKEN_LOG_CLAMP)
        per_token = torch.where(mask.bool(), per_token, 0.0)
        log_w = per_token.sum(dim=1, keepdim=True).clamp(_VESPO_LOG_W_MIN, 20.0)
        nonneg = advantages >= 0
        k = torch.where(nonneg, k_pos, k_neg).to(log_w.dtype)
        lam = torch.where(nonneg, lambda_pos, lambda_neg).to(log_w.dtype).clamp(min=1e-4)
        phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w))
        return phi.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


@register_loss("vespo")
class GammaWeightedLoss(GlobalTokenMeanLoss):
    """VESPO (Variational Sequence-Level Soft Policy Optimization, arXiv 2602.10693; TRL's
    vespo): REINFORCE scaled by the detached sequence gamma weight of :func:`vespo_weights`,
    ``-phi(w_i) A_i log pi``, as a token mean over the batch (dapo's aggregation). Needs the
    per-token ratio (``importance_sampling_level: token``; the config refuses sequence)."""

    def token_loss(
        self,
        logprobs: Tensor,
        ratio: Tensor,
        advantages: Tensor,
        epsilon_low: float,
        epsilon_high: float,
        *,
        mask: Tensor | None = None,
        k_pos: float = 2.0,
        lambda_pos: float = 3.0,
        k_neg: float = 3.0,
        lambda_neg: float = 2.0,
        **_: Any,
    ) -> Tensor:
        if mask is None or ratio.shape != logprobs.shape:
            raise ValueError("vespo needs the per-token ratio [B, T] and the completion mask")
        phi = vespo_weights(
            torch.log(ratio), mask, advantages,
            k_pos=k_pos, lambda_pos=lambda_pos, k_neg=k_neg, lambda_neg=lambda_neg,
        )  # fmt: skip
        return -phi * advantages * logprobs

    def clipped(
        self, ratio: Tensor, advantages: Tensor, epsilon_low: float, epsilon_high: float
    ) -> tuple[Tensor, Tensor]:
        none = torch.zeros_like(ratio * advantages, dtype=torch.bool)
        return none, none


def importance_ratio(
    logprobs: Tensor, old_logprobs: Tensor, keep: Tensor, importance_sampling_level: str
) -> Tensor:
    """rho = pi / pi_old per token [B, T], or GSPO's per sequence [B, 1] (§3.3:
    ``exp(masked mean_t (logp_t - old_t))``). Padding is zeroed before exp(): a NaN there
    would otherwise poison the sum and, through torch.where's backward, the gradient too."""
    log_ratio = torch.where(keep, logprobs - old_logprobs, 0.0)
    if importance_sampling_level == "sequence":
        log_ratio = masked_mean(log_ratio, keep, dim=1).unsqueeze(1)
    return torch.exp(log_ratio)


def sequence_surrogate(
    logprobs: Tensor, old_logprobs: Tensor | None, advantages: Tensor, mask: Tensor, *,
    loss_type: str = "grpo", epsilon_low: float = 0.2, epsilon_high: float = 0.2,
    importance_sampling_level: str = "token", variant_options: dict[str, Any] | None = None,
) -> Tensor:  # fmt: skip
    """Per completion, the mean over its tokens of the variant's policy term (no KL, no
    rollout correction, no gradient): [B]. GDRO's adversary signal, eqs. 5-6 with the
    unweighted advantages (on-policy and for the clipped surrogate: -A_i)."""
    with torch.no_grad():
        keep = mask.bool()
        old = logprobs if old_logprobs is None else old_logprobs
        ratio = importance_ratio(logprobs, old, keep, importance_sampling_level)
        adv = advantages.to(ratio.dtype).unsqueeze(1)
        batch, length = logprobs.shape
        variant = get_loss(loss_type)
        per_token = variant.token_loss(
            logprobs, ratio, adv, epsilon_low, epsilon_high,
            **_token_options(variant, variant_options, keep),
        )  # fmt: skip
        per_token = torch.where(keep, per_token.expand(batch, length), 0.0)
        return per_token.sum(1) / keep.sum(1).clamp(min=1)


def _token_options(
    variant: LossVariant, options: dict[str, Any] | None, keep: Tensor
) -> dict[str, Any]:
    """The keyword options of a variant's token_loss: the run's (delta, sapo's temperatures,
    vespo's shapes) and, for the variants that read it, the completion mask. A variant
    registered without these keywords still works when the run sets none of them."""
    options = dict(options or {})
    if "mask" in inspect.signature(variant.token_loss).parameters:
        options["mask"] = keep
    return options


def high_entropy_mask(entropies: Tensor, mask: Tensor, quantile: float) -> Tensor:
    """The tokens the policy term trains on with TRL's ``top_entropy_quantile`` (rho of "Beyond
    the 80/20 Rule", arXiv 2506.01939): those whose entropy is at or above the ``1 - rho``
    quantile of the completion tokens' entropies (torch.quantile, linear interpolation).
    rho = 1 keeps every token; rho = 0 keeps only the highest-entropy one(s). [B, T] bool;
    padding never kept. The quantile is over this micro-batch's tokens on this rank (TRL pools
    every process's micro-batch: the same in one process)."""
    keep = mask.bool()
    values = entropies[keep].float()
    if values.numel() == 0:
        return torch.zeros_like(keep)
    threshold = torch.quantile(values, 1.0 - quantile)
    return (entropies >= threshold) & keep


def off_policy_sequence_mask(
    advantages: Tensor,
    logprobs: Tensor,
    sampling_logprobs: Tensor,
    mask: Tensor,
    threshold: float,
) -> Tensor:
    """DeepSeek-V3.2's off-policy sequence masking (arXiv 2512.02556, Eq. 9; TRL's
    ``off_policy_mask_threshold`` delta): sequence i is dropped from the policy term when
    ``A_i < 0`` and its mean token ``log pi_sampling - log pi_theta`` (a forward-KL estimate of
    how far the policy has moved from the sampler, over its unmasked tokens) exceeds delta;
    kept otherwise. Tokens the sampler could not score (NaN) count 0. [B] bool, no grad."""
    log_ratio = torch.nan_to_num(sampling_logprobs - logprobs.detach(), nan=0.0)
    keep = mask.to(log_ratio.dtype)
    mean_kl = (log_ratio * keep).sum(1) / keep.sum(1).clamp(min=1)
    return (advantages.reshape(-1) >= 0) | (mean_kl <= threshold)


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor | None,
    ref_logprobs: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    *,
    loss_type: str = "grpo",
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    beta: float = 0.0,
    importance_sampling_level: str = "token",
    max_completion_length: int | None = None,
    rollout_weights: Tensor | None = None,
    row_weights: Tensor | None = None,
    token_mask: Tensor | None = None,
    variant_options: dict[str, Any] | None = None,
    kl_ratio_correction: bool = False,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped GRPO surrogate loss (to minimise) plus no-grad metrics (0-d tensors).

    Per token, DeepSeekMath eq. (3) with DAPO's separate clip bounds (algorithms.md §2, §3.2):
    ``loss_it = -min(rho_it A_i, clip(rho_it, 1 - eps_low, 1 + eps_high) A_i) + beta k3_it``,
    with ``rho_it = exp(logp_it - old_it)`` and k3 from :func:`kl_k3`. The policy term is the
    registered variant's :meth:`LossVariant.token_loss`.

    Aggregation by ``loss_type`` (:data:`LOSSES`), the TRL options of algorithms.md §3.5 (L_i =
    number of unmasked tokens of sequence i, clamped at 1):

    - ``"grpo"``: ``(1/B) sum_i (1/L_i) sum_t loss_it``, DeepSeekMath eq. (3).
    - ``"bnpo"``, ``"dapo"``: ``sum_it loss_it / sum_i L_i``, the DAPO objective (§3.2). TRL's
      dapo divides by the token count of the whole accumulated batch; for gradient accumulation
      over micro-batches, rescale each micro-batch loss by :meth:`LossVariant.share`.
    - ``"dr_grpo"``: ``sum_it loss_it / (B * max_completion_length)``, Dr. GRPO (§3.1); the
      constant is T when ``max_completion_length`` is None.

    ``importance_sampling_level="sequence"`` is GSPO (§3.3): every token of sequence i uses
    ``s_i = exp(masked mean_t (logp_it - old_it))``, and the gradient flows through that mean.

    Args:
        logprobs: [B, T] log-probs of the sampled tokens under the current policy (with grad).
        old_logprobs: [B, T] log-probs under the sampling policy, or None for on-policy (the
            ratio is then 1 in value but keeps its gradient).
        ref_logprobs: [B, T] log-probs under the frozen reference; may be None only if beta == 0.
        advantages: [B], one per sequence.
        mask: [B, T], 1 (or True) for completion tokens, 0 for padding. Masked positions may
            hold any value, NaN included; they affect neither the loss nor its gradient.
        loss_type, epsilon_low, epsilon_high, beta, importance_sampling_level,
        max_completion_length: as above.
        rollout_weights: [B, T] or [B, 1] from :func:`rollout_correction_weights`, or None.
            They multiply the clipped surrogate per token (not the KL term), as TRL does.
        row_weights: [B] positive per-sequence multipliers of the policy term (not the KL), or
            None: a curriculum's weights (Prompt-GDRO eq. 16). For the clipped surrogate,
            ``w * -min(rho A, clip(rho) A) = -min(rho wA, clip(rho) wA)`` when w > 0.
        token_mask: [B, T] bool, the tokens whose policy term counts (the KL term and the
            normaliser still use ``mask``), or None: TRL's ``top_entropy_quantile``
            (:func:`high_entropy_mask`).
        variant_options: keyword options of the variant's token loss: ``delta`` (two-sided
            clipping), sapo's ``temperature_pos`` / ``temperature_neg``, vespo's ``k_pos``,
            ``lambda_pos``, ``k_neg``, ``lambda_neg``.
        kl_ratio_correction: multiply each token's k3 by the importance ratio rho (with its
            gradient; TRL's ``use_bias_correction_kl``): k3 estimates KL under pi_theta's
            samples, and the completions came from pi_old. The logged ``"kl"`` stays k3.

    Returns:
        ``(loss, metrics)``. metrics are python floats: ``"kl"`` (mean k3 over unmasked tokens;
        0.0 without a reference), ``"clip_ratio/low_mean"`` (ratio < 1 - eps_low and A < 0),
        ``"clip_ratio/high_mean"`` (ratio > 1 + eps_high and A > 0), ``"clip_ratio/region_mean"``
        (either) and ``"ratio_mean"``, averaged over unmasked tokens; at the sequence level they
        are averaged over the B sequences, as TRL does.
    """
    variant = get_loss(loss_type)
    if importance_sampling_level not in IMPORTANCE_SAMPLING_LEVELS:
        raise ValueError(
            f"importance_sampling_level must be one of {IMPORTANCE_SAMPLING_LEVELS}, "
            f"got {importance_sampling_level!r}"
        )
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    if beta > 0 and ref_logprobs is None:
        raise ValueError("beta > 0 needs ref_logprobs (pass beta=0.0 to train without a reference)")
    if epsilon_low < 0 or epsilon_high < 0:
        raise ValueError(f"epsilons must be >= 0, got low={epsilon_low}, high={epsilon_high}")
    if max_completion_length is not None and max_completion_length < 1:
        raise ValueError(f"max_completion_length must be >= 1, got {max_completion_length}")
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be [B, T], got shape {tuple(logprobs.shape)}")
    for name, other in (
        ("old_logprobs", old_logprobs),
        ("ref_logprobs", ref_logprobs),
        ("mask", mask),
    ):
        if other is not None and other.shape != logprobs.shape:
            raise ValueError(
                f"{name} shape {tuple(other.shape)} != logprobs shape {tuple(logprobs.shape)}"
            )
    batch, length = logprobs.shape
    if advantages.shape != (batch,):
        raise ValueError(f"advantages must be [B]=[{batch}], got shape {tuple(advantages.shape)}")
    if rollout_weights is not None and tuple(rollout_weights.shape) not in (
        (batch, length),
        (batch, 1),
    ):
        raise ValueError(
            f"rollout_weights must be [B, T] or [B, 1], got shape {tuple(rollout_weights.shape)}"
        )
    if row_weights is not None and tuple(row_weights.shape) != (batch,):
        raise ValueError(f"row_weights must be [B]=[{batch}], got {tuple(row_weights.shape)}")
    if token_mask is not None and token_mask.shape != logprobs.shape:
        raise ValueError(
            f"token_mask shape {tuple(token_mask.shape)} != logprobs shape "
            f"{tuple(logprobs.shape)}"
        )

    keep = mask.bool()
    if old_logprobs is None:
        old_logprobs = logprobs.detach()
    ratio = importance_ratio(logprobs, old_logprobs, keep, importance_sampling_level)
    adv = advantages.to(ratio.dtype).unsqueeze(1)  # [B, 1]: one advantage for all tokens

    per_token = variant.token_loss(
        logprobs, ratio, adv, epsilon_low, epsilon_high,
        **_token_options(variant, variant_options, keep),
    )  # fmt: skip
    per_token = per_token.expand(batch, length)
    if token_mask is not None:
        per_token = per_token * token_mask.to(per_token.dtype)
    if rollout_weights is not None:
        per_token = per_token * rollout_weights.detach().to(per_token.dtype)
    if row_weights is not None:
        per_token = per_token * row_weights.detach().to(per_token.dtype).unsqueeze(1)
    kl = None
    if ref_logprobs is not None:
        kl = kl_k3(torch.where(keep, logprobs, 0.0), torch.where(keep, ref_logprobs, 0.0))
        if beta > 0:
            per_token = per_token + beta * (kl * ratio if kl_ratio_correction else kl)

    token_sum = torch.where(keep, per_token, 0.0)
    loss = variant.reduce(token_sum, keep, max_completion_length)

    with torch.no_grad():
        ratio_d = ratio.detach()
        is_low, is_high = variant.clipped(ratio_d, adv, epsilon_low, epsilon_high)
        stats = torch.stack([is_low, is_high, is_low | is_high]).to(ratio_d.dtype)
        stats = torch.cat([stats, ratio_d.unsqueeze(0)])  # [4, B, T] or [4, B, 1]
        if importance_sampling_level == "token":
            means = masked_mean(stats, keep, dim=(1, 2))
        else:
            means = stats.mean(dim=(1, 2))
        kl_mean = masked_mean(kl.detach(), keep) if kl is not None else means.new_zeros(())
        # 0-d tensors on the loss's device: the caller reads them once per pass (no sync here).
        values = torch.cat([kl_mean.reshape(1), means]).unbind()
    keys = (
        "kl",
        "clip_ratio/low_mean",
        "clip_ratio/high_mean",
        "clip_ratio/region_mean",
        "ratio_mean",
    )
    return loss, dict(zip(keys, values, strict=True))


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


# The registered loss variants (in registration order); config validation reads this.
LOSS_TYPES = tuple(LOSSES)
