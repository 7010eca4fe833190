"""GRPO: one step of DeepSeekMath Alg. 1, with GDRO's plan and observe around it.

    prompts  -> the curriculum's plan: rollouts and weight per prompt       (curriculum/)
             -> generate the completions                             (rollout/: an engine)
             -> score with every reward function             (rewards/scoring.RolloutScorer)
             -> row weights and group-relative advantages   (Draw.row_weights, algo/advantages)
             -> mini-batches of whole groups, old and reference log-probs, mu passes of the
                loss, one optimizer step per mini-batch; the engine takes the new weights
                                                  (policy/update.learn, with GRPOLoss)
             -> the curriculum observes the outcome                       (curriculum/)

The step is :func:`grpo_step`, a function of the run (:class:`~groupwise.wiring.run.Run` with
:class:`~groupwise.wiring.run.GRPOParts`); DAPO's dynamic sampling and Reinforce-Ada's top-up
stay behind :func:`draw_batch`. It returns what the step produced; the trainer keeps the batch
for the records and logs the step's metrics (:mod:`groupwise.trainer.metrics`).
:class:`GRPOTrainer` is the trainer with TRL's names that runs it; everything else (the loop,
logging, evaluation, checkpoints) is :mod:`groupwise.trainer.base`'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..algo.advantages import global_group_advantages, global_normalize_then_sum
from ..algo.grpo import high_entropy_mask, off_policy_sequence_mask
from ..config.grpo_config import GRPOConfig
from ..curriculum import Outcome
from ..curriculum.base import Draw
from ..curriculum.dynamic import DynamicSampling
from ..curriculum.topup import TopUp
from ..policy import update
from ..policy.loss import GRPOLoss
from ..rewards.scoring import Scores
from ..rollout import Rollout
from ..wiring.run import GRPOParts, Run
from .base import Algorithm, PhaseTimer, RunPart, Trainer
from .metrics import StepResult


def grpo_step(run: Run[GRPOParts], timer: PhaseTimer, steps: int | None = None) -> StepResult:
    """Generate, score and update once (its first ``steps`` optimizer steps when given);
    returns what the step produced (its metric blocks: the curriculum's observation, dynamic
    sampling's, top-up's and the loss's logs)."""
    parts = run.algorithm
    # q ~ D, the curriculum's plan (n_q, w_q), o_i ~ pi_old(.|q), r_i, w_q per row (None: 1)
    batch, plan, rollout, scores, weights = draw_batch(run, timer)
    advantages = group_advantages(run, scores, rollout.group_ids)  # A_i
    timer.mark("scoring")
    # mu passes of J_GRPO (eq. 3) over the generation batch; the engine takes the weights
    stats = update.learn(run.policy, rollout, advantages, weights, parts.loss, run.engine, steps)
    timer.mark("update")
    loss_logs = parts.loss.logs(stats) if hasattr(parts.loss, "logs") else {}
    logs = {**parts.dynamic.logs, **parts.top_up.logs, **loss_logs}
    # the curriculum observes the outcome (success per prompt, losses per bin) for its
    # next plan
    outcome = Outcome(
        rollout, scores.correctness, scores.rewards, stats.sequence_loss, stats.skipped
    )
    curriculum_logs = run.curriculum.observe(plan, outcome)
    timer.mark("planning")
    return StepResult(batch.rows, plan, rollout, scores, advantages, stats,
                      extra=(curriculum_logs, logs), dropped=parts.dynamic.logs)  # fmt: skip


def draw_batch(run: Run[GRPOParts], timer: PhaseTimer) -> Draw:
    """The step's batch: one prompt batch (:func:`draw`), or with DAPO's dynamic sampling as
    many as it takes to fill the step with informative groups
    (:mod:`groupwise.curriculum.dynamic` says when there are enough and which to keep)."""
    dynamic = run.algorithm.dynamic
    if not dynamic.enabled:
        return draw(run, timer)
    collection = dynamic.start(run.options.advantages.prompt_weighting)
    while not collection.add(draw(run, timer)):
        pass
    return collection.result()


def draw(run: Run[GRPOParts], timer: PhaseTimer) -> Draw:
    """One prompt batch, planned, generated and scored (``select_top_up`` generates in
    rounds: :mod:`groupwise.curriculum.topup`)."""
    curriculum, top_up = run.curriculum, run.algorithm.top_up
    batch = run.prompts.next(curriculum)  # q ~ D (the curriculum may choose among more)
    plan = curriculum.plan(batch)  # n_q rollouts, weight w_q (GDRO eqs. 16, 19-21)
    timer.mark("planning")

    def roll(prompt_ids: list, counts: list[int], rows: list) -> tuple[Rollout, Scores]:
        # o_i ~ pi_old(.|q); the rows reset a multi-turn engine's environments
        rollout = run.engine.generate(prompt_ids, counts, rows=rows)
        timer.mark("generation")
        scores = run.scorer(rows, rollout)  # r_i
        timer.mark("scoring")
        return rollout, scores

    # w_q, times GDRO eq. 17's mean(n) / n_x with prompt_weighting "equal"
    weighting = run.options.advantages.prompt_weighting
    if top_up.enabled:  # rounds until the groups are informative or the budget is spent
        rounds = top_up.start(batch, plan, curriculum.weights_for, prompt_weighting=weighting)
        while rounds.request is not None:
            rounds.add(*roll(*rounds.request))
        return rounds.result()
    weights = plan.local_weights(weighting)  # per prompt of this rank (None: all 1)
    rollout, scores = roll(batch.prompt_ids, plan.local_counts, batch.rows)
    rows = None if weights is None else weights[rollout.group_ids.cpu()]  # each row its prompt's
    return Draw(batch, plan, rollout, scores, rows)


def group_advantages(run: Run[Any], scores: Scores, group_ids: torch.Tensor) -> torch.Tensor:
    """A_i = (r_i - mean(group)) / (std + eps), DeepSeekMath Sec. 4.1.2 (``scale_rewards``);
    with ``multi_objective_aggregation: normalize_then_sum`` each reward function is
    normalised in its group before the weighted sum, then the sum over the batch (TRL).
    Group statistics are over every rank's rows of a group."""
    options, group_ids = run.options.advantages, group_ids.cpu()
    if options.multi_objective_aggregation == "normalize_then_sum":
        weights = run.scorer.combine.weights
        return global_normalize_then_sum(scores.per_func, group_ids, weights, run.dist)
    return global_group_advantages(scores.rewards, group_ids, options.scale_rewards, run.dist)


def evaluation_loss(
    run: Run[GRPOParts], args: GRPOConfig, rows: Sequence[Mapping[str, Any]], batch_size: int
) -> dict[str, float]:
    """TRL's ``eval_loss``: the GRPO objective, without an update, on ``num_generations``
    samples of each evaluation prompt (the training sampling options, from a generator of
    its own so that training's sampling is untouched), advantages from their own rewards,
    averaged over batches of ``batch_size`` prompts. On-policy the ratio is 1, so with
    group-centred advantages it is mostly the KL term (beta > 0) and the entropy bonus."""
    if not args.eval_loss or not rows:
        return {}
    from ..data.prompts import tokenize_prompts
    from ..evaluation import prompt_render

    seed = args.seed + run.dist.rank
    generator = torch.Generator(device=run.generator.device).manual_seed(seed)
    losses = []
    run.model.eval()
    try:
        for begin in range(0, len(rows), batch_size):
            batch = [rows[i] for i in range(begin, min(begin + batch_size, len(rows)))]
            prompts = [r["prompt"] for r in batch]
            render = prompt_render(run.engine)
            ids = tokenize_prompts(prompts, run.tokenizer, args.max_prompt_length, render)
            with run.policy.full_weights():  # FSDP: generation calls the unwrapped model
                rollout = run.engine.generate(
                    ids, args.num_generations, generator=generator, rows=batch
                )
            scores = run.scorer(batch, rollout)
            advantages = group_advantages(run, scores, rollout.group_ids)
            losses.append(update.loss_value(run.policy, rollout, advantages, run.algorithm.loss))
    finally:
        run.model.train()
    return {"eval_loss": sum(losses) / len(losses)}


GRPO = Algorithm("grpo", evaluation_loss=evaluation_loss)


class GRPOTrainer(Trainer):
    """GRPO trainer with TRL's constructor signature: the
    :class:`~groupwise.trainer.base.Trainer` whose ``train_step`` runs :func:`grpo_step`.

    model: a built-in name, a path, or a loaded ``PreTrainedModel``. reward_funcs: one callable
    (or built-in name) or a list, each ``f(prompts, completions, **columns) -> list[float|None]``.
    train_dataset / eval_dataset: indexable collections of rows with a ``prompt`` column.
    """

    algorithm = GRPO
    loss = RunPart[GRPOLoss]("algorithm.loss")
    dynamic = RunPart[DynamicSampling]("algorithm.dynamic")
    top_up = RunPart[TopUp]("algorithm.top_up")

    def train_step(self) -> dict[str, float]:
        """Generate, score and update once (:func:`grpo_step`); returns this step's metrics."""
        timer = PhaseTimer(self.device)
        steps = self.optimizer_steps_now()
        result = grpo_step(self.run, timer, steps)
        self.global_step += steps
        return self.step_logs(result, timer)

    @property
    def entropy_coef(self) -> float:
        """The entropy bonus's coefficient now (TRL's attribute; adapted each optimizer step
        with ``use_adaptive_entropy``)."""
        control = getattr(self.loss, "entropy", None)
        return self.args.entropy_coef if control is None else control.coef

    def get_high_entropy_mask(
        self, entropies: torch.Tensor, mask: torch.Tensor, threshold: float
    ) -> torch.Tensor:
        """TRL's helper: the tokens whose entropy is at or above the ``threshold`` quantile of
        the unmasked tokens' entropies (``threshold = 1 - top_entropy_quantile``); this process's
        tokens (algo.grpo.high_entropy_mask)."""
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
        and 0.0 (drop), in the mask's dtype (algo.grpo.off_policy_sequence_mask)."""
        keep = off_policy_sequence_mask(
            advantages, per_token_logps, sampling_per_token_logps, mask, off_policy_threshold
        )
        return keep.to(mask.dtype).unsqueeze(1)

    def draw(self, timer: PhaseTimer) -> Draw:
        """One prompt batch, planned, generated and scored (:func:`draw`)."""
        return draw(self.run, timer)

    def advantages(self, scores: Scores, group_ids: torch.Tensor) -> torch.Tensor:
        """The group-relative advantages of ``scores`` (:func:`group_advantages`)."""
        return group_advantages(self.run, scores, group_ids)
