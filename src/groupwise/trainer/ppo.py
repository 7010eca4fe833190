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
the same pieces as the GRPO trainer (:class:`~groupwise.trainer.base.Trainer`), and its critic
is a second trained network (:class:`~groupwise.policy.policy.Trainable`) stepped with the policy.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from ..algo.losses import LossTerms, MicroBatch, get_loss, masked_mean
from ..algo.ppo import (
    explained_variance,
    gae_advantages,
    masked_whiten,
    ppo_policy_loss,
    token_rewards,
    value_loss,
)
from ..config.grpo_config import GRPOConfig
from ..errors import ConfigError
from ..files import staged_files
from ..policy.critic import (
    CRITIC_CONFIG,
    CRITIC_DIR,
    CRITIC_WEIGHTS,
    Critic,
    ValueModel,
    build_value_model,
)
from ..policy.update import scatter_rows
from ..rollout import Rollout
from ..runtime.distributed import DistributedContext
from ..sections import PPO_MULTI_TURN
from .base import PhaseTimer, Trainer

# ----------------------------------------------------------------------------------------------
# The math: pure functions on [B, T] tensors (B completions, T completion positions).














# ----------------------------------------------------------------------------------------------
# The critic.








# ----------------------------------------------------------------------------------------------
# The trainer.




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
    as :class:`~groupwise.trainer.grpo.GRPOTrainer`, with the same constructor.

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
        self.critic_optimizer = self.critic_trainable.network.optimizer
        self.critic_scheduler = self.critic_trainable.network.scheduler

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
            stats = policy.update(inputs, loss, also=[critic.network])
        self.engine.sync(policy.model)
        timer.mark("update")
        self.global_step += 1
        # 4. Metrics: GRPO's keys where they apply (not frac_reward_zero_std: with a critic,
        # equal rewards in a group do not make the advantages 0), plus the critic's.
        critic_logs = {
            "value_loss": stats.sums.get("value_loss", 0.0),
            "value_clip_frac": stats.sums.get("value_clip_frac", 0.0),
            "value_grad_norm": float(stats.grad_norms[1]),
            "critic_learning_rate": critic.network.learning_rate,
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
