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
scalar value head, trained by its own AdamW (:class:`~groupwise.policy.critic.Critic`, built
with the run: :func:`groupwise.wiring.assemble.assemble_ppo`). V(s_t) is read from the
critic's hidden state at the position whose policy hidden state predicts completion token t.

The math is in pure functions (:mod:`groupwise.algo.ppo`), the loss of a micro-batch is
:class:`~groupwise.policy.loss.PPOLoss`, and the step is :func:`ppo_step`, a function of the
run; it reads the ``ppo`` section (:class:`~groupwise.sections.PPOOptions`) and the ``loss``
and ``batch`` sections. :class:`PPOTrainer` is the trainer with TRL's names that runs it.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from ..algo.ppo import explained_variance, gae_advantages, masked_whiten, token_rewards
from ..algo.variants import masked_mean
from ..config.grpo_config import GRPOConfig
from ..errors import ConfigError
from ..files import staged_files
from ..policy import update
from ..policy.batches import scatter_rows
from ..policy.critic import CRITIC_CONFIG, CRITIC_DIR, CRITIC_WEIGHTS, Critic, ValueModel
from ..policy.loss import PPOLoss
from ..sections import PPO_MULTI_TURN
from ..wiring.run import PPOParts, Run
from .base import Algorithm, PhaseTimer, RunPart, Trainer
from .metrics import StepResult


def ppo_step(run: Run[PPOParts], timer: PhaseTimer, steps: int | None = None) -> StepResult:
    """Generate, score, estimate advantages with the critic and update policy and critic
    ``num_iterations`` times (``steps`` times when given: the run's last batch stops at
    ``max_steps``); returns what the step produced (its metric block: the critic's)."""
    options, policy, engine = run.options, run.policy, run.engine
    ppo, critic = run.algorithm.options, run.algorithm.critic
    beta, iterations = options.loss.beta, options.batch.num_iterations
    batch = run.prompts.next()
    rollout = engine.generate(batch.prompt_ids, options.batch.num_generations, rows=batch.rows)
    timer.mark("generation")
    scores = run.scorer(batch.rows, rollout)
    timer.mark("scoring")
    # 1. Rollout-time quantities, once, without grad: old log-probs (for the KL reward and
    # the ratios after the first pass), reference log-probs and values. Completions whose
    # every reward function said None take no part in the update.
    need_old = iterations > 1 or beta > 0
    inputs = update.prepare(policy, rollout, None, need_old=need_old,
                            exclude_rows=torch.isnan(scores.rewards))  # fmt: skip
    mask, parts = inputs.mask, inputs.micro_batches
    with torch.no_grad(), policy.autocast():
        old_values = scatter_rows([critic.values(rollout, rows) for rows in parts], parts)
    # 2. Token rewards (KL penalty inside), GAE, whitening over the global batch.
    seq_rewards = torch.nan_to_num(scores.rewards, nan=0.0).to(run.device)
    old, ref = (scatter_rows(x, parts) if beta > 0 else None
                for x in (inputs.old_logprobs, inputs.ref_logprobs))  # fmt: skip
    rewards = token_rewards(seq_rewards, old, ref, mask, beta)
    kl_rewards = rewards - token_rewards(seq_rewards, None, None, mask, 0.0)  # -beta k1
    advantages, returns = gae_advantages(rewards, old_values, mask, ppo.ppo_gamma, ppo.ppo_lam)
    raw_advantages = advantages
    if ppo.whiten_advantages:  # with the global batch's mean and std
        advantages = masked_whiten(advantages, mask, reduce=policy.network.global_sum)
    # 3. num_iterations passes of the joint loss; policy and critic step together.
    loss = PPOLoss(options.loss, ppo, critic, rollout, advantages, returns, old_values,
                   policy.autocast)  # fmt: skip
    for _ in range(iterations if steps is None else steps):
        stats = update.update(policy, inputs, loss, also=[critic.network])
    engine.sync(policy.model)
    timer.mark("update")
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
    per_completion = masked_mean(advantages, mask, dim=1)
    return StepResult(batch.rows, None, rollout, scores, per_completion, stats,
                      extra=(critic_logs,), zero_std=False)  # fmt: skip


def check_ppo_options(args: GRPOConfig, interaction: Any) -> None:
    """Refuse what PPO cannot run, before anything is loaded (each error names the option)."""
    if args.importance_sampling_level != "token":
        raise ConfigError(
            "importance_sampling_level: PPOTrainer needs importance_sampling_level='token', "
            f"got {args.importance_sampling_level!r}"
        )
    if args.curriculum != "none":
        raise ConfigError(f"curriculum={args.curriculum}: the curriculum works with GRPO only")
    if args.generation_dtype != "auto":
        raise ConfigError(
            f"generation_dtype={args.generation_dtype} (with rollout correction) works with "
            "GRPO only"
        )
    if args.optimizer_steps_per_generation > 1:
        raise ConfigError(
            "steps_per_generation / generation_batch_size: PPOTrainer takes one optimizer "
            "step per generation batch (per num_iterations pass); leave both unset"
        )
    if interaction is not None:  # PPOTrainer(tools=...) / environment_factory
        raise ConfigError(PPO_MULTI_TURN)


def save_critic(run: Run[PPOParts], folder: Path) -> None:
    """The critic beside a saved policy, under ``<folder>/critic/``: ``model.safetensors`` (the
    ValueModel state dict) and ``critic_config.json``. :meth:`PPOTrainer.load_critic` reads
    them back."""
    critic = run.algorithm.critic.module
    with staged_files(folder / CRITIC_DIR) as tmp:
        tensors = {k: v.detach().contiguous().cpu() for k, v in critic.state_dict().items()}
        save_file(tensors, tmp / CRITIC_WEIGHTS)
        info = {
            "critic_model": run.algorithm.options.critic_model,
            "hidden_size": critic.head.in_features,
        }
        (tmp / CRITIC_CONFIG).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")


PPO = Algorithm(
    "ppo",
    default_args=partial(GRPOConfig, algorithm="ppo"),
    check=check_ppo_options,
    sharding_refusal="the critic is only replicated, not sharded",
    save_files=save_critic,
)


class PPOTrainer(Trainer):
    """PPO (clipped surrogate, GAE, learned critic, KL penalty in the reward) on the same pieces
    as :class:`~groupwise.trainer.grpo.GRPOTrainer`, with the same constructor.

    Options used: the ``ppo`` section (``ppo_gamma``, ``ppo_lam``, ``vf_coef``,
    ``cliprange_value``, ``whiten_advantages``, ``critic_model``, ``critic_learning_rate``),
    ``beta`` (per-token KL penalty in the reward), ``epsilon`` / ``epsilon_high`` (policy ratio
    clip), ``num_iterations`` (PPO epochs per batch), ``num_generations`` (1 is allowed). Both
    the policy and the value loss are token means over the batch. GRPO-only options
    (``loss_type``, ``scale_rewards``) are ignored. ``save_model`` also writes the critic.
    """

    algorithm = PPO
    # TRL-style names for the critic's parts (``critic``: the plain module checkpoints read).
    critic = RunPart[ValueModel]("algorithm.critic.module")
    critic_trainable = RunPart[Critic]("algorithm.critic")
    critic_optimizer = RunPart[torch.optim.Optimizer]("algorithm.critic.network.optimizer")
    critic_scheduler = RunPart[Any]("algorithm.critic.network.scheduler")

    def train_step(self) -> dict[str, float]:
        """Generate, score, estimate advantages with the critic and update policy and critic
        (:func:`ppo_step`); returns this step's metrics."""
        timer = PhaseTimer(self.device)
        steps = self.optimizer_steps_now()
        result = ppo_step(self.run, timer, steps)
        self.global_step += steps
        return self.step_logs(result, timer)

    def load_critic(self, path: str | Path) -> None:
        """Load critic weights written by :meth:`save_model` (``path`` is the saved folder)."""
        tensors = load_file(Path(path) / CRITIC_DIR / CRITIC_WEIGHTS, device=str(self.device))
        self.critic.load_state_dict(tensors)
