"""A Hugging Face model's KV cache, as the rollout engines and the policy's forward use it: the
models a wrapper holds (PEFT, DDP, ``torch.compile``), the keyword its forward takes the cache
by and the attribute it returns it in (both renamed in transformers 5.24), one forward on top of
a cache, and whether a cache holds recurrent layers (hybrid models).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
from transformers.cache_utils import Cache, LinearAttentionCacheLayerMixin


def wrapped_models(model: torch.nn.Module) -> list[torch.nn.Module]:
    """``model`` and the models it wraps, outermost first: PEFT's ``get_base_model()``, DDP's /
    FSDP1's ``module``, ``torch.compile``'s ``_orig_mod``."""
    found = [model]
    while True:
        outer, inner = found[-1], None
        if hasattr(outer, "get_base_model"):
            inner = outer.get_base_model()
        else:
            for name in ("module", "_orig_mod"):
                candidate = outer._modules.get(name)
                if candidate is not None:
                    inner = candidate
                    break
        if inner is None or any(inner is m for m in found):
            return found
        found.append(inner)


def cache_keyword(model: torch.nn.Module) -> str:
    """The keyword ``model``'s forward takes its KV cache by: ``cache`` in transformers 5.24 and
    later (which deprecate ``past_key_values``, to be removed in 5.40), ``past_key_values``
    before, and in remote-code models that kept the old name. Read from the forward signature
    of the model under any PEFT, DDP or ``torch.compile`` wrapper (which pass it through)."""
    inner = wrapped_models(model)[-1]
    return _forward_cache_keyword(type(inner))


@functools.cache
def _forward_cache_keyword(cls: type) -> str:
    parameters = inspect.signature(cls.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def returned_cache(output: Any) -> Cache | None:
    """The KV cache a forward returned: ``output.cache`` from transformers 5.24, else
    ``output.past_key_values`` (reading the old name on 5.24 warns)."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else getattr(output, "past_key_values", None)


def forward_with_cache(
    model: torch.nn.Module,
    ids: torch.Tensor,
    attention_mask: torch.Tensor,
    positions: torch.Tensor,
    cache: Cache,
) -> tuple[torch.Tensor, Cache | None]:
    """One forward of ``ids`` [B, L] at ``positions`` on top of ``cache`` (which it extends):
    the last position's logits [B, V], computed for that position alone (the next token's), and
    the cache the model returned."""
    out = model(
        input_ids=ids,
        attention_mask=attention_mask,
        position_ids=positions,
        use_cache=True,
        logits_to_keep=1,
        **{cache_keyword(model): cache},
    )
    return out.logits[:, -1, :], returned_cache(out)


def has_recurrent_state(cache: Cache) -> bool:
    """Whether ``cache`` holds recurrent layers (Mamba / linear attention: a conv and SSM state
    per row instead of per-token keys and values), as hybrid models such as Nemotron-H have."""
    return any(isinstance(layer, LinearAttentionCacheLayerMixin) for layer in cache.layers)
