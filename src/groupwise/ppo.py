"""PPO with a learned critic and GAE: the actor-critic baseline for GRPO comparisons.

The same codebase as GRPO (rollout, reward scoring, reference model, optimizer, loop, logging,
saving), so a GRPO vs PPO comparison differs only in the algorithm. One step (algorithms.md
§3.6, verl core_algos.py; DeepSeekMath eqs. 1-2):

    prompts -> generate num_generations completions each         (the rollout engine)
            -> sequence rewards                                 (the run's scorer)
            -> old log-probs, reference log-probs, old values   (no grad, once per batch)
            -> token rewards  r_t = -beta (logp_t - logp_ref_t) + R * 1[t = last]
            -> GAE advantages and returns, advantages whitened over the batch
            -> num_iterations passes of: clipped policy surrogate + vf_coef * clipped value loss

The critic is a separate model (a copy of the policy's decoder, or ``critic_model``'s) with a
scalar value head, trained by its own AdamW. V(s_t) is read from the critic's hidden state at
the position whose policy hidden state predicts completion token t.

The math is in pure functions (:func:`token_rewards`, :func:`gae_advantages`,
:func:`masked_whiten`, :func:`value_loss`, :func:`ppo_policy_loss`,
:func:`explained_variance`); :class:`PPOTrainer` only wires them to models: it is built from
the same pieces as the GRPO trainer (:class:`~groupwise.run.Trainer`), and its critic is a second
trained network (:class:`~groupwise.trainable.Trainable`) stepped with the policy.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from transformers import PreTrainedModel

from .batching import scatter_rows, trimmed_completions
from .config import PPO_MULTI_TURN, ConfigError, GRPOConfig
from .distributed import DistributedContext
from .files import staged_files
from .grpo_loss import policy_loss
from .losses import LossTerms, MicroBatch, get_loss, masked_mean
from .models import load_model_and_tokenizer
from .rollout import Rollout
from .run import PhaseTimer, Trainer
from .sections import Sections
from .trainable import Trainable

CRITIC_DIR = "critic"
CRITIC_WEIGHTS = "model.safetensors"
CRITIC_CONFIG = "critic_config.json"


# ----------------------------------------------------------------------------------------------
# The math: pure functions on [B, T] tensors (B completions, T completion positions).


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

    ``grpo_loss.policy_loss`` takes one advantage per sequence; broadcasting would give every token
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


# ----------------------------------------------------------------------------------------------
# The critic.


class ValueModel(nn.Module):
    """A decoder backbone (no LM head) and a scalar value head on its last hidden state.

    The head is initialised to zero, so V = 0 everywhere at the start (a neutral prior; the head
    then learns first and the backbone follows once the head is non-zero). The head stays in
    float32 whatever the backbone's dtype, so values are not rounded to bf16."""

    def __init__(self, backbone: PreTrainedModel, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor) -> Tensor:
        """Values [N, L] (float32) at every position of ``input_ids``."""
        hidden = self.backbone(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
        ).last_hidden_state
        with torch.autocast(device_type=hidden.device.type, enabled=False):  # head in float32
            return self.head(hidden.float()).squeeze(-1)


def build_value_model(policy: PreTrainedModel, critic_model: str | None, seed: int) -> ValueModel:
    """A copy of the policy's decoder (critic_model None; with LoRA, of the merged weights), or
    the decoder of ``critic_model`` (a built-in name or path; it must use the policy's tokenizer),
    with a zero value head."""
    if critic_model is None and hasattr(policy, "merge_and_unload"):
        # A LoRA policy (peft): the critic is a plain, fully trained copy of the merged weights.
        backbone = copy.deepcopy(policy).merge_and_unload().get_decoder()
    elif critic_model is None:
        backbone = copy.deepcopy(policy.get_decoder())
    else:
        backbone = load_model_and_tokenizer(critic_model, seed=seed)[0].get_decoder()
        if backbone.config.vocab_size != policy.config.vocab_size:
            raise ValueError(
                f"critic_model {critic_model!r} has a vocabulary of {backbone.config.vocab_size} "
                f"tokens, the policy {policy.config.vocab_size}: the critic must read the "
                "policy's token ids (use a model with the same tokenizer)"
            )
    backbone.requires_grad_(True)
    return ValueModel(backbone, backbone.config.hidden_size)


def completion_values(
    critic: ValueModel | DistributedDataParallel,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
) -> Tensor:
    """V(s_t) [N, T]: the critic's value at the position whose hidden state predicts completion
    token t, i.e. position ``prompt_len - 1 + t`` of prompt + completion. This mirrors
    ``logprobs.completion_logprobs`` with group_size 1 (same attention mask and position ids),
    so V(s_t) sees exactly the context of pi(o_t | ...). One prompt row per completion row."""
    # Drop left-padding columns shared by every row (as completion_logprobs does).
    used = prompt_mask.any(dim=0).nonzero()
    start = int(used[0]) if used.numel() else 0
    prompt_ids, prompt_mask = prompt_ids[:, start:], prompt_mask[:, start:]
    prompt_len, width = prompt_ids.shape[1], completion_ids.shape[1]
    ids = torch.cat([prompt_ids, completion_ids], dim=1)
    mask = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], dim=1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    values = critic(ids, mask, positions)
    # The hidden state at position p predicts token p + 1: V(s_t) is at prompt_len - 1 + t.
    return values[:, prompt_len - 1 : prompt_len - 1 + width]


# ----------------------------------------------------------------------------------------------
# The trainer.


class Critic(Trainable):
    """The value model as a trained network: replicated with DDP under data parallel (which
    averages its gradients and broadcasts rank 0's weights on construction), its own AdamW
    (``critic_learning_rate``, default ``learning_rate``) and LR schedule."""

    def __init__(
        self, model: ValueModel, options: Sections, dist: DistributedContext, device: torch.device
    ) -> None:
        wrapper = None
        if dist.enabled:
            wrapper = DistributedDataParallel(
                model, device_ids=[device.index] if device.type == "cuda" else None
            )
        optimization, lr = options.optimization, options.algorithm.critic_learning_rate
        lr = lr if lr is not None else optimization.learning_rate
        super().__init__(model, wrapper, optimization, options.batch, dist, lr)

    def values(self, rollout: Rollout, rows: Tensor) -> Tensor:
        """V(s_t) [n, T] for the completions ``rows`` (row indices) of the rollout, with grad if
        enabled (the training forward goes through DDP under data parallel); computed on the
        rows' longest completion and zero-padded back to width T."""
        index = rollout.group_ids[rows]
        completion_ids, completion_mask, width = trimmed_completions(rollout, rows)
        train = torch.is_grad_enabled() and self.wrapper is not None
        values = completion_values(
            self.wrapper if train else self.module,
            rollout.prompt_ids[index],
            rollout.prompt_mask[index],
            completion_ids,
            completion_mask,
        )
        return torch.nn.functional.pad(values, (0, rollout.completion_ids.shape[1] - width))


class PPOLoss:
    """Clipped policy surrogate + vf_coef * clipped value loss of one micro-batch, both token
    means over the global batch (each micro-batch weighs its share of every rank's tokens; the
    gradient average over ranks divides by the world size, which the weight undoes)."""

    def __init__(
        self,
        args: GRPOConfig,
        critic: Critic,
        rollout: Rollout,
        advantages: Tensor,
        returns: Tensor,
        old_values: Tensor,
        autocast: Callable[[], Any],
    ) -> None:
        self.args, self.critic, self.rollout = args, critic, rollout
        self.advantages, self.returns, self.old_values = advantages, returns, old_values
        self.autocast = autocast
        self.token_mean = get_loss("dapo")  # the global batch's token mean

    def __call__(self, logps: Tensor, mb: MicroBatch) -> LossTerms:
        args = self.args
        with self.autocast():
            values = self.critic.values(self.rollout, mb.rows)
        old = mb.old_logprobs if mb.old_logprobs is not None else logps.detach()
        epsilon_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
        pg_loss, metrics = ppo_policy_loss(
            logps, old, mb.ref_logprobs, self.advantages[mb.rows], mb.mask,
            epsilon_low=args.epsilon, epsilon_high=epsilon_high,
        )  # fmt: skip
        vf_loss, vf_clip = value_loss(
            values, self.old_values[mb.rows], self.returns[mb.rows], mb.mask, args.cliprange_value
        )
        weight = self.token_mean.share(len(mb.rows), mb.mask.sum(), mb.counts)
        # Detached tensors: the update reads every metric once per pass (no sync here).
        metrics = {**metrics, "loss": pg_loss.detach(), "value_loss": vf_loss.detach(),
                   "value_clip_frac": torch.as_tensor(vf_clip).detach()}  # fmt: skip
        # Policy and critic share no parameters: one backward serves both.
        return LossTerms(pg_loss + args.vf_coef * vf_loss, weight, metrics)


class PPOTrainer(Trainer):
    """PPO (clipped surrogate, GAE, learned critic, KL penalty in the reward) on the same pieces
    as :class:`~groupwise.trainer.GRPOTrainer`, with the same constructor.

    Options used: ``ppo_gamma``, ``ppo_lam``, ``vf_coef``, ``cliprange_value``,
    ``whiten_advantages``, ``critic_model``, ``critic_learning_rate``, ``beta`` (per-token KL
    penalty in the reward), ``epsilon`` / ``epsilon_high`` (policy ratio clip),
    ``num_iterations`` (PPO epochs per batch), ``num_generations`` (1 is allowed). Both the
    policy and the value loss are token means over the batch. GRPO-only options (``loss_type``,
    ``scale_rewards``) are ignored.
    """

    sharding_refusal = "the critic is only replicated, not sharded"

    @classmethod
    def default_args(cls) -> GRPOConfig:
        return GRPOConfig(algorithm="ppo")

    def setup(self) -> None:
        args = self.args
        if self.interaction is not None:  # PPOTrainer(tools=...) / environment_factory
            raise ConfigError(PPO_MULTI_TURN)
        critic = build_value_model(self.model, args.critic_model, args.seed)
        critic.backbone.to(device=self.device, dtype=self.precision.trained)
        critic.head.to(device=self.device, dtype=torch.float32)
        if args.gradient_checkpointing:
            critic.backbone.gradient_checkpointing_enable()
            critic.backbone.config.use_cache = False
        critic.train()
        self.critic_trainable = Critic(critic, self.options, self.dist, self.device)
        # TRL-style names for the critic's parts (the plain module: checkpoints read it).
        self.critic: ValueModel = critic
        self.critic_optimizer = self.critic_trainable.optimizer
        self.critic_scheduler = self.critic_trainable.scheduler

    def check_options(self, args: GRPOConfig, dist: DistributedContext) -> None:
        super().check_options(args, dist)
        if args.importance_sampling_level != "token":
            raise ValueError("PPOTrainer needs importance_sampling_level='token'")
        if args.curriculum != "none":
            raise ValueError("the curriculum works with GRPO only")
        if args.generation_dtype != "auto":
            raise ValueError("generation_dtype (with rollout correction) works with GRPO only")
        if args.optimizer_steps_per_generation > 1:
            raise ConfigError(
                "steps_per_generation / generation_batch_size: PPOTrainer takes one optimizer "
                "step per generation batch (per num_iterations pass); leave both unset"
            )

    def train_step(self) -> dict[str, float]:
        """Generate, score, estimate advantages with the critic and update policy and critic
        ``num_iterations`` times; returns this step's metrics."""
        args, policy, critic = self.args, self.policy, self.critic_trainable
        timer = PhaseTimer(self.device)
        batch = self.prompts.next()
        rollout = self.engine.generate(batch.prompt_ids, args.num_generations, rows=batch.rows)
        timer.mark("generation")
        scores = self.scorer(batch.rows, rollout)
        timer.mark("scoring")
        # 1. Rollout-time quantities, once, without grad: old log-probs (for the KL reward and
        # the ratios after the first pass), reference log-probs and values. Completions whose
        # every reward function said None take no part in the update.
        inputs = policy.prepare(rollout, None, need_old=args.num_iterations > 1 or args.beta > 0,
                                exclude_rows=torch.isnan(scores.rewards))  # fmt: skip
        mask, parts = inputs.mask, inputs.micro_batches
        with torch.no_grad(), policy.autocast():
            old_values = scatter_rows([critic.values(rollout, rows) for rows in parts], parts)
        # 2. Token rewards (KL penalty inside), GAE, whitening over the global batch.
        seq_rewards = torch.nan_to_num(scores.rewards, nan=0.0).to(self.device)
        old, ref = (scatter_rows(x, parts) if args.beta > 0 else None
                    for x in (inputs.old_logprobs, inputs.ref_logprobs))  # fmt: skip
        rewards = token_rewards(seq_rewards, old, ref, mask, args.beta)
        kl_rewards = rewards - token_rewards(seq_rewards, None, None, mask, 0.0)  # -beta k1
        advantages, returns = gae_advantages(rewards, old_values, mask, args.ppo_gamma,
                                             args.ppo_lam)  # fmt: skip
        raw_advantages = advantages
        if args.whiten_advantages:  # with the global batch's mean and std
            advantages = masked_whiten(advantages, mask, reduce=policy.global_sum)
        # 3. num_iterations passes of the joint loss; policy and critic step together.
        loss = PPOLoss(args, critic, rollout, advantages, returns, old_values, policy.autocast)
        for _ in range(args.num_iterations):
            stats = policy.update(inputs, loss, also=[critic])
        self.engine.sync(policy.model)
        timer.mark("update")
        self.global_step += 1
        # 4. Metrics: GRPO's keys where they apply (not frac_reward_zero_std: with a critic,
        # equal rewards in a group do not make the advantages 0), plus the critic's.
        critic_logs = {
            "value_loss": stats.sums.get("value_loss", 0.0),
            "value_clip_frac": stats.sums.get("value_clip_frac", 0.0),
            "value_grad_norm": float(stats.grad_norms[1]),
            "critic_learning_rate": critic.learning_rate,
            "explained_variance": explained_variance(old_values, returns, mask),
            "values/mean": float(masked_mean(old_values, mask)),
            "returns/mean": float(masked_mean(returns, mask)),
            "advantages/mean_raw": float(masked_mean(raw_advantages, mask)),
            "non_score_reward": float(kl_rewards.sum(1).mean()),
        }
        # For completions.jsonl: one advantage per completion, the mean of its token advantages.
        self.records.keep_batch(batch.rows, rollout, scores, masked_mean(advantages, mask, dim=1))
        return self.step_logs(rollout, scores, stats, timer, critic_logs, zero_std=False)

    # ------------------------------------------------------------------------------------------
    # Checkpoint hooks and saving.

    def extra_state_dict(self) -> dict[str, Any]:
        """The critic's weights, optimizer and scheduler state, for the trainer checkpoint."""
        return {
            "critic": self.critic.state_dict(),
            "critic_optimizer": self.critic_optimizer.state_dict(),
            "critic_scheduler": self.critic_scheduler.state_dict(),
        }

    def load_extra_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`extra_state_dict` returned."""
        self.critic.load_state_dict(state["critic"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        if "critic_scheduler" in state:
            self.critic_scheduler.load_state_dict(state["critic_scheduler"])

    def save_model(self, path: str | Path | None = None, output_dir: str | None = None) -> Path:
        """Save the policy and tokenizer (as GRPOTrainer does) and the critic under
        ``<path>/critic/``: ``model.safetensors`` (the ValueModel state dict) and
        ``critic_config.json``. :meth:`load_critic` reads them back."""
        target = super().save_model(path, output_dir)
        if not self.dist.is_main:  # under data parallel only rank 0 writes
            return target
        with staged_files(target / CRITIC_DIR) as tmp:
            tensors = {
                k: v.detach().contiguous().cpu() for k, v in self.critic.state_dict().items()
            }
            save_file(tensors, tmp / CRITIC_WEIGHTS)
            info = {
                "critic_model": self.args.critic_model,
                "hidden_size": self.critic.head.in_features,
            }
            (tmp / CRITIC_CONFIG).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        return target

    def load_critic(self, path: str | Path) -> None:
        """Load critic weights written by :meth:`save_model` (``path`` is the saved folder)."""
        tensors = load_file(Path(path) / CRITIC_DIR / CRITIC_WEIGHTS, device=str(self.device))
        self.critic.load_state_dict(tensors)
