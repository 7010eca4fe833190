"""TRL / Hugging Face ``TrainingArguments`` option names that a TRL GRPO script passes.

A TRL script builds ``GRPOConfig(...)`` with the usual ``TrainingArguments`` keywords. Here:

- Names that mean something in groupwise are translated (:func:`translate_trl_options`):
  ``use_cpu`` -> ``device="cpu"``; ``bf16`` -> ``bf16_autocast`` (fp32 weights with bf16
  autocast, as in TRL and the HF Trainer; None: auto, on with a bf16 GPU);
  ``fp16=True`` is refused (groupwise has no fp16 loss scaling); ``optim`` is a real field
  (torch's AdamW or bitsandbytes' 8-bit / paged AdamW); ``model_init_kwargs``'
  ``quantization_config`` (a ``BitsAndBytesConfig`` or its dict) sets QLoRA's ``load_in_4bit``,
  ``bnb_4bit_quant_type`` and ``use_bnb_nested_quant``, its ``dtype`` / ``torch_dtype``
  (float32, bfloat16: the trained weights' dtype, as TRL loads them), ``attn_implementation``
  and ``trust_remote_code`` set those options, its other keys are ignored (groupwise places the
  model itself); ``warmup_steps`` below 1 is a
  ratio (transformers 5's meaning) and becomes ``warmup_ratio``; ``num_train_epochs`` without
  ``max_steps`` sets ``max_steps=-1`` (TRL's "train for num_train_epochs"); ``save_strategy=
  "steps"`` without ``save_steps`` saves every 500 steps and ``eval_strategy="steps"`` without
  ``eval_steps`` evaluates every ``logging_steps`` (TrainingArguments' defaults);
  ``max_tool_calling_iterations=N`` (tool rounds) is ``max_turns=N + 1``;
  ``activation_checkpointing`` (transformers 5's name) is ``gradient_checkpointing``, and the
  ``offload`` key of its kwargs (``activation_checkpointing_kwargs``, or the older
  ``gradient_checkpointing_kwargs``) is ``activation_offloading``;
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
- Names in :data:`TRL_REFUSED` are accepted only at their "off" value; any other value is a
  :class:`~groupwise.errors.ConfigError` naming the option.
- Dict options given as JSON strings are parsed as TRL parses them (``chat_template_kwargs``,
  ``generation_kwargs``, ``model_init_kwargs`` must then be a JSON object).
- ``logging_steps``, ``save_steps`` and ``eval_steps`` below 1 are ratios of ``max_steps``
  (transformers' meaning), made step counts by ``GRPOConfig.for_dataset``.
- Every TRL name reads back (``GRPOConfig.__getattr__``): the value given, its translation
  (:data:`~groupwise.config.trl_readback.TRL_VIEWS`), or TRL's default
  (:data:`~groupwise.config.trl_readback.TRL_DEFAULTS`); so do TrainingArguments' runtime
  properties (``world_size``, ``should_save``, ``main_process_first()``, ...) for one
  process per rank. A TRL name set after construction is read as at construction
  (:func:`set_trl_option`).
"""

from __future__ import annotations

import importlib.util
import json
import math
import warnings
from typing import Any

from ..errors import ConfigError


class IgnoredOptionsWarning(UserWarning):
    """TRL options that were accepted but have no effect in groupwise."""


# TRL-only names that groupwise translates (not fields of GRPOConfig), with their types for
# YAML / command-line coercion.
TRL_TRANSLATED: dict[str, Any] = {
    "activation_checkpointing": bool | None,  # gradient_checkpointing
    "activation_checkpointing_kwargs": dict[str, Any] | str | None,  # offload, every_n_layers
    "gradient_checkpointing_kwargs": dict[str, Any] | str | None,  # its older name
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
        "vllm_model_impl",
    )
)

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

# Cadences that below 1 are a ratio of the run's optimizer steps, ceil(max_steps * ratio)
# (transformers' TrainerState.compute_steps), resolved once max_steps is known.
STEP_RATIO_OPTIONS = ("logging_steps", "save_steps", "eval_steps")


def step_cadence(name: str, value: Any) -> Any:
    """A cadence option's value: an integer count of steps (a whole float becomes one), or a
    ratio in (0, 1); a non-integer of 1 or more is refused, as TrainingArguments refuses it."""
    if isinstance(value, float) and not math.isnan(value):
        if value >= 1 or value == 0:
            if not value.is_integer():
                raise ConfigError(
                    f"{name} must be an integer number of steps, or a ratio of max_steps below 1 "
                    f"(e.g. 0.25: every quarter of the run), got {value}"
                )
            return int(value)
    return value


def resolve_step_ratio(value: Any, max_steps: int) -> Any:
    """A ratio cadence as steps of a run of ``max_steps``; a step count unchanged."""
    if isinstance(value, float) and 0 < value < 1 and max_steps > 0:
        return math.ceil(max_steps * value)
    return value
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


# TRL's (and TrainingArguments') dict options it reads from a string starting with "{" as JSON
# (its _VALID_DICT_FIELDS; another string is a file path there, e.g. a DeepSpeed config).
_JSON_DICT_OPTIONS = (
    "accelerator_config",
    "fsdp_config",
    "deepspeed",
    "activation_checkpointing_kwargs",
    "gradient_checkpointing_kwargs",
    "transformers_continuous_batching_config",
)
# Dict options groupwise applies: a string must be a JSON object (no file path is read).
_JSON_ONLY_OPTIONS = ("chat_template_kwargs", "generation_kwargs", "model_init_kwargs")


def _convert_str_values(values: dict[str, Any]) -> dict[str, Any]:
    """transformers' ``_convert_str_dict``: string values "true" / "false" / digits in a parsed
    JSON dict become bools and numbers, nested dicts too."""
    for key, value in values.items():
        if isinstance(value, dict):
            values[key] = _convert_str_values(value)
        elif isinstance(value, str):
            if value.lower() in ("true", "false"):
                values[key] = value.lower() == "true"
            elif value.isdigit():
                values[key] = int(value)
            elif value.replace(".", "", 1).isdigit():
                values[key] = float(value)
    return values


def _json_dicts(kwargs: dict[str, Any]) -> None:
    """TRL's dict options given as JSON strings (a script's ``chat_template_kwargs='{...}'``,
    the command line's ``--deepspeed '{...}'``) parsed in place, as TRL parses them."""
    for name in (*_JSON_DICT_OPTIONS, *_JSON_ONLY_OPTIONS):
        value = kwargs.get(name)
        if not isinstance(value, str) or (name in _JSON_DICT_OPTIONS and not value.startswith("{")):
            continue
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as err:
            raise ConfigError(
                f"{name} must be a mapping: {value!r} is not a JSON object ({err}); give a "
                "dict, or its JSON text such as '{\"key\": value}'"
            ) from None
        if not isinstance(parsed, dict):
            raise ConfigError(f"{name} expects a mapping (a JSON object), got {value!r}")
        kwargs[name] = _convert_str_values(parsed)


def _command_line_value(value: Any) -> Any:
    """A refused option's value as a YAML scalar when it is a string (the command line gives
    strings: "null", "false", "{}"); a string YAML cannot read stays the string."""
    import yaml

    if not isinstance(value, str):
        return value
    if value.strip().lower() in ("", "none", "null"):
        return None
    try:
        return yaml.safe_load(value)
    except yaml.YAMLError:  # e.g. a regex such as "[0-9]+": no "off" value, refused below
        return value


def _refuse_training_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Take the :data:`TRL_REFUSED` names out of ``kwargs``: those at their "off" value are
    returned (to be reported as ignored), any other value is refused naming the option."""
    off = {}
    for name in sorted(set(kwargs) & set(TRL_REFUSED)):
        value = kwargs.pop(name)
        allowed, why = TRL_REFUSED[name]
        if _command_line_value(value) not in allowed:
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


# model_init_kwargs' dtype (a torch.dtype or its name) -> groupwise's dtype: the trained weights'
# dtype, as TRL's from_pretrained(dtype=...) gives it. "auto" (the checkpoint's dtype) and None
# change nothing here.
_INIT_DTYPES = {"float32": "float32", "bfloat16": "bfloat16"}


_MODEL_LOADING_KEYS = ("torch_dtype", "dtype", "attn_implementation", "trust_remote_code")


def _model_loading(init: dict[str, Any], kwargs: dict[str, Any]) -> None:
    """``model_init_kwargs``' ``dtype`` (or ``torch_dtype``), ``attn_implementation`` and
    ``trust_remote_code``, which TRL hands to ``from_pretrained``, set groupwise's options of
    the same meaning. ``dtype="auto"`` sets nothing (groupwise does not read the checkpoint's
    dtype; reported as ignored, :func:`unapplied_model_init_kwargs`)."""
    for key in ("torch_dtype", "dtype"):  # torch_dtype: transformers' older name
        value = init.get(key)
        name = str(value).removeprefix("torch.") if value is not None else None
        if name in ("float16", "half"):
            raise ConfigError(
                f"model_init_kwargs['{key}']={value!r} is not supported: groupwise trains in "
                "float32 or bfloat16 (no fp16 loss scaling)"
            )
        if name in _INIT_DTYPES:
            _set(kwargs, "dtype", _INIT_DTYPES[name], f"model_init_kwargs['{key}']={value!r}")
        elif name not in (None, "auto"):
            raise ConfigError(
                f"model_init_kwargs['{key}']={value!r} is not a dtype groupwise trains in "
                "(float32, bfloat16, auto)"
            )
    for key in ("attn_implementation", "trust_remote_code"):
        value = init.get(key)
        if value is not None:
            _set(kwargs, key, value, f"model_init_kwargs['{key}']={value!r}")


def unapplied_model_init_kwargs(init: dict[str, Any]) -> dict[str, Any]:
    """The keys of ``model_init_kwargs`` that set no groupwise option (reported as ignored)."""
    return {key: value for key, value in init.items()
            if key not in _MODEL_LOADING_KEYS
            or (key in ("dtype", "torch_dtype") and str(value) == "auto")}  # fmt: skip


def reported_ignored(ignored: dict[str, Any]) -> dict[str, Any]:
    """The ignored TRL options to report: ``model_init_kwargs`` and the activation
    checkpointing kwargs without the keys they applied (they read back whole, as the script
    gave them)."""
    reported = dict(ignored)
    if isinstance(reported.get("model_init_kwargs"), dict):
        rest = unapplied_model_init_kwargs(reported.pop("model_init_kwargs"))
        if rest:
            reported["model_init_kwargs"] = rest
    for name in _CHECKPOINTING_KWARGS:
        if isinstance(reported.get(name), dict):
            rest = {k: v for k, v in reported.pop(name).items() if not _applied_checkpointing(k, v)}
            if rest:
                reported[name] = rest
    return reported


# transformers 5's activation_checkpointing_kwargs, and its older name (used when the newer is
# not given, as TrainingArguments resolves them).
_CHECKPOINTING_KWARGS = ("activation_checkpointing_kwargs", "gradient_checkpointing_kwargs")


def _applied_checkpointing(key: str, value: Any) -> bool:
    """Whether a checkpointing kwarg is one groupwise does: ``offload`` (activation_offloading),
    ``every_n_layers=1`` (every decoder layer), ``use_reentrant=False`` (its checkpointing)."""
    return key == "offload" or (key, value) in (("every_n_layers", 1), ("use_reentrant", False))


def _checkpointing(kwargs: dict[str, Any]) -> dict[str, Any]:
    """transformers 5's activation checkpointing names: ``activation_checkpointing`` is
    ``gradient_checkpointing`` (the newer name wins when both are given, as in
    TrainingArguments); its kwargs' ``offload`` is ``activation_offloading``; ``every_n_layers``
    other than 1 is refused (every decoder layer is checkpointed). The kwargs are returned, to
    read back as given and be reported but for the keys applied (:func:`reported_ignored`)."""
    checkpointing = kwargs.pop("activation_checkpointing", None)
    if checkpointing is not None:
        kwargs["gradient_checkpointing"] = bool(checkpointing)
    given = {name: kwargs.pop(name) for name in _CHECKPOINTING_KWARGS if name in kwargs}
    name = next((n for n in _CHECKPOINTING_KWARGS if given.get(n) is not None), None)
    options = given.get(name) if name else None
    if options is None:
        return given
    if not isinstance(options, dict):
        raise ConfigError(f"{name} must be a dict (a JSON object), got {options!r}")
    every = options.get("every_n_layers", 1)
    if every != 1:
        raise ConfigError(
            f"{name} every_n_layers={every!r} is not supported: groupwise checkpoints every "
            "decoder layer (every_n_layers=1) or none (gradient_checkpointing: false)"
        )
    if "offload" in options:
        offload = bool(options["offload"])
        _set(kwargs, "activation_offloading", offload, f"{name} offload={options['offload']!r}")
    return dict.fromkeys(given, options)  # both names read back the one in effect


def _model_init_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """TRL's ``model_init_kwargs``: its ``quantization_config`` (transformers'
    ``BitsAndBytesConfig`` or its ``to_dict()``) sets the 4-bit options, its ``dtype``,
    ``attn_implementation`` and ``trust_remote_code`` set those options (:func:`_model_loading`);
    the rest is returned (quantization_config aside), to be read back as given and reported as
    ignored but for the keys applied (:func:`reported_ignored`)."""
    init = kwargs.pop("model_init_kwargs", None)
    if init is None:
        return {}
    if not isinstance(init, dict):
        raise ConfigError(f"model_init_kwargs must be a mapping, got {init!r}")
    init = dict(init)
    _model_loading(init, kwargs)
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
    ``training_args.model_init_kwargs``), read as at construction: ``(options it sets, the
    other keys, ignored)``."""
    changes: dict[str, Any] = {"model_init_kwargs": init}
    rest = _model_init_kwargs(changes).get("model_init_kwargs", {})
    changes.pop("model_init_kwargs", None)
    return changes, unapplied_model_init_kwargs(rest)


def translate_trl_options(
    kwargs: dict[str, Any], defaults: dict[str, Any] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``GRPOConfig`` keyword arguments with TRL names translated (see the module docstring),
    and the ignored ones ``{name: value}`` taken out. ``defaults``: the options' defaults
    (``GRPOConfig.field_defaults()``), for the values one option takes from another's."""
    kwargs = dict(kwargs)
    _json_dicts(kwargs)
    ignored = {name: kwargs.pop(name) for name in sorted(kwargs) if name in TRL_IGNORED}
    ignored.update(_refuse_training_options(kwargs))
    _generation_kwargs(kwargs)
    ignored.update(_model_init_kwargs(kwargs))
    ignored.update(_checkpointing(kwargs))
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
    if kwargs.get("eval_strategy") == "steps" and kwargs.get("eval_steps") is None:
        # TrainingArguments: eval_steps defaults to logging_steps
        kwargs["eval_steps"] = kwargs.get("logging_steps", (defaults or {}).get("logging_steps"))
    for name in _NONE_IS_DEFAULT:  # TRL's "unset"; groupwise's default applies
        if name in kwargs and kwargs[name] is None:
            del kwargs[name]
    return kwargs, ignored


def set_trl_option(config: Any, name: str, value: Any) -> None:
    """A TRL name set on a config after it was made (TRL's own code assigns some, e.g.
    ``args.transformers_continuous_batching_config``), read as at construction: a translated
    name sets the groupwise options it means, an ignored one (or a refused one at its "off"
    value) is kept in ``trl_ignored`` and reported, a refused one is an error naming it."""
    if name == "use_vllm" and not value:  # transformers' generation: any engine but vLLM's
        changes = {"generation_engine": "hf"} if config.generation_engine == "vllm" else {}
        ignored: dict[str, Any] = {}
    elif name == "bf16" and value is None:  # TRL's "unset": groupwise's auto
        changes, ignored = {"bf16_autocast": None}, {}
    else:
        changes, ignored = translate_trl_options({name: value})
    for option, new in changes.items():
        setattr(config, option, new)
    if changes:
        config.explicit_options = config.explicit_options | frozenset(changes)
    if ignored:
        config.trl_ignored = {**config.trl_ignored, **ignored}
        warnings.warn(ignored_message(ignored), IgnoredOptionsWarning, stacklevel=3)


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
