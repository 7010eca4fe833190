"""The policy's weights under plain Hugging Face checkpoint names, LoRA merged: what an engine
that keeps its own copy of the weights (the static engine, vLLM) loads after every optimizer step.

FSDP2 shards are gathered; peft's wrapper names map back to the checkpoint's; a LoRA layer's
weight is W + scale * B @ A computed out of place in fp32 (peft's in-place merge and unmerge on
a bf16 base would round the frozen base a little differently every step).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from ..errors import ConfigError

# Name pieces that are not part of the plain Hugging Face checkpoint name (PEFT's wrapper prefix,
# activation-checkpoint and torch.compile wrappers, PEFT's modules_to_save copy).
_WRAPPER_PREFIXES = ("base_model.model.",)
_WRAPPER_PIECES = (
    ".base_layer",
    "_checkpoint_wrapped_module.",
    "_orig_mod.",
    ".modules_to_save.default",
)


def checkpoint_name(name: str) -> str | None:
    """The plain Hugging Face checkpoint name of a parameter of the policy, or None for tensors
    an engine's copy has no place for (LoRA adapters, merged into their base; PEFT's untouched
    original of a ``modules_to_save`` module)."""
    if "lora_" in name or ".original_module." in name:
        return None
    for prefix in _WRAPPER_PREFIXES:
        name = name.removeprefix(prefix)
    for piece in _WRAPPER_PIECES:
        name = name.replace(piece, "")
    return name


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor: an FSDP2 shard (DTensor) is all-gathered, anything else as is."""
    full_tensor = getattr(tensor, "full_tensor", None)
    return full_tensor() if callable(full_tensor) else tensor


def _lora_delta(module: torch.nn.Module, engine: str) -> torch.Tensor | None:
    """The active adapters' update of a peft LoRA layer's base weight, in fp32, computed out of
    place (None when no adapter applies: disabled, or already merged into the base)."""
    if getattr(module, "disable_adapters", False) or getattr(module, "merged", False):
        return None
    delta = None
    for adapter in getattr(module, "active_adapters", ()):
        if adapter not in module.lora_A:
            continue
        if getattr(module, "use_dora", {}).get(adapter, False):
            raise ConfigError(
                f"generation_engine={engine} cannot merge a DoRA adapter (use_dora) into its own "
                "copy of the weights; use plain LoRA or generation_engine: hf"
            )
        a, b = module.lora_A[adapter], module.lora_B[adapter]
        if isinstance(a, torch.nn.Linear) and isinstance(b, torch.nn.Linear):
            part = _full(b.weight).float() @ _full(a.weight).float()  # [out, r] @ [r, in]
            if getattr(module, "fan_in_fan_out", False):  # GPT-2 style Conv1D base: [in, out]
                part = part.T
            part = part * float(module.scaling[adapter])
        else:  # embedding / convolution adapters: peft's own out-of-place delta
            part = module.get_delta_weight(adapter).float()
        delta = part if delta is None else delta + part
    return delta


def checkpoint_weights(
    model: torch.nn.Module, dtype: torch.dtype | None = None, engine: str = "vllm"
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(checkpoint name, tensor)`` for every weight of the policy, in the model's order, each
    cast to ``dtype`` (None: as stored); ``engine`` names the engine in errors. LoRA layers'
    base weights come merged (W + scale * B @ A in fp32); tied parameters (the LM head tied to
    the embedding) come once, under the first name, which vLLM's ``load_weights`` expects (it
    skips ``lm_head.weight`` for tied models)."""
    lora_layers = {
        name: module
        for name, module in model.named_modules()
        if hasattr(module, "lora_A") and hasattr(module, "base_layer")
    }
    for name, param in model.named_parameters():  # remove_duplicate: a tied weight once
        target = checkpoint_name(name)
        if target is None:
            continue
        tensor = _full(param.detach())
        owner = name.rsplit(".", 2)[0] if name.endswith(".base_layer.weight") else None
        delta = _lora_delta(lora_layers[owner], engine) if owner in lora_layers else None
        if delta is not None:
            tensor = tensor.float() + delta.to(tensor.device)
        yield target, tensor.to(dtype) if dtype is not None else tensor
