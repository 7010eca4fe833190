"""A run's options -> its machine and model: the device
(:func:`groupwise.runtime.distributed.resolve_device`), the precision
(:func:`resolve_run_precision`), the attention implementation (:func:`check_attn_implementation`)
and the model itself (:func:`build_model`: loaded or built in, QLoRA's 4-bit base, gradient
checkpointing, LoRA with :func:`apply_lora`; :func:`load_for_generation` for ``groupwise eval``
and ``chat``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..config.grpo_config import GRPOConfig
from ..errors import ConfigError
from ..policy.optimizer import check_optim_device
from ..runtime.models import (
    is_adapter_folder,
    is_peft_model,
    load_model_and_tokenizer,
    saved_adapter_base,
)
from ..runtime.precision import Precision, configure_tf32, resolve_precision, warn_lost_updates
from ..runtime.quantization import (
    bnb_config,
    compute_dtype,
    is_4bit,
    keep_trainable_layout,
    model_4bit_settings,
    prepare_for_kbit_training,
    quantize_4bit,
    require_bitsandbytes,
)
from ..sections import ModelOptions


def apply_lora(
    model: PreTrainedModel, options: ModelOptions, peft_config: Any | None = None
) -> PreTrainedModel:
    """Wrap ``model`` in a peft LoRA adapter; only the adapter's parameters train.
    ``peft_config`` (a ``peft.LoraConfig``, TRL's ``GRPOTrainer(peft_config=...)``) is used as
    given; otherwise one is made from ``lora_r``, ``lora_alpha``, ``lora_dropout`` and
    ``lora_target_modules``."""
    from peft import LoraConfig, get_peft_model

    if peft_config is not None:
        return get_peft_model(model, peft_config)
    config = LoraConfig(
        r=options.lora_r,
        lora_alpha=options.lora_alpha,
        lora_dropout=options.lora_dropout,
        # "all-linear": every nn.Linear except the output layer (peft's rule).
        target_modules=options.lora_target_modules or "all-linear",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


# The task a run records for a training set that names no dataset of its own.
CUSTOM_DATASET = "custom"


def dataset_label(dataset: Any) -> str:
    """A training set's name for the run's records: a ``datasets.Dataset``'s own name (from the
    hub), else :data:`CUSTOM_DATASET` (a list of rows, ``Dataset.from_list``, or a local file,
    whose packaged builder's name, json or parquet, names only its format)."""
    info = getattr(dataset, "info", None)
    name = getattr(info, "dataset_name", None)
    if name and name != getattr(info, "builder_name", None):
        return str(name)
    return CUSTOM_DATASET


def options_from_model(args: GRPOConfig, model: Any, train_dataset: Any) -> GRPOConfig:
    """``args`` with what a model object given to the trainer says about the run, so that its
    records (config.yaml, run.json, the model card, the default output folder) name what is
    trained rather than the options' defaults: ``model`` is the object's ``name_or_path``
    (its class name when it has none, unless ``model`` was given); ``task`` the training set's
    :func:`dataset_label` unless ``task`` was given; and when the model holds bitsandbytes 4-bit
    layers and trains an adapter (a PeftModel, ``peft_config`` or ``use_peft``: TRL's QLoRA,
    ``prepare_model_for_kbit_training`` then ``get_peft_model``), ``load_in_4bit`` with the
    quant type and double quantisation of those layers. A name or path (a str) is read from
    the options, so those are returned as they are."""
    if isinstance(model, str):
        return args
    changes: dict[str, Any] = {}
    name = getattr(getattr(model, "config", None), "name_or_path", None)
    if name:
        changes["model"] = str(name)
    elif not args.is_set("model"):
        changes["model"] = type(getattr(model, "get_base_model", lambda: model)()).__name__
    if train_dataset is not None and not args.is_set("task"):
        changes["task"] = dataset_label(train_dataset)
    settings = model_4bit_settings(model)
    if settings is not None and args.use_peft:
        quant_type, double_quant = settings
        held = {"load_in_4bit": True, "bnb_4bit_quant_type": quant_type,
                "use_bnb_nested_quant": double_quant}  # fmt: skip
        for option, value in held.items():
            if args.is_set(option) and getattr(args, option) != value:
                raise ConfigError(
                    f"the model given is quantised with {option}={value!r} (read from its "
                    f"4-bit layers), but {option}={getattr(args, option)!r} was also given; "
                    "leave the option out (the model's own quantisation is trained)"
                )
        changes.update(held)
    changes = {k: v for k, v in changes.items() if getattr(args, k) != v}
    return args.replace(**changes) if changes else args


def resolve_run_precision(args: GRPOConfig, device: torch.device) -> Precision:
    """The run's numerics (:mod:`groupwise.runtime.precision`) on ``device``, with the pure-bf16
    warning and TF32 set up."""
    precision = resolve_precision(
        args.dtype, args.bf16_autocast, args.generation_dtype, device, use_peft=args.use_peft
    )
    warn_lost_updates(precision, args.learning_rate, args.use_peft)
    configure_tf32(args.tf32, device)
    return precision


def check_attn_implementation(name: str, device: torch.device) -> None:
    """Refuse flash_attention_2 where it cannot run, before a model is loaded."""
    if name != "flash_attention_2":
        return
    if device.type != "cuda":
        raise ConfigError(
            f"attn_implementation=flash_attention_2 needs a CUDA GPU (device is {device.type}); "
            "use sdpa"
        )
    if importlib.util.find_spec("flash_attn") is None:
        raise ConfigError(
            "attn_implementation=flash_attention_2 needs the flash-attn package "
            "(pip install flash-attn --no-build-isolation); or use sdpa, torch's fused kernel"
        )


def check_quantization(args: GRPOConfig, device: torch.device) -> None:
    """bitsandbytes installed for the options that need it, and a paged optimizer on CUDA."""
    if args.load_in_4bit:
        require_bitsandbytes("load_in_4bit=True")
    if args.optim not in ("adamw_torch", "adamw_torch_fused"):
        require_bitsandbytes(f"optim={args.optim}")
    check_optim_device(args.optim, device)


def build_model(
    model: str | PreTrainedModel,
    processing_class: PreTrainedTokenizerBase | None,
    args: GRPOConfig,
    device: torch.device,
    dtype: torch.dtype,
    peft_config: Any | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The policy model on its device and dtype (gradient checkpointing, LoRA: ``peft_config``
    when given, else the ``lora_*`` options) and tokenizer. A saved model is read straight into
    ``dtype`` and ``device``; a loaded one is moved there. With ``load_in_4bit`` the base is
    QLoRA's: saved weights are quantised as they are read, others (built in, given loaded,
    an adapter merged into its base) as they are placed; its 4-bit layers compute in the
    run's dtype (bf16 under bf16 autocast or weights, else fp32)."""
    check_attn_implementation(args.attn_implementation, device)
    check_quantization(args, device)
    quantization = None
    if args.load_in_4bit:
        bf16 = resolve_precision(args.dtype, args.bf16_autocast, args.generation_dtype, device,
                                 use_peft=args.use_peft).autocast  # fmt: skip
        quantization = (args.bnb_4bit_quant_type, args.use_bnb_nested_quant,
                        compute_dtype(dtype, bf16))  # fmt: skip
    model, tokenizer = load_model_and_tokenizer(
        model,
        processing_class,
        seed=args.seed,
        dtype=dtype,
        device=device,
        attn_implementation=args.attn_implementation,
        trust_remote_code=args.trust_remote_code,
        quantization=bnb_config(*quantization) if quantization else None,
    )
    if is_4bit(model) and not args.load_in_4bit:
        raise ConfigError(
            "the model given holds 4-bit (bitsandbytes) layers, whose weights cannot train: "
            "give it a LoRA adapter to train (QLoRA), as peft.get_peft_model(model, "
            "LoraConfig(...)), the trainer's peft_config=LoraConfig(...), or use_peft=True"
        )
    model = place(model, device, dtype, quantization)
    if args.gradient_checkpointing:
        # transformers 5's name; gradient_checkpointing_enable is its deprecated alias, which
        # warns on every run now that checkpointing is on by default (TRL's default).
        model.activation_checkpointing_enable()
        model.config.use_cache = False
    else:
        checkpointing_off(model)
    if args.use_peft and not is_peft_model(model):  # a PeftModel given brings its adapter
        if args.load_in_4bit:
            model = prepare_for_kbit_training(model)
        model = apply_lora(model, ModelOptions.from_config(args), peft_config)
    model.train()
    return model, tokenizer


def checkpointing_off(model: PreTrainedModel) -> None:
    """Turn off the activation checkpointing a model given to the trainer came with (peft's
    ``prepare_model_for_kbit_training`` turns it on by default): ``gradient_checkpointing``
    decides, and the policy's forward that shares a prompt's KV cache across its group needs
    the cache that a checkpointing model does not return in training."""
    base = model.get_base_model() if is_peft_model(model) else model
    if getattr(base, "is_activation_checkpointing", False):
        base.activation_checkpointing_disable()


def load_for_generation(
    name: str, args: GRPOConfig, device: torch.device, precision: Precision
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model ``groupwise eval`` and ``chat`` generate with, in eval mode: read in the run's
    weights dtype on ``device``. With ``load_in_4bit`` its base is 4-bit, as QLoRA trains it, and
    a saved adapter sits unmerged on that quantised base, as it was trained (merged into the
    16-bit base instead, it would be evaluated on weights it never saw); the 4-bit layers keep
    the layout and numerics they trained in."""
    quantization = None
    if args.load_in_4bit:
        require_bitsandbytes("load_in_4bit=True")
        quantization = (args.bnb_4bit_quant_type, args.use_bnb_nested_quant,
                        compute_dtype(precision.weights, precision.autocast))  # fmt: skip
        if is_adapter_folder(name):
            from peft import PeftModel
            from transformers import AutoTokenizer

            base, tokenizer = load_for_generation(saved_adapter_base(name), args, device, precision)
            if (Path(name) / "tokenizer_config.json").is_file():
                tokenizer = AutoTokenizer.from_pretrained(name)
            return PeftModel.from_pretrained(base, name).eval(), tokenizer
    model, tokenizer = load_model_and_tokenizer(
        name,
        seed=args.seed,
        dtype=precision.weights,
        device=device,
        trust_remote_code=args.trust_remote_code,
        quantization=bnb_config(*quantization) if quantization else None,
    )
    return place(model, device, precision.weights, quantization).eval(), tokenizer


def place(
    model: PreTrainedModel, device: torch.device, dtype: torch.dtype, quantization: tuple | None
) -> PreTrainedModel:
    """A loaded model on ``device``: cast to ``dtype``, or with ``quantization`` (quant type,
    double quantisation, compute dtype) quantised as it is placed where loading did not already;
    4-bit layers keep the layout training and generation share (:func:`keep_trainable_layout`)."""
    if not is_4bit(model):  # transformers refuses to cast a 4-bit model's dtype
        model = model.to(device=device, dtype=dtype)
    if quantization and not is_4bit(model):
        model = quantize_4bit(model, *quantization, device)
    if is_4bit(model):
        keep_trainable_layout(model)
    return model
