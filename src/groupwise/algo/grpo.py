"""The GRPO objective of a micro-batch, top to bottom.

Per token, the importance ratio against the sampling policy (or GSPO's per sequence), the
registered loss variant's policy term (:data:`groupwise.algo.variants.LOSSES`), the masks that drop
tokens from it (TRL's ``top_entropy_quantile``, DeepSeek-V3.2's off-policy sequence mask) and the
k3 KL to the reference: :func:`policy_loss`, pure math on tensors, with the per-sequence term a
curriculum reads (:func:`sequence_surrogate`) and the entropy bonus and its adaptive coefficient
(:func:`entropy_bonus`, :func:`adapt_entropy_coef`). :class:`groupwise.policy.loss.GRPOLoss`
binds them to a run's options and to one micro-batch of the update. Section numbers refer to
docs/algorithms.md.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor

from .variants import IMPORTANCE_SAMPLING_LEVELS, LossVariant, get_loss, masked_mean


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(pi_theta || pi_ref), DeepSeekMath eq. (4) (algorithms.md §2).

    ``exp(ref - logp) - (ref - logp) - 1``: unbiased for samples from pi_theta, and >= 0 because
    e^x >= 1 + x. Exact, with no clamping (verl clamps ref - logp to +-20). Same shape as inputs.
    """
    log_ratio = ref_logprobs - logprobs
    return torch.exp(log_ratio) - log_ratio - 1


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
    registered variant's :meth:`~groupwise.algo.variants.LossVariant.token_loss`.

    Aggregation by ``loss_type`` (:data:`~groupwise.algo.variants.LOSSES`), the TRL options of
    algorithms.md §3.5 (L_i = number of unmasked tokens of sequence i, clamped at 1):

    - ``"grpo"``: ``(1/B) sum_i (1/L_i) sum_t loss_it``, DeepSeekMath eq. (3).
    - ``"bnpo"``, ``"dapo"``: ``sum_it loss_it / sum_i L_i``, the DAPO objective (§3.2). TRL's
      dapo divides by the token count of the whole accumulated batch; for gradient accumulation
      over micro-batches, rescale each micro-batch loss by
      :meth:`~groupwise.algo.variants.LossVariant.share`.
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
        rollout_weights: [B, T] or [B, 1] from
            :func:`~groupwise.algo.variants.rollout_correction_weights`, or None. They multiply the
            clipped surrogate per token (not the KL term), as TRL does.
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


# ----------------------------------------------------------------------------------------------
# The entropy bonus and its adaptive coefficient (Eqs. 1-2)


def adapt_entropy_coef(
    coef: float,
    entropy: float,
    *,
    target: float,
    delta: float,
    coef_min: float,
    coef_max: float,
) -> float:
    """Eq. 2: the coefficient after an optimizer step that measured ``entropy`` (nats/token)."""
    if entropy <= target:
        return min(coef + delta, coef_max)
    return max(coef - delta, coef_min)


def entropy_bonus(entropies: Tensor, keep: Tensor, share: float | Tensor) -> Tensor:
    """Micro-batch k's part of ``H`` in Eq. 1: the mean entropy over its ``keep`` tokens [n, T]
    times ``share``, its weight in the global batch (a 0-d tensor keeps the GPU unsynced)."""
    keep = keep.to(entropies.dtype)
    return (entropies * keep).sum() / keep.sum().clamp(min=1) * share
