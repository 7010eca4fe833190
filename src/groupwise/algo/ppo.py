"""PPO's math with a learned critic and GAE, the actor-critic baseline for GRPO comparisons.
One step (algorithms.md §3.6, verl core_algos.py; DeepSeekMath eqs. 1-2):

    token rewards  r_t = -beta (logp_t - logp_ref_t) + R * 1[t = last]    (token_rewards)
    GAE advantages and returns, advantages whitened over the batch      (gae_advantages,
                                                                         masked_whiten)
    clipped policy surrogate + vf_coef * clipped value loss             (ppo_policy_loss,
                                                                         value_loss)

Pure functions on tensors; :class:`groupwise.trainer.ppo.PPOTrainer` wires them to the policy
and its critic (:mod:`groupwise.policy.critic`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .grpo import policy_loss
from .variants import masked_mean


def token_rewards(
    seq_rewards: Tensor,
    logps_old: Tensor | None,
    logps_ref: Tensor | None,
    mask: Tensor,
    beta: float,
) -> Tensor:
    """Per-token rewards [B, T] with the KL penalty inside the reward (algorithms.md §3.6):

        r_t = -beta * (logp_old_t - logp_ref_t) + R * 1[t = last unmasked token]

    ``logp_old`` are the sampling policy's log-probs (k1 estimate of the KL). With beta == 0 the
    log-probs may be None. Masked positions get 0; a row with no unmasked token gets no reward.

    Args:
        seq_rewards: [B] sequence rewards R (must be finite).
        logps_old, logps_ref: [B, T] log-probs of the sampled tokens, or None when beta == 0.
        mask: [B, T] 1 for completion tokens, 0 for padding.
        beta: KL coefficient (>= 0).
    """
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    keep = mask.bool()
    batch, length = keep.shape
    rewards = torch.zeros((batch, length), dtype=torch.float32, device=keep.device)
    if beta > 0:
        if logps_old is None or logps_ref is None:
            raise ValueError("beta > 0 needs logps_old and logps_ref")
        kl = logps_old.float() - logps_ref.float()  # k1 per token
        rewards = torch.where(keep, -beta * kl, 0.0)
    if length == 0:
        return rewards
    # Index of the last unmasked token of each row (-1 when the row has none).
    positions = torch.arange(length, device=keep.device).expand(batch, length)
    last = torch.where(keep, positions, -1).amax(dim=1)
    has_token = last >= 0
    rows = torch.arange(batch, device=keep.device)[has_token]
    rewards[rows, last[has_token]] += seq_rewards.to(rewards)[has_token]
    return rewards


def gae_advantages(
    rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation by reverse recursion (algorithms.md §3.6):

        delta_t = r_t + gamma * V(s_{t+1}) - V(s_t)
        A_t     = delta_t + gamma * lam * A_{t+1}
        returns = A + V

    Masked positions are skipped (as in verl): the "next" value and advantage are those of the
    next unmasked position, and after the last unmasked token both are 0 (episode end). Values
    and rewards at masked positions are ignored, even NaN; there A = returns = 0.

    Args:
        rewards: [B, T] token rewards (e.g. from :func:`token_rewards`).
        values: [B, T] V(s_t), the critic's estimate before token t.
        mask: [B, T] 1 for completion tokens.
        gamma, lam: discount and GAE lambda in [0, 1].

    Returns:
        ``(advantages, returns)``, both [B, T] float32, no grad.
    """
    keep = mask.bool()
    rewards, values = rewards.detach().float(), values.detach().float()
    batch, length = rewards.shape
    advantages = torch.zeros_like(rewards)
    next_value = rewards.new_zeros(batch)  # V(s_{t+1}); 0 after the last token
    next_adv = rewards.new_zeros(batch)  # A_{t+1}; 0 after the last token
    for t in reversed(range(length)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        m = keep[:, t]
        advantages[:, t] = torch.where(m, adv, 0.0)
        next_value = torch.where(m, values[:, t], next_value)
        next_adv = torch.where(m, adv, next_adv)
    returns = torch.where(keep, advantages + values, 0.0)
    return advantages, returns


def masked_whiten(
    x: Tensor,
    mask: Tensor,
    eps: float = 1e-8,
    reduce: Callable[[Tensor], Tensor] | None = None,
) -> Tensor:
    """``(x - mean) / sqrt(var + eps)`` with mean and unbiased (Bessel) variance over the unmasked
    entries only, as TRL's and verl's ``masked_whiten``; masked entries become 0.

    ``reduce`` sums a tensor over data parallel ranks: the sums and counts behind the mean and
    the variance are then those of the global batch, so every rank whitens with the same
    statistics as one process holding the whole batch."""
    total = reduce if reduce is not None else (lambda t: t)
    keep = mask.bool()
    count = total(keep.sum())
    mean = total(torch.where(keep, x, 0.0).sum()) / count.clamp(min=1)
    centered = torch.where(keep, x - mean, 0.0)
    var = total((centered**2).sum()) / (count - 1).clamp(min=1)
    return centered * torch.rsqrt(var + eps)


def value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, cliprange_value: float
) -> tuple[Tensor, Tensor]:
    """Clipped value loss (algorithms.md §3.6, verl ``compute_value_loss``):

        V_clip = clip(V, V_old - eps_v, V_old + eps_v)
        L_V    = 0.5 * mean_t max((V - R)^2, (V_clip - R)^2)      over unmasked tokens

    Returns ``(loss, clip_frac)``; clip_frac (no grad) is the fraction of unmasked tokens where
    the clipped term is the larger one.
    """
    keep = mask.bool()
    v_clipped = old_values + torch.clamp(values - old_values, -cliprange_value, cliprange_value)
    loss_unclipped = (values - returns) ** 2
    loss_clipped = (v_clipped - returns) ** 2
    loss = 0.5 * masked_mean(torch.maximum(loss_unclipped, loss_clipped), keep)
    clip_frac = masked_mean((loss_clipped > loss_unclipped).float(), keep).detach()
    return loss, clip_frac


def ppo_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    ref_logprobs: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    epsilon_low: float,
    epsilon_high: float,
) -> tuple[Tensor, dict[str, float]]:
    """PPO's clipped surrogate with token-level advantages, token-mean over unmasked tokens:

        loss = mean_t -min(rho_t A_t, clip(rho_t, 1 - eps_low, 1 + eps_high) A_t)

    :func:`.grpo.policy_loss` takes one advantage per sequence; broadcasting would give every token
    the same A. So each token is passed to it as a sequence of length 1 ([B*T, 1] log-probs, [B*T]
    advantages) with ``loss_type="dapo"`` (sum over tokens / number of tokens): exactly the
    formula above, with GRPO's clip code and metrics. beta = 0: PPO's KL is in the reward;
    ``ref_logprobs`` only feeds the logged k3 ``kl``.
    """
    flat = (-1, 1)
    return policy_loss(
        logprobs.reshape(flat),
        old_logprobs.reshape(flat),
        ref_logprobs.reshape(flat) if ref_logprobs is not None else None,
        advantages.reshape(-1),
        mask.reshape(flat),
        loss_type="dapo",
        epsilon_low=epsilon_low,
        epsilon_high=epsilon_high,
        beta=0.0,
    )


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """``1 - Var[R - V] / Var[R]`` over unmasked tokens (1: perfect critic, 0: no better than a
    constant). 0.0 when the returns have no variance (below 1e-10)."""
    keep = mask.bool()
    if keep.sum() < 2:
        return 0.0
    r, v = returns[keep].float(), values[keep].float()
    var_returns = r.var()
    if var_returns <= 1e-10:  # constant returns (up to rounding): the ratio is meaningless
        return 0.0
    return float(1.0 - (r - v).var() / var_returns)
