"""The GRPO trainer: one step of DeepSeekMath Alg. 1, with GDRO's plan and observe around it.

    prompts  -> the curriculum's plan: rollouts and weight per prompt       (curriculum/)
             -> generate the completions                             (rollout/: an engine)
             -> score with every reward function             (rewards/scoring.RolloutScorer)
             -> group-relative advantages and row weights   (algo/advantages, Plan.row_weights)
             -> mini-batches of whole groups, old and reference log-probs, mu passes of the
                loss, one optimizer step per mini-batch; the engine takes the new weights
                                                      (policy/: Policy.learn, with GRPOLoss)
             -> the curriculum observes the outcome                       (curriculum/)
             -> the batch is kept for the records, the step's metrics
                                                             (trainer/metrics.StepMetrics)

DAPO's dynamic sampling and Reinforce-Ada's top-up stay behind :meth:`GRPOTrainer.draw_batch`.
The step's parts come from :func:`groupwise.build.assemble.assemble_grpo`.

Everything else (the loop, logging, evaluation, checkpoints) is the run's
(:mod:`groupwise.trainer.base`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..algo.advantages import global_group_advantages, global_normalize_then_sum
from ..algo.grpo import high_entropy_mask, off_policy_sequence_mask
from ..build.assemble import assemble_grpo
from ..curriculum import Outcome
from ..curriculum.dynamic import Draw
from ..rewards.scoring import Scores
from ..rollout import Rollout
from .base import PhaseTimer, Trainer
from .metrics import StepResult


class GRPOTrainer(Trainer):
    """GRPO trainer with TRL's constructor signature.

    model: a built-in name, a path, or a loaded ``PreTrainedModel``. reward_funcs: one callable
    (or built-in name) or a list, each ``f(prompts, completions, **columns) -> list[float|None]``.
    train_dataset / eval_dataset: indexable collections of rows with a ``prompt`` column.
    """

    def setup(self) -> None:
        """GRPO's own parts from their sections (:func:`groupwise.build.assemble.assemble_grpo`)."""
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

    def draw_batch(self, timer: PhaseTimer) -> Draw:
        """The step's batch: one prompt batch (:meth:`draw`), or with DAPO's dynamic sampling
        as many as it takes to fill the step with informative groups
        (:mod:`groupwise.curriculum.dynamic`, which calls :meth:`draw` itself)."""
        if self.dynamic.enabled:
            return self.dynamic.collect(lambda: self.draw(timer))
        return self.draw(timer)

    def draw(self, timer: PhaseTimer) -> Draw:
        """One prompt batch, planned, generated and scored (``select_top_up`` generates in
        rounds: :mod:`groupwise.curriculum.topup`)."""
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
        from ..data.prompts import tokenize_prompts
        from ..evaluation import prompt_render

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
        normalised in its group before the weighted sum, then the sum over the batch (TRL).
        Group statistics are over every rank's rows of a group."""
        options, group_ids = self.options.advantages, group_ids.cpu()
        if options.multi_objective_aggregation == "normalize_then_sum":
            weights = self.scorer.combine.weights
            return global_normalize_then_sum(scores.per_func, group_ids, weights, self.dist)
        return global_group_advantages(scores.rewards, group_ids, options.scale_rewards, self.dist)

    def train_step(self) -> dict[str, float]:
        """Generate, score and update once; returns this step's metrics."""
        timer = PhaseTimer(self.device)
        # q ~ D, the curriculum's plan (n_q, w_q), o_i ~ pi_old(.|q), r_i
        batch, plan, rollout, scores = self.draw_batch(timer)
        advantages = self.advantages(scores, rollout.group_ids)  # A_i
        # w_q per row (None: all 1), times GDRO eq. 17's mean(n) / n_x with prompt_weighting
        weights = plan.row_weights(rollout, self.options.advantages.prompt_weighting)
        timer.mark("scoring")
        # mu passes of J_GRPO (eq. 3) over the generation batch; the engine takes the weights
        stats = self.policy.learn(rollout, advantages, weights, self.loss, self.engine)
        timer.mark("update")
        self.global_step += 1
        loss_logs = self.loss.logs(stats) if hasattr(self.loss, "logs") else {}
        logs = {**self.dynamic.logs, **self.top_up.logs, **loss_logs}
        # the curriculum observes the outcome (success per prompt, losses per bin) for its
        # next plan
        outcome = Outcome(
            rollout, scores.correctness, scores.rewards, stats.sequence_loss, stats.skipped
        )
        curriculum_logs = self.curriculum.observe(plan, outcome)
        # the records keep the batch, then the step's metrics
        result = StepResult(batch.rows, plan, rollout, scores, advantages, stats)
        return self.step_metrics.report(self.global_step, result, timer, (curriculum_logs, logs),
                                        records=self.records, engine=self.engine)  # fmt: skip
