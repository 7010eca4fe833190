"""Which rollout engine a planned run gets, and what that engine holds: pure functions, no torch.

``generation_engine: auto`` is resolved as the trainer resolves it
(:func:`groupwise.sections.generation.resolve_generation_engine`), with the one input that
needs a loaded model, whether the static engine can decode it (``rollout/static.py``'s
``supports()``), read here from the model's ``config.json`` fields instead
(:func:`static_refusal`). What the static engine then keeps depends on how the policy trains:

- full fine-tuning: its own copy of every weight in the generation dtype, for the whole run;
  loading it (at build and at every sync) streams one decoder layer at a time, so the transient
  is one layer's weights, q/k/v and gate/up concatenated, in the policy's dtype;
- LoRA on a 16-bit base, and QLoRA: no copy; it reads the policy's frozen base in place and
  applies the adapters unmerged (a 4-bit linear through bitsandbytes' own matmul, one
  projection dequantised at a time: the planner's dequantised-linear row);
- every rollout: a prompt cache [layers, prompts, kv_heads, slots, head_dim] for K and V, then
  a row cache [layers, rows, kv_heads, slots, head_dim] for every completion generated together,
  both alive right after the prefill; with CUDA graphs (a CUDA device's default) the slots are
  rounded up to a multiple of :data:`GRAPH_SLOT_BUCKET`. The buffers are freed after the rollout.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..sections.generation import resolve_generation_engine

# rollout/static.py's SUPPORTED_MODEL_TYPES (tests/memory checks the two agree).
STATIC_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
GRAPH_SLOT_BUCKET = 64  # rollout/static_graphs.py: slots rounded up for one graph per bucket
PREFILL_TOKENS = 4096  # rollout/static.py: prompt tokens per prefill forward (whole prompts)


def static_refusal(config: Mapping[str, Any]) -> str | None:
    """Why the static engine cannot decode a model of this ``config.json``, or None: the checks
    ``supports()`` makes on a loaded model's config. A config without ``model_type`` (a shape
    given on the command line) is taken as the LLaMA-style decoder the planner models."""
    model_type = config.get("model_type", "llama")
    if model_type not in STATIC_MODEL_TYPES:
        return (
            f"model_type {model_type!r} is not one the static engine implements "
            f"({', '.join(STATIC_MODEL_TYPES)})"
        )
    if config.get("hidden_act", "silu") != "silu":
        return f"hidden_act {config['hidden_act']!r} (the static engine implements silu)"
    if config.get("mlp_bias", False):
        return "mlp_bias=True"
    if config.get("use_sliding_window", False) or (
        model_type == "mistral" and config.get("sliding_window")
    ):
        return "sliding-window attention"
    return None


def planned_engine(
    requested: str,
    *,
    device: str,
    refusal: str | None,
    use_dora: bool = False,
    multi_turn: bool = False,
    generation_kwargs: bool = False,
) -> str:
    """The engine a run gets: ``requested`` unless it is ``auto``, which resolves as the trainer
    resolves it. ``refusal``: :func:`static_refusal` of the model; a DoRA adapter is refused
    too (the static engine applies plain LoRA). A 4-bit base is not refused: the static engine
    runs bitsandbytes' 4-bit layers in place."""
    if use_dora and refusal is None:
        refusal = "a DoRA adapter (use_dora), which the static engine does not apply"
    engine, _ = resolve_generation_engine(
        requested, device_type=device, static_unsupported=refusal, multi_turn=multi_turn,
        generation_kwargs=generation_kwargs,
    )  # fmt: skip
    return engine


def static_copies_weights(lora_r: int) -> bool:
    """The static engine keeps its own weight copy only for a full fine-tune; under LoRA or
    QLoRA it reads the policy's frozen base in place."""
    return lora_r <= 0


def static_slots(tokens: int, device: str, cuda_graphs: bool = True) -> int:
    """KV cache slots the static engine allocates for ``tokens`` (prompt + completion): rounded
    up to the graph bucket on CUDA with graphs, exact otherwise."""
    if device != "cuda" or not cuda_graphs:
        return tokens
    return -(-tokens // GRAPH_SLOT_BUCKET) * GRAPH_SLOT_BUCKET


def prefill_prompts(engine: str, prompts: int, prompt_len: int) -> int:
    """Prompts one prefill forward runs: the static engine's chunk of whole prompts
    (:data:`PREFILL_TOKENS` tokens at most, one prompt at least); the HF engine's, all."""
    if engine != "static":
        return prompts
    return min(prompts, max(1, PREFILL_TOKENS // max(1, prompt_len)))
