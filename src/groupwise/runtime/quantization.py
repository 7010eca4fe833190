"""Quantised weights through bitsandbytes: QLoRA's frozen 4-bit base (Dettmers et al. 2023: NF4
weights, double quantisation of the constants, compute in 16/32 bits). The 8-bit optimizer
states are the optimizer's (:mod:`groupwise.policy.optimizer`).

A base is quantised as it is loaded (transformers' ``BitsAndBytesConfig``, as TRL's
``model_init_kwargs={"quantization_config": ...}`` does) or, for a model built in memory (the
built-in ``tiny-random``), by swapping each ``nn.Linear`` but the LM head for a
``bitsandbytes.nn.Linear4bit``: the same modules transformers' quantizer puts there.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from ..errors import ConfigError

QUANT_EXTRA = 'pip install "groupwise[quant]"'


def require_bitsandbytes(what: str) -> None:
    """Refuse ``what`` (an option and its value) when bitsandbytes is not installed."""
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ConfigError(f"{what} needs the bitsandbytes package: {QUANT_EXTRA}")


def compute_dtype(weights: torch.dtype, autocast: bool) -> torch.dtype:
    """The dtype a 4-bit layer dequantises into and multiplies in: the run's own (bf16 when
    the run computes in bf16, weights or autocast; fp32 otherwise, as on a CPU)."""
    return torch.bfloat16 if autocast or weights == torch.bfloat16 else torch.float32


def bnb_config(quant_type: str, double_quant: bool, dtype: torch.dtype) -> Any:
    """transformers' ``BitsAndBytesConfig`` for a frozen 4-bit base (QLoRA's settings)."""
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=quant_type,
        bnb_4bit_use_double_quant=double_quant,
        bnb_4bit_compute_dtype=dtype,
    )


def is_4bit(model: torch.nn.Module) -> bool:
    """Whether ``model`` holds bitsandbytes 4-bit layers (loaded or quantised in memory)."""
    if importlib.util.find_spec("bitsandbytes") is None:
        return False
    import bitsandbytes as bnb

    return any(isinstance(m, bnb.nn.Linear4bit) for m in model.modules())


def model_4bit_settings(model: torch.nn.Module) -> tuple[str, bool] | None:
    """The 4-bit quantisation ``model`` actually holds, read from its first bitsandbytes layer:
    ``(quant type, double quantisation)``; None when it has no 4-bit layer. The layers, not
    ``config.quantization_config``: a model quantised by hand may carry no such config, and
    the layers are what trains and generates."""
    if not is_4bit(model):
        return None
    import bitsandbytes as bnb

    layer = next(m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit))
    weight = layer.weight
    state = getattr(weight, "quant_state", None)
    if state is not None:  # quantised: its state says what was done
        return str(state.quant_type), bool(state.nested)
    # Not yet quantised (on the meta device, or before the move that quantises it).
    return str(weight.quant_type), bool(weight.compress_statistics)


def quantize_4bit(
    model: torch.nn.Module,
    quant_type: str,
    double_quant: bool,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.nn.Module:
    """Swap every ``nn.Linear`` of ``model`` but its LM head (kept in ``dtype``, as transformers
    keeps the output embeddings) for a frozen ``Linear4bit`` on ``device``; the weights are
    quantised as each layer moves there (``Params4bit``), so a GPU never holds them unquantised."""
    import bitsandbytes as bnb

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is not torch.nn.Linear or child is head:
                continue
            layer = bnb.nn.Linear4bit(
                child.in_features,
                child.out_features,
                bias=child.bias is not None,
                compute_dtype=dtype,
                compress_statistics=double_quant,
                quant_type=quant_type,
                device="meta",
            )
            layer.weight = bnb.nn.Params4bit(
                child.weight.data,
                requires_grad=False,
                compress_statistics=double_quant,
                quant_type=quant_type,
            )
            if child.bias is not None:
                layer.bias = torch.nn.Parameter(child.bias.data, requires_grad=False)
            setattr(parent, name, layer.to(device))
    if hasattr(model, "config"):
        # As from_pretrained records it: what reads the config (save_pretrained, the engines'
        # checks) then sees a quantized model, whichever way it was quantized.
        model.config.quantization_config = bnb_config(quant_type, double_quant, dtype)
    return model


def keep_trainable_layout(model: torch.nn.Module) -> torch.nn.Module:
    """Stop bitsandbytes from repacking 4-bit weights for its CPU inference kernel. On a CPU
    with AVX512-BF16 a ``Linear4bit`` in eval mode rewrites its weight, once and for good, into
    a layout whose kernel has no autograd: the training forward that follows would then drop
    the gradient through every base layer (the adapters of earlier layers would get wrong
    gradients) and compute in other numerics than generation. Generation and training share
    these layers, so they keep the one layout both can use."""
    import bitsandbytes as bnb

    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            module.support_avx512bf16_for_cpu = False
    return model


def prepare_for_kbit_training(model: torch.nn.Module) -> torch.nn.Module:
    """peft's ``prepare_model_for_kbit_training``, the parts that are right here: every base
    parameter frozen (the adapter, added next, is what trains), and with gradient
    checkpointing the embeddings' output made to require grad, so that checkpointed layers
    whose inputs would otherwise need no grad still pass gradients to the adapters inside.
    Not its cast of 16-bit parameters to fp32: peft does that for fp16 training, which
    groupwise does not do; a frozen base keeps the run's dtype (bf16 holds fp32's range)."""
    for param in model.parameters():
        param.requires_grad_(False)
    # transformers 5.23 renamed is_gradient_checkpointing (deprecated, warns) to this one.
    checkpointing = getattr(model, "is_activation_checkpointing", None)
    if checkpointing is None:
        checkpointing = getattr(model, "is_gradient_checkpointing", False)
    if checkpointing and getattr(model, "_require_grads_hook", None) is None:
        model.enable_input_require_grads()
    return model
