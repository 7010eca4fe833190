"""The TRL / transformers surface of a trainer: what code written for ``trl.GRPOTrainer`` or
``transformers.Trainer`` reaches for.

:class:`TRLSurface` (a mixin of :class:`groupwise.trainer.base.Trainer`): ``train()`` returning
``TrainOutput``, ``evaluate()``, ``save_model()``, ``state`` (a ``TrainerState`` whose
``log_history`` ends with the end-of-training rows), callbacks and ``control``, and TRL's
attribute names for the trainer's parts (``model``, ``ref_model``, ``optimizer``,
``reward_funcs``, ``reward_processing_classes``, ``tools``, ...). :func:`trl_arguments` reads the
constructor's TRL forms (positional order, ``peft_config``, ``optimizers``). transformers'
post-training methods (``log_metrics``, ``save_metrics``, ``save_state``, ``accelerator``,
``create_model_card``, ``push_to_hub``, ``end``) with their Hugging Face meaning.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import PreTrainedModel, TrainerControl, TrainerState
from transformers.trainer_pt_utils import log_metrics, save_metrics, save_state
from transformers.trainer_utils import TrainOutput

from ..config.grpo_config import GRPOConfig
from ..config.trl import IgnoredOptionsWarning, ignored_message, model_init_changes
from ..errors import ConfigError
from ..rewards import RewardFunc
from ..runtime.models import is_peft_model
from .checkpoints import resume_argument
from .datasets import check_eval_dataset, materialize
from .evaluate import evaluation_metrics
from .hf_api import Accelerator, push_folder, write_model_card
from .loop import TrainingLoop

if TYPE_CHECKING:
    from ..policy.policy import Policy
    from ..rewards.scoring import RolloutScorer
    from ..rollout import RolloutEngine
    from ..runtime.distributed import DistributedContext


def trl_arguments(
    model: Any,
    train_dataset: Any,
    args: Any,
    optimizers: tuple[Any, Any],
    peft_config: Any,
    default_args: Callable[[], GRPOConfig],
    quantization_config: Any = None,
) -> tuple[Any, GRPOConfig]:
    """The training set and config from a constructor call in TRL's forms: TRL's positional
    order ``(model, reward_funcs, args, train_dataset)``, ``args`` left out (``default_args()``),
    a ``PeftModel`` or ``peft_config`` (LoRA as configured there, recorded in the config),
    ``quantization_config`` and ``args.model_init_kwargs`` assigned after the config was made
    (:func:`with_model_init_kwargs`), and ``optimizers``, refused unless ``(None, None)``."""
    if isinstance(train_dataset, GRPOConfig) and not isinstance(args, GRPOConfig):
        train_dataset, args = args, train_dataset  # TRL's order: (model, funcs, args, data)
    if tuple(optimizers) != (None, None):
        raise ConfigError(
            "optimizers: groupwise builds its own AdamW and schedule; pass (None, None) and "
            "set learning_rate, lr_scheduler_type, warmup_steps, weight_decay, adam_* instead"
        )
    if args is not None and not isinstance(args, GRPOConfig):
        raise TypeError(f"args must be a groupwise GRPOConfig, got {type(args).__name__}")
    args = with_model_init_kwargs(args or default_args(), quantization_config)
    if is_peft_model(model):  # TRL: a PeftModel trains its own adapter
        if peft_config is not None:
            raise ConfigError(
                "model is already a PeftModel (it has its adapter) and peft_config was also "
                "given; pass the base model with peft_config, or the PeftModel alone"
            )
        args = with_peft_config(args, model.peft_config[model.active_adapter])
    if peft_config is not None:
        args = with_peft_config(args, peft_config)
    return train_dataset, args


def with_model_init_kwargs(args: GRPOConfig, quantization_config: Any = None) -> GRPOConfig:
    """``args`` with TRL's model loading options applied: a ``model_init_kwargs`` assigned to
    the config after it was made (TRL's grpo.py does ``training_args.model_init_kwargs = ...``)
    and the trainer's ``quantization_config`` keyword (a ``BitsAndBytesConfig``, as TRL puts it
    in ``model_init_kwargs["quantization_config"]``), both read as ``GRPOConfig(
    model_init_kwargs=...)`` reads them (:func:`groupwise.config.trl.model_init_changes`)."""
    init = vars(args).get("model_init_kwargs")  # assigned after construction, else None
    if init is not None and not isinstance(init, Mapping):
        raise ConfigError(f"args.model_init_kwargs must be a mapping, got {init!r}")
    if quantization_config is not None:
        init = dict(init or {})
        if init.get("quantization_config") is not None:
            raise ConfigError(  # TRL refuses it too
                "quantization_config was given both to the trainer and in "
                "args.model_init_kwargs; give it once"
            )
        init["quantization_config"] = quantization_config
    if init is None:
        return args
    changes, ignored = model_init_changes(dict(init))
    # What TRL's grpo.py always sets is no news when it says what groupwise does anyway: unset
    # (None), the default revision, or the run's own option of that name.
    fields = GRPOConfig.field_names()
    ignored = {key: value for key, value in ignored.items()
               if value is not None and (key, value) != ("revision", "main")
               and not (key in fields and getattr(args, key) == value)}  # fmt: skip
    for name, value in changes.items():
        if args.is_set(name) and getattr(args, name) != value:
            raise ConfigError(
                f"model_init_kwargs' quantization_config means {name}={value!r}, but "
                f"{name}={getattr(args, name)!r} was also given"
            )
    if ignored:
        warnings.warn(ignored_message({"model_init_kwargs": ignored}), IgnoredOptionsWarning,
                      stacklevel=3)  # fmt: skip
    return args.replace(**changes) if changes else args


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
    return args.replace(
        use_peft=True,
        lora_r=int(peft_config.r),
        lora_alpha=int(peft_config.lora_alpha),
        lora_dropout=float(getattr(peft_config, "lora_dropout", 0.0)),
        lora_target_modules=recorded,
    )


class CallbackHandler:
    """``transformers.TrainerCallback``-like objects (or classes, instantiated here): an event
    calls the callbacks that have it with ``(args, state, control, **kwargs)``; a callback may
    return a new ``TrainerControl``."""

    def __init__(self, callbacks: Sequence[Any] | None) -> None:
        self.callbacks = [cb() if isinstance(cb, type) else cb for cb in callbacks or ()]

    def add(self, callback: Any) -> None:
        self.callbacks.append(callback() if isinstance(callback, type) else callback)

    def call(
        self,
        event: str,
        args: GRPOConfig,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> TrainerControl:
        """``event`` on every callback that has it; returns the control in force after them."""
        for callback in self.callbacks:
            method = getattr(callback, event, None)
            if method is None:
                continue
            result = method(args, state, control, **kwargs)
            if isinstance(result, TrainerControl):
                control = result
        return control


class TRLSurface:
    """TRL's and transformers' methods and attribute names on
    :class:`groupwise.trainer.base.Trainer`, over the parts its constructor built (``policy``,
    ``engine``, ``scorer``, ``prompts``, ``records``, ``checkpoints``, ``callback_handler``)."""

    # What the surface reads of the trainer it is mixed into (groupwise.trainer.base.Trainer).
    args: GRPOConfig
    dist: DistributedContext
    policy: Policy
    engine: RolloutEngine
    scorer: RolloutScorer
    global_step: int
    output_dir: Path
    device: torch.device

    # TRL's flag: whether the loss adds a Mixture-of-Experts model's router load-balancing loss
    # (then logged as aux_loss). groupwise trains on its policy loss alone, so never.
    aux_loss_enabled: bool = False

    def train(self, resume_from_checkpoint: bool | str | None = None) -> TrainOutput:
        """Run ``max_steps`` steps (continuing from a checkpoint when
        ``resume_from_checkpoint`` is set), logging to ``output_dir/metrics.jsonl``, evaluating
        every ``eval_steps`` and saving every ``save_steps``, on SIGINT/SIGTERM, and at the end
        (:class:`groupwise.trainer.loop.TrainingLoop`).

        Returns transformers' ``TrainOutput(global_step, training_loss, metrics)``, as TRL's
        trainer does: see :meth:`train_summary`. The per-step rows are ``self.log_history``.

        ``resume_from_checkpoint`` as in the Hugging Face Trainer: True continues from the
        newest checkpoint in output_dir, a path from that checkpoint; it replaces
        ``args.resume_from_checkpoint`` (None keeps it)."""
        if resume_from_checkpoint is not None:
            value = resume_argument(resume_from_checkpoint, self.output_dir)
            self.args = self.args.replace(resume_from_checkpoint=value)
        metrics = TrainingLoop(self).run()
        if self.args.use_peft and self.args.save_merged_model and self.dist.is_main:
            merged = copy.deepcopy(self.model).merge_and_unload()
            merged.save_pretrained(self.output_dir / "merged")
            self.tokenizer.save_pretrained(self.output_dir / "merged")
        return TrainOutput(self.global_step, metrics["train_loss"], metrics)

    def train_summary(
        self, seconds: float, steps: int, losses: Sequence[float]
    ) -> dict[str, float]:
        """transformers' end-of-training metrics of a ``train()`` call that ran ``steps`` steps
        in ``seconds`` with these finite per-step ``losses``: ``train_loss``, their mean (NaN
        when none ran), ``train_runtime``, ``train_samples_per_second`` (completions trained
        on, every rank's), ``train_steps_per_second`` and ``epoch``. The row
        ``state.log_history`` ends with; not written to metrics.jsonl, which holds one row per
        logged step."""
        seconds = max(seconds, 1e-9)
        samples = steps * self.args.completions_per_generation * self.dist.world_size
        return {
            "train_runtime": round(seconds, 4),
            "train_samples_per_second": round(samples / seconds, 3),
            "train_steps_per_second": round(steps / seconds, 3),
            "train_loss": sum(losses) / len(losses) if losses else math.nan,
            "epoch": self.state.epoch,
        }

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
        ``eval/<metric>``. The metrics: :func:`groupwise.trainer.evaluate.evaluation_metrics`."""
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
        check_eval_dataset(dataset, "eval_dataset")
        return evaluation_metrics(
            materialize(dataset),
            self.args,
            engine=self.engine,
            tokenizer=self.tokenizer,
            policy=self.policy,
            scorer=self.scorer,
            score=self.score,
            batch_size=batch_size,
            greedy=greedy,
            loss=self.evaluation_loss,
        )

    def save_model(
        self, path: str | Path | None = None, output_dir: str | None = None
    ) -> Path:
        """Save model and tokenizer in Hugging Face format (``from_pretrained``-loadable; with
        LoRA the adapter, ``PeftModel.from_pretrained``-loadable).

        Files are written into a temporary folder first and then moved into place one by one
        (``os.replace`` is atomic), so a crash never leaves a truncated weights file.

        Under FSDP every rank must call it (the full weights are gathered); rank 0 writes.
        ``output_dir`` is TRL's name for ``path``."""
        path = path if path is not None else output_dir
        return self.checkpoints.save_model(Path(path) if path is not None else self.output_dir)

    # -- transformers.Trainer's post-training methods ------------------------------------------
    # transformers.Trainer binds these functions of trainer_pt_utils the same way, so
    # {split}_results.json, all_results.json and trainer_state.json are the files it writes.
    log_metrics = log_metrics
    save_metrics = save_metrics
    save_state = save_state

    @property
    def accelerator(self) -> Accelerator:
        return Accelerator(self.dist, self.device)

    def is_world_process_zero(self) -> bool:
        return self.dist.is_main

    def is_local_process_zero(self) -> bool:
        return self.dist.local_rank == 0

    @property
    def hub_model_id(self) -> str:
        """TrainingArguments' ``hub_model_id``, else the output folder's name (transformers')."""
        return self.args.trl_ignored.get("hub_model_id") or self.output_dir.name

    def end(self) -> None:
        """transformers' ``Trainer.end()``: leave the process group at the end of a script."""
        self.accelerator.end_training()

    def create_model_card(
        self,
        model_name: str | None = None,
        dataset_name: str | None = None,
        tags: str | list[str] | None = None,
        **_: Any,
    ) -> Path | None:
        """``output_dir/README.md`` (main process; TRL's keyword names, the others accepted):
        :func:`groupwise.trainer.hf_api.write_model_card`."""
        if not self.is_world_process_zero():
            return None
        return write_model_card(self.args, self.output_dir, model_name, dataset_name, tags)

    def push_to_hub(self, commit_message: str = "End of training", **kwargs: Any) -> Any:
        """A model card from ``kwargs`` (as TRL), then ``output_dir`` uploaded to
        ``hub_model_id``; offline or unreachable, an error saying so."""
        if not self.is_world_process_zero():
            return None
        self.create_model_card(**kwargs)
        return push_folder(self.args, self.output_dir, self.hub_model_id, commit_message)

    # -- log history and callbacks ---------------------------------------------------------------
    @property
    def log_history(self) -> list[dict[str, float]]:
        """Every logged row: one per logged step, one per evaluation (metrics.jsonl's rows)."""
        return self.records.history

    @log_history.setter
    def log_history(self, rows: list[dict[str, float]]) -> None:
        self.records.history = rows

    @property
    def callbacks(self) -> list[Any]:
        return self.callback_handler.callbacks

    def add_callback(self, callback: Any) -> None:
        """Add a ``TrainerCallback``-like object (or class), as transformers' Trainer does."""
        self.callback_handler.add(callback)

    def _callback(self, event: str, **kwargs: Any) -> None:
        """Call ``event`` on every callback that has it, with transformers' arguments."""
        if not self.callback_handler.callbacks:  # the state is not built for nobody
            return
        self.control = self.callback_handler.call(
            event,
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

    # -- the components' parts users reach for (TRL's attribute names) -------------------------
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
        self.steps_per_epoch = self.args.steps_per_epoch(len(dataset), self.dist.world_size)

    @property
    def reward_funcs(self) -> list[RewardFunc]:
        return self.scorer.funcs

    @property
    def reward_names(self) -> list[str]:
        return self.scorer.names

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
