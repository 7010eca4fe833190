"""The planner's per-component formulas over a model shape: saved activations (checkpointed,
offloaded, with LoRA's own), log-prob logits, the KV cache, the sampler's logits and the frozen
base's weights (16-bit or NF4). Pure arithmetic; :mod:`groupwise.memory.plan` says what each
counts and assembles them into rows."""

from __future__ import annotations

from collections.abc import Sequence

from .quant import nf4_bytes
from .shapes import ModelShape


def norm_saved_bytes(dtype_bytes: int, frozen: bool = False) -> int:
    """Bytes one RMSNorm keeps per normalised value, its output aside (transformers'
    ``LlamaRMSNorm``): its input in fp32 (a 16-bit input's fp32 copy, an fp32 input itself) and,
    for its weight's gradient, the normalised values in the dtype (not for a frozen norm)."""
    return max(4, dtype_bytes) + (0 if frozen else dtype_bytes)


def layer_activation_bytes(
    shape: ModelShape, dtype_bytes: int, linear_inputs: int | None = None, frozen: bool = False
) -> int:
    """Bytes one LLaMA block saves for backward, per token (plan's doc): both RMSNorms' input and
    normalised values, the rotated query and the attention output (2q), the rotated key and the
    value (2kv), SiLU's input, its output and the up projection (3i), Qwen3's per-head q/k norms,
    and ``linear_inputs`` (:func:`linear_input_bytes`; None: a trained block's). ``frozen``: the
    block's own weights are frozen (LoRA, QLoRA), so its norms keep only their input."""
    norm = norm_saved_bytes(dtype_bytes, frozen)
    total = (
        2 * norm * shape.hidden
        + (2 * shape.q_dim + 2 * shape.kv_dim + 3 * shape.intermediate) * dtype_bytes
    )
    if shape.qk_norm:
        total += norm * (shape.q_dim + shape.kv_dim)
    if linear_inputs is None:
        linear_inputs = linear_input_bytes(shape, dtype_bytes)
    return total + linear_inputs


def linear_input_bytes(
    shape: ModelShape,
    dtype_bytes: int,
    lora_r: int = 0,
    targets: Sequence[str] | None = None,
    dropout: float = 0.0,
) -> int:
    """Bytes per token of a block's linear inputs kept for their weights' gradients, beyond what
    the norms and the attention keep anyway: a trained linear keeps its input (the attention
    norm's output for q, k, v; the MLP norm's output for gate and up; SiLU(gate) x up for down;
    o_proj's input is the attention output, already kept). A frozen base linear keeps nothing;
    its LoRA adapter keeps the input (with ``lora_dropout`` a dropped-out copy of its own,
    :func:`lora_activation_bytes`; without, the same tensor, counted here once per input)."""
    h, i = shape.hidden, shape.intermediate
    if lora_r <= 0:
        return (2 * h + i) * dtype_bytes
    if dropout > 0:
        return 0
    chosen = shape.lora_targets(targets)
    inputs = {("q_proj", "k_proj", "v_proj"): h, ("gate_proj", "up_proj"): h, ("down_proj",): i}
    return sum(n for names, n in inputs.items() if any(t in chosen for t in names)) * dtype_bytes


def layer_activation_values(shape: ModelShape) -> int:
    """Values one trained LLaMA block saves for backward per token, in fp32:
    6h + 2q + 2kv + 4i (+ 2q + 2kv for Qwen3's q/k norms)."""
    return layer_activation_bytes(shape, 4) // 4


def backward_transient_bytes(shape: ModelShape, tokens: int, dtype_bytes: int) -> int:
    """The backward pass's own buffers at its peak, inside one block's MLP: the incoming
    gradient of the hidden state, the gradient of the down projection's input and of one of
    its factors (2h + i per token)."""
    return (2 * shape.hidden + shape.intermediate) * tokens * dtype_bytes


def lora_activation_bytes(
    shape: ModelShape,
    rank: int,
    targets: Sequence[str] | None,
    dropout: float,
    dtype_bytes: int,
    mask_bytes: int = 1,
) -> int:
    """Bytes one layer's LoRA adapters save for backward, per token: each adapter keeps A's
    output (rank values) for B's gradient; with ``lora_dropout`` > 0 also the dropped-out input
    (d_in values) for A's gradient and dropout's mask (``mask_bytes`` per element: 1 for the
    fused CUDA kernel's bool mask, the dtype's width on a CPU, where dropout multiplies by a
    mask of the input's dtype). peft applies dropout per adapter, so q, k and v each keep their
    own copy of the same input."""
    if rank <= 0:
        return 0
    total = 0
    for d_in, _ in shape.lora_targets(targets).values():
        total += rank * dtype_bytes
        if dropout > 0:
            total += d_in * (dtype_bytes + mask_bytes)
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
    layer_token_bytes: int | None = None,
    frozen_norms: bool = False,
) -> tuple[int, int]:
    """(GPU bytes, host bytes) of one micro-batch's saved activations through the decoder, with
    the backward pass's own buffers at its peak (:func:`backward_transient_bytes`).

    ``layer_token_bytes``: what one block saves per token (None: a trained block's,
    :func:`layer_activation_bytes`). Without offloading everything stays on the GPU. With
    ``activation_offloading`` every saved tensor moves to host memory as the forward pass saves
    it and comes back for the backward pass (TRL's ``activation_offloading``,
    ``torch.autograd.graph.save_on_cpu``): copied on the compute stream, one layer's saved
    tensors are on the GPU at a time, the host holds all of them (a side-stream variant such as
    torchtune's overlaps the copies and holds more). With gradient checkpointing only the
    layers' inputs are saved, so only they move; the layer being recomputed is on the GPU either
    way, with its input. The final norm's input, normalised values (unless ``frozen_norms``)
    and output (read by the log-prob head) stay on the GPU.
    """
    per_layer = (
        layer_activation_bytes(shape, dtype_bytes)
        if layer_token_bytes is None
        else layer_token_bytes
    )
    if checkpointing or group_size <= 1:
        tokens = batch * (prompt_len + completion_len)
        repeated_kv = 0
    else:
        tokens = batch // group_size * prompt_len + batch * completion_len
        repeated_kv = (batch - batch // group_size) * prompt_len * 2 * shape.kv_dim
    layer = per_layer * tokens + repeated_kv * dtype_bytes + lora_token_bytes * tokens
    layer_input = shape.hidden * tokens * dtype_bytes
    final_norm = (norm_saved_bytes(dtype_bytes, frozen_norms) + dtype_bytes) * shape.hidden * tokens
    final_norm += backward_transient_bytes(shape, tokens, dtype_bytes)
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


def logits_bytes(
    vocab: int, batch: int, completion_len: int, impl: str, chunk_size: int, dtype_bytes: int = 4
) -> int:
    """Peak bytes of the LM-head outputs on the way to per-token log-probs (plan's doc): naive,
    three fp32 [tokens x vocab] buffers; chunked, one chunk's raw head outputs in the dtype, their
    fp32 copy (the same buffer in fp32) and fp32 exponentials (policy/logprobs.py's forward,
    which outweighs its backward)."""
    if impl == "naive":
        return 3 * batch * completion_len * vocab * 4
    per_value = 8 + (dtype_bytes if dtype_bytes < 4 else 0)
    return min(chunk_size, batch * completion_len) * vocab * per_value


def kv_cache_bytes(
    shape: ModelShape, sequences: int, prompt_len: int, completion_len: int, dtype_bytes: int
) -> int:
    """The HF engine's cache at its longest: 2 (K and V) x layers x kv_heads x head_dim x
    (prompt + completion) x sequences x bytes, plus one layer's K (or V) in flight: transformers'
    ``DynamicCache`` grows by ``torch.cat``, which allocates the longer tensor before it frees
    the shorter one."""
    per_tensor = shape.kv_dim * (prompt_len + completion_len) * sequences * dtype_bytes
    return (2 * shape.layers + 1) * per_tensor


def static_kv_cache_bytes(
    shape: ModelShape, prompts: int, rows: int, slots: int, dtype_bytes: int
) -> int:
    """The static engine's caches right after the prefill (engine.py's doc): K and V of
    [layers, prompts, kv_heads, slots, head_dim] for the prompts and of [layers, rows, ...] for
    every completion, both alive while the prompt rows are copied into the row cache."""
    return 2 * shape.layers * shape.kv_dim * slots * (prompts + rows) * dtype_bytes


def prefill_bytes(
    shape: ModelShape, prompts: int, chunk: int, slots: int, prompt_len: int, dtype_bytes: int
) -> int:
    """The prefill at its largest: the prompts' K and V over every layer (the cache the
    prefill writes, [layers, prompts, kv_heads, slots, head_dim] each), and one layer's
    activations of a forward over ``chunk`` prompts, per token: the fp32 residual stream and
    its normed copy (2h x 4 B), RoPE's fp32 temporaries over q and k (3 (q + kv) x 4 B), q, k,
    v (q + 2kv), the attention output and its row-major copy (2q), and the MLP's gate and up,
    SiLU(gate) and their product (4i); a fused attention keeps no score matrix (measured on a
    CPU: tests/memory/test_planner_measured.py)."""
    cache = 2 * shape.layers * shape.kv_dim * slots * prompts * dtype_bytes
    per_token = 8 * shape.hidden + 12 * (shape.q_dim + shape.kv_dim)
    per_token += dtype_bytes * (3 * shape.q_dim + 2 * shape.kv_dim + 4 * shape.intermediate)
    return cache + chunk * prompt_len * per_token


def block_weight_bytes(shape: ModelShape, dtype_bytes: int) -> int:
    """One decoder block's weights (linears, norms, biases) in the dtype: what the static engine
    holds in flight while it loads its copy layer by layer."""
    numels = [d_in * d_out for d_in, d_out in shape.linear_shapes().values()]
    per_layer = sum(numels) + 2 * shape.hidden
    if shape.attention_bias:
        per_layer += shape.q_dim + 2 * shape.kv_dim
    if shape.qk_norm:
        per_layer += 2 * shape.head_size
    return per_layer * dtype_bytes


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
