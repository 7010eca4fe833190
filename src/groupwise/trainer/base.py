"""Running a trainer: :class:`Trainer` and the services it owns.

:class:`Trainer` holds what GRPO and PPO share: the machine, model and tokenizer, the prompt
batches, the rewards, the policy and its rollout engine, and the services around a step. A
subclass writes ``train_step()``: :class:`groupwise.trainer.grpo.GRPOTrainer`,
:class:`groupwise.trainer.ppo.PPOTrainer`. The services, one module each:

- ``loop``: ``train()``'s loop and its cadence (when to log, evaluate, save, stop), the failure
  monitor, SIGINT/SIGTERM;
- ``metrics``: a step's outputs as the logged metric dict (``StepMetrics``, ``ComputeLedger``);
- ``records``: ``log_history``, metrics.jsonl, events.jsonl, completions.jsonl, the loggers;
- ``checkpoints``: saving the model and checkpoints, reading them back;
- ``evaluate``: what ``evaluate()`` computes on an evaluation set;
- ``trl_api``: the TRL / transformers surface (``train()``, ``evaluate()``, ``save_model()``,
  ``state``, callbacks, TRL's attribute names);
- ``datasets``: the checks a dataset must pass, streams read into rows.

The parts themselves are built from the options in one step,
:func:`groupwise.build.assemble.assemble`.

A checkpoint's training state is ``{component: component.state_dict()}`` plus the step, the
config, every rank's RNG state and the metrics so far (:meth:`Trainer.state_dict`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase, TrainerControl, TrainerState

from ..algo.advantages import informative_groups
from ..build.assemble import assemble
from ..build.model import build_model, resolve_device, resolve_run_precision
from ..build.rollout import build_interaction, environment_dataset
from ..config.grpo_config import GRPOConfig, default_output_dir
from ..curriculum import Curriculum
from ..errors import ConfigError
from ..policy.policy import optimizer_steps
from ..policy.update import UpdateStats
from ..rewards import RewardFunc, RewardModel
from ..rewards.scoring import Scores
from ..rollout import Rollout
from ..runtime.distributed import (
    DistributedContext,
    all_gather_objects,
    all_reduce_sum,
    init_distributed,
)
from ..runtime.models import adapter_base_name
from ..sections import Sections
from .checkpoints import Checkpoints, plain
from .datasets import check_dataset, check_eval_dataset, stream_prefix
from .metrics import ComputeLedger, StepMetrics
from .monitor import TrainingMonitor
from .records import RunRecords
from .trl_api import CallbackHandler, TRLSurface, trl_arguments

__all__ = ["PhaseTimer", "Trainer"]


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
    """The step's own clock, kept with the trainer whose ``train_step`` marks it. Wall time of
    a step's phases: ``mark(name)`` ends the phase begun at the previous mark
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


class Trainer(TRLSurface):
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
    ``optimizers`` (only ``(None, None)``), ``quantization_config`` (a
    ``transformers.BitsAndBytesConfig``: QLoRA's 4-bit base, as in ``model_init_kwargs``).
    TRL's positional order ``(model, reward_funcs, args, train_dataset)`` works too.

    Multi-turn rollouts (docs/tools.md): ``tools``, typed and documented Python
    functions (or built-in names) the model may call, as TRL's ``tools``; or
    ``environment_factory``, a callable returning one :class:`groupwise.tools.Environment` per
    conversation (``reset(row)``, ``step(message)``, ``state()``)."""

    # Why this trainer cannot run with its model sharded (FSDP2), or None when it can.
    sharding_refusal: str | None = None

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
        quantization_config: Any | None = None,
        peft_config: Any | None = None,
        tools: Sequence[Callable[..., Any] | str] | None = None,
        environment_factory: Callable[[], Any] | None = None,
    ) -> None:
        train_dataset, args = trl_arguments(
            model, train_dataset, args, optimizers, peft_config, self.default_args,
            quantization_config,
        )
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
        check_dataset(train_dataset, "train_dataset")
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
        if eval_dataset is not None:
            check_eval_dataset(eval_dataset, "eval_dataset")
        # The run's parts, built in one place from the options (groupwise.build.assemble).
        parts = assemble(
            args,
            model,
            self.tokenizer,
            device=self.device,
            precision=self.precision,
            dist=self.dist,
            train_dataset=train_dataset,
            reward_funcs=reward_funcs,
            reward_processing_classes=reward_processing_classes,
            interaction=self.interaction,
            environment_rewards=environments.reward_funcs if environments is not None else (),
        )
        self.options: Sections = parts.options
        self.scorer, self.policy, self.engine = parts.scorer, parts.policy, parts.engine
        self.generator, self.prompts = parts.generator, parts.prompts
        self.monitor = TrainingMonitor(self.options.monitor, self.scorer.correctness_name)
        self.curriculum: Curriculum = parts.curriculum
        # One pass over the prompts in steps (TrainerState.epoch); redone by train_dataset's setter
        self.steps_per_epoch = args.steps_per_epoch(len(self.prompts.dataset), self.dist.world_size)
        self.scorer.combine.trainer_state = lambda: self.state  # TRL's trainer_state kwarg
        # TRL's attribute: each reward function's tokenizer (a reward model's), else None.
        self.reward_processing_classes = [
            f.tokenizer if isinstance(f, RewardModel) else None for f in self.scorer.funcs
        ]
        self.eval_dataset = eval_dataset
        self.global_step = 0
        self.compute = ComputeLedger()  # tokens, rollouts, informative groups, optimizer steps
        self.output_dir = Path(args.output_dir)
        self.records = RunRecords(self.output_dir, self.dist, self.scorer.names, args.answer_column,
                                  keep_samples=args.log_completions)  # fmt: skip
        # A saved LoRA adapter names its base (None: PEFT's own record, from a loaded model).
        adapter_base = (
            adapter_base_name(given) if args.use_peft and isinstance(given, str) else None
        )
        self.checkpoints = Checkpoints(
            self.output_dir, self.dist, self.policy, self.tokenizer, adapter_base
        )
        self.step_metrics = StepMetrics(self.dist, self.scorer, self.policy, self.compute,
                                        self.compute_spent, args.num_generations,
                                        args.num_iterations)  # fmt: skip
        self.callback_handler = CallbackHandler(callbacks)
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

    def check_options(self, args: GRPOConfig, dist: DistributedContext) -> None:
        """Refuse option combinations this trainer cannot run, before anything is loaded."""
        if dist.enabled and args.data_parallel == "fsdp" and self.sharding_refusal:
            raise ConfigError(
                f"algorithm={args.algorithm} with data_parallel=fsdp is not supported: "
                f"{self.sharding_refusal} (use data_parallel=ddp)"
            )

    # -- what a train_step calls ------------------------------------------------------------------
    def train_step(self) -> dict[str, float]:
        raise NotImplementedError

    def score(
        self, rows: Sequence[dict[str, Any]], rollout: Rollout
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rewards [N] (weighted sum; NaN where every function returned None) and the per-function
        rewards [N, F] (NaN for None). Dataset columns reach the functions by name, as in TRL."""
        scores = self.scorer(rows, rollout)
        return scores.rewards, scores.per_func

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
        optimisation and timing, then ``extra`` blocks, averaged over ranks
        (:class:`~groupwise.trainer.metrics.StepMetrics`)."""
        return self.step_metrics(self.global_step, rollout, scores, stats, timer, extra,
                                 zero_std=zero_std, engine=self.engine)  # fmt: skip

    def evaluation_loss(
        self, rows: Sequence[dict[str, Any]], batch_size: int
    ) -> dict[str, float]:
        """TRL's ``eval_loss`` of the evaluation rows, where the algorithm has one (GRPO)."""
        return {}

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
        spent["optimizer_steps"] = optimizer_steps(self.options.batch, 1)
        return spent

    def completion_records(self, num_prompts: int | None = None) -> list[dict[str, Any]]:
        """The last step's first ``num_prompts`` prompts with all their completions, each with
        its reward, reward components and advantage, and the ground truth."""
        return self.records.completion_records(self.global_step, num_prompts)

    # -- records --------------------------------------------------------------------------------
    def _log(self, logs: dict[str, float]) -> None:
        """Log a row: log_history, the on_log callbacks, then metrics.jsonl and the loggers."""
        self.records.history.append(logs)
        self._callback("on_log", logs=dict(logs))
        self.records.write(logs, step=int(logs.get("step", self.global_step)))

    def _clear_earlier_run(self) -> None:
        """overwrite_output_dir: remove the earlier run in output_dir and say what went."""
        self.records.clear_earlier_run()

    @property
    def state(self) -> TrainerState:
        """A ``transformers.TrainerState`` of this run, up to date: global_step, max_steps,
        log_history (``self.log_history``'s rows with, as in transformers, the summary row each
        ``train()`` call added at its end: train_loss, train_runtime, ..., and the final step's
        metrics), epoch, ..."""
        state, args, per_epoch = self._state, self.args, self.steps_per_epoch
        state.global_step = self.global_step
        state.max_steps = args.max_steps
        history = list(self.records.history)
        for position, row in reversed(self.records.summaries):
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

    def state_dict(self) -> dict[str, Any]:
        """Everything but the model weights that a step depends on or that was logged."""
        state: dict[str, Any] = {
            "format": 1,
            "global_step": self.global_step,
            "config": self.args.to_dict(),
            "optimizer": self.policy.optimizer_state_dict(),
            "scheduler": self.policy.scheduler.state_dict(),
            # One entry per rank: each samples with its own generator.
            "rng": self.checkpoints.rng_states(self._generators()),
        }
        for name, component in self.components().items():
            value = component.state_dict()
            state[name] = plain(value) if value is not None else None
        state.update(plain(self.scorer.state_dict()))
        state["log_history"] = plain(self.log_history)
        state["extra"] = self.extra_state_dict()
        return state

    def save_checkpoint(self) -> Path:
        """Write ``checkpoint-<step>`` atomically and apply ``save_total_limit``."""
        # state_dict() is a collective under data parallel: every rank calls it
        path = self.checkpoints.save(
            self.global_step, self.state_dict(), self.args.save_total_limit
        )
        self._callback("on_save")
        return path

    def load_checkpoint(self, path: str | Path) -> None:
        """Restore the state saved by :meth:`save_checkpoint`, refusing a checkpoint whose config
        differs in options that change training, and cut the run's log files back to it."""
        path = Path(path)
        state = self.checkpoints.read(path, self.args.to_dict())  # the weights are loaded
        self.engine.sync(self.policy.model)  # an engine with its own weights (static, vLLM)
        self.policy.load_optimizer_state_dict(state["optimizer"])
        self.policy.scheduler.load_state_dict(state["scheduler"])
        for name, component in self.components().items():
            if state.get(name) is not None:
                component.load_state_dict(state[name])
        self.scorer.load_state_dict(state)
        self.load_extra_state_dict(state.get("extra", {}))
        notes = self.checkpoints.restore_rng(path, state["rng"], self._generators())
        self.global_step = int(state["global_step"])
        for note in notes:
            self.records.warn(self.global_step, "info", f"resuming {path.name}: {note}")
        self.records.rewind(self.global_step, list(state["log_history"]))
        tqdm.write(f"[groupwise] resumed from {path} at step {self.global_step}")
