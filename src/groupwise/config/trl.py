"""TRL / Hugging Face ``TrainingArguments`` option names that a TRL GRPO script passes.

A TRL script builds ``GRPOConfig(...)`` with the usual ``TrainingArguments`` keywords. Here:

- Names that mean something in groupwise are translated (:func:`translate_trl_options`):
  ``use_cpu`` -> ``device="cpu"``; ``bf16`` -> ``bf16_autocast`` (fp32 weights with bf16
  autocast, as in TRL and the HF Trainer; None: auto, on with a bf16 GPU);
  ``fp16=True`` is refused (groupwise has no fp16 loss scaling); ``optim`` is a real field
  (torch's AdamW or bitsandbytes' 8-bit / paged AdamW); ``model_init_kwargs``'
  ``quantization_config`` (a ``BitsAndBytesConfig`` or its dict) sets QLoRA's ``load_in_4bit``,
  ``bnb_4bit_quant_type`` and ``use_bnb_nested_quant``, its other keys are ignored, as
  before (groupwise places and types the model itself); ``warmup_steps`` below 1 is a
  ratio (transformers 5's meaning) and becomes ``warmup_ratio``; ``num_train_epochs`` without
  ``max_steps`` sets ``max_steps=-1`` (TRL's "train for num_train_epochs"); ``save_strategy=
  "steps"`` without ``save_steps`` saves every 500 steps and ``eval_strategy="steps"`` without
  ``eval_steps`` evaluates every ``logging_steps`` (TrainingArguments' defaults);
  ``max_tool_calling_iterations=N`` (tool rounds) is ``max_turns=N + 1``;
  ``use_vllm=True`` -> ``generation_engine="vllm"`` (the colocated vLLM engine; the ``vllm_*``
  options of colocate mode are real fields, server mode is refused), and an explicit
  ``use_vllm=False`` (TRL: transformers' own generation) -> ``"hf"`` unless the engine is given;
  ``scale_rewards=True`` / ``False`` (TRL's booleans) are ``"group"`` / ``"none"``;
  ``lr_scheduler_type="constant_with_warmup"`` is groupwise's ``constant`` (which warms up over
  ``warmup_steps``); transformers' enums (``SchedulerType.COSINE``, ...) are read as their values.
  ``num_train_epochs``, ``warmup_ratio``, ``adam_epsilon``, ``save_strategy``, ``eval_strategy``,
  ``per_device_eval_batch_size`` and ``trust_remote_code`` are real ``GRPOConfig`` fields.
- Names in :data:`TRL_IGNORED` (TRL 1.16's GRPOConfig fields with no meaning in groupwise, and
  a few older TrainingArguments names) are accepted, kept out of the config's fields (so
  ``to_dict()``, ``config.yaml`` and checkpoint comparison never see them) and reported once,
  in one :class:`IgnoredOptionsWarning` listing every such name the caller passed.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

from ..errors import ConfigError


class IgnoredOptionsWarning(UserWarning):
    """TRL options that were accepted but have no effect in groupwise."""


# TRL-only names that groupwise translates (not fields of GRPOConfig), with their types for
# YAML / command-line coercion.
TRL_TRANSLATED: dict[str, Any] = {
    "use_cpu": bool,
    "bf16": bool | None,
    "fp16": bool,
    "model_init_kwargs": dict[str, Any] | None,  # quantization_config: load_in_4bit, ...
    "max_tool_calling_iterations": int | None,  # tool rounds: max_turns = N + 1
    "use_vllm": bool,  # True: generation_engine = "vllm"; False: "hf" (unless given)
    "vllm_importance_sampling_correction": bool,  # rollout_correction
    "vllm_importance_sampling_mode": str,  # rollout_correction_mode
    "vllm_importance_sampling_clip_max": float | None,  # rollout_correction_clip_max
    "vllm_importance_sampling_cap": float | None,  # rollout_correction_clip_max
    "vllm_importance_sampling_clip_min": float | None,  # rollout_correction_clip_min
}

# TRL 1.16 GRPOConfig fields that have no meaning in groupwise (one optimizer, no hub, no vLLM
# server, no DeepSpeed/accelerate, no Liger kernels, ...), plus
# older TrainingArguments names still common in scripts (logging_dir). overwrite_output_dir is
# a real option here (an earlier run in output_dir is refused without it).
TRL_IGNORED: frozenset[str] = frozenset(
    (
        "accelerator_config",
        "activation_checkpointing",
        "activation_checkpointing_kwargs",
        "average_tokens_across_devices",
        "batch_eval_metrics",
        "bf16_full_eval",
        "cache_implementation",
        "cast_lm_head_to_fp32",
        "dataloader_drop_last",
        "dataloader_in_order",
        "dataloader_multiprocessing_context",
        "dataloader_num_workers",
        "dataloader_persistent_workers",
        "dataloader_pin_memory",
        "dataloader_prefetch_factor",
        "ddp_backend",
        "ddp_broadcast_buffers",
        "ddp_bucket_cap_mb",
        "ddp_find_unused_parameters",
        "ddp_static_graph",
        "ddp_timeout",
        "debug",
        "deepspeed",
        "do_eval",
        "do_predict",
        "do_train",
        "ds3_gather_for_generation",
        "enable_jit_checkpoint",
        "eval_accumulation_steps",
        "eval_delay",
        "eval_do_concat_batches",
        "eval_use_gather_object",
        "fp16_full_eval",
        "fsdp",
        "fsdp_config",
        "full_determinism",
        "gradient_checkpointing_kwargs",
        "greater_is_better",
        "hub_always_push",
        "hub_model_id",
        "hub_private_repo",
        "hub_revision",
        "hub_strategy",
        "hub_token",
        "ignore_data_skip",
        "include_for_metrics",
        "include_num_input_tokens_seen",
        "label_names",
        "length_column_name",
        "label_smoothing_factor",
        "liger_kernel_config",
        "local_rank",
        "log_completions_hub_repo",
        "log_level",
        "log_level_replica",
        "log_multimodal",
        "log_on_each_node",
        "log_unique_prompts",
        "logging_dir",
        "logging_first_step",
        "logging_nan_inf_filter",
        "logging_strategy",
        "metric_for_best_model",
        "num_generations_eval",
        "pad_to_multiple_of",
        "parallelism_config",
        "prediction_loss_only",
        "project",
        "push_to_hub",
        "remove_unused_columns",
        "restore_callback_states_from_checkpoint",
        "router_aux_loss_coef",
        "run_name",
        "save_on_each_node",
        "save_only_model",
        "skip_memory_metrics",
        "torch_compile",
        "torch_compile_backend",
        "torch_compile_mode",
        "torch_empty_cache_steps",
        "trackio_bucket_id",
        "trackio_space_id",
        "trackio_static_space_id",
        "train_sampling_strategy",
        "transformers_continuous_batching_config",
        "use_cache",
        "use_liger_kernel",
        "use_transformers_continuous_batching",
        "use_transformers_paged",
        "vllm_group_port",
        "vllm_model_impl",
        "vllm_server_base_url",
        "vllm_server_host",
        "vllm_server_port",
        "vllm_server_timeout",
    )
)

_LOG_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}


def _process_log_level(config: Any) -> Callable[[], int]:
    """TrainingArguments' ``get_process_log_level()``: ``log_level`` on each machine's first
    process (transformers' own verbosity while "passive", its default), ``log_level_replica``
    ("warning" by default) on the others."""

    def get_process_log_level() -> int:
        import os

        from transformers.utils import logging as hf_logging

        first = int(os.environ.get("LOCAL_RANK", "0")) == 0
        name = (config.trl_ignored.get("log_level", "passive") if first
                else config.trl_ignored.get("log_level_replica", "warning"))  # fmt: skip
        return _LOG_LEVELS.get(name, hf_logging.get_verbosity())

    return get_process_log_level


def _n_gpu(config: Any) -> int:
    """TrainingArguments' ``n_gpu``: GPUs this process uses; groupwise uses one per process."""
    import torch

    return int(config.device != "cpu" and torch.cuda.is_available())


# TRL's translated names as a script reads them back from its config (training_args.bf16, ...).
TRL_VIEWS: dict[str, Callable[[Any], Any]] = {
    "get_process_log_level": _process_log_level,  # open-r1 sets its loggers' level with it
    "n_gpu": _n_gpu,
    "bf16": lambda config: config.bf16_autocast,  # None: auto (on with a bf16 GPU)
    "fp16": lambda config: False,  # fp16=True is refused
    "use_cpu": lambda config: config.device == "cpu",
    "use_vllm": lambda config: config.generation_engine == "vllm",
}

# TrainingArguments' / TRL's defaults of names scripts read back when they were not given:
# TRL's grpo.py reads model_init_kwargs and push_to_hub, open-r1 local_rank and do_eval.
TRL_DEFAULTS: dict[str, Any] = {
    "model_init_kwargs": None,
    "push_to_hub": False,
    "hub_model_id": None,
    "local_rank": -1,
    "do_train": False,
    "do_eval": False,
    "do_predict": False,
    "run_name": None,
    "logging_dir": None,
}

# TRL options that change what is trained and that groupwise does not implement: accepted at
# the value that means "off" (groupwise's behaviour, reported with the ignored ones), refused
# with the reason otherwise. name -> (the values that mean off, why another is refused).
TRL_REFUSED: dict[str, tuple[tuple[Any, ...], str]] = {
    "auto_find_batch_size": ((False,), "the batch arithmetic is fixed by the options given"),
    "data_seed": ((None,), "the data order follows seed (one seed for data and sampling)"),
    "disable_dropout": ((False,), "dropout stays as the model configures it"),
    "load_best_model_at_end": ((False,), "the final weights are the last step's"),
    "lr_scheduler_kwargs": ((None, {}), "the schedules (constant, linear, cosine) take no options"),
    "neftune_noise_alpha": ((None,), "no NEFTune noise is added to the embeddings"),
    "optim_args": ((None, ""), "AdamW is configured by adam_beta1, adam_beta2, adam_epsilon"),
    "optim_target_modules": ((None,), "every trainable parameter gets the same AdamW"),
    "vllm_structured_outputs_regex": ((None,), "generation is never constrained by a regex"),
}

# TRL's generation_kwargs keys that groupwise's engines apply, and the option each sets.
GENERATION_KWARGS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
}

# generate() options the hf engine sets itself, each with why a generation_kwargs value for it
# is refused.
ENGINE_OWNED = {
    "num_return_sequences": "each completion is its own row; num_generations sets the group",
    "max_length": "max_completion_length (TRL: max_new_tokens) bounds the completion",
    "eos_token_id": "a completion ends at the tokenizer's and the model's EOS ids",
    "pad_token_id": "completions are padded with the tokenizer's pad_token_id",
    "return_dict_in_generate": "the engine reads only the token ids generate() returns",
    "output_scores": "the engine reads only the token ids generate() returns",
    "output_logits": "the engine reads only the token ids generate() returns",
    "output_attentions": "the engine reads only the token ids generate() returns",
    "output_hidden_states": "the engine reads only the token ids generate() returns",
    "stop_strings": "a completion ends at EOS (a stop string would end it without one)",
}

# TRL's vLLM importance-sampling options: groupwise's rollout correction (every engine whose
# numerics differ from the trainer's, vLLM included).
_ROLLOUT_CORRECTION = {
    "vllm_importance_sampling_correction": "rollout_correction",
    "vllm_importance_sampling_mode": "rollout_correction_mode",
    "vllm_importance_sampling_clip_max": "rollout_correction_clip_max",
    "vllm_importance_sampling_cap": "rollout_correction_clip_max",  # TRL's older name
    "vllm_importance_sampling_clip_min": "rollout_correction_clip_min",
}

_DEFAULT_SAVE_STEPS = 500  # TrainingArguments' save_steps
_ENUMS = ("lr_scheduler_type", "save_strategy", "eval_strategy", "optim")
# Options that TRL allows to be None ("unset") where groupwise has a value.
_NONE_IS_DEFAULT = (
    "eval_steps",
    "num_generations",
    "max_completion_length",
    "num_completions_to_print",
    "disable_tqdm",
    "tf32",
    "shuffle_dataset",
)


def is_trl_name(name: str) -> bool:
    return name in TRL_IGNORED or name in TRL_TRANSLATED or name in TRL_REFUSED


def _refuse_training_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Take the :data:`TRL_REFUSED` names out of ``kwargs``: those at their "off" value are
    returned (to be reported as ignored), any other value is refused naming the option."""
    import yaml

    off = {}
    for name in sorted(set(kwargs) & set(TRL_REFUSED)):
        value = kwargs.pop(name)
        allowed, why = TRL_REFUSED[name]
        parsed = yaml.safe_load(value) if isinstance(value, str) and value else value
        if parsed not in allowed:
            raise ConfigError(
                f"{name}={value!r} is not supported: it changes training and groupwise does not "
                f"implement it ({why}); leave it unset"
            )
        off[name] = value
    return off


def _generation_kwargs(kwargs: dict[str, Any]) -> None:
    """TRL's ``generation_kwargs`` (options of transformers' ``generate()``): the sampling keys
    the engines apply set the matching options (overriding them, as in TRL); ``do_sample=True``
    is what groupwise does anyway; the other ``GenerationConfig`` options stay in
    ``generation_kwargs``, which the hf engine hands to ``generate()``. A key that is no
    ``GenerationConfig`` option, or one the engine sets itself, is refused, naming it."""
    extra = kwargs.pop("generation_kwargs", None) or {}
    if not isinstance(extra, dict):
        raise ConfigError(f"generation_kwargs must be a mapping, got {extra!r}")
    rest: dict[str, Any] = {}
    for key, value in extra.items():
        if key in GENERATION_KWARGS:
            kwargs[GENERATION_KWARGS[key]] = value
        elif key == "do_sample":
            if not value:
                raise ConfigError(
                    f"generation_kwargs['do_sample']={value!r} is not supported: a group's "
                    "completions must be sampled to differ (GRPO compares them); for greedy "
                    "decoding set temperature=0"
                )
        elif key == "max_new_tokens" or key == "max_tokens":
            kwargs["max_completion_length"] = value
        elif key in ENGINE_OWNED:
            raise ConfigError(
                f"generation_kwargs[{key!r}]={value!r} is not supported: {ENGINE_OWNED[key]}"
            )
        else:
            rest[key] = value
    if rest:
        _check_generation_config(rest)
        kwargs["generation_kwargs"] = rest


def _check_generation_config(options: dict[str, Any]) -> None:
    """Every key a ``transformers.GenerationConfig`` option and the values accepted by its
    ``validate()``."""
    from transformers import GenerationConfig

    known = set(GenerationConfig().to_dict()) - {"transformers_version"}
    for key, value in options.items():
        if key not in known:
            raise ConfigError(
                f"generation_kwargs[{key!r}]={value!r} is not supported: {key!r} is not an "
                "option of transformers' GenerationConfig (generate() would not apply it); the "
                f"sampling keys are {', '.join(GENERATION_KWARGS)}"
            )
    try:
        GenerationConfig(**options).validate()
    except ValueError as err:
        raise ConfigError(f"generation_kwargs {options!r}: {err}") from None


def _set(kwargs: dict[str, Any], name: str, value: Any, because: str) -> None:
    """``kwargs[name] = value`` unless the caller set ``name`` to something else."""
    if name in kwargs and kwargs[name] != value:
        raise ConfigError(
            f"{because} means {name}={value!r}, but {name}={kwargs[name]!r} was also given"
        )
    kwargs[name] = value


# A BitsAndBytesConfig's keys -> (groupwise's option, or None: only the value that groupwise
# does anyway is accepted) for QLoRA's 4-bit base. The compute dtype is the run's own
# (runtime.quantization.compute_dtype), so bnb_4bit_compute_dtype is not read.
_QUANTIZATION_KEYS = {
    "load_in_4bit": "load_in_4bit",
    "bnb_4bit_quant_type": "bnb_4bit_quant_type",
    "bnb_4bit_use_double_quant": "use_bnb_nested_quant",
}
_QUANTIZATION_FIXED = {  # key: (the values groupwise accepts, why)
    "load_in_8bit": ((False, None), "an 8-bit base is not supported; use load_in_4bit"),
    "bnb_4bit_quant_storage": ((None, "uint8", "torch.uint8"), "4-bit weights are stored as uint8"),
    "llm_int8_skip_modules": ((None,), "every linear layer but the LM head is quantised"),
}


def _model_init_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """TRL's ``model_init_kwargs``: its ``quantization_config`` (transformers'
    ``BitsAndBytesConfig`` or its ``to_dict()``) sets the 4-bit options; the other keys are
    returned, to be reported as ignored."""
    init = kwargs.pop("model_init_kwargs", None)
    if init is None:
        return {}
    if not isinstance(init, dict):
        raise ConfigError(f"model_init_kwargs must be a mapping, got {init!r}")
    init = dict(init)
    quant = init.pop("quantization_config", None)
    if quant is not None:
        if hasattr(quant, "to_dict"):  # a BitsAndBytesConfig
            quant = quant.to_dict()
        if not isinstance(quant, dict):
            raise ConfigError(
                "model_init_kwargs['quantization_config'] must be a transformers "
                f"BitsAndBytesConfig or a mapping, got {quant!r}"
            )
        method = quant.get("quant_method", "bitsandbytes")
        if str(getattr(method, "value", method)) != "bitsandbytes":
            raise ConfigError(
                f"model_init_kwargs['quantization_config'] uses quant_method={method!r}; "
                "groupwise quantises through bitsandbytes only (BitsAndBytesConfig)"
            )
        for key, (allowed, why) in _QUANTIZATION_FIXED.items():
            value = quant.get(key)
            if str(value) not in map(str, allowed):
                raise ConfigError(
                    f"model_init_kwargs['quantization_config'] {key}={value!r} is not "
                    f"supported: {why}"
                )
        for key, name in _QUANTIZATION_KEYS.items():
            if key in quant:
                _set(kwargs, name, quant[key], f"quantization_config {key}={quant[key]!r}")
    return {"model_init_kwargs": init} if init else {}


def model_init_changes(init: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """TRL's ``model_init_kwargs`` given after the config was made (TRL's grpo.py assigns
    ``training_args.model_init_kwargs``), read as at construction: ``(options its
    quantization_config sets, the other keys, ignored)``."""
    changes: dict[str, Any] = {"model_init_kwargs": init}
    rest = _model_init_kwargs(changes).get("model_init_kwargs", {})
    changes.pop("model_init_kwargs", None)
    return changes, rest


def translate_trl_options(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``GRPOConfig`` keyword arguments with TRL names translated (see the module docstring),
    and the ignored ones ``{name: value}`` taken out."""
    kwargs = dict(kwargs)
    ignored = {name: kwargs.pop(name) for name in sorted(kwargs) if name in TRL_IGNORED}
    ignored.update(_refuse_training_options(kwargs))
    _generation_kwargs(kwargs)
    ignored.update(_model_init_kwargs(kwargs))
    for trl_name, name in _ROLLOUT_CORRECTION.items():
        if trl_name in kwargs:
            value = kwargs.pop(trl_name)
            if trl_name != "vllm_importance_sampling_cap" or value is not None:
                _set(kwargs, name, value, f"{trl_name}={value!r}")
    for name in _ENUMS:  # transformers' SchedulerType / IntervalStrategy enums -> their value
        if hasattr(kwargs.get(name), "value"):
            kwargs[name] = kwargs[name].value
    scale = kwargs.get("scale_rewards")
    if isinstance(scale, str) and scale.lower() in ("true", "false"):
        scale = scale.lower() == "true"
    if isinstance(scale, bool):  # TRL's booleans: True is "group", False is "none"
        kwargs["scale_rewards"] = "group" if scale else "none"
    if kwargs.get("lr_scheduler_type") == "constant_with_warmup":  # groupwise's constant warms up
        kwargs["lr_scheduler_type"] = "constant"
    if kwargs.pop("use_cpu", False):
        _set(kwargs, "device", "cpu", "use_cpu=True")
    if kwargs.pop("fp16", False):
        where = " on CPU (use_cpu=True)" if kwargs.get("device") == "cpu" else ""
        raise ConfigError(
            f"fp16=True is not supported{where}: groupwise trains in float32 or bfloat16 "
            "(no fp16 loss scaling); use bf16=True on a GPU with bfloat16, or bf16=False"
        )
    # TrainingArguments' bf16 is mixed precision: fp32 weights, bf16 autocast. Pure bf16 weights
    # (groupwise's dtype: bfloat16) are never what a TRL script asked for.
    bf16 = kwargs.pop("bf16", None)
    if bf16 is not None:
        _set(kwargs, "bf16_autocast", bool(bf16), f"bf16={bf16}")
    if "use_vllm" in kwargs and not kwargs["use_vllm"]:  # TRL: transformers' own generation
        kwargs.setdefault("generation_engine", "hf")
    if kwargs.pop("use_vllm", False):
        _set(kwargs, "generation_engine", "vllm", "use_vllm=True")
    if "max_tool_calling_iterations" in kwargs:
        rounds = kwargs.pop("max_tool_calling_iterations")
        if rounds is not None:  # None (TRL: no limit) keeps max_turns
            _set(kwargs, "max_turns", int(rounds) + 1, f"max_tool_calling_iterations={rounds}")
    warmup = kwargs.get("warmup_steps")
    if isinstance(warmup, str):
        try:
            warmup = float(warmup)
        except ValueError:
            pass
    if isinstance(warmup, float) and 0 < warmup < 1:  # transformers 5: a ratio of max_steps
        del kwargs["warmup_steps"]
        _set(kwargs, "warmup_ratio", warmup, f"warmup_steps={warmup} (< 1: a ratio)")
    if "num_train_epochs" in kwargs and "max_steps" not in kwargs:
        kwargs["max_steps"] = -1
    if kwargs.get("save_strategy") == "steps" and "save_steps" not in kwargs:
        kwargs["save_steps"] = _DEFAULT_SAVE_STEPS
    if kwargs.get("eval_strategy") == "steps" and kwargs.get("eval_steps") is None:
        kwargs["eval_steps"] = kwargs.get("logging_steps", 1)
    for name in _NONE_IS_DEFAULT:  # TRL's "unset"; groupwise's default applies
        if name in kwargs and kwargs[name] is None:
            del kwargs[name]
    return kwargs, ignored


def normalise_report_to(value: Any) -> list[str]:
    """TRL's ``report_to``, held as transformers' ``TrainingArguments`` holds it, a list (so a
    script's ``"wandb" in training_args.report_to`` works): None, "none" or a list holding it
    -> []; "all" -> the installed ones of tensorboard and wandb; a single name -> a list."""
    if value is None:
        return []
    names = [value] if isinstance(value, str) else list(value)
    if "none" in names:
        return []
    if "all" in names:
        return [n for n in ("tensorboard", "wandb") if importlib.util.find_spec(n) is not None]
    return names


def ignored_message(ignored: dict[str, Any]) -> str:
    listed = ", ".join(f"{name}={value!r}" for name, value in ignored.items())
    return (
        f"groupwise accepted these TRL options but ignores them (no meaning here; "
        f"docs/trl.md): {listed}"
    )
