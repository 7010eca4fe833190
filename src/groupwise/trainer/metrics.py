"""Step metrics: what one step produced (:class:`StepResult`: its rows and plan, the rollout,
scores, advantages, update statistics and the algorithm's own metric blocks) as the metric dict
the run logs (docs/metrics.md), with the phase timer and the compute ledger behind them.

An algorithm's step function returns a :class:`StepResult`; the trainer's ``train_step`` turns
it into the logged metrics with :class:`StepMetrics`, the same way for GRPO and PPO.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from ..algo.advantages import group_reward_std, informative_groups, zero_std_groups_fraction
from ..algo.variants import rollout_correction_logs
from ..curriculum import Plan
from ..policy.batches import UpdateStats
from ..policy.policy import Policy
from ..rewards.scoring import RolloutScorer, Scores
from ..rollout import Rollout
from ..runtime.distributed import DistributedContext, all_reduce_sum, reduce_metrics
from ..sections import BatchOptions, LossOptions


class Timings(Protocol):
    """A step's wall time by phase (``trainer.base.PhaseTimer``): seconds per phase, and in all."""

    phases: dict[str, float]

    @property
    def total(self) -> float: ...


class ComputeLedger:
    """What the run has spent so far (checkpointed, so a resumed run continues the totals):
    generated completion tokens, rollouts, prompt groups and informative groups (correctness
    that varies, :func:`groupwise.algo.advantages.informative_groups`) and optimizer steps, over
    every rank. :meth:`record` adds one step and returns its ``compute/*`` metrics."""

    KEYS = ("generated_tokens", "rollouts", "groups", "informative_groups", "optimizer_steps")

    def __init__(self) -> None:
        self.totals: dict[str, int] = dict.fromkeys(self.KEYS, 0)

    def record(self, step: dict[str, int]) -> dict[str, float]:
        for key in self.KEYS:
            self.totals[key] += step[key]
        logs: dict[str, float] = {}
        for key in ("generated_tokens", "rollouts", "informative_groups", "optimizer_steps"):
            logs[f"compute/{key}"] = float(step[key])
            logs[f"compute/{key}_total"] = float(self.totals[key])
        logs["compute/informative_groups_per_rollout"] = step["informative_groups"] / max(
            step["rollouts"], 1
        )
        logs["compute/informative_groups_per_rollout_total"] = self.totals[
            "informative_groups"
        ] / max(self.totals["rollouts"], 1)
        return logs

    def state_dict(self) -> dict[str, int]:
        return dict(self.totals)

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.totals = {key: int(state.get(key, 0)) for key in self.KEYS}


def sequence_tokens(rollout: Rollout) -> tuple[int, int]:
    """A rollout's prompt and completion tokens (padding excluded), counted as verl counts a
    batch: verl's batch holds every completion with its own copy of the prompt, so a prompt's
    tokens count once per completion, not once per group."""
    per_prompt = rollout.prompt_mask.sum(dim=1)
    prompt = int(per_prompt[rollout.group_ids.to(per_prompt.device)].sum())
    return prompt, int(rollout.completion_mask.sum())


def verl_throughput(
    prompt_tokens: int, completion_tokens: int, step_seconds: float, world_size: int
) -> dict[str, float]:
    """verl's ``perf/*`` throughput metrics, so its users can compare runs at a glance: the
    step's prompt + completion tokens over every rank, and those tokens per second per device
    (total / (step seconds x world size)). Unlike ``tokens_per_second`` (completion tokens
    only), prompts count, which is the work the update's forward passes do."""
    total = prompt_tokens + completion_tokens
    return {
        "perf/total_num_tokens": float(total),
        "perf/throughput": total / (max(step_seconds, 1e-9) * world_size),
    }


def rollout_mismatch_logs(
    stats: Sequence[tuple[torch.Tensor, torch.Tensor]], loss: LossOptions
) -> dict[str, float]:
    """TRL's sampling/* metrics over a step: |logp_trainer - logp_sampler| per token and the
    rollout-correction weights (whether or not they are applied), and the share of those
    weights the run's mode masks or truncates
    (:func:`~groupwise.algo.variants.rollout_correction_logs`)."""
    diff = torch.cat([d for d, _ in stats])
    weights = torch.cat([w.flatten() for _, w in stats])
    share = rollout_correction_logs(
        weights,
        mode=loss.rollout_correction_mode,
        clip_min=loss.rollout_correction_clip_min,
        clip_max=loss.rollout_correction_clip_max,
    )
    if diff.numel() == 0:  # every token masked; all ranks must still log the same keys
        diff = weights = torch.zeros(1)
    return {
        "sampling/sampling_logp_difference/mean": float(diff.mean()),
        "sampling/sampling_logp_difference/max": float(diff.max()),
        "sampling/importance_sampling_ratio/min": float(weights.min()),
        "sampling/importance_sampling_ratio/mean": float(weights.mean()),
        "sampling/importance_sampling_ratio/max": float(weights.max()),
        **share,
    }


@dataclass(frozen=True)
class StepResult:
    """What one step produced on this rank: its prompt rows and plan (None without a
    curriculum's), the rollout, its scores, one advantage per completion (GRPO's before the
    curriculum's weights; PPO's the mean of its token advantages), the update's statistics, and
    the algorithm's own metric blocks (``extra``). ``zero_std=False`` (PPO, whose critic gives
    equal rewards nonzero advantages) leaves out ``frac_reward_zero_std``; ``dropped`` holds
    dynamic sampling's global counts of what it generated and dropped (its ``logs``)."""

    rows: list[dict[str, Any]]
    plan: Plan | None
    rollout: Rollout
    scores: Scores
    advantages: torch.Tensor
    stats: UpdateStats
    extra: Sequence[dict[str, float]] = ()
    zero_std: bool = True
    dropped: Mapping[str, float] = field(default_factory=dict)


def compute_spent(
    rollout: Rollout,
    scores: Scores,
    dist: DistributedContext,
    batch: BatchOptions,
    dropped: Mapping[str, float] | None = None,
) -> dict[str, int]:
    """A step's generated tokens, rollouts, groups and informative groups over every rank, and
    its optimizer steps (one per mini-batch per pass). Dynamic sampling's dropped groups
    (``dropped``, its already global counts) cost their generation, so they count too."""
    local = torch.tensor(
        [
            int(rollout.completion_mask.sum()),
            int(rollout.completion_ids.shape[0]),
            int(torch.unique(rollout.group_ids.cpu()).numel()),
            int(informative_groups(scores.correctness, rollout.group_ids.cpu()).sum()),
        ],
        dtype=torch.float64,
    )
    total = [int(v) for v in all_reduce_sum(local, dist).tolist()]
    spent = dict(zip(ComputeLedger.KEYS[:4], total, strict=True))
    spent["optimizer_steps"] = batch.optimizer_steps_per_batch
    dropped = dropped or {}
    spent["generated_tokens"] += int(dropped.get("dynamic/dropped_tokens", 0))
    spent["rollouts"] += int(dropped.get("dynamic/dropped_rollouts", 0))
    spent["groups"] += int(dropped.get("dynamic/dropped_groups", 0))
    spent["informative_groups"] += int(dropped.get("dynamic/trimmed_groups", 0))
    return spent


class StepMetrics:
    """A step's metric dict: rewards, completion lengths, loss terms, optimisation, timing and
    throughput, the algorithm's ``extra`` blocks, the reward functions' ``log_metric`` values
    and the compute ledger's ``compute/*`` (:func:`compute_spent`), averaged over ranks
    (docs/metrics.md). The ``batch`` section gives the group size, the optimizer steps per
    step and ``num_iterations``, which turns the update's summed entropy into a per-token
    mean."""

    def __init__(
        self,
        dist: DistributedContext,
        scorer: RolloutScorer,
        policy: Policy,
        ledger: ComputeLedger,
        batch: BatchOptions,
    ) -> None:
        self.dist, self.scorer, self.policy, self.ledger = dist, scorer, policy, ledger
        self.batch = batch

    def __call__(
        self, step: int, result: StepResult, timer: Timings, engine: Any = None
    ) -> dict[str, float]:
        """The metrics of step ``step``; ``engine`` is read for a multi-turn run's timing."""
        rollout, scores, stats = result.rollout, result.scores, result.stats
        rewards, group_ids = scores.rewards, rollout.group_ids.cpu()
        logs: dict[str, float] = {
            "step": step,
            "reward": float(torch.nanmean(rewards)) if not torch.isnan(rewards).all() else 0.0,
        }
        if result.zero_std:
            logs["reward_std"] = float(torch.nanmean(group_reward_std(rewards, group_ids)))
            logs["frac_reward_zero_std"] = zero_std_groups_fraction(rewards, group_ids)
        elif self.batch.num_generations > 1:
            logs["reward_std"] = float(torch.nanmean(group_reward_std(rewards, group_ids)))
        logs.update(self.scorer.logs(scores.per_func))
        logs.update(self._update_and_timing(rollout, stats, timer))
        # verl's perf/throughput: every rank's prompt + completion tokens, per device-second.
        tokens = torch.tensor(sequence_tokens(rollout), dtype=torch.float64)
        prompt_tokens, completion_tokens = (int(v) for v in all_reduce_sum(tokens, self.dist))
        world = self.dist.world_size
        logs.update(verl_throughput(prompt_tokens, completion_tokens, timer.total, world))
        if rollout.conversations is not None:  # multi-turn: tool use, turns, masked tokens
            logs.update(conversation_logs(rollout, scores.correctness))
            timing = getattr(engine, "timing", {})
            logs["time/environment"] = timing.get("env_s", 0.0)
            logs["time/context_insert"] = timing.get("insert_s", 0.0)
        for block in result.extra:
            logs.update(block)
        logs.update(self.scorer.combine.take_metrics())  # the reward functions' log_metric
        spent = compute_spent(rollout, scores, self.dist, self.batch, result.dropped)
        logs.update(self.ledger.record(spent))
        if stats.mismatch:
            logs.update(rollout_mismatch_logs(stats.mismatch, self.policy.options.loss))
        logs = reduce_metrics(logs, self.dist)
        if stats.skipped:
            logs["nonfinite_step"] = 1.0
        return logs

    def _update_and_timing(
        self, rollout: Rollout, stats: UpdateStats, timer: Timings
    ) -> dict[str, float]:
        """Completion lengths, the update's loss terms and the phases' wall times."""
        lengths = rollout.lengths.float()
        gen_tokens = int(rollout.completion_mask.sum())
        generation = timer.phases.get("generation", 0.0)
        sums = stats.sums
        # Entropy per token: tokens counts every rank's tokens and reduce_metrics averages the
        # ranks' shares, hence the world size.
        world = self.dist.world_size
        entropy = stats.entropy_sum * world / float(stats.tokens) / self.batch.num_iterations
        return {
            "completions/mean_length": float(lengths.mean()),
            "completions/min_length": float(lengths.min()),
            "completions/max_length": float(lengths.max()),
            "completions/clipped_ratio": float(rollout.truncated.float().mean()),
            "loss": sums.get("loss", 0.0),
            "kl": sums.get("kl", 0.0),
            "clip_ratio/low_mean": sums.get("clip_ratio/low_mean", 0.0),
            "clip_ratio/high_mean": sums.get("clip_ratio/high_mean", 0.0),
            "clip_ratio/region_mean": sums.get("clip_ratio/region_mean", 0.0),
            "entropy": entropy,
            "grad_norm": float(stats.grad_norm),
            "learning_rate": self.policy.network.learning_rate,
            "time/generation": generation,
            "time/scoring": timer.phases.get("scoring", 0.0),
            "time/update": timer.phases.get("update", 0.0),
            "time/planning": timer.phases.get("planning", 0.0),
            "time/step": timer.total,
            "tokens_per_second": gen_tokens / timer.total,
            "generation_tokens_per_second": gen_tokens / max(generation, 1e-9),
        }


def conversation_logs(rollout: Rollout, correctness: torch.Tensor) -> dict[str, float]:
    """A multi-turn rollout's metrics (docs/metrics.md "tools"): tool calls per conversation,
    the share of conversations with a call, the failed share of calls, turns, the share of
    completion tokens masked from the loss, and the mean correctness score of conversations
    with and without a tool call (NaN when there are none)."""
    states = rollout.env_states or [{} for _ in rollout.texts]
    calls = torch.tensor([float(s.get("tool_calls", 0)) for s in states])
    errors = torch.tensor([float(s.get("tool_errors", 0)) for s in states])
    turns = torch.tensor([float(s.get("turns", 1)) for s in states])
    used = calls > 0
    score = correctness.detach().float().cpu()

    def mean(values: torch.Tensor) -> float:
        values = values[~torch.isnan(values)]
        return float(values.mean()) if values.numel() else float("nan")

    tokens = float(rollout.completion_mask.sum())
    trained = float(rollout.loss_mask.sum())
    return {
        "tools/call_frequency": float(calls.mean()),
        "tools/call_rate": float(used.float().mean()),
        "tools/failure_frequency": float(errors.sum() / calls.sum()) if calls.sum() > 0 else 0.0,
        "tools/accuracy_with_call": mean(score[used]),
        "tools/accuracy_without_call": mean(score[~used]),
        "turns/mean": float(turns.mean()),
        "turns/max": float(turns.max()),
        "tokens/masked_fraction": 1.0 - trained / tokens if tokens else 0.0,
    }
