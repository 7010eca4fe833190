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


def _active_adapters(module: torch.nn.Module) -> list[str]:
    """The adapters of a peft LoRA layer that change its output now: active, not disabled, not
    already merged into the base. peft keeps a Linear's adapters in ``lora_A`` and an
    Embedding's in ``lora_embedding_A`` (``lora_A`` then stays empty), so both are looked up."""
    if getattr(module, "disable_adapters", False) or getattr(module, "merged", False):
        return []
    held = set(getattr(module, "lora_A", {})) | set(getattr(module, "lora_embedding_A", {}))
    return [a for a in getattr(module, "active_adapters", ()) if a in held]


def _lora_delta(module: torch.nn.Module, engine: str) -> torch.Tensor | None:
    """The active adapters' update of a peft LoRA layer's base weight, in fp32, computed out of
    place (None when no adapter applies: disabled, or already merged into the base)."""
    delta = None
    for adapter in _active_adapters(module):
        if getattr(module, "use_dora", {}).get(adapter, False):
            raise ConfigError(
                f"generation_engine={engine} cannot merge a DoRA adapter (use_dora) into its own "
                "copy of the weights; use plain LoRA or generation_engine: hf"
            )
        a = module.lora_A[adapter] if adapter in module.lora_A else None
        b = module.lora_B[adapter] if adapter in module.lora_B else None
        if isinstance(a, torch.nn.Linear) and isinstance(b, torch.nn.Linear):
            part = _full(b.weight).float() @ _full(a.weight).float()  # [out, r] @ [r, in]
            if getattr(module, "fan_in_fan_out", False):  # GPT-2 style Conv1D base: [in, out]
                part = part.T
            part = part * float(module.scaling[adapter])
        else:  # embedding / convolution adapters: peft's own out-of-place delta
            part = module.get_delta_weight(adapter).float()
        delta = part if delta is None else delta + part
    return delta


def _plan(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter, torch.nn.Module | None]]:
    """``(checkpoint name, parameter, LoRA layer owning it or None)`` for every weight an engine
    loads, in the model's order.

    A parameter shared under two names (the LM head tied to the embedding) comes once, unless
    the two names compute with different weights: a LoRA adapter on one of them only (peft
    adapts ``embed_tokens`` and leaves the tied ``lm_head`` on the bare weight), or a head
    trained apart (``modules_to_save=["lm_head"]``, which is a separate parameter anyway). Then
    both come, and the engine's copy must be untied (:func:`unties_embeddings`)."""
    lora_layers = {
        name: module
        for name, module in model.named_modules()
        if hasattr(module, "base_layer")
        and (hasattr(module, "lora_A") or hasattr(module, "lora_embedding_A"))
    }
    plan: list[tuple[str, torch.nn.Parameter, torch.nn.Module | None]] = []
    seen: dict[int, torch.nn.Module | None] = {}  # id(param) -> its first name's LoRA layer
    for name, param in model.named_parameters(remove_duplicate=False):
        target = checkpoint_name(name)
        if target is None:
            continue
        owner = name.rsplit(".", 2)[0] if name.endswith(".base_layer.weight") else None
        layer = lora_layers.get(owner) if owner is not None else None
        if layer is not None and not _active_adapters(layer):
            layer = None
        if id(param) in seen and seen[id(param)] is layer:  # a plain tie: once
            continue
        seen.setdefault(id(param), layer)
        if any(t == target for t, _, _ in plan):  # the same checkpoint name twice: keep the first
            continue
        plan.append((target, param, layer))
    return plan


def checkpoint_shapes(model: torch.nn.Module) -> list[tuple[str, tuple[int, ...]]]:
    """``(checkpoint name, full shape)`` of every tensor :func:`checkpoint_weights` yields, in
    its order, read without gathering anything (an FSDP2 shard's ``shape`` is the full one)."""
    return [(target, tuple(param.shape)) for target, param, _ in _plan(model)]


def unties_embeddings(model: torch.nn.Module) -> bool:
    """Whether the policy's LM head computes with other weights than its input embedding
    although its config ties them (a head trained apart, or LoRA on one of the two): an engine
    that keeps its own copy must then build it untied and load ``lm_head.weight`` too."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "config", None)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    return tied and any(target == "lm_head.weight" for target, _, _ in _plan(model))


def checkpoint_weights(
    model: torch.nn.Module, dtype: torch.dtype | None = None, engine: str = "vllm"
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(checkpoint name, tensor)`` for every weight of the policy, in the model's order, each
    cast to ``dtype`` (None: as stored); ``engine`` names the engine in errors. LoRA layers'
    base weights come merged (W + scale * B @ A in fp32; peft's own delta for embedding
    adapters); tied parameters (the LM head tied to the embedding) come once, under the first
    name, which vLLM's ``load_weights`` expects (it skips ``lm_head.weight`` for tied models),
    unless the head and the embedding differ (see :func:`_plan`)."""
    for target, param, layer in _plan(model):
        tensor = _full(param.detach())
        delta = _lora_delta(layer, engine) if layer is not None else None
        if delta is not None:
            tensor = tensor.float() + delta.to(tensor.device)
        yield target, tensor.to(dtype) if dtype is not None else tensor
