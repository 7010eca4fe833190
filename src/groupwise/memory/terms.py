"""The planner's per-component formulas over a model shape: saved activations (checkpointed,
offloaded, with LoRA's own), log-prob logits, the KV cache, the sampler's logits and the frozen
base's weights (16-bit or NF4). Pure arithmetic; :mod:`groupwise.memory.plan` says what each
counts and assembles them into rows."""

from __future__ import annotations

from collections.abc import Sequence

from .quant import nf4_bytes
from .shapes import ModelShape


def layer_activation_values(shape: ModelShape) -> int:
    """Values one LLaMA block saves for backward, per token: 4h + 2q + 2kv + 4i (plan's doc)."""
    return 4 * shape.hidden + 2 * shape.q_dim + 2 * shape.kv_dim + 4 * shape.intermediate


def lora_activation_bytes(
    shape: ModelShape, rank: int, targets: Sequence[str] | None, dropout: float, dtype_bytes: int
) -> int:
    """Bytes one layer's LoRA adapters save for backward, per token: each adapter keeps A's
    output (rank values) for B's gradient; with ``lora_dropout`` > 0 also the dropped-out input
    (d_in values) for A's gradient and dropout's mask (1 byte per element). peft applies
    dropout per adapter, so q, k and v each keep their own copy of the same input."""
    if rank <= 0:
        return 0
    total = 0
    for d_in, _ in shape.lora_targets(targets).values():
        total += rank * dtype_bytes
        if dropout > 0:
            total += d_in * (dtype_bytes + 1)
    return total


def activation_split(
    shape: ModelShape,
    batch: int,
    prompt_len: int,
    completion_len: int,
    dtype_bytes: int,
    checkpointing: bool,
    group_size: int = 1,
    lora_token_bytes: int = 0,
    offload: bool = False,
) -> tuple[int, int]:
    """(GPU bytes, host bytes) of one micro-batch's saved activations through the decoder.

    Without offloading everything stays on the GPU. With ``activation_offloading`` every saved
    tensor moves to host memory as the forward pass saves it and comes back for the backward
    pass (TRL's ``activation_offloading``, ``torch.autograd.graph.save_on_cpu``): copied on
    the compute stream, one layer's saved tensors are on the GPU at a time, the host holds all
    of them (a side-stream variant such as torchtune's overlaps the copies and holds more).
    With gradient checkpointing only the layers' inputs are saved, so only they move; the
    layer being recomputed is on the GPU either way, with its input. The final norm's 2h per
    token stays on the GPU.
    """
    per_layer = layer_activation_values(shape)
    if checkpointing or group_size <= 1:
        tokens = batch * (prompt_len + completion_len)
        repeated_kv = 0
    else:
        tokens = batch // group_size * prompt_len + batch * completion_len
        repeated_kv = (batch - batch // group_size) * prompt_len * 2 * shape.kv_dim
    layer = (per_layer * tokens + repeated_kv) * dtype_bytes + lora_token_bytes * tokens
    layer_input = shape.hidden * tokens * dtype_bytes
    final_norm = 2 * shape.hidden * tokens * dtype_bytes
    if checkpointing:
        # Each layer's input is kept; one layer's activations exist while it is recomputed.
        if offload:
            return layer_input + layer + final_norm, shape.layers * layer_input
        return shape.layers * layer_input + layer + final_norm, 0
    if offload:
        return layer + final_norm, shape.layers * layer
    return shape.layers * layer + final_norm, 0


def activation_bytes(
    shape: ModelShape,
    batch: int,
    prompt_len: int,
    completion_len: int,
    dtype_bytes: int,
    checkpointing: bool,
    group_size: int = 1,
) -> int:
    """Saved activations of one micro-batch's forward pass through the decoder (no LM head),
    all on the GPU (no offloading, no LoRA).

    ``group_size`` > 1: the prompt is encoded once per group of ``group_size`` completions
    (groupwise's GRPO), and its keys and values are repeated for the completions' attention.
    """
    gpu, _ = activation_split(
        shape, batch, prompt_len, completion_len, dtype_bytes, checkpointing, group_size
    )
    return gpu


def logits_bytes(vocab: int, batch: int, completion_len: int, impl: str, chunk_size: int) -> int:
    """Peak bytes of the LM-head outputs on the way to per-token log-probs (plan's doc)."""
    if impl == "naive":
        return 3 * batch * completion_len * vocab * 4
    return 2 * min(chunk_size, batch * completion_len) * vocab * 4


def kv_cache_bytes(
    shape: ModelShape, sequences: int, prompt_len: int, completion_len: int, dtype_bytes: int
) -> int:
    """2 (K and V) x layers x kv_heads x head_dim x (prompt + completion) x sequences x bytes."""
    return 2 * shape.layers * shape.kv_dim * (prompt_len + completion_len) * sequences * dtype_bytes


def generation_logits_bytes(vocab: int, sequences: int, dtype_bytes: int) -> int:
    """The sampler's buffers at one decoding step (rollout/hf.py, ``sample_next_token``): the
    last position's logits in the model's dtype, then fp32 scaled logits, probabilities and
    their CDF, each [sequences x vocab]. The prompt's prefill keeps only its last position's
    logits (``logits_to_keep=1``)."""
    return sequences * vocab * (dtype_bytes + 3 * 4)


def base_weight_bytes(
    shape: ModelShape,
    dtype_bytes: int,
    load_in_4bit: bool = False,
    double_quant: bool = True,
    lm_head: bool = True,
) -> int:
    """Weights of the frozen or full model (without its LM head for ``lm_head=False``): every
    parameter in the dtype, or with ``load_in_4bit`` the decoder blocks' linears in NF4 and the
    rest (embeddings, norms, biases, the LM head) in the dtype (quant.py's doc)."""
    params = shape.num_params() - (0 if lm_head else shape.lm_head_params())
    if not load_in_4bit:
        return params * dtype_bytes
    linears = shape.linear_numels()
    packed = sum(nf4_bytes(n, double_quant) for n in linears)
    return packed + (params - sum(linears)) * dtype_bytes


def dequantised_linear_bytes(shape: ModelShape, dtype_bytes: int) -> int:
    """The compute-dtype copy of the largest 4-bit linear: bitsandbytes dequantises one linear's
    weight for each matmul (forward and backward) and frees it after."""
    return max(shape.linear_numels()) * dtype_bytes
