"""What code written for ``trl.GRPOTrainer`` or ``transformers.Trainer`` passes a trainer, read
in groupwise's terms: :func:`trl_arguments` reads the constructor's TRL forms (positional order,
``peft_config``, ``optimizers``, ``quantization_config``, ``model_init_kwargs`` assigned after
the config was made), :class:`CallbackHandler` calls transformers' callbacks, and
:func:`fill_trainer_state` gives a run's progress as a ``TrainerState``. The methods and
attribute names themselves are :class:`groupwise.trainer.base.Trainer`'s.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from transformers import TrainerControl, TrainerState

from ..config.grpo_config import GRPOConfig
from ..config.trl import IgnoredOptionsWarning, ignored_message, model_init_changes
from ..errors import ConfigError
from ..runtime.models import is_peft_model
from ..wiring.model import options_from_model


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
    # A model object: the records name it, and its own 4-bit quantisation is what trains.
    return train_dataset, options_from_model(args, model, train_dataset)


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
                f"model_init_kwargs means {name}={value!r}, but "
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


def fill_trainer_state(
    state: TrainerState,
    args: GRPOConfig,
    global_step: int,
    steps_per_epoch: int,
    history: list[dict[str, float]],
    summaries: Sequence[tuple[int, dict[str, float]]],
    rank: int,
    local_rank: int,
) -> TrainerState:
    """``state`` brought up to date with the run: global_step, max_steps, epoch, the logging
    cadence, the batch size, which process this is, and log_history: the logged rows with, as
    in transformers, the summary row each ``train()`` call added at its end (``summaries``:
    (position in the history, row))."""
    rows = list(history)
    for position, row in reversed(summaries):
        rows.insert(min(position, len(rows)), row)
    state.log_history = rows
    state.global_step = global_step
    state.max_steps = args.max_steps
    state.epoch = global_step / steps_per_epoch
    state.num_train_epochs = math.ceil(args.max_steps / steps_per_epoch)
    state.logging_steps = args.logging_steps
    state.save_steps = args.save_steps
    state.eval_steps = args.eval_steps
    state.train_batch_size = args.per_device_train_batch_size
    state.is_world_process_zero = rank == 0
    state.is_local_process_zero = local_rank == 0
    return state
