"""The GRPO training loop.

One step (DeepSeekMath Alg. 1 with TRL's options):

    prompts  -> generate G completions each                  (rollout.generate)
             -> score with every reward function              (weighted sum, NaN = not applicable)
             -> group-relative advantages                     (core.group_advantages)
             -> old log-probs (mu > 1) and reference log-probs (beta > 0)
             -> mu optimizer passes of the clipped surrogate  (core.policy_loss)
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .config import GRPOConfig
from .core import group_advantages, group_reward_std, policy_loss, zero_std_groups_fraction
from .curriculum import Curriculum
from .data import tokenize_prompts
from .logprobs import completion_logprobs
from .models import load_model_and_tokenizer
from .rewards import RewardFunc, build_reward_func, reward_func_name
from .rewards.combine import RewardScorer, score_rollout
from .rollout import Rollout, SamplingParams, generate


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device={name!r} was asked for but CUDA is not available")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "float32":
        return torch.float32
    if name == "bfloat16":
        return torch.bfloat16
    # auto: bf16 on GPUs that support it, fp32 elsewhere (CPU training in bf16 loses updates).
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class PromptSampler:
    """Draws prompt indices without replacement within an epoch, reshuffling every epoch."""

    def __init__(self, size: int, seed: int) -> None:
        if size < 1:
            raise ValueError("the training dataset is empty")
        self.size = size
        self.generator = torch.Generator().manual_seed(seed)
        self.order: list[int] = []
        self.epoch = 0

    def take(self, count: int) -> list[int]:
        batch = []
        while len(batch) < count:
            if not self.order:
                self.order = torch.randperm(self.size, generator=self.generator).tolist()
                self.epoch += 1
            batch.append(self.order.pop(0))
        return batch


def _lr_lambda(args: GRPOConfig, total_steps: int) -> Callable[[int], float]:
    def factor(step: int) -> float:
        if args.warmup_steps and step < args.warmup_steps:
            return (step + 1) / args.warmup_steps
        if args.lr_scheduler_type == "constant":
            return 1.0
        progress = (step - args.warmup_steps) / max(1, total_steps - args.warmup_steps)
        progress = min(max(progress, 0.0), 1.0)
        if args.lr_scheduler_type == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


class GRPOTrainer:
    """GRPO trainer with TRL's constructor signature.

    model: a built-in name, a path, or a loaded ``PreTrainedModel``. reward_funcs: one callable
    (or built-in name) or a list, each ``f(prompts, completions, **columns) -> list[float|None]``.
    train_dataset / eval_dataset: indexable collections of rows with a ``prompt`` column.
    """

    def __init__(
        self,
        model: str | PreTrainedModel,
        reward_funcs: RewardFunc | str | Sequence[RewardFunc | str],
        train_dataset: Sequence[dict[str, Any]],
        args: GRPOConfig | None = None,
        eval_dataset: Sequence[dict[str, Any]] | None = None,
        processing_class: PreTrainedTokenizerBase | None = None,
    ) -> None:
        self.args = args = args or GRPOConfig()
        seed_everything(args.seed)
        self.device = resolve_device(args.device)
        self.dtype = resolve_dtype(args.dtype, self.device)
        model, tokenizer = load_model_and_tokenizer(model, processing_class, seed=args.seed)
        self.model: PreTrainedModel = model.to(device=self.device, dtype=self.dtype)
        self.tokenizer = tokenizer
        if args.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
            self.model.config.use_cache = False
        self.model.train()

        if callable(reward_funcs) or isinstance(reward_funcs, str):
            reward_funcs = [reward_funcs]
        self.reward_funcs = [build_reward_func(f, args) for f in reward_funcs]
        self.reward_names = [reward_func_name(f) for f in self.reward_funcs]
        weights = args.reward_weights or [1.0] * len(self.reward_funcs)
        if len(weights) != len(self.reward_funcs):
            raise ValueError(
                f"reward_weights has {len(weights)} entries for {len(self.reward_funcs)} "
                f"reward functions ({self.reward_names})"
            )
        self.scorer = RewardScorer(
            self.reward_funcs, weights, max_failure_fraction=args.reward_max_failure_fraction
        )

        self.train_dataset = train_dataset
        self.eval_dataset = eval_dataset
        self._check_dataset(train_dataset, "train_dataset")
        if eval_dataset is not None:
            self._check_dataset(eval_dataset, "eval_dataset")

        # The frozen reference exists only when the KL term is on (beta > 0).
        self.ref_model: PreTrainedModel | None = None
        if args.beta > 0:
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)

        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=args.learning_rate,
            betas=(args.adam_beta1, args.adam_beta2),
            weight_decay=args.weight_decay,
        )
        total_updates = args.max_steps * args.num_iterations
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, _lr_lambda(args, total_updates)
        )
        self.sampler = PromptSampler(len(train_dataset), args.seed)
        self.curriculum: Curriculum | None = None
        if args.curriculum != "none":
            self.curriculum = Curriculum(
                args.curriculum,
                num_bins=args.gdro_num_bins,
                edges=args.gdro_bin_edges,
                window=args.gdro_window,
                hysteresis=args.gdro_hysteresis,
                mean_budget=args.num_generations,
                n_min=args.rollout_min,
                n_max=args.rollout_max,
                allocator=args.rollout_allocator,
                prompt_signal=args.gdro_signal,
                prompt_kwargs=dict(
                    eta=args.gdro_eta,
                    gamma=args.gdro_gamma,
                    ema_beta=args.gdro_ema_beta,
                    clip=args.gdro_clip,
                    weight_cap=args.gdro_weight_cap,
                    share_normalize=args.gdro_share_normalize,
                ),
                rollout_kwargs=dict(
                    eta=args.gdro_eta,
                    gamma=args.gdro_gamma,
                    dual_lr=args.rollout_dual_lr,
                    score_decay=args.rollout_score_decay,
                ),
            )
        self._uniform_groups = True
        self.generator = torch.Generator(device=self.device).manual_seed(args.seed)
        self.sampling = SamplingParams(
            max_completion_length=args.max_completion_length,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
        )
        self.global_step = 0
        self.log_history: list[dict[str, float]] = []
        self._metrics_started = False
        self.output_dir = Path(args.output_dir)

    # ------------------------------------------------------------------------------------------
    @staticmethod
    def _check_dataset(dataset: Sequence[dict[str, Any]], name: str) -> None:
        if len(dataset) == 0:
            raise ValueError(f"{name} is empty")
        first = dataset[0]
        if not isinstance(first, dict) or "prompt" not in first:
            raise ValueError(f"{name}: rows must be dicts with a 'prompt' column, got {first!r}")

    def _micro_batches(self, n_rows: int) -> list[slice]:
        size = self.args.per_device_train_batch_size
        return [slice(i, min(i + size, n_rows)) for i in range(0, n_rows, size)]

    # ------------------------------------------------------------------------------------------
    def score(
        self, rows: Sequence[dict[str, Any]], rollout: Rollout
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rewards [N] (weighted sum; NaN where every function returned None) and the per-function
        rewards [N, F] (NaN for None). Dataset columns reach the functions by name, as in TRL."""
        return score_rollout(self.scorer, rows, rollout)

    # ------------------------------------------------------------------------------------------
    def _logprobs(
        self, model: PreTrainedModel, rollout: Rollout, rows: slice
    ) -> tuple[torch.Tensor, torch.Tensor]:
        group = self.args.num_generations
        start, stop = rows.start, rows.stop
        # Share the prompt forward across a group when the micro-batch holds whole groups.
        share = (
            self._uniform_groups
            and start % group == 0
            and (stop - start) % group == 0
            and not self.args.gradient_checkpointing
        )
        if share:
            prompts = slice(start // group, stop // group)
            prompt_ids, prompt_mask, group_size = (
                rollout.prompt_ids[prompts],
                rollout.prompt_mask[prompts],
                group,
            )
        else:
            index = rollout.group_ids[rows]
            prompt_ids, prompt_mask, group_size = (
                rollout.prompt_ids[index],
                rollout.prompt_mask[index],
                1,
            )
        return completion_logprobs(
            model,
            prompt_ids,
            prompt_mask,
            rollout.completion_ids[rows],
            rollout.completion_mask[rows],
            temperature=self.args.temperature if self.args.temperature > 0 else 1.0,
            chunk_size=self.args.logprob_chunk_size,
            group_size=group_size,
        )

    def train_step(self) -> dict[str, float]:
        """Generate, score and update once; returns this step's metrics."""
        args = self.args
        t_start = time.perf_counter()
        indices = self.sampler.take(args.prompts_per_step)
        rows = [self.train_dataset[i] for i in indices]
        prompt_ids = tokenize_prompts(
            [r["prompt"] for r in rows], self.tokenizer, args.max_prompt_length
        )
        # Curriculum interface 1: rollouts per prompt (Rollout-GDRO; else G for every prompt).
        bins, counts = (
            self.curriculum.plan(indices)
            if self.curriculum is not None
            else (None, [args.num_generations] * len(rows))
        )
        self._uniform_groups = all(c == args.num_generations for c in counts)
        rollout = generate(
            self.model,
            self.tokenizer,
            prompt_ids,
            args.num_generations if self._uniform_groups else counts,
            self.sampling,
            self.generator,
        )
        t_generated = time.perf_counter()

        rewards, per_func = self.score(rows, rollout)
        group_ids = rollout.group_ids.cpu()
        raw_advantages = group_advantages(rewards, group_ids, scale=args.scale_rewards)
        advantages = raw_advantages
        if self.curriculum is not None:
            # Curriculum interface 2: a per-sample advantage multiplier (Prompt-GDRO, eq. 16).
            weights = self.curriculum.advantage_weights(bins, group_ids.tolist())
            advantages = raw_advantages * torch.as_tensor(weights, dtype=raw_advantages.dtype)
        t_scored = time.perf_counter()

        advantages = advantages.to(self.device)
        mask = rollout.completion_mask.float()
        if args.mask_truncated_completions:
            mask = mask * (~rollout.truncated).float()[:, None]
        micro_batches = self._micro_batches(mask.shape[0])
        old_logps: list[torch.Tensor | None] = [None] * len(micro_batches)
        ref_logps: list[torch.Tensor | None] = [None] * len(micro_batches)
        with torch.no_grad():
            for k, rows_k in enumerate(micro_batches):
                if args.num_iterations > 1:  # mu > 1: the ratio is against the sampling policy
                    old_logps[k] = self._logprobs(self.model, rollout, rows_k)[0]
                if self.ref_model is not None:
                    ref_logps[k] = self._logprobs(self.ref_model, rollout, rows_k)[0]

        last_logps: list[torch.Tensor | None] = [None] * len(micro_batches)
        total_rows = mask.shape[0]
        total_tokens = mask.sum().clamp(min=1)
        sums: dict[str, float] = {}
        entropy_sum = 0.0
        for _ in range(args.num_iterations):
            self.optimizer.zero_grad(set_to_none=True)
            for k, rows_k in enumerate(micro_batches):
                logps, entropy = self._logprobs(self.model, rollout, rows_k)
                last_logps[k] = logps.detach()
                mask_k = mask[rows_k]
                loss, metrics = policy_loss(
                    logps,
                    old_logps[k],
                    ref_logps[k],
                    advantages[rows_k],
                    mask_k,
                    loss_type=args.loss_type,
                    epsilon_low=args.epsilon,
                    epsilon_high=args.epsilon_high
                    if args.epsilon_high is not None
                    else args.epsilon,
                    beta=args.beta,
                    importance_sampling_level=args.importance_sampling_level,
                    max_completion_length=args.max_completion_length,
                )
                # Re-weight micro-batch losses so their sum is the loss of the whole batch:
                # sequence-normalised losses by rows, token-normalised ones by tokens.
                if args.loss_type == "dapo":
                    weight = float(mask_k.sum().clamp(min=1) / total_tokens)
                elif args.loss_type == "bnpo":
                    weight = 1.0 / len(micro_batches)
                else:
                    weight = (rows_k.stop - rows_k.start) / total_rows
                (loss * weight).backward()
                sums["loss"] = sums.get("loss", 0.0) + loss.item() * weight / args.num_iterations
                for key, value in metrics.items():
                    sums[key] = sums.get(key, 0.0) + value * weight / args.num_iterations
                entropy_sum += float((entropy * mask_k).sum())
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), args.max_grad_norm)
            self.optimizer.step()
            self.scheduler.step()
        t_updated = time.perf_counter()
        self.global_step += 1
        curriculum_logs = (
            self._observe_curriculum(
                indices, bins, counts, rollout, per_func, rewards, raw_advantages, mask,
                old_logps, last_logps, micro_batches,
            )
            if self.curriculum is not None
            else {}
        )  # fmt: skip

        lengths = rollout.lengths.float()
        gen_tokens = int(rollout.completion_mask.sum())
        step_time = t_updated - t_start
        logs = {
            "step": self.global_step,
            "reward": float(torch.nanmean(rewards)) if not torch.isnan(rewards).all() else 0.0,
            "reward_std": float(torch.nanmean(group_reward_std(rewards, group_ids))),
            "frac_reward_zero_std": zero_std_groups_fraction(rewards, group_ids),
        }
        errors = self.scorer.error_summary()
        for j, name in enumerate(self.reward_names):
            column = per_func[:, j]
            valid = column[~torch.isnan(column)]
            logs[f"rewards/{name}/mean"] = float(valid.mean()) if valid.numel() else float("nan")
            logs[f"rewards/{name}/std"] = float(valid.std()) if valid.numel() > 1 else 0.0
            logs[f"rewards/{name}/frac_none"] = 1.0 - valid.numel() / max(column.numel(), 1)
            logs[f"rewards/{name}/errors"] = errors[name]
            # Functions that keep their own counters (remote failures, sandbox timeouts, ...).
            stats = getattr(self.reward_funcs[j], "stats", None)
            if dataclasses.is_dataclass(stats) and not isinstance(stats, type):
                stats = dataclasses.asdict(stats)
            if isinstance(stats, dict):
                for key, value in stats.items():
                    if isinstance(value, (int, float)) and not isinstance(value, bool):
                        logs[f"rewards/{name}/{key}"] = float(value)
        logs.update(
            {
                "completions/mean_length": float(lengths.mean()),
                "completions/min_length": float(lengths.min()),
                "completions/max_length": float(lengths.max()),
                "completions/clipped_ratio": float(rollout.truncated.float().mean()),
                "loss": sums.get("loss", 0.0),
                "kl": sums.get("kl", 0.0),
                "clip_ratio/low_mean": sums.get("clip_ratio/low_mean", 0.0),
                "clip_ratio/high_mean": sums.get("clip_ratio/high_mean", 0.0),
                "clip_ratio/region_mean": sums.get("clip_ratio/region_mean", 0.0),
                "entropy": entropy_sum / float(total_tokens) / args.num_iterations,
                "grad_norm": float(grad_norm),
                "learning_rate": self.scheduler.get_last_lr()[0],
                "time/generation": t_generated - t_start,
                "time/scoring": t_scored - t_generated,
                "time/update": t_updated - t_scored,
                "time/step": step_time,
                "tokens_per_second": gen_tokens / step_time,
                "generation_tokens_per_second": gen_tokens / max(t_generated - t_start, 1e-9),
            }
        )
        logs.update(curriculum_logs)
        if args.log_completions:
            self._last_samples = [
                {"prompt": rows[g]["prompt"], "completion": text, "reward": float(r)}
                for g, text, r in zip(
                    group_ids.tolist(), rollout.texts, rewards.tolist(), strict=True
                )
            ]
        return logs

    _CORRECTNESS_REWARDS = (
        "accuracy_reward",
        "code_reward",
        "code_reward_binary",
        "countdown_reward",
        "task_reward",
        "reasoning_gym_reward",
    )

    def _observe_curriculum(
        self, indices, bins, counts, rollout, per_func, rewards, raw_advantages, mask,
        old_logps, last_logps, micro_batches,
    ) -> dict[str, float]:  # fmt: skip
        """Feed the step's outcome to the curriculum: per-response loss signal (eqs. 5-6 with the
        unweighted advantages, computed from the last pass), correctness, and rewards."""
        from .curriculum import per_response_loss

        args = self.args
        losses = []
        for k, rows_k in enumerate(micro_batches):
            current = last_logps[k]
            old = old_logps[k] if old_logps[k] is not None else current
            losses.append(
                per_response_loss(
                    current.cpu().numpy(),
                    old.cpu().numpy(),
                    raw_advantages[rows_k].numpy(),
                    mask[rows_k].cpu().numpy(),
                    args.epsilon,
                    args.epsilon_high if args.epsilon_high is not None else args.epsilon,
                )
            )
        row_loss = np.concatenate(losses)
        column = next(
            (j for j, n in enumerate(self.reward_names) if n in self._CORRECTNESS_REWARDS), None
        )
        scores = per_func[:, column] if column is not None else rewards
        row_correct = torch.nan_to_num(scores, nan=-math.inf) > args.gdro_correct_threshold
        return self.curriculum.observe(
            indices,
            bins,
            counts,
            rollout.group_ids.cpu().tolist(),
            row_correct.tolist(),
            row_loss.tolist(),
            rewards.tolist(),
        )

    # ------------------------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(
        self,
        dataset: Sequence[dict[str, Any]] | None = None,
        batch_size: int = 64,
        greedy: bool = True,
    ) -> dict[str, float]:
        """Mean of every reward function over ``dataset`` (default: eval_dataset), one greedy
        completion per prompt (or one sample at the training temperature)."""
        dataset = dataset if dataset is not None else self.eval_dataset
        if dataset is None:
            raise ValueError("evaluate() needs a dataset: pass one or give eval_dataset")
        params = SamplingParams(
            max_completion_length=self.args.max_completion_length,
            temperature=0.0 if greedy else self.args.temperature,
            top_p=self.args.top_p,
            top_k=self.args.top_k,
        )
        totals = torch.zeros(len(self.reward_funcs))
        counts = torch.zeros(len(self.reward_funcs))
        reward_sum, reward_count = 0.0, 0
        for begin in range(0, len(dataset), batch_size):
            rows = [dataset[i] for i in range(begin, min(begin + batch_size, len(dataset)))]
            ids = tokenize_prompts(
                [r["prompt"] for r in rows], self.tokenizer, self.args.max_prompt_length
            )
            rollout = generate(self.model, self.tokenizer, ids, 1, params, self.generator)
            rewards, per_func = self.score(rows, rollout)
            valid = ~torch.isnan(per_func)
            totals += torch.where(valid, per_func, 0.0).sum(0)
            counts += valid.sum(0)
            reward_sum += float(torch.nansum(rewards))
            reward_count += int((~torch.isnan(rewards)).sum())
        result = {
            "eval/reward": reward_sum / max(reward_count, 1),
            "eval/num_prompts": len(dataset),
        }
        for name, total, count in zip(self.reward_names, totals, counts, strict=True):
            result[f"eval/rewards/{name}/mean"] = float(total / count) if count else float("nan")
        if greedy and self.args.eval_num_generations > 0:
            result.update(self._sampled_eval(dataset))
        return result

    def _sampled_eval(self, dataset: Sequence[dict[str, Any]]) -> dict[str, float]:
        """pass@k / mean@k / format rate from ``eval_num_generations`` samples per prompt, overall
        and per difficulty level (the same metrics as ``groupwise eval``)."""
        from .evaluation import evaluate_model

        args = self.args
        res = evaluate_model(
            self.model,
            self.tokenizer,
            dataset,
            self.reward_funcs,
            n=args.eval_num_generations,
            ks=args.eval_ks,
            temperature=args.temperature if args.temperature > 0 else 1.0,
            top_p=args.top_p,
            top_k=args.top_k,
            max_completion_length=args.max_completion_length,
            max_prompt_length=args.max_prompt_length,
            seed=args.seed,
        )
        metrics: dict[str, float] = {}
        for key, value in res.summary["overall"].items():
            if key != "num_prompts" and isinstance(value, (int, float)):
                metrics[f"eval/{key}"] = float(value)
        for level, block in res.summary["by_difficulty"].items():
            for key, value in block.items():
                if key.startswith(("pass@", "mean@")) or key in ("accuracy", "num_prompts"):
                    metrics[f"eval/difficulty_{level}/{key}"] = float(value)
        self.model.train()
        return metrics

    # ------------------------------------------------------------------------------------------
    def _log(self, logs: dict[str, float]) -> None:
        self.log_history.append(logs)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        path = self.output_dir / "metrics.jsonl"
        if not self._metrics_started:
            # A new trainer is a new run: keep an earlier run's metrics under another name
            # instead of mixing the two or overwriting them.
            if path.exists():
                stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(path.stat().st_mtime))
                os.replace(path, path.with_name(f"metrics-{stamp}.jsonl"))
            self._metrics_started = True
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(logs) + "\n")

    def train(self) -> list[dict[str, float]]:
        """Run ``max_steps`` GRPO steps, logging to ``output_dir/metrics.jsonl``, evaluating every
        ``eval_steps`` and saving every ``save_steps`` and at the end."""
        args = self.args
        self.output_dir.mkdir(parents=True, exist_ok=True)
        args.to_yaml(self.output_dir / "config.yaml")
        if self.eval_dataset is not None and args.eval_on_start:
            self._log({"step": self.global_step, **self.evaluate()})
        bar = tqdm(
            total=args.max_steps,
            initial=self.global_step,
            desc="GRPO",
            disable=args.disable_tqdm,
            dynamic_ncols=True,
        )
        while self.global_step < args.max_steps:
            logs = self.train_step()
            if self.global_step % args.logging_steps == 0 or self.global_step == args.max_steps:
                self._log(logs)
            postfix = {
                "reward": f"{logs['reward']:.3f}",
                "len": f"{logs['completions/mean_length']:.0f}",
                "kl": f"{logs['kl']:.4f}",
                "s/step": f"{logs['time/step']:.1f}",
            }
            for name in self.reward_names:
                postfix[name.removesuffix("_reward")] = f"{logs[f'rewards/{name}/mean']:.2f}"
            bar.set_postfix(postfix, refresh=False)
            bar.update(1)
            if (
                args.eval_steps
                and self.eval_dataset is not None
                and (self.global_step % args.eval_steps == 0)
                and self.global_step < args.max_steps
            ):
                self._log({"step": self.global_step, **self.evaluate()})
            if args.save_steps and self.global_step % args.save_steps == 0:
                self.save_model(self.output_dir / f"checkpoint-{self.global_step}")
        bar.close()
        if self.eval_dataset is not None and (args.eval_on_start or args.eval_steps):
            self._log({"step": self.global_step, **self.evaluate()})
        self.save_model(self.output_dir)
        return self.log_history

    def save_model(self, path: str | Path | None = None) -> Path:
        """Save model and tokenizer in Hugging Face format (``from_pretrained``-loadable).

        Files are written into a temporary folder first and then moved into place one by one
        (``os.replace`` is atomic), so a crash never leaves a truncated weights file."""
        target = Path(path) if path is not None else self.output_dir
        target.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".save-", dir=target))
        try:
            self.model.save_pretrained(tmp)
            self.tokenizer.save_pretrained(tmp)
            for item in tmp.iterdir():
                os.replace(item, target / item.name)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return target
