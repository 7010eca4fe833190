"""The GRPO loss of one micro-batch, bound to a run's options (:class:`GRPOLoss`: the registered
loss variant, its share of the global batch, the per-completion policy term a curriculum reads,
the masks), and the entropy bonus with Skywork-OR1's adaptive coefficient
(:class:`EntropyControl`; TRL's ``entropy_coef`` / ``use_adaptive_entropy`` options and names).
The math is :mod:`groupwise.algo.grpo`'s.

With the bonus the objective to minimise is

    L = L_policy - c * H                                                                   (1)

where H is the mean per-token entropy of the policy over the tokens the policy term trains on
(every completion token; with ``top_entropy_quantile`` the high-entropy ones), whatever the
``loss_type``: the bonus is not rescaled to a loss type's own normalisation, so ``c`` means the
same for every loss. Over a global batch spread across micro-batches and ranks, micro-batch k's
part is its own token mean H_k weighted by its share of the batch's completion tokens, so
without a token mask the parts add up to exactly the batch's token mean.

Adaptive control (Skywork-OR1, arXiv 2505.22312, Sec. 3.2): after each optimizer step, with H
the entropy measured over that step's tokens (every micro-batch, every rank),

    c <- min(c + delta, c_max)   if H <= target
    c <- max(c - delta, c_min)   otherwise                                                 (2)

and the next step applies c only while the last measured H is at or below the target, so a
policy already above its target entropy gets no push (the first step, with nothing measured
yet, applies none, as TRL does).                                                          (3)

PPO's loss of a micro-batch, bound to its options the same way, is :class:`PPOLoss` (the
clipped surrogate plus the critic's clipped value loss; the math: :mod:`groupwise.algo.ppo`).
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..algo.grpo import (
    adapt_entropy_coef,
    entropy_bonus,
    high_entropy_mask,
    off_policy_sequence_mask,
    policy_loss,
    sequence_surrogate,
)
from ..algo.ppo import ppo_policy_loss, value_loss
from ..algo.variants import LossTerms, MicroBatch, get_loss
from ..runtime.distributed import DistributedContext, all_reduce_sum
from ..sections import LossOptions, PPOOptions

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..rollout import Rollout
    from .batches import UpdateStats
    from .critic import Critic


class EntropyControl:
    """The run's entropy coefficient: fixed (``entropy_coef``), or adapted after every optimizer
    step (Eqs. 2-3) from the token entropy the micro-batches of that step report."""

    def __init__(self, loss: LossOptions) -> None:
        """The coefficient and its bounds from the run's loss section (TRL's names:
        ``entropy_coef``, ``use_adaptive_entropy``, ``entropy_target``, ``entropy_coef_delta``,
        ``entropy_coef_min``, ``entropy_coef_max``)."""
        self.coef, self.adaptive = float(loss.entropy_coef), loss.use_adaptive_entropy
        self.target, self.delta = loss.entropy_target, loss.entropy_coef_delta
        self.coef_min, self.coef_max = loss.entropy_coef_min, loss.entropy_coef_max
        self.last_entropy = math.inf  # Eq. 3: nothing measured yet
        self._window: Tensor | None = None  # [entropy sum, token count] of this optimizer step

    @classmethod
    def from_options(cls, loss: LossOptions) -> EntropyControl | None:
        """The control of a run's loss section; None when there is no bonus."""
        if loss.entropy_coef == 0.0 and not loss.use_adaptive_entropy:
            return None
        return cls(loss)

    @property
    def applied(self) -> float:
        """The coefficient this optimizer step's micro-batches apply (Eq. 3)."""
        if self.adaptive and self.last_entropy > self.target:
            return 0.0
        return self.coef

    def observe(self, entropies: Tensor, keep: Tensor) -> None:
        """Add a micro-batch's entropies over its ``keep`` tokens to this step's measurement
        (device tensors: nothing is read until :meth:`step`)."""
        if not self.adaptive:
            return
        keep = keep.to(entropies.dtype)
        stats = torch.stack([(entropies.detach() * keep).sum(), keep.sum()]).double()
        self._window = stats if self._window is None else self._window + stats

    def step(self, dist: DistributedContext) -> None:
        """After an optimizer step: the step's token entropy over every rank, then Eq. 2. Every
        rank calls it (the sum is a collective)."""
        if not self.adaptive or self._window is None:
            return
        total, count = all_reduce_sum(self._window, dist).tolist()
        self._window = None
        if count == 0 or not math.isfinite(total):
            return  # nothing measured (or a skipped, non-finite step): keep the coefficient
        entropy = total / count
        self.coef = adapt_entropy_coef(
            self.coef,
            entropy,
            target=self.target,
            delta=self.delta,
            coef_min=self.coef_min,
            coef_max=self.coef_max,
        )
        self.last_entropy = entropy

    def logs(self) -> dict[str, float]:
        return {"entropy_coef": self.coef}

    def state_dict(self) -> dict[str, float]:
        return {"entropy_coef": self.coef, "last_entropy": self.last_entropy}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.coef = float(state["entropy_coef"])
        self.last_entropy = float(state["last_entropy"])


logger = logging.getLogger("groupwise.loss")


class GRPOLoss:
    """The GRPO objective of one micro-batch: the registered variant ``loss_type``
    (:func:`policy_loss`) with the run's clip, KL and GSPO options, its share of the global
    batch (:meth:`~groupwise.algo.variants.LossVariant.share`), and the per-completion policy term
    with unweighted advantages (:func:`sequence_surrogate`, GDRO's signal), and
    the entropy bonus when the run has one (:mod:`groupwise.policy.loss`)."""

    def __init__(self, loss: LossOptions, max_completion_length: int) -> None:
        # max_completion_length: dr_grpo's constant normaliser (Dr. GRPO divides by it).
        self.options, self.variant = loss, get_loss(loss.loss_type)
        self.max_completion_length = max_completion_length
        self.epsilon_high = loss.effective_epsilon_high
        self.variant_options = loss.variant_options()
        # What policy_loss and sequence_surrogate take of the options, the same every call.
        self.objective_options = dict(
            loss_type=loss.loss_type,
            epsilon_low=loss.epsilon,
            epsilon_high=self.epsilon_high,
            importance_sampling_level=loss.importance_sampling_level,
            variant_options=self.variant_options,
        )
        self.entropy = EntropyControl.from_options(loss)
        if loss.importance_sampling_level == "sequence" and self.variant.sums_tokens:
            logger.warning(
                "importance_sampling_level='sequence' with loss_type=%r: that loss sums per-token "
                "terms, which weights each sequence by its completion length instead of GSPO's "
                "per-sequence objective; loss_type='grpo' is GSPO's setup (arXiv 2507.18071)",
                loss.loss_type,
            )

    @classmethod
    def from_config(cls, config: Any) -> GRPOLoss:
        """The loss of a run's flat options (a ``GRPOConfig``: its ``loss`` section and
        completion length)."""
        return cls(LossOptions.from_config(config), config.max_completion_length)

    @property
    def entropy_grad(self) -> bool:
        """Whether the entropies must carry a gradient (only the bonus differentiates them;
        otherwise they stay detached, saving the softmax graph's memory)."""
        return self.entropy is not None

    def after_optimizer_step(self, dist: DistributedContext) -> None:
        if self.entropy is not None:
            self.entropy.step(dist)

    def logs(self, stats: UpdateStats) -> dict[str, float]:
        """With an entropy bonus, TRL's ``policy_loss`` (the loss without the bonus) and
        ``entropy_coef`` (after this step's update); nothing otherwise."""
        if self.entropy is None:
            return {}
        return {"policy_loss": stats.sums.get("policy_loss", 0.0), **self.entropy.logs()}

    def state_dict(self) -> dict[str, float] | None:
        """The adapted entropy coefficient travels in checkpoints (None: nothing to keep)."""
        return None if self.entropy is None else self.entropy.state_dict()

    def load_state_dict(self, state: dict[str, float]) -> None:
        if self.entropy is not None:
            self.entropy.load_state_dict(state)

    def __call__(self, logps: Tensor, mb: MicroBatch) -> LossTerms:
        o, options = self.options, self.objective_options
        assert mb.advantages is not None
        entropy_mask = None
        if o.top_entropy_quantile < 1.0:
            if mb.entropy is None:
                raise ValueError("top_entropy_quantile needs the policy's token entropies")
            entropy_mask = high_entropy_mask(
                mb.entropy.detach(), mb.mask, o.top_entropy_quantile
            )
        token_mask = entropy_mask
        if o.off_policy_mask_threshold is not None:
            # Measured against the sampler: its own log-probs when it gave them, else pi_old
            # (on-policy: the policy itself, so nothing is dropped).
            sampler = mb.sampling_logprobs if mb.sampling_logprobs is not None else mb.old_logprobs
            sampler = logps.detach() if sampler is None else sampler
            keep_rows = off_policy_sequence_mask(
                mb.advantages, logps, sampler, mb.mask, o.off_policy_mask_threshold
            )[:, None].expand_as(mb.mask)
            token_mask = keep_rows if token_mask is None else token_mask & keep_rows
        loss, metrics = policy_loss(
            logps,
            mb.old_logprobs,
            mb.ref_logprobs,
            mb.advantages,
            mb.mask,
            beta=o.beta,
            max_completion_length=self.max_completion_length,
            rollout_weights=mb.correction,
            row_weights=mb.row_weights,
            token_mask=token_mask,
            kl_ratio_correction=o.use_bias_correction_kl,
            **options,
        )
        weight = self.variant.share(len(mb.rows), mb.mask.sum(), mb.counts)
        signal = sequence_surrogate(logps, mb.old_logprobs, mb.advantages, mb.mask, **options)
        bonus = None
        if self.entropy is not None:
            assert mb.entropy is not None
            # Eq. 1 of groupwise.policy.loss: this micro-batch's token mean of H, weighted by its
            # share of the global batch's completion tokens, over the completion tokens (the
            # high-entropy ones with top_entropy_quantile; the off-policy mask does not apply,
            # as in TRL).
            keep = mb.mask if entropy_mask is None else mb.mask * entropy_mask.to(mb.mask.dtype)
            tokens = mb.mask.sum() / mb.counts.tokens * mb.counts.world_size
            mean_entropy = entropy_bonus(mb.entropy, keep, tokens)
            bonus = -self.entropy.applied * mean_entropy
            if torch.is_grad_enabled():  # a training pass: evaluation never moves the control
                self.entropy.observe(mb.entropy, keep)
        return LossTerms(loss, weight, metrics, signal, bonus)


class PPOLoss:
    """PPO's loss of one micro-batch: the clipped policy surrogate (the ``loss`` section's
    ``epsilon`` and :attr:`~groupwise.sections.LossOptions.clip_epsilon_high`) plus
    ``vf_coef`` times the clipped value loss (``cliprange_value``), both token means over the
    global batch (each micro-batch weighs its share of every rank's tokens; the gradient average
    over ranks divides by the world size, which the weight undoes). One per generation batch:
    it holds that batch's rollout, token advantages, returns and old values."""

    def __init__(
        self,
        loss: LossOptions,
        ppo: PPOOptions,
        critic: Critic,
        rollout: Rollout,
        advantages: Tensor,
        returns: Tensor,
        old_values: Tensor,
        autocast: Callable[[], Any],
    ) -> None:
        self.epsilon, self.epsilon_high = loss.epsilon, loss.clip_epsilon_high
        self.vf_coef, self.cliprange_value = ppo.vf_coef, ppo.cliprange_value
        self.critic, self.rollout = critic, rollout
        self.advantages, self.returns, self.old_values = advantages, returns, old_values
        self.autocast = autocast
        self.token_mean = get_loss("dapo")  # the global batch's token mean

    def __call__(self, logps: Tensor, mb: MicroBatch) -> LossTerms:
        with self.autocast():
            values = self.critic.values(self.rollout, mb.rows)
        old = mb.old_logprobs if mb.old_logprobs is not None else logps.detach()
        pg_loss, metrics = ppo_policy_loss(
            logps, old, mb.ref_logprobs, self.advantages[mb.rows], mb.mask,
            epsilon_low=self.epsilon, epsilon_high=self.epsilon_high,
        )  # fmt: skip
        vf_loss, vf_clip = value_loss(
            values, self.old_values[mb.rows], self.returns[mb.rows], mb.mask, self.cliprange_value
        )
        weight = self.token_mean.share(len(mb.rows), mb.mask.sum(), mb.counts)
        # Detached tensors: the update reads every metric once per pass (no sync here).
        metrics = {**metrics, "loss": pg_loss.detach(), "value_loss": vf_loss.detach(),
                   "value_clip_frac": torch.as_tensor(vf_clip).detach()}  # fmt: skip
        # Policy and critic share no parameters: one backward serves both.
        return LossTerms(pg_loss + self.vf_coef * vf_loss, weight, metrics)
