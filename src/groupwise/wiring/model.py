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
            "the model given holds 4-bit (bitsandbytes) layers: set load_in_4bit=True with "
            "use_peft=True to train a LoRA adapter on it (QLoRA)"
        )
    model = place(model, device, dtype, quantization)
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    if args.use_peft and not is_peft_model(model):  # a PeftModel given brings its adapter
        if args.load_in_4bit:
            model = prepare_for_kbit_training(model)
        model = apply_lora(model, ModelOptions.from_config(args), peft_config)
    model.train()
    return model, tokenizer


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
