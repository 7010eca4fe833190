"""The loss variants: a registry of (per-token policy term, aggregation) pairs, as pure functions
on tensors (algorithms.md §3.5).

A :class:`LossVariant` says how each token's loss is formed, how a micro-batch's tokens are
reduced to one number and what share of the global batch (:class:`BatchCounts`) that micro-batch
carries; ``loss_type`` picks one by name from :data:`LOSSES`. Also here: the masked mean the
losses average with and the rollout-correction weights a loss is given (TRL's
``vllm_importance_sampling_*``). :func:`groupwise.algo.grpo.policy_loss` puts them together.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

# The choices of the loss's options (the config validates against these).
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


def rollout_correction_weights(
    old_logprobs: Tensor,
    sampling_logprobs: Tensor,
    mask: Tensor,
    *,
    mode: str = "token_truncate",
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


def rollout_correction_logs(
    weights: Tensor, *, mode: str, clip_min: float | None, clip_max: float | None
) -> dict[str, float]:
    """How much of a step the rollout correction changed: the share of its weights (tokens in
    the ``token_*`` modes, completions in the ``sequence_*`` modes) that ``*_mask`` zeroed
    (``sampling/importance_sampling_ratio/masked_frac``) or ``*_truncate`` clamped to a bound
    (``sampling/importance_sampling_ratio/truncated_frac``).

    ``weights``: :func:`rollout_correction_weights`' output at the trained positions (token
    modes) or per completion (sequence modes), any shape. A masked weight is 0 (an outside
    ratio, or one that underflowed to 0); a truncated one sits at a bound (the clamp's
    output). No weights: 0."""
    if mode not in ROLLOUT_CORRECTION_MODES:
        raise ValueError(f"mode must be one of {ROLLOUT_CORRECTION_MODES}, got {mode!r}")
    w = weights.detach().flatten()
    if mode.endswith("_mask"):
        key, changed = "masked_frac", w == 0
    else:
        key, changed = "truncated_frac", torch.zeros_like(w, dtype=torch.bool)
        if clip_max is not None:
            changed |= w >= clip_max
        if clip_min is not None:
            changed |= w <= clip_min
    share = float(changed.float().mean()) if w.numel() else 0.0
    return {f"sampling/importance_sampling_ratio/{key}": share}


# ----------------------------------------------------------------------------------------------
# What a loss is given and what it answers, for one micro-batch of the update



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


@dataclass
class MicroBatch:
    """One micro-batch as a loss sees it: row indices into the rollout and their slices of the
    step's tensors (on the policy's device)."""

    rows: Tensor
    mask: Tensor  # [n, T] float: the tokens trained on
    advantages: Tensor | None  # [n] (GRPO) or [n, T] (PPO), None when the loss holds its own
    old_logprobs: Tensor | None  # [n, T] pi_old, None when on-policy (mu = 1)
    ref_logprobs: Tensor | None  # [n, T] pi_ref, None when beta = 0
    correction: Tensor | None  # [n, T] or [n, 1] rollout-correction weights
    row_weights: Tensor | None  # [n] a curriculum's weights
    counts: BatchCounts
    # [n, T] the policy's token entropies this pass (with grad only for an entropy bonus)
    entropy: Tensor | None = None
    # [n, T] the sampler's own log-probs (vLLM, bf16 generation), None when it gave none
    sampling_logprobs: Tensor | None = None


@dataclass
class LossTerms:
    """A loss's answer for one micro-batch: the loss (with grad), its ``weight`` in the global
    batch's loss (a float or a 0-d tensor), metrics (0-d detached tensors or floats, weighted
    like the loss when logged; read once per pass), the per-completion policy term a
    curriculum reads ([n], no grad; None if the loss has none) and ``bonus``, a term already in
    the global batch's units, added after the weight (the entropy bonus; None without)."""

    loss: Tensor
    weight: float | Tensor
    metrics: dict[str, float | Tensor]
    sequence_loss: Tensor | None = None
    bonus: Tensor | None = None


# ----------------------------------------------------------------------------------------------
# The variants: registered by name, picked by ``loss_type``



class LossVariant:
    """A GRPO loss variant: how each token's loss is formed (:meth:`token_loss`), how a
    micro-batch's tokens are reduced to one number (:meth:`reduce`), and that micro-batch's
    share of the global batch (:meth:`share`), so that the sum of ``share * reduce`` over
    micro-batches and ranks is the loss of the whole batch. Register one with
    :func:`register_loss`; ``loss_type`` picks it by name."""

    name = ""
    # Whether the reduction sums per-token terms over the batch: with GSPO's one ratio per
    # sequence (importance_sampling_level: sequence) that weights each sequence by its length
    # instead of GSPO's per-sequence mean, which the trainer warns about.
    sums_tokens = False

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

    sums_tokens = True

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

    sums_tokens = True

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


# The registered loss variants (in registration order); config validation reads this.
LOSS_TYPES = tuple(LOSSES)
