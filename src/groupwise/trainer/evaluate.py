"""Evaluation during training: what ``Trainer.evaluate()`` computes.

The mean of every reward function over one completion per prompt, and with
``eval_num_generations`` pass@k / mean@k (overall and per difficulty level), generated through
the training engine (so in the rollouts' numerics); the reward functions' ``log_metric`` values
as ``eval/<metric>`` (:func:`evaluation_metrics`, one set). :func:`evaluate_sets` takes what
``Trainer.evaluate()`` (trainer/base.py) is given: one set (a list, a dataset, a stream read
whole) or TRL's dict of named sets.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from .. import evaluation
from ..config.grpo_config import GRPOConfig
from ..policy.policy import Policy
from ..rewards.scoring import RolloutScorer
from ..rollout import Rollout
from ..wiring.rollout import sampling_params
from .datasets import check_eval_dataset, materialize

Score = Callable[[Sequence[dict[str, Any]], Rollout], tuple[torch.Tensor, torch.Tensor]]


def evaluate_sets(dataset: Any, args: GRPOConfig, **metrics: Any) -> dict[str, float]:
    """The ``eval/*`` metrics of ``dataset`` (:func:`evaluation_metrics`, whose keywords
    ``metrics`` holds); a dict of datasets (TRL's form) set by set, each one's metrics named
    ``eval/<name>/...`` and its loss ``eval_<name>_loss``."""
    if isinstance(dataset, Mapping):
        merged: dict[str, float] = {}
        for name, part in dataset.items():
            for key, value in evaluate_sets(part, args, **metrics).items():
                if key == "eval_loss":  # TRL's name for a set of a dict
                    merged[f"eval_{name}_loss"] = value
                else:
                    merged[f"eval/{name}/{key.removeprefix('eval/')}"] = value
        return merged
    check_eval_dataset(dataset, "eval_dataset")
    return evaluation_metrics(materialize(dataset), args, **metrics)


def evaluation_metrics(
    dataset: Sequence[dict[str, Any]],
    args: GRPOConfig,
    *,
    engine: Any,
    tokenizer: PreTrainedTokenizerBase,
    policy: Policy,
    scorer: RolloutScorer,
    score: Score,
    batch_size: int | None,
    greedy: bool,
    loss: Callable[[Sequence[dict[str, Any]], int], dict[str, float]] | None = None,
) -> dict[str, float]:
    """The ``eval/*`` metrics of ``dataset`` (a list of rows), ``batch_size`` (default
    ``per_device_eval_batch_size``) completions at a time as in TRL: one completion per
    prompt, greedy or sampled at the training temperature, so that many prompts per batch;
    ``score(rows, rollout)`` rewards the completions; ``loss(rows, prompts)`` adds the
    algorithm's ``eval_loss`` (TRL's) where it has one, on ``num_generations`` completions
    per prompt, so ``batch_size // num_generations`` prompts (at least one) per batch."""
    batch_size = batch_size or args.per_device_eval_batch_size
    combine = scorer.combine
    # log_metric values of training steps stay apart from this evaluation's
    training, combine.pending_metrics = combine.pending_metrics, {}
    try:
        with policy.full_weights():  # FSDP: generation calls the unwrapped model
            result = evaluation.reward_means(
                engine,
                tokenizer,
                dataset,
                score,
                scorer.names,
                sampling_params(args.sections().generation, greedy=greedy),
                batch_size=batch_size,
                max_prompt_length=args.max_prompt_length,
            )
            if greedy and args.eval_num_generations > 0:
                result.update(_pass_at_k(dataset, args, engine, tokenizer, scorer))
        policy.model.train()
        if loss is not None:
            result.update(loss(dataset, max(1, batch_size // args.num_generations)))
        result.update({f"eval/{k}": v for k, v in combine.take_metrics().items()})
    finally:
        combine.pending_metrics = training
    return result


def _pass_at_k(
    dataset: Sequence[dict[str, Any]],
    args: GRPOConfig,
    engine: Any,
    tokenizer: PreTrainedTokenizerBase,
    scorer: RolloutScorer,
) -> dict[str, float]:
    """pass@k / mean@k of ``eval_num_generations`` samples per prompt, overall and per
    difficulty level."""
    res = evaluation.evaluate_model(
        engine,
        tokenizer,
        dataset,
        scorer.funcs,
        n=args.eval_num_generations,
        ks=args.eval_ks,
        temperature=args.temperature if args.temperature > 0 else 1.0,
        top_p=args.top_p,
        top_k=args.top_k,
        max_completion_length=args.max_completion_length,
        max_prompt_length=args.max_prompt_length,
        seed=args.seed,
    )
    result = {}
    for key, value in res.summary["overall"].items():
        if key != "num_prompts" and isinstance(value, (int, float)):
            result[f"eval/{key}"] = float(value)
    for level, block in res.summary["by_difficulty"].items():
        for key, value in block.items():
            if key.startswith(("pass@", "mean@")) or key in ("accuracy", "num_prompts"):
                result[f"eval/difficulty_{level}/{key}"] = float(value)
    return result
