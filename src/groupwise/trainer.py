"""The GRPO training loop.

One step (DeepSeekMath Alg. 1 with TRL's options):

    prompts  -> generate G completions each                  (rollout.generate)
             -> score with every reward function              (weighted sum, NaN = not applicable)
             -> group-relative advantages                     (core.group_advantages)
             -> old log-probs (mu > 1) and reference log-probs (beta > 0)
             -> mu optimizer passes of the clipped surrogate  (core.policy_loss)
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import io
import json
import math
import os
import random
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from . import checkpoint as ckpt
from .build import build_reward_func
from .checkpoint import TrainingInterrupted, TrainingStopped
from .config import ConfigError, GRPOConfig
from .core import (
    group_advantages,
    group_reward_std,
    policy_loss,
    rollout_correction_weights,
    zero_std_groups_fraction,
)
from .curriculum import Curriculum
from .data import tokenize_prompts
from .distributed import (
    LogprobModule,
    all_gather_objects,
    all_reduce_sum,
    any_rank,
    barrier,
    concat_over_ranks,
    fsdp_full_weights,
    init_distributed,
    max_over_ranks,
    reduce_metrics,
    shard_fsdp,
)
from .loggers import RunLoggers
from .logprobs import completion_logprobs
from .models import load_model_and_tokenizer
from .monitor import TrainingMonitor
from .rewards import RewardFunc, correctness_index, reward_func_name
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

    def _all_rank_rng_states(self) -> list[dict[str, Any]]:
        """Every rank's RNG states (a collective under data parallel). They travel as
        torch.save bytes: all_gather_object cannot carry tensors between CPU processes."""
        buffer = io.BytesIO()
        torch.save(ckpt.rng_state(self._generators()), buffer)
        blobs = all_gather_objects(buffer.getvalue(), self.dist)
        return [torch.load(io.BytesIO(blob), weights_only=True) for blob in blobs]

    def state_dict(self) -> dict[str, Any]:
        return {
            "generator": self.generator.get_state(),
            "order": list(self.order),
            "epoch": self.epoch,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
        self.order = list(state["order"])
        self.epoch = int(state["epoch"])


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


def apply_lora(model: PreTrainedModel, args: GRPOConfig) -> PreTrainedModel:
    """Wrap ``model`` in a peft LoRA adapter; only the adapter's parameters train."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=args.lora_r,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        # "all-linear": every nn.Linear except the output layer (peft's rule).
        target_modules=args.lora_target_modules or "all-linear",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


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
        self.dist = init_distributed(args.device)
        self.device = resolve_device(args.device)
        if self.device.type == "cuda" and self.dist.enabled:
            self.device = torch.device("cuda", self.dist.local_rank)
        # data_parallel only means something under torchrun; a single process ignores it.
        self._fsdp = self.dist.enabled and args.data_parallel == "fsdp"
        if self._fsdp and args.algorithm == "ppo":
            raise ConfigError(
                "algorithm=ppo with data_parallel=fsdp is not supported: the critic is only "
                "replicated with DDP (use data_parallel=ddp)"
            )
        self.dtype = resolve_dtype(args.dtype, self.device)
        model, tokenizer = load_model_and_tokenizer(model, processing_class, seed=args.seed)
        model = model.to(device=self.device, dtype=self.dtype)
        if args.gradient_checkpointing:
            model.gradient_checkpointing_enable()
            model.config.use_cache = False
        if args.use_peft:
            model = apply_lora(model, args)
        self.model: PreTrainedModel = model
        self.tokenizer = tokenizer
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

        # The frozen reference exists only when the KL term is on (beta > 0). With LoRA it is the
        # same weights with the adapter disabled: no second copy.
        self.ref_model: PreTrainedModel | None = None
        if args.beta > 0 and not args.use_peft:
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
            if args.ref_model_offload:
                self.ref_model.to("cpu")

        # DDP wraps the training forward (completion log-probs) so gradients are averaged;
        # constructing it broadcasts rank 0's parameters. FSDP shards the model in place (its
        # parameters become DTensor shards), so the optimizer is built afterwards, on the shards.
        self.ddp_model: DistributedDataParallel | None = None
        self.fsdp_model: Any = None  # the FSDP root: LogprobModule(self.model)
        self._full_weights_depth = 0
        if self._fsdp:
            self.fsdp_model = shard_fsdp(self.model, self.dist, self.device)
        elif self.dist.enabled:
            self.ddp_model = DistributedDataParallel(
                LogprobModule(self.model),
                device_ids=[self.device.index] if self.device.type == "cuda" else None,
            )

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
        # Each rank samples its own completions (the model and prompt order are shared).
        self.generator = torch.Generator(device=self.device).manual_seed(args.seed + self.dist.rank)
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
        self._last_samples: list[dict[str, Any]] = []
        self._stop_signal: int | None = None
        correct = correctness_index(self.reward_funcs)  # the reward that says "solved"
        self.monitor = TrainingMonitor(  # failure-mode warnings, checkpointed
            args, correctness_reward=self.reward_names[correct] if correct is not None else None
        )
        self.loggers: RunLoggers | None = None  # TensorBoard / wandb, opened by train()

    # ------------------------------------------------------------------------------------------
    @staticmethod
    def _check_dataset(dataset: Sequence[dict[str, Any]], name: str) -> None:
        if len(dataset) == 0:
            raise ValueError(f"{name} is empty")
        first = dataset[0]
        if not isinstance(first, dict) or "prompt" not in first:
            raise ValueError(f"{name}: rows must be dicts with a 'prompt' column, got {first!r}")

    def _micro_batches(self, rollout: Rollout) -> list[torch.Tensor]:
        lengths = rollout.completion_mask.sum(dim=1).cpu()
        return micro_batch_rows(
            lengths,
            self.args.per_device_train_batch_size,
            self.args.num_generations if self._uniform_groups else None,
            by_length=self.args.group_by_length,
        )

    def _take_prompts(self) -> tuple[list[int], slice]:
        """The step's global batch of prompt indices and this rank's share of it: every rank
        draws the global batch in the same order and keeps its own consecutive prompts."""
        share = self.args.prompts_per_step
        indices = self.sampler.take(share * self.dist.world_size)
        return indices, slice(self.dist.rank * share, (self.dist.rank + 1) * share)

    def _padding_micro_batches(self, micro_batches: list[Any]) -> list[Any]:
        """Extra micro-batches (repeats of the last) that this rank runs with weight 0.

        FSDP2 gathers weights in every training forward and backward, which are collectives,
        so every rank must run the same number of them; ranks can hold different numbers of
        rows (Rollout-GDRO's rollouts per prompt). DDP needs none: only the last micro-batch's
        backward synchronises (the others run under no_sync), and its one buffer broadcast per
        step happens in the first forward whatever the count."""
        if self.fsdp_model is None:
            return []
        most = max_over_ranks(len(micro_batches), self.dist)
        return [micro_batches[-1]] * (most - len(micro_batches))

    def _zero_weight_pass(self, rollout: Rollout, rows: Any) -> None:
        """A training forward and backward that adds nothing to the gradients (see
        :meth:`_padding_micro_batches`)."""
        with self._autocast():
            logps, _ = self._logprobs(self.model, rollout, rows)
        (logps.sum() * 0.0).backward()

    # ------------------------------------------------------------------------------------------
    def score(
        self, rows: Sequence[dict[str, Any]], rollout: Rollout
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rewards [N] (weighted sum; NaN where every function returned None) and the per-function
        rewards [N, F] (NaN for None). Dataset columns reach the functions by name, as in TRL."""
        return score_rollout(self.scorer, rows, rollout)

    @contextlib.contextmanager
    def _full_weights(self) -> Any:
        """Under FSDP, the policy's full weights for no-grad calls of the Hugging Face model
        (generation, evaluation, old log-probs); a no-op otherwise. Re-entrant."""
        if self.fsdp_model is None or self._full_weights_depth > 0:
            self._full_weights_depth += 1
            try:
                yield
            finally:
                self._full_weights_depth -= 1
            return
        self._full_weights_depth += 1
        try:
            with fsdp_full_weights(self.fsdp_model):
                yield
        finally:
            self._full_weights_depth -= 1

    # ------------------------------------------------------------------------------------------
    def _logprobs(
        self, model: PreTrainedModel, rollout: Rollout, rows: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs and entropies [n, T] of the completions ``rows`` (row indices into the
        rollout). The forward runs on the rows' own longest completion (padding trimmed per
        micro-batch); the results are padded back to the rollout's width T with zeros."""
        group = self.args.num_generations
        completion_ids, completion_mask, width = trimmed_completions(rollout, rows)
        # Share the prompt forward across the rows of a prompt: whole groups, or a micro-batch
        # that holds part of one group (micro_batch_rows lays them out so).
        blocks = prompt_blocks(rollout.group_ids[rows].cpu(), group)
        share = blocks is not None and not self.args.gradient_checkpointing
        policy_grad = model is self.model and torch.is_grad_enabled()
        if policy_grad and self.fsdp_model is not None:
            # FSDP2 all-gathers each layer in every decoder call, and the shared path makes two
            # (prompt, then completions; one when width is 1): every rank must take the same
            # path for this micro-batch (ranks run equally many, see _padding_micro_batches).
            share = not any_rank(not (share and width > 1), self.dist)
        if share:
            prompts, group_size = blocks
            prompt_ids, prompt_mask = rollout.prompt_ids[prompts], rollout.prompt_mask[prompts]
        else:
            index = rollout.group_ids[rows]
            prompt_ids, prompt_mask, group_size = (
                rollout.prompt_ids[index],
                rollout.prompt_mask[index],
                1,
            )
        # The policy's forward with gradients goes through the DDP / FSDP wrapper when data
        # parallel; without gradients, FSDP gathers the full weights around the plain call.
        wrapper = self.ddp_model or self.fsdp_model
        forward = (
            wrapper
            if policy_grad and wrapper is not None
            else functools.partial(completion_logprobs, model)
        )
        gather = (
            self._full_weights()
            if model is self.model and not policy_grad
            else contextlib.nullcontext()
        )
        with gather:
            logps, entropy = forward(
                prompt_ids,
                prompt_mask,
                completion_ids,
                completion_mask,
                temperature=self.args.temperature if self.args.temperature > 0 else 1.0,
                chunk_size=self.args.logprob_chunk_size,
                group_size=group_size,
                impl=self.args.logprob_impl,
            )
        pad = (0, rollout.completion_ids.shape[1] - width)
        return torch.nn.functional.pad(logps, pad), torch.nn.functional.pad(entropy, pad)

    def _global_batch_advantages(
        self, rewards: torch.Tensor, group_ids: torch.Tensor
    ) -> torch.Tensor:
        """scale_rewards=batch under data parallel: the std is over every rank's rewards."""
        gathered = all_gather_objects((rewards.tolist(), group_ids.tolist()), self.dist)
        all_rewards, all_ids, start = [], [], 0
        offset = 0
        for rank, (r, g) in enumerate(gathered):
            if rank == self.dist.rank:
                start = len(all_rewards)
            all_rewards += r
            all_ids += [offset + i for i in g]
            offset += max(g, default=-1) + 1
        advantages = group_advantages(
            torch.tensor(all_rewards, dtype=rewards.dtype), torch.tensor(all_ids), scale="batch"
        )
        return advantages[start : start + len(rewards)]

    def _reference_logprobs(self, rollout: Rollout, rows: slice) -> torch.Tensor:
        """Log-probs under the frozen reference: the adapter-disabled model with LoRA, else the
        reference copy (moved to the device for the call when it is offloaded to CPU)."""
        if self.args.use_peft:
            with self.model.disable_adapter():
                return self._logprobs(self.model, rollout, rows)[0]
        assert self.ref_model is not None
        offloaded = self.args.ref_model_offload and self.device.type != "cpu"
        if offloaded:
            self.ref_model.to(self.device)
        try:
            return self._logprobs(self.ref_model, rollout, rows)[0]
        finally:
            if offloaded:
                self.ref_model.to("cpu")

    def _autocast(self) -> contextlib.AbstractContextManager:
        if not self.args.bf16_autocast:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)

    @property
    def _generation_differs(self) -> bool:
        """True when generation runs other numerics than the update (bf16 autocast for
        generation only, weights not already bf16): the sampler's log-probs are then recorded
        and compared with the trainer's (rollout correction)."""
        return (
            self.args.generation_dtype == "bfloat16"
            and not self.args.bf16_autocast
            and self.dtype != torch.bfloat16
        )

    def _generation_autocast(self) -> contextlib.AbstractContextManager:
        if self._generation_differs:
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return self._autocast()

    def train_step(self) -> dict[str, float]:
        """Generate, score and update once; returns this step's metrics."""
        args = self.args
        t_start = time.perf_counter()
        global_indices, mine = self._take_prompts()
        indices = global_indices[mine]
        rows = [self.train_dataset[i] for i in indices]
        prompt_ids = tokenize_prompts(
            [r["prompt"] for r in rows], self.tokenizer, args.max_prompt_length
        )
        # Curriculum interface 1: rollouts per prompt (Rollout-GDRO; else G for every prompt).
        # Every rank plans the global batch from the same state (so its classifier state stays
        # identical, and Rollout-GDRO's exact budget is the global one) and keeps its share.
        global_bins: list[int] | None = None
        global_counts = [args.num_generations] * len(global_indices)
        if self.curriculum is not None:
            global_bins, global_counts = self.curriculum.plan(global_indices)
        counts = global_counts[mine]
        self._uniform_groups = all(c == args.num_generations for c in counts)
        with self._generation_autocast(), self._full_weights():
            rollout = generate(
                self.model,
                self.tokenizer,
                prompt_ids,
                args.num_generations if self._uniform_groups else counts,
                self.sampling,
                self.generator,
                return_logprobs=self._generation_differs,
            )
        t_generated = time.perf_counter()

        rewards, per_func = self.score(rows, rollout)
        group_ids = rollout.group_ids.cpu()
        if self.dist.enabled and args.scale_rewards == "batch":
            raw_advantages = self._global_batch_advantages(rewards, group_ids)
        else:  # groups never straddle ranks, so group statistics are local
            raw_advantages = group_advantages(rewards, group_ids, scale=args.scale_rewards)
        advantages = raw_advantages
        if self.curriculum is not None:
            # Curriculum interface 2: a per-sample advantage multiplier (Prompt-GDRO, eq. 16).
            # Eq. 16 normalises over the global batch (group ids are this rank's prompts).
            weights = self.curriculum.prompt_weights(global_bins, global_counts)[mine]
            advantages = (
                raw_advantages * torch.as_tensor(weights, dtype=raw_advantages.dtype)[group_ids]
            )
        t_scored = time.perf_counter()

        advantages = advantages.to(self.device)
        mask = rollout.completion_mask.float()
        if args.mask_truncated_completions:
            mask = mask * (~rollout.truncated).float()[:, None]
        micro_batches = self._micro_batches(rollout)
        padding = self._padding_micro_batches(micro_batches)
        old_logps: list[torch.Tensor | None] = [None] * len(micro_batches)
        ref_logps: list[torch.Tensor | None] = [None] * len(micro_batches)
        # FSDP: the full weights are gathered once for the loop, so the no-grad forwards hold
        # no collective (ranks may run different numbers of them).
        with torch.no_grad(), self._autocast(), self._full_weights():
            for k, rows_k in enumerate(micro_batches):
                if args.num_iterations > 1:  # mu > 1: the ratio is against the sampling policy
                    old_logps[k] = self._logprobs(self.model, rollout, rows_k)[0]
                if args.beta > 0:
                    ref_logps[k] = self._reference_logprobs(rollout, rows_k)

        last_logps: list[torch.Tensor | None] = [None] * len(micro_batches)
        # Rollout correction weights per micro-batch, from the first pass's log-probs (equal to
        # the old log-probs: the weights have no gradient).
        correction: list[torch.Tensor | None] = [None] * len(micro_batches)
        mismatch_stats: list[tuple[torch.Tensor, torch.Tensor]] = []
        # Losses are normalised over the global batch (all ranks): rows (their number differs
        # between ranks under Rollout-GDRO), active tokens for dapo, micro-batches for bnpo.
        # The gradient average over ranks then divides by world size, which the weights undo.
        world = self.dist.world_size
        total_rows = int(all_reduce_sum(torch.tensor(mask.shape[0]), self.dist))
        total_tokens = all_reduce_sum(mask.sum(), self.dist).clamp(min=1)
        total_micro_batches = int(all_reduce_sum(torch.tensor(len(micro_batches)), self.dist))
        sums: dict[str, float] = {}
        entropy_sum = 0.0
        nonfinite = False
        grad_norm = torch.tensor(0.0)
        for iteration in range(args.num_iterations):
            self.optimizer.zero_grad(set_to_none=True)
            for k, rows_k in enumerate(micro_batches + padding):
                # DDP all-reduces (FSDP reduce-scatters) gradients on the last micro-batch only.
                sync = k == len(micro_batches) + len(padding) - 1
                if self.fsdp_model is not None:
                    self.fsdp_model.set_requires_gradient_sync(sync)
                if k >= len(micro_batches):
                    self._zero_weight_pass(rollout, rows_k)
                    continue

                def no_sync(sync: bool = sync) -> contextlib.AbstractContextManager:
                    if self.ddp_model is None or sync:
                        return contextlib.nullcontext()
                    return self.ddp_model.no_sync()

                with no_sync(), self._autocast():
                    logps, entropy = self._logprobs(self.model, rollout, rows_k)
                last_logps[k] = logps.detach()
                mask_k = mask[rows_k]
                if rollout.sampling_logprobs is not None and iteration == 0:
                    correction[k], stats = self._rollout_correction(
                        old_logps[k] if old_logps[k] is not None else last_logps[k],
                        rollout.sampling_logprobs[rows_k].to(self.device),
                        mask_k,
                    )
                    mismatch_stats.append(stats)
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
                    rollout_weights=correction[k],
                )
                # Re-weight micro-batch losses so their sum is the loss of the whole batch:
                # sequence-normalised losses by rows, token-normalised ones by tokens.
                if args.loss_type == "dapo":
                    weight = float(mask_k.sum() / total_tokens) * world
                elif args.loss_type == "bnpo":
                    weight = world / total_micro_batches
                else:
                    weight = len(rows_k) / total_rows * world
                # A non-finite loss still goes through backward: its NaN gradients make every
                # rank skip the update together (no rank may leave the all-reduce).
                nonfinite |= not bool(torch.isfinite(loss))
                with no_sync():
                    (loss * weight).backward()
                sums["loss"] = sums.get("loss", 0.0) + loss.item() * weight / args.num_iterations
                for key, value in metrics.items():
                    sums[key] = sums.get(key, 0.0) + value * weight / args.num_iterations
                entropy_sum += float((entropy * mask_k).sum())
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), args.max_grad_norm)
            if hasattr(grad_norm, "full_tensor"):  # FSDP: a DTensor (a partial norm per rank)
                grad_norm = grad_norm.full_tensor()
            nonfinite = any_rank(nonfinite or not bool(torch.isfinite(grad_norm)), self.dist)
            if nonfinite:
                # A NaN/inf loss or gradient: skip the update so the weights stay good; the
                # trainer logs the event and stops after max_bad_steps in a row.
                self.optimizer.zero_grad(set_to_none=True)
                break
            self.optimizer.step()
            self.scheduler.step()
        t_updated = time.perf_counter()
        self.global_step += 1
        curriculum_logs = (
            self._observe_curriculum(
                global_indices, global_bins, global_counts, mine.start, rollout, per_func,
                rewards, raw_advantages, mask, old_logps, last_logps, micro_batches,
            )
            if self.curriculum is not None and not nonfinite
            else {}
        )  # fmt: skip

        logs = {
            "step": self.global_step,
            "reward": float(torch.nanmean(rewards)) if not torch.isnan(rewards).all() else 0.0,
            "reward_std": float(torch.nanmean(group_reward_std(rewards, group_ids))),
            "frac_reward_zero_std": zero_std_groups_fraction(rewards, group_ids),
        }
        logs.update(self._reward_function_logs(per_func))
        # Entropy per token: total_tokens counts every rank's tokens and reduce_metrics averages
        # the ranks' shares, hence the world size.
        logs.update(
            self._update_logs(
                rollout, sums, entropy_sum * world / float(total_tokens) / args.num_iterations,
                grad_norm, (t_start, t_generated, t_scored, t_updated),
            )
        )  # fmt: skip
        logs.update(curriculum_logs)
        if mismatch_stats:
            logs.update(rollout_mismatch_logs(mismatch_stats))
        logs = reduce_metrics(logs, self.dist)
        if nonfinite:
            logs["nonfinite_step"] = 1.0
        self._keep_batch(rows, rollout, rewards, per_func, advantages.cpu(), group_ids)
        return logs

    def _rollout_correction(
        self, old_logps: torch.Tensor, sampling_logps: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor | None, tuple[torch.Tensor, torch.Tensor]]:
        """The rollout-correction weights of one micro-batch (None when switched off) and what
        the step logs: |old - sampling| over its tokens and the weights."""
        args = self.args
        weights = rollout_correction_weights(
            old_logps,
            sampling_logps,
            mask,
            mode=args.rollout_correction_mode,
            clip_min=args.rollout_correction_clip_min,
            clip_max=args.rollout_correction_clip_max,
        )
        keep = mask.bool()
        diff = (old_logps - sampling_logps).abs()[keep]
        selected = weights.flatten() if weights.shape[1] == 1 else weights[keep]
        return (weights if args.rollout_correction else None), (diff, selected)

    def _update_logs(
        self,
        rollout: Rollout,
        sums: dict[str, float],
        entropy: float,
        grad_norm: torch.Tensor,
        times: tuple[float, float, float, float],
    ) -> dict[str, float]:
        """Completion lengths, loss terms, optimisation and timing metrics of a step (shared by
        GRPO and PPO). times: start, generated, scored, updated (perf_counter seconds)."""
        t_start, t_generated, t_scored, t_updated = times
        lengths = rollout.lengths.float()
        gen_tokens = int(rollout.completion_mask.sum())
        step_time = t_updated - t_start
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
            "grad_norm": float(grad_norm),
            "learning_rate": self.scheduler.get_last_lr()[0],
            "time/generation": t_generated - t_start,
            "time/scoring": t_scored - t_generated,
            "time/update": t_updated - t_scored,
            "time/step": step_time,
            "tokens_per_second": gen_tokens / step_time,
            "generation_tokens_per_second": gen_tokens / max(t_generated - t_start, 1e-9),
        }

    def _keep_batch(self, rows, rollout, rewards, per_func, advantages, group_ids) -> None:
        """The last step's batch, for completions.jsonl (one advantage per completion)."""
        self._last_batch = (rows, rollout.texts, rewards, per_func, advantages, group_ids)
        if self.args.log_completions:
            self._last_samples = [
                {"prompt": rows[g]["prompt"], "completion": text, "reward": float(r)}
                for g, text, r in zip(
                    group_ids.tolist(), rollout.texts, rewards.tolist(), strict=True
                )
            ]

    def _reward_function_logs(self, per_func: torch.Tensor) -> dict[str, float]:
        """Per reward function: mean, std, fraction None, errors and the function's own counters
        (remote failures, sandbox timeouts, ...)."""
        logs: dict[str, float] = {}
        errors = self.scorer.error_summary()
        for j, name in enumerate(self.reward_names):
            column = per_func[:, j]
            valid = column[~torch.isnan(column)]
            logs[f"rewards/{name}/mean"] = float(valid.mean()) if valid.numel() else float("nan")
            logs[f"rewards/{name}/std"] = float(valid.std()) if valid.numel() > 1 else 0.0
            logs[f"rewards/{name}/frac_none"] = 1.0 - valid.numel() / max(column.numel(), 1)
            logs[f"rewards/{name}/errors"] = errors[name]
            stats = getattr(self.reward_funcs[j], "stats", None)
            if dataclasses.is_dataclass(stats) and not isinstance(stats, type):
                stats = dataclasses.asdict(stats)
            if isinstance(stats, dict):
                for key, value in stats.items():
                    if isinstance(value, (int, float)) and not isinstance(value, bool):
                        logs[f"rewards/{name}/{key}"] = float(value)
        return logs

    def _observe_curriculum(
        self, indices, bins, counts, first_prompt, rollout, per_func, rewards, raw_advantages,
        mask, old_logps, last_logps, micro_batches,
    ) -> dict[str, float]:  # fmt: skip
        """Feed the step's outcome to the curriculum: per-response loss signal (eqs. 5-6 with the
        unweighted advantages, computed from the last pass), correctness, and rewards.

        ``indices``, ``bins``, ``counts``: the global batch's prompts; this rank's rollout holds
        the prompts from ``first_prompt`` on. Under data parallel every rank gathers all ranks'
        rows and observes the same global batch in the same order, so the curriculum state
        stays identical on every rank (and equal to one process's on that batch)."""
        from .curriculum import per_response_loss

        args = self.args
        row_loss = np.zeros(mask.shape[0])
        for k, rows_k in enumerate(micro_batches):
            current = last_logps[k]
            old = old_logps[k] if old_logps[k] is not None else current
            row_loss[rows_k.numpy()] = per_response_loss(
                current.cpu().numpy(),
                old.cpu().numpy(),
                raw_advantages[rows_k].numpy(),
                mask[rows_k].cpu().numpy(),
                args.epsilon,
                args.epsilon_high if args.epsilon_high is not None else args.epsilon,
            )
        column = correctness_index(self.reward_funcs)
        scores = per_func[:, column] if column is not None else rewards
        row_correct = torch.nan_to_num(scores, nan=-math.inf) > args.gdro_correct_threshold
        row_prompt = (rollout.group_ids.cpu() + first_prompt).tolist()
        columns = (row_prompt, row_correct.tolist(), row_loss.tolist(), rewards.tolist())
        row_prompt, row_correct, row_loss, row_reward = concat_over_ranks(columns, self.dist)
        return self.curriculum.observe(
            indices, bins, counts, row_prompt, row_correct, row_loss, row_reward
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
        with self._full_weights():  # FSDP: generation calls the unwrapped model
            return self._evaluate(dataset, batch_size, greedy)

    def _evaluate(
        self, dataset: Sequence[dict[str, Any]] | None, batch_size: int, greedy: bool
    ) -> dict[str, float]:
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
        if not self.dist.is_main:  # under data parallel only rank 0 writes
            return
        self.output_dir.mkdir(parents=True, exist_ok=True)
        path = self.output_dir / "metrics.jsonl"
        if not self._metrics_started:
            # A new trainer is a new run: keep an earlier run's metrics under another name
            # instead of mixing the two or overwriting them.
            if path.exists():
                stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(path.stat().st_mtime))
                os.replace(path, path.with_name(f"metrics-{stamp}.jsonl"))
            for name in ("events.jsonl", "completions.jsonl"):
                if (self.output_dir / name).exists():
                    (self.output_dir / name).unlink()
            self._metrics_started = True
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(logs) + "\n")
        if self.loggers is not None:
            self.loggers.log(logs, step=int(logs.get("step", self.global_step)))

    def _append_jsonl(self, name: str, record: dict[str, Any]) -> None:
        if not self.dist.is_main:
            return
        self.output_dir.mkdir(parents=True, exist_ok=True)
        with open(self.output_dir / name, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")

    def _warn(self, step: int, kind: str, message: str) -> None:
        """A warning or note: console, events.jsonl (read by ``groupwise report``), loggers."""
        if not self.dist.is_main:
            return
        tqdm.write(
            f"[groupwise] {'note' if kind == 'info' else 'warning'} (step {step}): {message}"
        )
        self._append_jsonl("events.jsonl", {"step": step, "kind": kind, "message": message})
        if self.loggers is not None:
            self.loggers.log_warning(step, kind, message)

    def completion_records(self, num_prompts: int | None = None) -> list[dict[str, Any]]:
        """The last step's first ``num_prompts`` prompts with all their completions, each with
        its reward, reward components and advantage, and the ground truth."""
        if not getattr(self, "_last_batch", None):
            return []
        rows, texts, rewards, per_func, advantages, group_ids = self._last_batch
        records: dict[int, dict[str, Any]] = {}
        limit = len(rows) if num_prompts is None else num_prompts
        for i, g in enumerate(group_ids.tolist()):
            if g >= limit:
                continue
            if g not in records:
                row = rows[g]
                answer = row.get(self.args.answer_column, row.get("answer"))
                records[g] = {
                    "step": self.global_step,
                    "prompt": row["prompt"],
                    "answer": answer if isinstance(answer, (str, int, float, list, dict)) else None,
                    "completions": [],
                }
            records[g]["completions"].append(
                {
                    "text": texts[i],
                    "reward": _finite_or_none(rewards[i]),
                    "rewards": {
                        name: _finite_or_none(per_func[i, j])
                        for j, name in enumerate(self.reward_names)
                    },
                    "advantage": float(advantages[i]),
                }
            )
        return [records[g] for g in sorted(records)]

    def _log_completions(self) -> None:
        if not self.dist.is_main:
            return
        records = self.completion_records(self.args.completions_sample_size)
        for record in records:
            self._append_jsonl("completions.jsonl", record)
        if self.args.num_completions_to_print:
            print_completions(records[: self.args.num_completions_to_print])

    # ------------------------------------------------------------------------------------------
    def extra_state_dict(self) -> dict[str, Any]:
        """State of subclasses (e.g. the PPO critic) to keep in checkpoints."""
        return {}

    def load_extra_state_dict(self, state: dict[str, Any]) -> None:
        return None

    def _generators(self) -> dict[str, torch.Generator]:
        return {"sampling": self.generator}

    def _all_rank_rng_states(self) -> list[dict[str, Any]]:
        """Every rank's RNG states (a collective under data parallel). They travel as
        torch.save bytes: all_gather_object cannot carry tensors between CPU processes."""
        buffer = io.BytesIO()
        torch.save(ckpt.rng_state(self._generators()), buffer)
        blobs = all_gather_objects(buffer.getvalue(), self.dist)
        return [torch.load(io.BytesIO(blob), weights_only=True) for blob in blobs]

    def state_dict(self) -> dict[str, Any]:
        """Everything but the model weights that a step depends on or that was logged."""
        stats = {}
        for name, func in zip(self.reward_names, self.reward_funcs, strict=True):
            value = getattr(func, "stats", None)
            if dataclasses.is_dataclass(value) and not isinstance(value, type):
                stats[name] = dataclasses.asdict(value)
            elif isinstance(value, dict):
                stats[name] = dict(value)
        return {
            "format": 1,
            "global_step": self.global_step,
            "config": self.args.to_dict(),
            "optimizer": self._optimizer_state_dict(),
            "scheduler": self.scheduler.state_dict(),
            # One entry per rank: each samples with its own generator.
            "rng": self._all_rank_rng_states(),
            "sampler": self.sampler.state_dict(),
            "curriculum": ckpt.plain(self.curriculum.state_dict())
            if self.curriculum is not None
            else None,
            "monitor": ckpt.plain(self.monitor.state_dict()),
            "reward_errors": {k: dict(v) for k, v in self.scorer.error_counts.items()},
            "reward_stats": ckpt.plain(stats),
            "log_history": ckpt.plain(self.log_history),
            "extra": self.extra_state_dict(),
        }

    def _optimizer_state_dict(self) -> dict[str, Any]:
        """The optimizer state; under FSDP the full (unsharded) state keyed by parameter name,
        gathered to rank 0 (a collective; other ranks get an empty dict)."""
        if self.fsdp_model is None:
            return self.optimizer.state_dict()
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_optimizer_state_dict(self.model, self.optimizer, options=options)

    def _full_model_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Under FSDP the full model weights on rank 0, in CPU memory (a collective: every rank
        calls it; the others get an empty dict); None without FSDP (save_pretrained reads the
        model itself)."""
        if self.fsdp_model is None:
            return None
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        weights = get_model_state_dict(self.model, options=options)
        # Tied weights (the LM head) come back as separate copies; save_pretrained would keep
        # both. Drop the duplicates, as a plain save_pretrained does.
        for name, _ in _tied_parameter_names(self.model):
            weights.pop(name, None)
        return weights

    def _save_pretrained(self, folder: Path, weights: dict[str, torch.Tensor] | None) -> None:
        if weights is None:
            self.model.save_pretrained(folder)
        else:
            self.model.save_pretrained(folder, state_dict=weights)

    def save_checkpoint(self) -> Path:
        """Write ``checkpoint-<step>`` atomically and apply ``save_total_limit``."""

        state = self.state_dict()  # a collective under data parallel: every rank calls it
        weights = self._full_model_state_dict()  # FSDP: a collective too

        def write(folder: Path) -> None:
            self._save_pretrained(folder, weights)
            self.tokenizer.save_pretrained(folder)
            torch.save(state, folder / ckpt.STATE_FILE)

        path = self.output_dir / f"{ckpt.PREFIX}{self.global_step}"
        if self.dist.is_main:
            path = ckpt.write_checkpoint(self.output_dir, self.global_step, write)
            ckpt.rotate_checkpoints(self.output_dir, self.args.save_total_limit)
        barrier(self.dist)
        return path

    def _load_weights(self, path: Path) -> None:
        from safetensors.torch import load_file

        if self.args.use_peft:
            from peft import set_peft_model_state_dict

            file = path / "adapter_model.safetensors"
            if not file.is_file():
                raise ckpt.CheckpointError(f"checkpoint {path}: {file.name} is missing")
            result = set_peft_model_state_dict(self.model, load_file(file))
            if getattr(result, "unexpected_keys", None):
                raise ckpt.CheckpointError(
                    f"checkpoint {path}: adapter does not match this model "
                    f"({result.unexpected_keys[:3]} ...)"
                )
            return
        files = sorted(path.glob("model*.safetensors"))
        if not files:
            raise ckpt.CheckpointError(f"checkpoint {path}: no model*.safetensors weights")
        weights: dict[str, torch.Tensor] = {}
        for file in files:
            weights.update(load_file(file))
        if self.fsdp_model is not None:
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                set_model_state_dict,
            )

            # Every rank read the full weights; each keeps its own shards.
            options = StateDictOptions(full_state_dict=True, strict=False)
            missing, unexpected = set_model_state_dict(self.model, weights, options=options)
        else:
            missing, unexpected = self.model.load_state_dict(weights, strict=False)
        tied = {name for name, _ in _tied_parameter_names(self.model)}
        missing = [m for m in missing if m not in tied]
        if missing or unexpected:
            raise ckpt.CheckpointError(
                f"checkpoint {path}: weights do not match the model (missing {missing[:3]}, "
                f"unexpected {unexpected[:3]})"
            )

    def _load_optimizer_state_dict(self, state: dict[str, Any]) -> None:
        if self.fsdp_model is None:
            self.optimizer.load_state_dict(state)
            return
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        # Every rank read the full state (keyed by parameter name); each keeps its own shards.
        options = StateDictOptions(full_state_dict=True)
        set_optimizer_state_dict(self.model, self.optimizer, state, options=options)

    def load_checkpoint(self, path: str | Path) -> None:
        """Restore the state saved by :meth:`save_checkpoint`, refusing a checkpoint whose config
        differs in options that change training, and cut the run's log files back to it."""
        path = Path(path)
        ckpt.verify_checkpoint(path)
        state = torch.load(path / ckpt.STATE_FILE, map_location="cpu", weights_only=True)
        ckpt.check_resume_config(state["config"], self.args.to_dict(), path)
        self._load_weights(path)
        self._load_optimizer_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.sampler.load_state_dict(state["sampler"])
        if self.curriculum is not None and state.get("curriculum") is not None:
            self.curriculum.load_state_dict(state["curriculum"])
        if state.get("monitor") is not None:
            self.monitor.load_state_dict(state["monitor"])
        for name, counts in state.get("reward_errors", {}).items():
            self.scorer.error_counts[name] = type(self.scorer.error_counts[name])(counts)
        for name, func in zip(self.reward_names, self.reward_funcs, strict=True):
            saved = state.get("reward_stats", {}).get(name)
            current = getattr(func, "stats", None)
            if saved is None or current is None:
                continue
            if isinstance(current, dict):
                current.update(saved)
            else:
                for key, value in saved.items():
                    setattr(current, key, value)
        self.load_extra_state_dict(state.get("extra", {}))
        rng = state["rng"]
        if len(rng) != self.dist.world_size:
            raise ckpt.CheckpointError(
                f"checkpoint {path} was written by {len(rng)} process(es); resume it with the "
                f"same number (this run has {self.dist.world_size})"
            )
        ckpt.set_rng_state(rng[self.dist.rank], self._generators())
        self.global_step = int(state["global_step"])
        self.log_history = list(state["log_history"])
        # Rows that the interrupted run logged after this checkpoint would be logged again.
        if self.dist.is_main:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            _write_jsonl_atomic(self.output_dir / "metrics.jsonl", self.log_history)
            for name in ("events.jsonl", "completions.jsonl"):
                _truncate_jsonl(self.output_dir / name, self.global_step)
        barrier(self.dist)
        self._metrics_started = True
        tqdm.write(f"[groupwise] resumed from {path} at step {self.global_step}")

    # ------------------------------------------------------------------------------------------
    def _install_signal_handlers(self) -> dict[int, Any]:
        """SIGINT/SIGTERM finish the current step, save a checkpoint and stop (a second SIGINT
        aborts at once)."""
        if threading.current_thread() is not threading.main_thread():
            return {}

        def handler(signum: int, frame: Any) -> None:
            if self._stop_signal is not None and signum == signal.SIGINT:
                raise KeyboardInterrupt
            self._stop_signal = signum
            tqdm.write(
                f"[groupwise] {signal.Signals(signum).name}: saving a checkpoint after this "
                "step (Ctrl-C again to abort without saving)"
            )

        previous = {}
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, handler)
        return previous

    def _resume_if_asked(self) -> None:
        value = self.args.resume_from_checkpoint
        if not value:
            return
        path = ckpt.resolve_resume_path(value, self.output_dir)
        if path is None:
            tqdm.write(f"[groupwise] no checkpoint in {self.output_dir}: starting from step 0")
            return
        self.load_checkpoint(path)

    def train(self) -> list[dict[str, float]]:
        """Run ``max_steps`` GRPO steps (continuing from a checkpoint when
        ``resume_from_checkpoint`` is set), logging to ``output_dir/metrics.jsonl``, evaluating
        every ``eval_steps`` and saving every ``save_steps``, on SIGINT/SIGTERM, and at the end."""
        args = self.args
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self._resume_if_asked()
        if self.dist.is_main:
            args.to_yaml(self.output_dir / "config.yaml")
            self.scorer.write_manifest(self.output_dir / "rewards.json")  # names, weights, flags
        if self.loggers is None and args.report_to and self.dist.is_main:
            self.loggers = RunLoggers(
                self.output_dir,
                args.report_to,
                config=args.to_dict(),
                run_name=self.output_dir.name,
                resume=self.global_step > 0,
                resume_step=self.global_step,
            )
        previous_handlers = self._install_signal_handlers()
        try:
            self._train_loop()
        finally:
            for signum, handler in previous_handlers.items():
                signal.signal(signum, handler)
            if self.loggers is not None:
                self.loggers.close()
                self.loggers = None
        if args.use_peft and args.save_merged_model and self.dist.is_main:
            merged = copy.deepcopy(self.model).merge_and_unload()
            merged.save_pretrained(self.output_dir / "merged")
            self.tokenizer.save_pretrained(self.output_dir / "merged")
        return self.log_history

    def _train_loop(self) -> None:
        args = self.args
        if self.eval_dataset is not None and args.eval_on_start and self.global_step == 0:
            self._log({"step": self.global_step, **self.evaluate()})
        bar = tqdm(
            total=args.max_steps,
            initial=self.global_step,
            desc=args.algorithm.upper(),
            disable=args.disable_tqdm or not self.dist.is_main,
            dynamic_ncols=True,
        )
        while self.global_step < args.max_steps:
            logs = self.train_step()
            step = self.global_step
            if step % args.logging_steps == 0 or step == args.max_steps:
                self._log(logs)
            if args.log_completions_steps and step % args.log_completions_steps == 0:
                self._log_completions()
            if logs.get("nonfinite_step"):
                for w in self.monitor.record_bad_step(step, "loss or gradient is NaN/inf"):
                    self._warn(w.step, w.kind, w.message)
            for w in self.monitor.update(logs):
                self._warn(w.step, w.kind, w.message)
            if self.monitor.should_stop:
                bar.close()
                path = self.save_checkpoint()
                raise TrainingStopped(
                    f"{args.max_bad_steps} steps in a row had a NaN/inf loss or gradient and "
                    f"were skipped; the weights are unchanged since the last good step and "
                    f"were saved to {path}. Lower learning_rate or check the rewards."
                )
            bar.set_postfix(self._progress_postfix(logs), refresh=False)
            bar.update(1)
            if (
                args.eval_steps
                and self.eval_dataset is not None
                and (step % args.eval_steps == 0)
                and step < args.max_steps
            ):
                self._log({"step": step, **self.evaluate()})
            if args.save_steps and step % args.save_steps == 0:
                self.save_checkpoint()
            if any_rank(self._stop_signal is not None, self.dist):
                bar.close()
                path = self.save_checkpoint()
                signum, self._stop_signal = self._stop_signal or signal.SIGTERM, None
                raise TrainingInterrupted(signum, path)
        bar.close()
        if self.eval_dataset is not None and (args.eval_on_start or args.eval_steps):
            if not (self.log_history and self.log_history[-1].get("step") == self.global_step
                    and "eval/reward" in self.log_history[-1]):  # fmt: skip
                self._log({"step": self.global_step, **self.evaluate()})
        saved = (self.output_dir / f"checkpoint-{self.global_step}").exists()
        if args.save_steps and any_rank(not saved, self.dist):
            self.save_checkpoint()
        if self.dist.is_main or self.fsdp_model is not None:  # FSDP: gathering is collective
            self.save_model(self.output_dir)
        barrier(self.dist)

    def _progress_postfix(self, logs: dict[str, float]) -> dict[str, str]:
        postfix = {
            "reward": f"{logs['reward']:.3f}",
            "len": f"{logs['completions/mean_length']:.0f}",
            "kl": f"{logs['kl']:.4f}",
            "s/step": f"{logs['time/step']:.1f}",
        }
        for name in self.reward_names:
            postfix[name.removesuffix("_reward")] = f"{logs[f'rewards/{name}/mean']:.2f}"
        return postfix

    def save_model(self, path: str | Path | None = None) -> Path:
        """Save model and tokenizer in Hugging Face format (``from_pretrained``-loadable; with
        LoRA the adapter, ``PeftModel.from_pretrained``-loadable).

        Files are written into a temporary folder first and then moved into place one by one
        (``os.replace`` is atomic), so a crash never leaves a truncated weights file.

        Under FSDP every rank must call it (the full weights are gathered); rank 0 writes."""
        target = Path(path) if path is not None else self.output_dir
        weights = self._full_model_state_dict()
        if not self.dist.is_main and self.fsdp_model is not None:
            return target
        target.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".save-", dir=target))
        try:
            self._save_pretrained(tmp, weights)
            self.tokenizer.save_pretrained(tmp)
            for item in tmp.iterdir():
                os.replace(item, target / item.name)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return target


def rollout_mismatch_logs(
    stats: Sequence[tuple[torch.Tensor, torch.Tensor]],
) -> dict[str, float]:
    """TRL's sampling/* metrics over a step: |logp_trainer - logp_sampler| per token and the
    rollout-correction weights (whether or not they are applied)."""
    diff = torch.cat([d for d, _ in stats])
    weights = torch.cat([w for _, w in stats])
    if diff.numel() == 0:  # every token masked; all ranks must still log the same keys
        diff = weights = torch.zeros(1)
    return {
        "sampling/sampling_logp_difference/mean": float(diff.mean()),
        "sampling/sampling_logp_difference/max": float(diff.max()),
        "sampling/importance_sampling_ratio/min": float(weights.min()),
        "sampling/importance_sampling_ratio/mean": float(weights.mean()),
        "sampling/importance_sampling_ratio/max": float(weights.max()),
    }


def trimmed_completions(
    rollout: Rollout, rows: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The completion ids and mask of ``rows``, cut to their longest completion (at least one
    column), and that width: a micro-batch's forward pays only for its own padding."""
    mask = rollout.completion_mask[rows]
    width = max(int(mask.sum(dim=1).max()), 1)
    return rollout.completion_ids[rows, :width], mask[:, :width], width


def micro_batch_rows(
    lengths: torch.Tensor, size: int, group_size: int | None, *, by_length: bool = True
) -> list[torch.Tensor]:
    """Split the rows of a rollout into micro-batches of at most ``size`` rows (LongTensors of
    row indices), laid out so that each can share its prompt forward (see :func:`prompt_blocks`).

    With uniform groups of ``group_size`` rows (rows of a group contiguous): if ``size`` is a
    multiple of it, micro-batches hold whole groups; if it divides it, each micro-batch holds
    ``size`` rows of one group (with ``by_length``, a group's longest rows go together). Else
    the units are single rows. With ``by_length`` the units are ordered longest first (a unit
    counts as its longest completion; stable for ties), so each micro-batch pads to a similar
    width. A single micro-batch keeps the rollout's order. Every row appears exactly once.
    """
    n_rows = int(lengths.numel())
    if size >= n_rows:
        return [torch.arange(n_rows)]
    rows = torch.arange(n_rows)
    uniform = group_size is not None and n_rows % group_size == 0
    if uniform and size % group_size == 0:
        units = rows.view(-1, group_size)  # whole groups
    elif uniform and group_size % size == 0:
        units = rows.view(-1, group_size)
        if by_length:
            within = torch.sort(lengths.view(-1, group_size), dim=1, descending=True, stable=True)
            units = units.gather(1, within.indices)
        units = units.reshape(-1, size)  # pieces of one group
    else:
        units = rows.view(-1, 1)
    if by_length:
        order = torch.sort(lengths[units].max(dim=1).values, descending=True, stable=True)
        units = units[order.indices]
    return list(units.reshape(-1).split(size))


def prompt_blocks(row_groups: torch.Tensor, group_size: int) -> tuple[torch.Tensor, int] | None:
    """How a micro-batch can share its prompt forward: ``(prompts, block)`` when its rows form
    consecutive blocks of ``block`` rows answering the same prompt (row r answers
    ``prompts[r // block]``, the layout ``completion_logprobs(group_size=block)`` takes), else
    None. ``row_groups``: the prompt (group) index of each row. Tried: every row one prompt
    (block = all rows), then blocks of ``group_size``."""
    n_rows = int(row_groups.numel())
    if n_rows == 0:
        return None
    if bool((row_groups == row_groups[0]).all()):
        return row_groups[:1], n_rows
    if n_rows % group_size == 0:
        blocks = row_groups.view(-1, group_size)
        if bool((blocks == blocks[:, :1]).all()):
            return blocks[:, 0], group_size
    return None


def scatter_rows(
    parts: Sequence[torch.Tensor], micro_batches: Sequence[torch.Tensor]
) -> torch.Tensor:
    """Re-assemble per-micro-batch results [n_k, ...] into rollout row order [N, ...]."""
    index = torch.cat(list(micro_batches)).to(parts[0].device)
    out = parts[0].new_empty((index.numel(), *parts[0].shape[1:]))
    out[index] = torch.cat(list(parts))
    return out


def _finite_or_none(value: torch.Tensor | float) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


def _tied_parameter_names(model: torch.nn.Module) -> list[tuple[str, str]]:
    """(name, first name) pairs for parameters that share storage with an earlier one."""
    seen: dict[int, str] = {}
    tied = []
    for name, param in model.named_parameters(remove_duplicate=False):
        key = id(param)
        if key in seen:
            tied.append((name, seen[key]))
        else:
            seen[key] = name
    return tied


def _write_jsonl_atomic(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    os.replace(tmp, path)


def _truncate_jsonl(path: Path, max_step: int) -> None:
    """Keep the rows of a JSONL log whose step is <= max_step (and unreadable tails go)."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by the crash
        if int(row.get("step", 0)) <= max_step:
            kept.append(row)
    _write_jsonl_atomic(path, kept)


def print_completions(records: Sequence[dict[str, Any]]) -> None:
    """A rich table per prompt: each completion with its reward components and advantage."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for record in records:
        prompt = record["prompt"]
        if isinstance(prompt, list):
            prompt = prompt[-1].get("content", "") if prompt else ""
        table = Table(
            title=f"step {record['step']}: {prompt[-200:]!s}",
            caption=f"answer: {record.get('answer')}",
            show_lines=True,
        )
        table.add_column("completion", overflow="fold")
        names = list(record["completions"][0]["rewards"]) if record["completions"] else []
        for name in names:
            table.add_column(name.removesuffix("_reward"), justify="right")
        table.add_column("reward", justify="right")
        table.add_column("advantage", justify="right")

        def fmt(value: float | None) -> str:
            return "-" if value is None else f"{value:.2f}"

        for item in record["completions"]:
            table.add_row(
                item["text"],
                *(fmt(item["rewards"][n]) for n in names),
                fmt(item["reward"]),
                f"{item['advantage']:+.2f}",
            )
        console.print(table)
