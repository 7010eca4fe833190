"""Running a trainer: the loop and the services around a step.

:class:`Trainer` holds what GRPO and PPO share: the machine, model and tokenizer, the prompt
batches, the rewards, the policy and its rollout engine, and the run services: ``train()`` (the
loop with its cadence of logging, evaluation and saving, SIGINT/SIGTERM, the failure monitor),
metric files, completion tables, evaluation and checkpoints. A subclass writes
``train_step()``: :class:`groupwise.trainer.GRPOTrainer`, :class:`groupwise.ppo.PPOTrainer`.

A checkpoint's training state is ``{component: component.state_dict()}`` plus the step, the
config, every rank's RNG state and the metrics so far.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import itertools
import json
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from tqdm.auto import tqdm
from transformers import (
    PreTrainedModel,
    PreTrainedTokenizerBase,
    TrainerControl,
    TrainerState,
)
from transformers.trainer_utils import TrainOutput

from . import checkpoint as ckpt
from . import console
from .build import (
    build_engine,
    build_interaction,
    build_model,
    build_scorer,
    environment_dataset,
    resolve_device,
    resolve_run_precision,
    sampling_params,
)
from .checkpoint import TrainingInterrupted, TrainingStopped
from .config import ConfigError, GRPOConfig, default_output_dir
from .core import group_reward_std, informative_groups, zero_std_groups_fraction
from .curriculum import Curriculum, NoCurriculum, Plan
from .distributed import (
    DistributedContext,
    all_gather_objects,
    all_reduce_sum,
    any_rank,
    barrier,
    init_distributed,
    reduce_metrics,
)
from .errors import first_line, option
from .files import atomic_write_text, staged_files
from .loggers import RunLoggers
from .models import adapter_base_name, is_peft_model, record_adapter_base
from .monitor import TrainingMonitor
from .policy import CheckpointMismatch, Policy, UpdateStats, optimizer_steps
from .report.record import changed_defaults, record_run_end, record_run_start
from .rewards import RewardFunc, RewardModel
from .rollout import Rollout
from .rollout.multiturn import conversation_logs
from .sampler import PromptBatches
from .scoring import Scores


def _model_name(model: Any, args: GRPOConfig) -> str:
    """The model's name for a default output folder: the name or path given, else the loaded
    model's own ``name_or_path``."""
    if isinstance(model, str):
        return model
    name = getattr(getattr(model, "config", None), "name_or_path", None)
    return str(name) if name else str(args.model)


def seed_everything(seed: int) -> None:
    import random

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class PhaseTimer:
    """Wall time of a step's phases: ``mark(name)`` ends the phase begun at the previous mark
    (and adds it to ``name``'s time). On CUDA each mark first waits for the device: kernels run
    asynchronously, so without it a phase's GPU work would be billed to the next phase that
    happens to wait (one sync per phase, a handful per step)."""

    def __init__(self, device: torch.device | None = None) -> None:
        self.cuda = device is not None and device.type == "cuda"
        if self.cuda:
            torch.cuda.synchronize(device)
        self.device = device
        self.start = self.last = time.perf_counter()
        self.phases: dict[str, float] = {}

    def mark(self, name: str) -> None:
        """A phase marked more than once (several generation batches) adds up."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self.phases[name], self.last = self.phases.get(name, 0.0) + now - self.last, now

    @property
    def total(self) -> float:
        return self.last - self.start


class ComputeLedger:
    """What the run has spent so far (checkpointed, so a resumed run continues the totals):
    generated completion tokens, rollouts, prompt groups and informative groups (correctness
    that varies, :func:`groupwise.core.informative_groups`) and optimizer steps, over every
    rank. :meth:`record` adds one step and returns its ``compute/*`` metrics."""

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


def with_peft_config(args: GRPOConfig, peft_config: Any) -> GRPOConfig:
    """``args`` with use_peft on and the lora_* options read from a ``peft.LoraConfig`` (the
    adapter itself is built from ``peft_config`` as given; these record it in config.yaml)."""
    if not all(hasattr(peft_config, name) for name in ("r", "lora_alpha", "target_modules")):
        raise ConfigError(
            f"peft_config: only a peft.LoraConfig is supported, got {type(peft_config).__name__}"
        )
    targets = peft_config.target_modules
    if targets is None or targets == "all-linear":
        recorded = None
    else:
        recorded = [targets] if isinstance(targets, str) else sorted(targets)
    resolved = dataclasses.replace(
        args,
        use_peft=True,
        lora_r=int(peft_config.r),
        lora_alpha=int(peft_config.lora_alpha),
        lora_dropout=float(getattr(peft_config, "lora_dropout", 0.0)),
        lora_target_modules=recorded,
    )
    resolved.trl_ignored = dict(args.trl_ignored)
    return resolved


class Trainer:
    """What every trainer shares (see the module docstring). ``args`` defaults to
    ``GRPOConfig()``; ``model`` is a built-in name, a path or a loaded ``PreTrainedModel``;
    ``reward_funcs`` built-in names or callables ``f(prompts, completions, **columns)``.

    TRL's other arguments: ``processing_class`` (the tokenizer, instead of the model's own),
    ``peft_config`` (a ``peft.LoraConfig``: LoRA as configured there), ``callbacks``
    (``transformers.TrainerCallback``-like objects or classes: on_init_end, on_train_begin,
    on_step_begin, on_step_end, on_log, on_evaluate, on_save and on_train_end are called with
    ``(args, state, control, **kwargs)``; ``control.should_training_stop`` and
    ``control.should_save`` are obeyed), ``reward_processing_classes`` (the tokenizers of the
    reward models in ``reward_funcs``: one, or a list with an entry per reward function),
    ``optimizers`` (only ``(None, None)``). TRL's positional order ``(model, reward_funcs, args,
    train_dataset)`` works too.

    Multi-turn rollouts (docs/tools.md): ``tools``, typed and documented Python
    functions (or built-in names) the model may call, as TRL's ``tools``; or
    ``environment_factory``, a callable returning one :class:`groupwise.tools.Environment` per
    conversation (``reset(row)``, ``step(message)``, ``state()``)."""

    def __init__(
        self,
        model: str | PreTrainedModel,
        reward_funcs: RewardFunc | str | Sequence[RewardFunc | str] | None = None,
        train_dataset: Sequence[dict[str, Any]] | GRPOConfig | None = None,
        args: GRPOConfig | Sequence[dict[str, Any]] | None = None,
        eval_dataset: Sequence[dict[str, Any]] | None = None,
        processing_class: PreTrainedTokenizerBase | None = None,
        reward_processing_classes: Any = None,
        callbacks: Sequence[Any] | None = None,
        optimizers: tuple[Any, Any] = (None, None),
        peft_config: Any | None = None,
        tools: Sequence[Callable[..., Any] | str] | None = None,
        environment_factory: Callable[[], Any] | None = None,
    ) -> None:
        if isinstance(train_dataset, GRPOConfig) and not isinstance(args, GRPOConfig):
            train_dataset, args = args, train_dataset  # TRL's order: (model, funcs, args, data)
        if tuple(optimizers) != (None, None):
            raise ConfigError(
                "optimizers: groupwise builds its own AdamW and schedule; pass (None, None) and "
                "set learning_rate, lr_scheduler_type, warmup_steps, weight_decay, adam_* instead"
            )
        if args is not None and not isinstance(args, GRPOConfig):
            raise TypeError(f"args must be a groupwise GRPOConfig, got {type(args).__name__}")
        args = args or self.default_args()
        if is_peft_model(model):  # TRL: a PeftModel trains its own adapter
            if peft_config is not None:
                raise ConfigError(
                    "model is already a PeftModel (it has its adapter) and peft_config was also "
                    "given; pass the base model with peft_config, or the PeftModel alone"
                )
            args = with_peft_config(args, model.peft_config[model.active_adapter])
        if peft_config is not None:
            args = with_peft_config(args, peft_config)
        # Tools or an environment: multi-turn rollouts (rollout/multiturn.py).
        self.interaction = build_interaction(args, tools, environment_factory)
        environments = self.interaction.environments if self.interaction else None
        train_dataset = environment_dataset(train_dataset, environments, args)
        seed_everything(args.seed)
        self.dist: DistributedContext = init_distributed(args.device)
        if args.output_dir is None and args.resume_from_checkpoint == "auto":
            raise ConfigError(
                "resume_from_checkpoint='auto' (--resume) continues the run in output_dir, but "
                "no output_dir is set (a new run would start from step 0 in a new folder): give "
                "the run's folder (--output_dir RUN on the command line, output_dir=RUN in "
                "Python)"
            )
        if args.output_dir is None:  # a new folder per run; every rank writes to rank 0's
            args.output_dir = all_gather_objects(
                default_output_dir(_model_name(model, args), args.task), self.dist
            )[0]
        train_dataset = stream_prefix(train_dataset, args, self.dist.world_size)
        self._check_dataset(train_dataset, "train_dataset")
        # max_steps=-1 (num_train_epochs) and "epoch" strategies need the dataset's size.
        self.args = args = args.for_dataset(len(train_dataset), self.dist.world_size)
        self.check_options(args, self.dist)
        self.device = resolve_device(args.device)
        if self.device.type == "cuda" and self.dist.enabled:
            self.device = torch.device("cuda", self.dist.local_rank)
        # fp32 weights with bf16 autocast on a bf16 GPU, fp32 on CPU (docs/gpu.md).
        self.precision = resolve_run_precision(args, self.device)
        self.dtype = self.precision.weights
        given = model
        model, self.tokenizer = build_model(
            model, processing_class, args, self.device, self.dtype, peft_config
        )
        # The base a saved LoRA adapter names (None: PEFT's own record, from a loaded model).
        self._adapter_base = (
            adapter_base_name(given) if args.use_peft and isinstance(given, str) else None
        )
        self.scorer = build_scorer(
            reward_funcs,
            args,
            reward_processing_classes,
            self.device,
            environments.reward_funcs if environments is not None else (),
        )
        self.scorer.combine.trainer_state = lambda: self.state  # TRL's trainer_state kwarg
        # TRL's attribute: each reward function's tokenizer (a reward model's), else None.
        self.reward_processing_classes = [
            f.tokenizer if isinstance(f, RewardModel) else None for f in self.scorer.funcs
        ]
        self.eval_dataset = eval_dataset
        if eval_dataset is not None:
            self._check_eval_dataset(eval_dataset, "eval_dataset")
        self.policy = Policy(model, args, self.dist, self.device, self.precision)
        self.curriculum: Curriculum = NoCurriculum(args.num_generations)
        # Each rank samples its own completions (the model and prompt order are shared).
        self.generator = torch.Generator(device=self.device).manual_seed(args.seed + self.dist.rank)
        self.engine = build_engine(
            self.policy, self.tokenizer, args, self.generator, self.precision, self.interaction
        )
        self.prompts = PromptBatches(
            train_dataset,
            self.tokenizer,
            args.prompts_per_step,
            args.max_prompt_length,
            args.seed,
            self.dist,
            getattr(self.engine, "prompt_text", None),  # with tools: shown in the prompt
            shuffle=args.shuffle_dataset,
        )
        self.global_step = 0
        self.compute = ComputeLedger()  # tokens, rollouts, informative groups, optimizer steps
        self.log_history: list[dict[str, float]] = []
        # (len(log_history) then, row): train()'s end-of-training rows, for state.log_history
        self._train_summaries: list[tuple[int, dict[str, float]]] = []
        self._train_losses: list[float] = []  # this train() call's per-step losses
        self._metrics_started = False
        self._earlier_run: list[str] = []  # what an earlier run left in output_dir (train())
        self.output_dir = Path(args.output_dir)
        self._last_samples: list[dict[str, Any]] = []
        self._last_batch: tuple | None = None
        self._stop_signal: int | None = None
        # Failure-mode warnings (checkpointed), reading the reward that says "solved".
        self.monitor = TrainingMonitor(args, correctness_reward=self.scorer.correctness_name)
        self.loggers: RunLoggers | None = None  # TensorBoard / wandb, opened by train()
        self.callbacks = [cb() if isinstance(cb, type) else cb for cb in callbacks or ()]
        self.control = TrainerControl()
        self._state = TrainerState()
        self.setup()
        self._callback("on_init_end")

    @classmethod
    def default_args(cls) -> GRPOConfig:
        """The options when none are given."""
        return GRPOConfig()

    def setup(self) -> None:
        """Build what this trainer adds to the shared components (called last by __init__)."""

    # Why this trainer cannot run with its model sharded (FSDP2), or None when it can.
    sharding_refusal: str | None = None
    # TRL's flag: whether the loss adds a Mixture-of-Experts model's router load-balancing loss
    # (then logged as aux_loss). groupwise trains on its policy loss alone, so never.
    aux_loss_enabled: bool = False

    def check_options(self, args: GRPOConfig, dist: DistributedContext) -> None:
        """Refuse option combinations this trainer cannot run, before anything is loaded."""
        if dist.enabled and args.data_parallel == "fsdp" and self.sharding_refusal:
            raise ConfigError(
                f"algorithm={args.algorithm} with data_parallel=fsdp is not supported: "
                f"{self.sharding_refusal} (use data_parallel=ddp)"
            )

    def train_step(self) -> dict[str, float]:
        raise NotImplementedError

    # -- the components' parts users reach for (TRL's attribute names) -------------------------
    @property
    def state(self) -> TrainerState:
        """A ``transformers.TrainerState`` of this run, up to date: global_step, max_steps,
        log_history (``self.log_history``'s rows with, as in transformers, the summary row each
        ``train()`` call added at its end: train_loss, train_runtime, ..., and the final step's
        metrics), epoch, ..."""
        state, args = self._state, self.args
        per_epoch = args.steps_per_epoch(len(self.prompts.dataset), self.dist.world_size)
        state.global_step = self.global_step
        state.max_steps = args.max_steps
        history = list(self.log_history)
        for position, row in reversed(self._train_summaries):
            history.insert(min(position, len(history)), row)
        state.log_history = history
        state.epoch = self.global_step / per_epoch
        state.num_train_epochs = math.ceil(args.max_steps / per_epoch)
        state.logging_steps = args.logging_steps
        state.save_steps = args.save_steps
        state.eval_steps = args.eval_steps
        state.train_batch_size = args.per_device_train_batch_size
        state.is_world_process_zero = self.dist.is_main
        state.is_local_process_zero = self.dist.local_rank == 0
        return state

    def add_callback(self, callback: Any) -> None:
        """Add a ``TrainerCallback``-like object (or class), as transformers' Trainer does."""
        self.callbacks.append(callback() if isinstance(callback, type) else callback)

    def _callback(self, event: str, **kwargs: Any) -> None:
        """Call ``event`` on every callback that has it, with transformers' arguments."""
        for callback in self.callbacks:
            method = getattr(callback, event, None)
            if method is None:
                continue
            result = method(
                self.args,
                self.state,
                self.control,
                model=self.model,
                processing_class=self.tokenizer,
                optimizer=self.optimizer,
                lr_scheduler=self.scheduler,
                train_dataloader=None,
                eval_dataloader=None,
                **kwargs,
            )
            if isinstance(result, TrainerControl):
                self.control = result

    @property
    def model(self) -> PreTrainedModel:
        return self.policy.model

    @property
    def ref_model(self) -> PreTrainedModel | None:
        return self.policy.ref_model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.policy.optimizer

    @property
    def scheduler(self) -> torch.optim.lr_scheduler.LRScheduler:
        return self.policy.scheduler

    @property
    def sampling(self) -> Any:
        return self.engine.params

    @property
    def train_dataset(self) -> Sequence[dict[str, Any]]:
        return self.prompts.dataset

    @train_dataset.setter
    def train_dataset(self, dataset: Sequence[dict[str, Any]]) -> None:
        self.prompts.dataset = dataset

    @property
    def reward_funcs(self) -> list[RewardFunc]:
        return self.scorer.funcs

    @property
    def reward_names(self) -> list[str]:
        return self.scorer.names

    @classmethod
    def _check_eval_dataset(cls, dataset: Any, name: str) -> None:
        """An evaluation set, or a dict of them by name (TRL's form); an IterableDataset is read
        when evaluated (its first row is checked now)."""
        if isinstance(dataset, Mapping):
            if not dataset:
                raise ValueError(f"{name} is an empty dict; give at least one dataset")
            for key, part in dataset.items():
                cls._check_eval_dataset(part, f"{name}[{key!r}]")
            return
        if not _is_indexable(dataset):
            first = next(iter(dataset), None) if isinstance(dataset, Iterable) else None
            if first is None:
                raise ValueError(f"{name} is empty or not a dataset ({type(dataset).__name__})")
            dataset = [first]
        cls._check_dataset(dataset, name)

    @property
    def reward_func_names(self) -> list[str]:
        """TRL's name for :attr:`reward_names`."""
        return self.scorer.names

    @property
    def reward_weights(self) -> torch.Tensor:
        """The reward functions' weights (those of environment-owned rewards are 1)."""
        return self.scorer.combine.weights

    @property
    def tools(self) -> list[Callable[..., Any]]:
        """TRL's ``trainer.tools``: the tool functions of an environment_factory run (every
        environment's methods, bound to its first instance, and the standalone tools)."""
        environments = self.interaction.environments if self.interaction else None
        return environments.all_tools if environments is not None else []

    @property
    def environments(self) -> list[Any] | None:
        """TRL's ``trainer.environments``: the environment instance of each rollout of the
        last generated batch (an environment_factory run; None before the first or without)."""
        environments = self.interaction.environments if self.interaction else None
        return environments.last if environments is not None else None

    @staticmethod
    def _check_dataset(dataset: Sequence[dict[str, Any]], name: str) -> None:
        if not _is_indexable(dataset):
            raise TypeError(
                f"{name} must be a list of dict rows, a datasets.Dataset or a "
                f"datasets.IterableDataset, got {type(dataset).__name__}"
            )
        if len(dataset) == 0:
            raise ValueError(f"{name} is empty")
        first = dataset[0]
        if not isinstance(first, dict) or "prompt" not in first:
            raise ValueError(f"{name}: rows must be dicts with a 'prompt' column, got {first!r}")

    def score(
        self, rows: Sequence[dict[str, Any]], rollout: Rollout
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rewards [N] (weighted sum; NaN where every function returned None) and the per-function
        rewards [N, F] (NaN for None). Dataset columns reach the functions by name, as in TRL."""
        scores = self.scorer(rows, rollout)
        return scores.rewards, scores.per_func

    # -- step metrics -----------------------------------------------------------------------------
    def step_logs(
        self,
        rollout: Rollout,
        scores: Scores,
        stats: UpdateStats,
        timer: PhaseTimer,
        *extra: dict[str, float],
        zero_std: bool = True,
    ) -> dict[str, float]:
        """One step's metrics (docs/metrics.md): rewards, completion lengths, loss terms,
        optimisation and timing, then ``extra`` blocks, averaged over ranks."""
        rewards, group_ids = scores.rewards, rollout.group_ids.cpu()
        logs: dict[str, float] = {
            "step": self.global_step,
            "reward": float(torch.nanmean(rewards)) if not torch.isnan(rewards).all() else 0.0,
        }
        if zero_std:
            logs["reward_std"] = float(torch.nanmean(group_reward_std(rewards, group_ids)))
            logs["frac_reward_zero_std"] = zero_std_groups_fraction(rewards, group_ids)
        elif self.args.num_generations > 1:
            logs["reward_std"] = float(torch.nanmean(group_reward_std(rewards, group_ids)))
        logs.update(self.scorer.logs(scores.per_func))
        lengths = rollout.lengths.float()
        gen_tokens = int(rollout.completion_mask.sum())
        generation = timer.phases.get("generation", 0.0)
        sums = stats.sums
        # Entropy per token: tokens counts every rank's tokens and reduce_metrics averages the
        # ranks' shares, hence the world size.
        world, passes = self.dist.world_size, self.args.num_iterations
        entropy = stats.entropy_sum * world / float(stats.tokens) / passes
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
                "entropy": entropy,
                "grad_norm": float(stats.grad_norm),
                "learning_rate": self.policy.learning_rate,
                "time/generation": generation,
                "time/scoring": timer.phases.get("scoring", 0.0),
                "time/update": timer.phases.get("update", 0.0),
                "time/step": timer.total,
                "tokens_per_second": gen_tokens / timer.total,
                "generation_tokens_per_second": gen_tokens / max(generation, 1e-9),
            }
        )
        # verl's perf/throughput: every rank's prompt + completion tokens, per device-second.
        tokens = torch.tensor(sequence_tokens(rollout), dtype=torch.float64)
        prompt_tokens, completion_tokens = (int(v) for v in all_reduce_sum(tokens, self.dist))
        logs.update(verl_throughput(prompt_tokens, completion_tokens, timer.total, world))
        if rollout.conversations is not None:  # multi-turn: tool use, turns, masked tokens
            logs.update(conversation_logs(rollout, scores.correctness))
            timing = getattr(self.engine, "timing", {})
            logs["time/environment"] = timing.get("env_s", 0.0)
            logs["time/context_insert"] = timing.get("insert_s", 0.0)
        for block in extra:
            logs.update(block)
        logs.update(self.scorer.combine.take_metrics())  # the reward functions' log_metric
        logs.update(self.compute.record(self.compute_spent(rollout, scores)))
        if stats.mismatch:
            logs.update(rollout_mismatch_logs(stats.mismatch))
        logs = reduce_metrics(logs, self.dist)
        if stats.skipped:
            logs["nonfinite_step"] = 1.0
        return logs

    def compute_spent(self, rollout: Rollout, scores: Scores) -> dict[str, int]:
        """This step's generated tokens, rollouts, groups and informative groups over every
        rank, and its optimizer steps (one per mini-batch per pass)."""
        local = torch.tensor(
            [
                int(rollout.completion_mask.sum()),
                int(rollout.completion_ids.shape[0]),
                int(torch.unique(rollout.group_ids.cpu()).numel()),
                int(informative_groups(scores.correctness, rollout.group_ids.cpu()).sum()),
            ],
            dtype=torch.float64,
        )
        total = [int(v) for v in all_reduce_sum(local, self.dist).tolist()]
        spent = dict(zip(ComputeLedger.KEYS[:4], total, strict=True))
        spent["optimizer_steps"] = optimizer_steps(self.args, 1)
        return spent

    def keep_batch(
        self,
        rows: list[dict[str, Any]],
        rollout: Rollout,
        scores: Scores,
        advantages: torch.Tensor,
        plan: Plan | None = None,
    ) -> None:
        """The last step's batch, for completions.jsonl (one advantage per completion: with a
        curriculum, its weighted advantage)."""
        group_ids = rollout.group_ids.cpu()
        weights = plan.row_weights(rollout) if plan is not None else None
        advantages = advantages.cpu() if weights is None else advantages.cpu() * weights
        self._last_batch = (rows, rollout.texts, scores.rewards, scores.per_func, advantages,
                            group_ids, scores.extra)  # fmt: skip
        if self.args.log_completions:
            self._last_samples = [
                {"prompt": rows[g]["prompt"], "completion": text, "reward": float(r)}
                for g, text, r in zip(
                    group_ids.tolist(), rollout.texts, scores.rewards.tolist(), strict=True
                )
            ]

    # -- evaluation -------------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(
        self,
        dataset: Sequence[dict[str, Any]] | None = None,
        batch_size: int | None = None,
        greedy: bool = True,
        *,
        eval_dataset: Any = None,
    ) -> dict[str, float]:
        """Mean of every reward function over ``dataset`` (default: eval_dataset), one greedy
        completion per prompt (or one sample at the training temperature), ``batch_size``
        (default ``per_device_eval_batch_size``) prompts at a time; with
        ``eval_num_generations`` also pass@k / mean@k (overall and per difficulty level).
        ``eval_dataset`` is TRL's name for ``dataset``. A dict of datasets (TRL's form) is
        evaluated set by set, each one's metrics named ``eval/<name>/...``; an IterableDataset
        is read whole. Scalars the reward functions log with ``log_metric`` are
        ``eval/<metric>``."""
        if eval_dataset is not None:
            if dataset is not None:
                raise ValueError("evaluate(): give dataset or eval_dataset (TRL's name), not both")
            dataset = eval_dataset
        dataset = dataset if dataset is not None else self.eval_dataset
        if dataset is None:
            raise ValueError("evaluate() needs a dataset: pass one or give eval_dataset")
        if isinstance(dataset, Mapping):
            merged: dict[str, float] = {}
            for name, part in dataset.items():
                for key, value in self.evaluate(part, batch_size, greedy).items():
                    if key == "eval_loss":  # TRL's name for a set of a dict
                        merged[f"eval_{name}_loss"] = value
                    else:
                        merged[f"eval/{name}/{key.removeprefix('eval/')}"] = value
            return merged
        self._check_eval_dataset(dataset, "eval_dataset")
        combine = self.scorer.combine
        # log_metric values of training steps stay apart from this evaluation's
        training, combine.pending_metrics = combine.pending_metrics, {}
        try:
            rows = materialize(dataset)
            result = self._evaluate(rows, batch_size, greedy)
            size = batch_size or self.args.per_device_eval_batch_size
            result.update(self.evaluation_loss(rows, size))
            result.update({f"eval/{k}": v for k, v in combine.take_metrics().items()})
        finally:
            combine.pending_metrics = training
        return result

    def evaluation_loss(
        self, rows: Sequence[dict[str, Any]], batch_size: int
    ) -> dict[str, float]:
        """TRL's ``eval_loss`` of the evaluation rows, where the algorithm has one (GRPO)."""
        return {}

    def _evaluate(
        self, dataset: Sequence[dict[str, Any]], batch_size: int | None, greedy: bool
    ) -> dict[str, float]:
        from .evaluation import evaluate_model, reward_means

        args = self.args
        batch_size = batch_size or args.per_device_eval_batch_size
        with self.policy.full_weights():  # FSDP: generation calls the unwrapped model
            result = reward_means(
                self.engine,
                self.tokenizer,
                dataset,
                self.score,
                self.reward_names,
                sampling_params(args, greedy=greedy),
                batch_size=batch_size,
                max_prompt_length=args.max_prompt_length,
            )
            if not (greedy and args.eval_num_generations > 0):
                return result
            res = evaluate_model(
                self.engine,
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
        for key, value in res.summary["overall"].items():
            if key != "num_prompts" and isinstance(value, (int, float)):
                result[f"eval/{key}"] = float(value)
        for level, block in res.summary["by_difficulty"].items():
            for key, value in block.items():
                if key.startswith(("pass@", "mean@")) or key in ("accuracy", "num_prompts"):
                    result[f"eval/difficulty_{level}/{key}"] = float(value)
        self.model.train()
        return result

    # -- files ----------------------------------------------------------------------------------
    def _log(self, logs: dict[str, float]) -> None:
        self.log_history.append(logs)
        self._callback("on_log", logs=dict(logs))
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
            handle.write(json.dumps(record, default=str) + "\n")

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
        if not self._last_batch:
            return []
        rows, texts, rewards, per_func, advantages, group_ids, extra = self._last_batch
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
                    # columns the reward functions logged with log_extra
                    **({"extra": {k: v[i] for k, v in extra.items()}} if extra else {}),
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

    # -- checkpoints ----------------------------------------------------------------------------
    def components(self) -> dict[str, Any]:
        """The stateful components a checkpoint holds, by name (``state_dict``/``load``)."""
        return {
            "sampler": self.prompts,
            "curriculum": self.curriculum,
            "monitor": self.monitor,
            "compute": self.compute,
        }

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
        state: dict[str, Any] = {
            "format": 1,
            "global_step": self.global_step,
            "config": self.args.to_dict(),
            "optimizer": self.policy.optimizer_state_dict(),
            "scheduler": self.policy.scheduler.state_dict(),
            # One entry per rank: each samples with its own generator.
            "rng": self._all_rank_rng_states(),
        }
        for name, component in self.components().items():
            value = component.state_dict()
            state[name] = ckpt.plain(value) if value is not None else None
        state.update(ckpt.plain(self.scorer.state_dict()))
        state["log_history"] = ckpt.plain(self.log_history)
        state["extra"] = self.extra_state_dict()
        return state

    def save_checkpoint(self) -> Path:
        """Write ``checkpoint-<step>`` atomically and apply ``save_total_limit``."""
        state = self.state_dict()  # a collective under data parallel: every rank calls it
        weights = self.policy.full_state_dict()  # FSDP: a collective too

        def write(folder: Path) -> None:
            self._save_weights(folder, weights)
            self.tokenizer.save_pretrained(folder)
            torch.save(state, folder / ckpt.STATE_FILE)

        path = self.output_dir / f"{ckpt.PREFIX}{self.global_step}"
        if self.dist.is_main:
            path = ckpt.write_checkpoint(self.output_dir, self.global_step, write)
            ckpt.rotate_checkpoints(self.output_dir, self.args.save_total_limit)
        barrier(self.dist)
        self._callback("on_save")
        return path

    def load_checkpoint(self, path: str | Path) -> None:
        """Restore the state saved by :meth:`save_checkpoint`, refusing a checkpoint whose config
        differs in options that change training, and cut the run's log files back to it."""
        path = Path(path)
        ckpt.verify_checkpoint(path)
        try:
            state = torch.load(path / ckpt.STATE_FILE, map_location="cpu", weights_only=True)
        except Exception as err:  # noqa: BLE001 - any unreadable file is named, not traced
            raise ckpt.CheckpointError(
                f"checkpoint {path}: {ckpt.STATE_FILE} cannot be read ({type(err).__name__}: "
                f"{first_line(err)}); resume from an earlier checkpoint, or start over"
            ) from err
        ckpt.check_resume_config(state["config"], self.args.to_dict(), path)
        try:
            self.policy.load_weights(path)
        except CheckpointMismatch as err:
            raise ckpt.CheckpointError(f"checkpoint {path}: {err}") from None
        except (OSError, ValueError, RuntimeError, SafetensorError) as err:
            raise ckpt.CheckpointError(
                f"checkpoint {path}: the model weights cannot be read ({type(err).__name__}: "
                f"{first_line(err)}); resume from an earlier checkpoint, or start over"
            ) from err
        self.engine.sync(self.policy.model)  # an engine with its own weights (static, vLLM)
        self.policy.load_optimizer_state_dict(state["optimizer"])
        self.policy.scheduler.load_state_dict(state["scheduler"])
        for name, component in self.components().items():
            if state.get(name) is not None:
                component.load_state_dict(state[name])
        self.scorer.load_state_dict(state)
        self.load_extra_state_dict(state.get("extra", {}))
        rng = state["rng"]
        if len(rng) != self.dist.world_size:
            raise ckpt.CheckpointError(
                f"checkpoint {path} was written by {len(rng)} process(es); resume it with the "
                f"same number (this run has {self.dist.world_size})"
            )
        notes = ckpt.set_rng_state(rng[self.dist.rank], self._generators())
        self.global_step = int(state["global_step"])
        for note in notes:
            self._warn(self.global_step, "info", f"resuming {path.name}: {note}")
        self.log_history = list(state["log_history"])
        # Rows that the interrupted run logged after this checkpoint would be logged again.
        if self.dist.is_main:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            write_jsonl_atomic(self.output_dir / "metrics.jsonl", self.log_history)
            for name in ("events.jsonl", "completions.jsonl"):
                truncate_jsonl(self.output_dir / name, self.global_step)
        barrier(self.dist)
        self._metrics_started = True
        tqdm.write(f"[groupwise] resumed from {path} at step {self.global_step}")

    # -- the loop -------------------------------------------------------------------------------
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

    def _clear_earlier_run(self) -> None:
        """overwrite_output_dir: remove all of the earlier run (not only its checkpoints, so no
        report or evaluation of another model stays behind) and say what went."""
        removed = ckpt.clear_earlier_run(self.output_dir)
        if removed:
            more = f" and {len(removed) - 12} more" if len(removed) > 12 else ""
            tqdm.write(
                f"[groupwise] overwrite_output_dir: removed the earlier run from "
                f"{self.output_dir}: {', '.join(removed[:12])}{more}"
            )

    def _resume_if_asked(self) -> None:
        value = self.args.resume_from_checkpoint
        if not value:
            return
        path = ckpt.resolve_resume_path(value, self.output_dir)
        if path is None:
            found = self._earlier_run
            if found and not self.args.overwrite_output_dir:
                overwrite = option("--overwrite_output_dir true", "overwrite_output_dir=True")
                raise ckpt.OutputDirError(
                    f"resume_from_checkpoint=auto, but output_dir={str(self.output_dir)!r} "
                    f"holds a run without checkpoints ({', '.join(found)}) that starting over "
                    f"would replace; pass {overwrite} to replace it, or choose another "
                    "output_dir (save_steps makes checkpoints)"
                )
            tqdm.write(f"[groupwise] no checkpoint in {self.output_dir}: starting from step 0")
            return
        self.load_checkpoint(path)

    def train(self, resume_from_checkpoint: bool | str | None = None) -> TrainOutput:
        """Run ``max_steps`` steps (continuing from a checkpoint when
        ``resume_from_checkpoint`` is set), logging to ``output_dir/metrics.jsonl``, evaluating
        every ``eval_steps`` and saving every ``save_steps``, on SIGINT/SIGTERM, and at the end.

        Returns transformers' ``TrainOutput(global_step, training_loss, metrics)``, as TRL's
        trainer does: see :meth:`train_summary`. The per-step rows are ``self.log_history``.

        ``resume_from_checkpoint`` as in the Hugging Face Trainer: True continues from the
        newest checkpoint in output_dir, a path from that checkpoint; it replaces
        ``args.resume_from_checkpoint`` (None keeps it)."""
        if resume_from_checkpoint is not None:
            value = ckpt.resume_argument(resume_from_checkpoint, self.output_dir)
            ignored = dict(self.args.trl_ignored)
            self.args = dataclasses.replace(self.args, resume_from_checkpoint=value)
            self.args.trl_ignored = ignored
        args = self.args
        started, first_step = time.perf_counter(), self.global_step
        self._train_losses = []
        self._earlier_run = []
        if self.global_step == 0 and not self._metrics_started:  # not a continuation
            ckpt.check_output_dir(
                self.output_dir, args.resume_from_checkpoint, args.overwrite_output_dir
            )
            self._earlier_run = ckpt.earlier_run(self.output_dir)
        barrier(self.dist)  # every rank looked before rank 0 writes anything
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self._resume_if_asked()
        fresh = self.global_step == 0 and not self._metrics_started  # nothing logged yet
        if fresh and args.overwrite_output_dir and self.dist.is_main:
            self._clear_earlier_run()
        if self.dist.is_main:
            args.to_yaml(self.output_dir / "config.yaml")
            # Reward names, weights and which one is correctness, for `groupwise report`.
            self.scorer.combine.write_manifest(self.output_dir / "rewards.json")
            # Version, device, dtype, dates, wall time and the changed options' defaults, too.
            segment_start = record_run_start(self.output_dir, self._run_facts(), not fresh)
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
        self.control = TrainerControl()
        try:
            self._callback("on_train_begin")
            self._train_loop()
            metrics = self.train_summary(
                time.perf_counter() - started, self.global_step - first_step
            )
            # As in TRL (whose log() merges the metrics not yet logged into this row), the
            # summary also carries the final step's metrics: log_history[-1]["reward"] works.
            final = next(
                (
                    r
                    for r in reversed(self.log_history)
                    if r.get("step") == self.global_step and "loss" in r
                ),
                {},
            )
            ran = self.global_step > first_step
            row = {**(final if ran else {}), **metrics, "step": self.global_step}
            self._train_summaries.append((len(self.log_history), row))
            self._callback("on_log", logs=dict(row))  # before on_train_end, as transformers
            self._callback("on_train_end")
        finally:
            if self.dist.is_main:
                record_run_end(self.output_dir, segment_start)
            for signum, handler in previous_handlers.items():
                signal.signal(signum, handler)
            if self.loggers is not None:
                self.loggers.close()
                self.loggers = None
        if args.use_peft and args.save_merged_model and self.dist.is_main:
            merged = copy.deepcopy(self.model).merge_and_unload()
            merged.save_pretrained(self.output_dir / "merged")
            self.tokenizer.save_pretrained(self.output_dir / "merged")
        return TrainOutput(self.global_step, metrics["train_loss"], metrics)

    def train_summary(self, seconds: float, steps: int) -> dict[str, float]:
        """transformers' end-of-training metrics of a ``train()`` call that ran ``steps`` steps
        in ``seconds``: ``train_loss``, the mean of those steps' finite ``loss`` (NaN when none
        ran), ``train_runtime``, ``train_samples_per_second`` (completions trained on, every
        rank's), ``train_steps_per_second`` and ``epoch``. The row ``state.log_history`` ends
        with; not written to metrics.jsonl, which holds one row per logged step."""
        losses = self._train_losses
        seconds = max(seconds, 1e-9)
        samples = steps * self.args.completions_per_generation * self.dist.world_size
        return {
            "train_runtime": round(seconds, 4),
            "train_samples_per_second": round(samples / seconds, 3),
            "train_steps_per_second": round(steps / seconds, 3),
            "train_loss": sum(losses) / len(losses) if losses else math.nan,
            "epoch": self.state.epoch,
        }

    def _run_facts(self) -> dict[str, Any]:
        """What ``run.json`` records besides dates (``groupwise report`` shows it)."""
        from importlib.metadata import PackageNotFoundError, version

        try:
            release = version("groupwise")
        except PackageNotFoundError:  # a source checkout that was never installed
            release = "unknown"
        return {
            "groupwise_version": release,
            "device": str(self.device),
            "world_size": self.dist.world_size,
            "dtype": str(self.dtype).removeprefix("torch."),
            "precision": self.precision.name,
            "defaults": changed_defaults(GRPOConfig().to_dict(), self.args.to_dict()),
        }

    def _train_loop(self) -> None:
        args = self.args
        if self.eval_dataset is not None and args.eval_on_start and self.global_step == 0:
            self._evaluate_and_log(self.global_step)
        # A bar on a terminal; a line per logged step without one, or when stdout is a file.
        show_bar = console.show_bar(args.disable_tqdm, self.dist.is_main)
        step_lines = console.print_step_lines(show_bar, self.dist.is_main)
        bar = tqdm(
            total=args.max_steps,
            initial=self.global_step,
            desc=args.algorithm.upper(),
            disable=not show_bar,
            dynamic_ncols=True,
        )
        while self.global_step < args.max_steps:
            self._callback("on_step_begin")
            logs = self.train_step()
            step = self.global_step
            if math.isfinite(logs.get("loss", math.nan)):  # transformers skips nan/inf losses
                self._train_losses.append(float(logs["loss"]))
            self._callback("on_step_end")
            if step % args.logging_steps == 0 or step == args.max_steps:
                self._log(logs)
                if step_lines:
                    tqdm.write(console.step_line(logs, args.max_steps, self.reward_names))
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
            bar.set_postfix_str(self._progress_postfix(logs), refresh=False)
            bar.update(1)
            if (
                args.eval_steps
                and self.eval_dataset is not None
                and (step % args.eval_steps == 0)
                and step < args.max_steps
            ):
                metrics = self._evaluate_and_log(step)
                self._callback("on_evaluate", metrics=metrics)
            if (args.save_steps and step % args.save_steps == 0) or self.control.should_save:
                self.control.should_save = False
                self.save_checkpoint()
            if any_rank(self._stop_signal is not None, self.dist):
                bar.close()
                path = self.save_checkpoint()
                signum, self._stop_signal = self._stop_signal or signal.SIGTERM, None
                raise TrainingInterrupted(signum, path)
            if self.control.should_training_stop:  # a callback asked to stop
                break
        bar.close()
        if self.eval_dataset is not None and (args.eval_on_start or args.eval_steps):
            last = self.log_history[-1] if self.log_history else {}
            evaluated = any(key.startswith("eval/") for key in last)
            if not (last.get("step") == self.global_step and evaluated):
                self._evaluate_and_log(self.global_step)
        saved = (self.output_dir / f"checkpoint-{self.global_step}").exists()
        if args.save_steps and any_rank(not saved, self.dist):
            self.save_checkpoint()
        if self.dist.is_main or self.policy.sharded:  # FSDP: gathering is collective
            self.save_model(self.output_dir)
        barrier(self.dist)

    def _progress_postfix(self, logs: dict[str, float]) -> str:
        return console.progress_postfix(logs, self.reward_names, self.scorer.correctness_name)

    def _evaluate_and_log(self, step: int) -> dict[str, float]:
        """Evaluate, log the results and print them (on the main rank)."""
        metrics = self.evaluate()
        self._log({"step": step, **metrics})
        if self.dist.is_main:
            tqdm.write(console.eval_line(metrics, step))
        return metrics

    def save_model(self, path: str | Path | None = None, output_dir: str | None = None) -> Path:
        """Save model and tokenizer in Hugging Face format (``from_pretrained``-loadable; with
        LoRA the adapter, ``PeftModel.from_pretrained``-loadable).

        Files are written into a temporary folder first and then moved into place one by one
        (``os.replace`` is atomic), so a crash never leaves a truncated weights file.

        Under FSDP every rank must call it (the full weights are gathered); rank 0 writes.
        ``output_dir`` is TRL's name for ``path``."""
        path = path if path is not None else output_dir
        target = Path(path) if path is not None else self.output_dir
        weights = self.policy.full_state_dict()
        if not self.dist.is_main and self.policy.sharded:
            return target
        with staged_files(target) as tmp:
            self._save_weights(tmp, weights)
            self.tokenizer.save_pretrained(tmp)
        return target

    def _save_weights(self, folder: Path, weights: dict[str, torch.Tensor] | None) -> None:
        """The model (or LoRA adapter) in Hugging Face format, an adapter naming a base that
        groupwise can load (a built-in name, an absolute path or a hub id)."""
        with console.quiet_transformers_bars():  # no "Writing model shards" bar per save
            self.policy.save_pretrained(folder, weights)
        if self._adapter_base is not None:
            record_adapter_base(folder, self._adapter_base)


def _is_indexable(dataset: Any) -> bool:
    return hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")


def stream_prefix(dataset: Any, args: GRPOConfig, world_size: int) -> Any:
    """A training set without a length (a ``datasets.IterableDataset``, a generator of rows)
    as the rows training will draw: its first ``max_steps`` x prompts per step (every rank's)
    rows, read now, in stream order; training cycles over them when the stream is shorter. As in
    TRL, such a dataset needs ``max_steps``. A sized, indexable dataset is returned as is."""
    if _is_indexable(dataset) or not isinstance(dataset, Iterable) or isinstance(dataset, str):
        return dataset
    if args.max_steps < 1:
        raise ConfigError(
            f"train_dataset is a {type(dataset).__name__} (no length), so the number of steps "
            "cannot follow from num_train_epochs: set max_steps (as TRL requires)"
        )
    needed = args.max_steps * args.prompts_per_step * world_size
    return list(itertools.islice(iter(dataset), needed))


def materialize(dataset: Any) -> Any:
    """An evaluation set without a length (a ``datasets.IterableDataset``) as a list of its
    rows (evaluation reads every row); a sized, indexable one as is."""
    return dataset if _is_indexable(dataset) else list(dataset)


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


def _finite_or_none(value: torch.Tensor | float) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


def write_jsonl_atomic(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    atomic_write_text(path, "".join(json.dumps(row) + "\n" for row in rows))


def truncate_jsonl(path: Path, max_step: int) -> None:
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
    write_jsonl_atomic(path, kept)


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
