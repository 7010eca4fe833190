"""The GRPO trainer: one step of DeepSeekMath Alg. 1, with GDRO's plan and observe around it.

    prompts  -> the curriculum's plan: rollouts and weight per prompt  (curriculum/)
             -> generate the completions                                (rollout/: an engine)
             -> score with every reward function                        (scoring.RolloutScorer)
             -> group-relative advantages                  (advantages.group_advantages)
             -> mini-batches of whole groups (steps_per_generation), old log-probs (when
                several, or mu > 1) and reference log-probs (beta > 0)  (update.prepare_generation)
             -> mu passes, one optimizer step per mini-batch each      (update.train_generation)
             -> the curriculum observes the outcome

Everything else (the loop, logging, evaluation, checkpoints) is the run's (:mod:`groupwise.run`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .assemble import assemble_grpo
from .curriculum import Outcome
from .distributed import global_group_advantages, global_normalize_then_sum
from .dynamic import Draw
from .grpo_loss import high_entropy_mask, off_policy_sequence_mask
from .rollout import Rollout
from .run import PhaseTimer, Trainer
from .sampler import PromptSampler
from .scoring import Scores

__all__ = ["GRPOTrainer", "PromptSampler"]


class GRPOTrainer(Trainer):
    """GRPO trainer with TRL's constructor signature.

    model: a built-in name, a path, or a loaded ``PreTrainedModel``. reward_funcs: one callable
    (or built-in name) or a list, each ``f(prompts, completions, **columns) -> list[float|None]``.
    train_dataset / eval_dataset: indexable collections of rows with a ``prompt`` column.
    """

    def setup(self) -> None:
        """GRPO's own parts from their sections (:func:`groupwise.assemble.assemble_grpo`)."""
        parts = assemble_grpo(self.options, self.dist, self.tokenizer.pad_token_id or 0)
        self.curriculum, self.loss = parts.curriculum, parts.loss
        self.dynamic, self.top_up = parts.dynamic, parts.top_up

    def components(self) -> dict[str, Any]:
        parts = {**super().components(), "dynamic_sampling": self.dynamic}
        if hasattr(self.loss, "state_dict"):  # any callable may stand in for GRPOLoss
            parts["loss"] = self.loss
        return parts

    def get_high_entropy_mask(
        self, entropies: torch.Tensor, mask: torch.Tensor, threshold: float
    ) -> torch.Tensor:
        """TRL's helper: the tokens whose entropy is at or above the ``threshold`` quantile of
        the unmasked tokens' entropies (``threshold = 1 - top_entropy_quantile``); this process's
        tokens (grpo_loss.high_entropy_mask)."""
        return high_entropy_mask(entropies, mask, 1.0 - threshold)

    @staticmethod
    def get_off_policy_mask(
        advantages: torch.Tensor,
        per_token_logps: torch.Tensor,
        sampling_per_token_logps: torch.Tensor,
        mask: torch.Tensor,
        off_policy_threshold: float,
    ) -> torch.Tensor:
        """TRL's helper: DeepSeek-V3.2's off-policy sequence mask as a [B, 1] tensor of 1.0 (keep)
        and 0.0 (drop), in the mask's dtype (grpo_loss.off_policy_sequence_mask)."""
        keep = off_policy_sequence_mask(
            advantages, per_token_logps, sampling_per_token_logps, mask, off_policy_threshold
        )
        return keep.to(mask.dtype).unsqueeze(1)

    @property
    def entropy_coef(self) -> float:
        """The entropy bonus's coefficient now (TRL's attribute; adapted each optimizer step
        with ``use_adaptive_entropy``)."""
        control = getattr(self.loss, "entropy", None)
        return self.args.entropy_coef if control is None else control.coef

    def draw(self, timer: PhaseTimer) -> Draw:
        """One prompt batch, planned, generated and scored (DAPO's dynamic sampling draws
        several per step: :mod:`groupwise.dynamic`; ``select_top_up`` generates in rounds:
        :mod:`groupwise.topup`)."""
        batch = self.prompts.next(self.curriculum)  # q ~ D (the curriculum may choose among more)
        plan = self.curriculum.plan(batch)  # n_q rollouts, weight w_q (GDRO eqs. 16, 19-21)

        def roll(prompt_ids: list, counts: list[int], rows: list) -> tuple[Rollout, Scores]:
            # o_i ~ pi_old(.|q); the rows reset a multi-turn engine's environments
            rollout = self.engine.generate(prompt_ids, counts, rows=rows)
            timer.mark("generation")
            scores = self.scorer(rows, rollout)  # r_i
            timer.mark("scoring")
            return rollout, scores

        if self.top_up.enabled:
            return self.top_up.collect(batch, plan, roll, self.curriculum.weights_for)
        return Draw(batch, plan, *roll(batch.prompt_ids, plan.local_counts, batch.rows))

    def compute_spent(self, rollout: Rollout, scores: Scores) -> dict[str, int]:
        """What the step generated, dynamic sampling's dropped groups included: they cost their
        generation (the counts in ``self.dynamic.logs`` are already global)."""
        spent = super().compute_spent(rollout, scores)
        dropped = self.dynamic.logs
        spent["generated_tokens"] += int(dropped.get("dynamic/dropped_tokens", 0))
        spent["rollouts"] += int(dropped.get("dynamic/dropped_rollouts", 0))
        spent["groups"] += int(dropped.get("dynamic/dropped_groups", 0))
        spent["informative_groups"] += int(dropped.get("dynamic/trimmed_groups", 0))
        return spent

    def evaluation_loss(
        self, rows: Sequence[Mapping[str, Any]], batch_size: int
    ) -> dict[str, float]:
        """TRL's ``eval_loss``: the GRPO objective, without an update, on ``num_generations``
        samples of each evaluation prompt (the training sampling options, from a generator of
        its own so that training's sampling is untouched), advantages from their own rewards,
        averaged over batches of ``batch_size`` prompts. On-policy the ratio is 1, so with
        group-centred advantages it is mostly the KL term (beta > 0) and the entropy bonus."""
        if not self.args.eval_loss or not rows:
            return {}
        from .data import tokenize_prompts
        from .evaluation import prompt_render

        args = self.args
        seed = args.seed + self.dist.rank
        generator = torch.Generator(device=self.generator.device).manual_seed(seed)
        losses = []
        self.model.eval()
        try:
            for begin in range(0, len(rows), batch_size):
                batch = [rows[i] for i in range(begin, min(begin + batch_size, len(rows)))]
                prompts = [r["prompt"] for r in batch]
                render = prompt_render(self.engine)
                ids = tokenize_prompts(prompts, self.tokenizer, args.max_prompt_length, render)
                with self.policy.full_weights():  # FSDP: generation calls the unwrapped model
                    rollout = self.engine.generate(
                        ids, args.num_generations, generator=generator, rows=batch
                    )
                scores = self.scorer(batch, rollout)
                advantages = self.advantages(scores, rollout.group_ids)
                losses.append(self.policy.loss_value(rollout, advantages, self.loss))
        finally:
            self.model.train()
        return {"eval_loss": sum(losses) / len(losses)}

    def advantages(self, scores: Scores, group_ids: torch.Tensor) -> torch.Tensor:
        """A_i = (r_i - mean(group)) / (std + eps), DeepSeekMath Sec. 4.1.2 (``scale_rewards``);
        with ``multi_objective_aggregation: normalize_then_sum`` each reward function is
        normalised in its group before the weighted sum, then the sum over the batch (TRL)."""
        if self.args.multi_objective_aggregation == "normalize_then_sum":
            weights = self.scorer.combine.weights
            return global_normalize_then_sum(scores.per_func, group_ids.cpu(), weights, self.dist)
        return global_group_advantages(
            scores.rewards, group_ids.cpu(), self.args.scale_rewards, self.dist
        )

    def train_step(self) -> dict[str, float]:
        """Generate, score and update once; returns this step's metrics."""
        timer = PhaseTimer(self.device)
        # q ~ D, plan, o_i ~ pi_old(.|q), r_i (dynamic_sampling: until enough informative groups)
        batch, plan, rollout, scores = self.dynamic.collect(lambda: self.draw(timer))
        advantages = self.advantages(scores, rollout.group_ids)  # A_i
        timer.mark("scoring")
        weights = plan.row_weights(rollout, self.args.prompt_weighting)  # w_q (GDRO eqs. 16-17)
        generation = self.policy.prepare_generation(rollout, advantages, weights)
        stats = self.policy.train_generation(generation, self.loss)  # mu passes of J_GRPO (eq. 3)
        self.engine.sync(self.policy.model)
        timer.mark("update")
        self.global_step += 1
        outcome = Outcome(
            rollout, scores.correctness, scores.rewards, stats.sequence_loss, stats.skipped
        )
        curriculum_logs = self.curriculum.observe(plan, outcome)
        self.keep_batch(batch.rows, rollout, scores, advantages, plan)
        loss_logs = self.loss.logs(stats) if hasattr(self.loss, "logs") else {}
        logs = {**self.dynamic.logs, **self.top_up.logs, **loss_logs}
        return self.step_logs(rollout, scores, stats, timer, curriculum_logs, logs)
