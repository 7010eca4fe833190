"""The memory planner proper: pure arithmetic, bytes for PPO and GRPO side by side.

The options, the per-component formulas, the rows of each algorithm, the peak total, the
``--accounting`` modes and the ``--json`` structure (:meth:`MemoryPlan.to_json`). The model
shapes they read are in :mod:`groupwise.memory.shapes`, the printed table in
:mod:`groupwise.memory.table`. Nothing here imports torch or the trainers (the real steps of
``--measure`` live in :mod:`groupwise.memory.measure`, the command line in
:mod:`groupwise.memory.cli`).

What is counted (``--accounting full``, the default), per network, for a LLaMA-style decoder
with P parameters of which P_t are trained (P_t = P, or the LoRA adapter's size):

- weights: P x bytes(dtype).
- gradients: P_t x bytes(dtype).
- fp32 master weights: P_t x 4, with ``--precision mixed`` (the default) in fp16/bf16. With
  ``--precision pure`` weights, gradients and optimizer states all stay in the 16-bit dtype,
  which is what groupwise's own trainer does with ``dtype=bfloat16`` (torch's AdamW keeps its
  states in the parameters' dtype).
- optimizer states: AdamW m and v, 2 x 4 B per trained parameter in mixed precision and fp32
  (2 x bytes(dtype) when pure), and while torch's multi-tensor AdamW steps (``adamw_torch``,
  and ``adamw_torch_fused`` off a GPU) one more copy of v, next to the gradients (the fused
  kernel that ``adamw_torch_fused`` runs on a GPU keeps none); 8-bit AdamW (``adamw_8bit`` /
  ``adamw_bnb_8bit``, and ``paged_adamw_8bit`` in unified memory) 2 x 1 B plus one fp32 absmax
  per 256 elements of each, tensor by tensor, tensors under 4096 elements in fp32 (quant.py);
  sgd (no momentum) nothing.
  So full fine-tuning in mixed precision costs the usual 2 + 2 + 4 + 4 + 4 = 16 B per trained
  parameter, and fp32 costs 4 + 4 + 8 = 16 B too.
- LoRA (``--lora_r R``): P_t = R x (d_in + d_out) summed over the targeted linears of every
  layer (default: q, k, v, o, gate, up, down; never the LM head); the frozen base has no
  gradients or optimizer states; the reference model is the base with the adapter disabled, so
  it costs 0 extra bytes. ``--beta 0`` loads no reference at all (the row disappears). The
  adapters train in ``adapter_dtype`` (groupwise: fp32 under a bf16 base). QLoRA
  (``--load_in_4bit``): the base's linears in NF4 with double quantisation, the rest of the base
  in bf16, and one linear dequantised at a time (quant.py); each adapter also saves A's output
  and, with ``lora_dropout``, its dropped-out input and mask for backward (terms.py).
- reward model: none for rule rewards (the default), else ``--reward_model_params`` x
  bytes(dtype), frozen, the same for both algorithms.
- critic (PPO only): a copy of the policy backbone (the LM head dropped unless tied) plus a
  value head (hidden + 1), trained like the policy. With LoRA the critic gets its own frozen
  backbone copy and its own adapter (a second network cannot share the policy's activations).
- activations (one micro-batch of ``--batch`` completions, in bytes(dtype); the update's forward
  and backward pass of the policy, and of the critic for PPO, one combined loss). Per layer and
  token, a trained LLaMA block (RMSNorm, GQA attention through SDPA, SwiGLU MLP) saves for
  backward ``6h + 2q + 2kv + 4i`` values: each RMSNorm's input, normalised values and output
  (the next linears' input; in 16 bits the input is kept as an fp32 copy: 4 + 2 + 2 bytes), the
  rotated query and the attention output (2q), the rotated key and the value (2kv), and the
  MLP's gate and up projections, SiLU(gate) and their product (4i); Qwen3's per-head q/k norms
  add their fp32 input and normalised values; q = heads x head_dim, kv = kv_heads x head_dim,
  i = intermediate size (terms.py; measured on a CPU, tests/memory/test_planner_measured.py).
  A frozen base linear (LoRA, QLoRA) keeps no input: its adapter does (below). No attention
  scores: SDPA never stores them. Plus the final norm's 3h per token, and the backward pass's
  own buffers at its peak (2h + i per token). With gradient checkpointing only each layer's
  input (h per token per layer) is kept, plus one layer's full activations while it is
  recomputed in the backward pass. ``--activation_offloading`` moves
  the saved tensors to host memory (a row of its own, not in the GPU's total), leaving two
  layer's worth on the GPU (terms.py); ``--padding_free`` packs each sequence whole (prompt
  and completion, no shared prompt) and counts the update's real completion tokens
  (``--mean_completion_len``) instead of rows padded to the longest.
  Tokens per micro-batch: batch x (prompt + completion). groupwise's policy forward (GRPO's and
  PPO's) encodes a group's prompt once and shares it when a micro-batch holds whole groups and
  checkpointing is off, so its prompt tokens are batch / G x prompt, plus the prompt's keys and
  values repeated G times for the completions' attention; PPO's critic runs every completion
  with its own prompt (batch x (prompt + completion) tokens).
- logits (fp32 math, groupwise's policy/logprobs.py): ``chunked`` (``logprob_impl``, the default)
  applies the LM head to at most ``logprob_chunk_size`` completion tokens at a time and keeps
  only logsumexp per token, recomputing the chunk in the backward pass: one chunk's raw head
  outputs in the dtype, their fp32 copy (the same buffer in fp32) and fp32 exponentials,
  min(chunk, batch x completion) x vocab x (8 + bytes(dtype) if 16-bit) B. ``naive``: full logits at
  every completion position, their log-softmax (kept for backward) and one more buffer of the
  same size (the entropy's exponentials, or the gradient), 3 x batch x completion x vocab x 4 B.
- the rollout engine (``--generation_engine``; ``auto``, the run's default, is resolved for each
  way of training as the trainer resolves it: engine.py): N = batch x gradient accumulation
  completions are generated together. ``hf``: a KV cache of (2 x layers + 1) x kv_heads x
  head_dim x (prompt + completion) x N x bytes(dtype), the one extra layer's K (or V) being
  the copy ``torch.cat`` makes as the cache grows; no weights of its own. ``static``: a prompt
  cache and a row cache of 2 x layers x kv_heads x slots x head_dim x bytes(generation dtype)
  each, for N / G prompts and N rows, slots = prompt + completion (a multiple of 64 with CUDA
  graphs); for a full fine-tune its own copy of every weight, P x bytes(generation dtype),
  resident, and while it loads one layer at a time (at build and each sync, when no KV cache
  exists) one block's weights in the dtype; under LoRA and QLoRA no copy (it reads the frozen
  base in place). Both: the sampler's [N x vocab] logits, scaled logits, probabilities and
  CDF. ``vllm``: its own weights and KV cache (``vllm_gpu_memory_utilization`` of the GPU) are
  not counted (the HF engine's KV cache stands in for it).

Total (the peak): weights, master weights, optimizer states and the static engine's copy are
resident throughout; the generation phase adds the KV cache, the update phase adds gradients,
activations and logits, the optimizer step its buffers next to the gradients, the static
engine's sync its one-layer load, the prefill the prompts' KV cache and one layer's
activations of a prefill forward (the static engine's over at most 4096 prompt tokens of whole
prompts, the HF engine's over every prompt); peak = resident + max(generation, update, step,
sync, prefill).
Planning for a GPU (``--gpu_memory``) adds the CUDA context and the caching allocator's
reserved bytes over the tensors, both assumed (0.8 GB and 15% of the tensors:
:data:`DEFAULT_CUDA_CONTEXT_GB`, :data:`DEFAULT_ALLOCATOR_SLACK`), not measured. Not counted:
small per-token vectors (log-probs, advantages, values), the static engine's per-projection
buffers.

The often-quoted figures for a 7B model in fp16 (PPO "roughly 112 GB before activations",
GRPO "roughly 56 GB") are reproduced exactly by one accounting only among the natural ones tried:
each *trained* network at 8 B per parameter (fp16 weights, fp16 gradients, fp16 Adam m and v:
4 copies x 14 GB = 56 GB) and the frozen networks not counted: PPO's actor + critic = 112 GB,
GRPO's actor = 56 GB, ratio 0.5 (``--accounting quoted``). Weights only (2 B per parameter,
``--accounting weights-only``) gives 14 GB per model copy: PPO's 4 networks 56 GB, GRPO's 3
(actor, reference, reward model) 42 GB. The usual mixed-precision 16 B per trained parameter
gives 112 GB for one trained network alone, i.e. the GRPO actor; then PPO (actor + critic
trained, reference and reward model frozen) is 252 GB vs GRPO's 140 GB, ratio 0.56 (238 vs
126 GB, 0.53, with rule rewards for both).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .engine import planned_engine, prefill_prompts, static_copies_weights, static_slots
from .quant import adam_state_bytes

# The shapes and units by their names here too (``from groupwise.memory.plan import ...``).
from .shapes import BUILTIN_SHAPES as BUILTIN_SHAPES
from .shapes import LORA_TARGETS as LORA_TARGETS
from .shapes import MemoryPlanError, ModelShape, _flags
from .shapes import infer_intermediate as infer_intermediate
from .shapes import resolve_model_shape as resolve_model_shape
from .shapes import shape_from_hf_config as shape_from_hf_config
from .terms import activation_bytes as activation_bytes
from .terms import (
    activation_split,
    base_weight_bytes,
    block_weight_bytes,
    dequantised_linear_bytes,
    generation_logits_bytes,
    layer_activation_bytes,
    linear_input_bytes,
    lora_activation_bytes,
    prefill_bytes,
    static_kv_cache_bytes,
)
from .terms import kv_cache_bytes as kv_cache_bytes
from .terms import layer_activation_values as layer_activation_values
from .terms import logits_bytes as logits_bytes
from .units import human_bytes as human_bytes
from .units import human_count as human_count

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
GENERATION_ENGINES = ("hf", "static", "vllm", "auto")
# Assumed for a GPU plan (--cuda_context_gb, --allocator_slack): the CUDA context of a process
# with torch, cuBLAS and bitsandbytes loaded (0.6-1.0 GB by the usual reports: context, kernel
# images, cuBLAS workspace), and the caching allocator's reserved bytes over the tensors' peak
# (blocks split and cached between steps; 10-30% for a cache grown by concatenation; one
# checked run reserved 1.13x the planned tensors).
DEFAULT_CUDA_CONTEXT_GB = 0.8
DEFAULT_ALLOCATOR_SLACK = 0.15
VLLM_NOT_COUNTED = "vLLM's own weights and KV cache (vllm_gpu_memory_utilization of the GPU)"
OPTIMIZERS = ("adamw", "adamw8bit", "paged_adamw8bit", "paged_adamw32bit", "sgd")
# TRL's (transformers') ``optim`` names, and the planner's optimizer each one counts as.
OPTIM_NAMES = {
    "adamw_torch": "adamw", "adamw_torch_fused": "adamw", "adamw_8bit": "adamw8bit",
    "adamw_bnb_8bit": "adamw8bit", "paged_adamw_8bit": "paged_adamw8bit",
    "paged_adamw_32bit": "paged_adamw32bit", "sgd": "sgd",
}  # fmt: skip
PRECISIONS = ("mixed", "pure")
ACCOUNTINGS = ("full", "quoted", "weights-only")
QUOTED_NOTE = (
    "PPO keeps four networks (actor, frozen reference, frozen reward model, critic), 'roughly "
    "112 GB before activations' for 7B in fp16; GRPO, without the critic, 'roughly 56 GB'"
)

# Component names (the JSON keys). Rows of the generation phase and of the update phase are
# not resident at the same time; everything else is (see total_bytes).
POLICY_WEIGHTS = "policy weights"
POLICY_GRADS = "policy gradients"
POLICY_MASTER = "policy fp32 master weights"
POLICY_OPTIM = "policy optimizer states"
POLICY_STEP = "policy optimizer step"
POLICY_ACTS = "policy activations"
LOGITS = "logits"
KV_CACHE = "KV cache (generation)"
GENERATION_WEIGHTS = "generation engine weights"
GENERATION_LOGITS = "logits (generation)"
STATIC_LOAD = "static engine load, one layer"
PREFILL = "prefill (generation)"
DEQUANT = "4-bit linear, dequantised"
HOST_ACTS = "offloaded activations (host)"
CUDA_CONTEXT = "CUDA context"
ALLOCATOR = "allocator slack"
REF_WEIGHTS = "reference weights"
RM_WEIGHTS = "reward model weights"
CRITIC_WEIGHTS = "critic weights"
CRITIC_GRADS = "critic gradients"
CRITIC_MASTER = "critic fp32 master weights"
CRITIC_OPTIM = "critic optimizer states"
CRITIC_STEP = "critic optimizer step"
CRITIC_ACTS = "critic activations"
ROW_ORDER = (
    POLICY_WEIGHTS, DEQUANT, POLICY_GRADS, POLICY_MASTER, POLICY_OPTIM, POLICY_STEP,
    POLICY_ACTS, LOGITS,
    KV_CACHE, GENERATION_LOGITS, PREFILL, GENERATION_WEIGHTS, STATIC_LOAD, REF_WEIGHTS,
    RM_WEIGHTS,
    CRITIC_WEIGHTS, CRITIC_GRADS, CRITIC_MASTER, CRITIC_OPTIM, CRITIC_STEP, CRITIC_ACTS,
    HOST_ACTS, CUDA_CONTEXT, ALLOCATOR,
)  # fmt: skip
GENERATION_PHASE = frozenset({KV_CACHE, GENERATION_LOGITS})
SYNC_PHASE = frozenset({STATIC_LOAD})  # between the optimizer step and the next rollout
PREFILL_PHASE = frozenset({PREFILL})  # a rollout's start: the prompts' cache, one layer's work
# The optimizer step: its own buffers, with the gradients (activations and logits are freed).
STEP_PHASE = frozenset({POLICY_STEP, CRITIC_STEP})
GRADIENT_ROWS = frozenset({POLICY_GRADS, CRITIC_GRADS})
HOST_ROWS = frozenset({HOST_ACTS})  # host memory: shown, not in the GPU's totals
UPDATE_PHASE = frozenset({POLICY_GRADS, POLICY_ACTS, LOGITS, CRITIC_GRADS, CRITIC_ACTS})

# What each row holds, as the table notes it ({...}: filled in from the options).
ROW_NOTES = {
    POLICY_WEIGHTS: "{weights}",
    DEQUANT: "the largest linear in {dtype}, one at a time",
    POLICY_GRADS: "trained parameters, {trained_dtype}",
    POLICY_MASTER: "trained parameters, 4 B",
    POLICY_OPTIM: "{optimizer}",
    POLICY_STEP: "torch AdamW's multi-tensor step: a copy of v, with the gradients",
    POLICY_ACTS: "saved for backward, one micro-batch{shared}",
    LOGITS: "{logits}",
    KV_CACHE: "generation phase only; {kv}",
    GENERATION_LOGITS: "the sampler's [sequences x vocab] buffers, one decoding step",
    GENERATION_WEIGHTS: "the static engine's own copy, {generation_dtype}",
    STATIC_LOAD: "at build and each sync, {dtype}; no KV cache then",
    PREFILL: "the prompts' KV cache and one layer's activations of a prefill forward",
    REF_WEIGHTS: "{reference}",
    RM_WEIGHTS: "frozen",
    CRITIC_WEIGHTS: "backbone + value head",
    CRITIC_GRADS: "",
    CRITIC_MASTER: "",
    CRITIC_OPTIM: "",
    CRITIC_STEP: "",
    CRITIC_ACTS: "trained with the policy",
    HOST_ACTS: "activation_offloading: saved tensors in host memory, not on the GPU",
    CUDA_CONTEXT: "assumed (torch, cuBLAS, bitsandbytes), not measured: --cuda_context_gb",
    ALLOCATOR: "assumed: reserved over allocated, {slack:.0%} of the tensors, --allocator_slack",
}


# ------------------------------------------------------------------------------------------------
# Options and the per-component formulas (all pure)


@dataclass(frozen=True)
class MemoryOptions:
    dtype: str = "bf16"  # fp32 | fp16 | bf16
    precision: str = "mixed"  # mixed (fp32 master + fp32 optimizer states) | pure
    optimizer: str = "adamw"  # adamw | adamw8bit | paged_adamw8bit | sgd, or TRL's optim names
    lora_r: int = 0  # 0: full fine-tuning
    lora_targets: tuple[str, ...] | None = None  # None: every linear but the LM head
    batch: int = 8  # completions per micro-batch (per_device_train_batch_size)
    group_size: int = 8  # G (num_generations)
    grad_accum: int = 1  # micro-batches per step (generated together)
    prompt_len: int = 512
    completion_len: int = 256
    gradient_checkpointing: bool = False
    logprob_impl: str = "chunked"  # chunked | naive
    logprob_chunk_size: int = 512
    beta: float = 0.04  # 0: no reference model
    reward_model_params: int = 0  # 0: rule rewards, no reward model
    share_prompt: bool = True  # the policy encodes a group's prompt once (groupwise)
    # hf | static | vllm (not counted) | auto: resolved per method as the trainer does (engine.py)
    generation_engine: str = "hf"
    generation_dtype: str | None = None  # the static engine's copy; None: the same as dtype
    adapter_dtype: str | None = None  # LoRA adapters' dtype; None: dtype (groupwise: fp32)
    load_in_4bit: bool = False  # QLoRA: the frozen base's linears in NF4 (needs lora_r > 0)
    double_quant: bool = False  # NF4's absmax quantised again (TRL's use_bnb_nested_quant)
    lora_dropout: float = 0.05  # > 0: each adapter keeps its dropped-out input for backward
    activation_offloading: bool = False  # saved activations in host memory
    padding_free: bool = False  # the update packs rows without pad tokens
    mean_completion_len: int | None = None  # padding_free's real tokens; None: completion_len
    cuda_context_bytes: int = 0  # the CUDA context (0: not planning for a GPU)
    allocator_slack: float = 0.0  # the caching allocator's share over the tensors' bytes
    device: str = "cuda"  # cpu | cuda: what auto resolves to, the static engine's graph slots
    cuda_graphs: bool = True  # the static engine's CUDA graphs (static_cuda_graphs; CUDA only)
    use_dora: bool = False  # a DoRA adapter: auto gives the HF engine
    multi_turn: bool = False  # tools / an environment: auto gives the HF engine
    generation_kwargs: bool = False  # transformers' generate() options: the HF engine

    @property
    def optimizer_kind(self) -> str:
        """The planner's optimizer for a TRL ``optim`` name (or the planner's own name)."""
        return OPTIM_NAMES.get(self.optimizer, self.optimizer)

    @property
    def update_completion_len(self) -> int:
        """Completion tokens per row in the update: padding_free packs only the real ones."""
        if self.padding_free and self.mean_completion_len is not None:
            return self.mean_completion_len
        return self.completion_len

    def validate(self) -> None:
        if self.dtype not in DTYPE_BYTES:
            raise MemoryPlanError(f"--dtype {self.dtype!r} is not one of {list(DTYPE_BYTES)}")
        if self.precision not in PRECISIONS:
            raise MemoryPlanError(
                f"--precision {self.precision!r} is not one of {list(PRECISIONS)}"
            )
        if self.optimizer_kind not in OPTIMIZERS:
            raise MemoryPlanError(
                f"--optim {self.optimizer!r} is not one of {list(OPTIM_NAMES)} (or the "
                f"planner's {list(OPTIMIZERS)})"
            )
        if self.load_in_4bit and self.lora_r <= 0:
            raise MemoryPlanError(
                "--load_in_4bit needs --lora_r > 0: QLoRA trains a LoRA adapter on the frozen "
                "4-bit base (a 4-bit model cannot be fully fine-tuned)"
            )
        if not 0 <= self.lora_dropout < 1:
            raise MemoryPlanError(f"--lora_dropout must be in [0, 1), got {self.lora_dropout}")
        if self.mean_completion_len is not None and not (
            1 <= self.mean_completion_len <= self.completion_len
        ):
            raise MemoryPlanError(
                f"--mean_completion_len must be in [1, --completion_len {self.completion_len}], "
                f"got {self.mean_completion_len}"
            )
        if self.cuda_context_bytes < 0 or self.allocator_slack < 0:
            raise MemoryPlanError("--cuda_context_gb and --allocator_slack must be >= 0")
        if self.generation_engine not in GENERATION_ENGINES:
            raise MemoryPlanError(
                f"--generation_engine {self.generation_engine!r} is not one of "
                f"{list(GENERATION_ENGINES)}"
            )
        if self.adapter_dtype is not None and self.adapter_dtype not in DTYPE_BYTES:
            raise MemoryPlanError(
                f"--adapter_dtype {self.adapter_dtype!r} is not one of {list(DTYPE_BYTES)}"
            )
        if self.generation_dtype is not None and self.generation_dtype not in DTYPE_BYTES:
            raise MemoryPlanError(
                f"--generation_dtype {self.generation_dtype!r} is not one of {list(DTYPE_BYTES)}"
            )
        if self.logprob_impl not in ("chunked", "naive"):
            raise MemoryPlanError(
                f"--logprob_impl {self.logprob_impl!r} is not one of ['chunked', 'naive']"
            )
        for flag, value in (
            ("--batch", self.batch),
            ("--group_size", self.group_size),
            ("--grad_accum", self.grad_accum),
            ("--prompt_len", self.prompt_len),
            ("--completion_len", self.completion_len),
            ("--logprob_chunk_size", self.logprob_chunk_size),
        ):
            if value < 1:
                raise MemoryPlanError(f"{flag} must be >= 1, got {value}")
        if self.lora_r < 0:
            raise MemoryPlanError(f"--lora_r must be >= 0 (0: full fine-tuning), got {self.lora_r}")
        if self.beta < 0:
            raise MemoryPlanError(f"--beta must be >= 0, got {self.beta}")
        if self.reward_model_params < 0:
            raise MemoryPlanError(
                f"--reward_model_params must be >= 0, got {self.reward_model_params}"
            )
        if (self.batch * self.grad_accum) % self.group_size:
            raise MemoryPlanError(
                f"--batch x --grad_accum ({self.batch} x {self.grad_accum}) must be a multiple of "
                f"--group_size ({self.group_size}) so that every prompt gets a full group"
            )


def resolved_engine(shape: ModelShape, opts: MemoryOptions) -> str:
    """The engine the run gets: ``generation_engine`` itself, or what ``auto`` resolves to for
    this model, training method and device (engine.py)."""
    return planned_engine(
        opts.generation_engine, device=opts.device, refusal=shape.static_refusal,
        use_dora=opts.use_dora and opts.lora_r > 0, multi_turn=opts.multi_turn,
        generation_kwargs=opts.generation_kwargs,
    )  # fmt: skip


def trained_dtype(opts: MemoryOptions) -> str:
    """The dtype of the trained parameters: the adapters' under LoRA, else the weights'."""
    return (opts.adapter_dtype or opts.dtype) if opts.lora_r else opts.dtype


def trained_bytes_per_param(opts: MemoryOptions) -> dict[str, int]:
    """Bytes per *trained* parameter, by kind: weights, gradients, fp32 master, optimizer."""
    width = DTYPE_BYTES[trained_dtype(opts)]
    mixed = opts.precision == "mixed" and width < 4
    # Adam's m and v: fp32 unless pure 16-bit; 8-bit: 2 B plus block statistics (quant.py).
    optimizer = adam_state_bytes([1 << 20], opts.optimizer_kind, _state_width(opts)) // (1 << 20)
    return {
        "weights": width,
        "gradients": width,
        "master": 4 if mixed else 0,
        "optimizer": optimizer,
    }


def _state_width(opts: MemoryOptions) -> int:
    """Bytes of each of AdamW's m and v: fp32 unless pure 16-bit training."""
    width = DTYPE_BYTES[trained_dtype(opts)]
    return 4 if (opts.precision == "mixed" or width == 4) else width


def _network_rows(
    prefix: str, frozen_bytes: int, trained: Sequence[int], opts: MemoryOptions
) -> dict[str, int]:
    """Weights of a network: ``frozen_bytes`` plus the ``trained`` tensors (their element
    counts), and the trained part's gradients, fp32 master weights and optimizer states, each
    tensor on its own (8-bit states: quant.py) (rows of 0 bytes are left out)."""
    per = trained_bytes_per_param(opts)
    count = sum(trained)
    rows = {
        f"{prefix} weights": frozen_bytes + count * per["weights"],
        f"{prefix} gradients": count * per["gradients"],
        f"{prefix} fp32 master weights": count * per["master"],
        f"{prefix} optimizer states": adam_state_bytes(
            trained, opts.optimizer_kind, _state_width(opts)
        ),
        # torch's multi-tensor AdamW takes the square root of every v into new tensors before
        # the update; its fused kernel (adamw_torch_fused on a GPU) and bitsandbytes' do not.
        f"{prefix} optimizer step": count * _state_width(opts) * _copies_v(opts),
    }
    always = (f"{prefix} weights", f"{prefix} gradients")
    return {k: v for k, v in rows.items() if v or k in always}


def _copies_v(opts: MemoryOptions) -> bool:
    """Whether the optimizer's step holds a copy of v: torch's AdamW but fused on a GPU
    (policy/optimizer.py runs adamw_torch_fused with ``fused=True`` there, as TRL does)."""
    fused = opts.optimizer == "adamw_torch_fused" and opts.device == "cuda"
    return opts.optimizer_kind == "adamw" and not fused


def _trained_numels(shape: ModelShape, opts: MemoryOptions, lm_head: bool = True) -> list[int]:
    """Element counts of the trained tensors: the LoRA adapter's, or every tensor of the model
    (without the LM head for ``lm_head=False``)."""
    if opts.lora_r:
        return shape.lora_numels(opts.lora_r, opts.lora_targets)
    numels = shape.tensor_numels()
    if not lm_head and shape.lm_head_params():
        numels = numels[:-1]  # the untied LM head is the last tensor
    elif not lm_head:
        numels = [numels[0] - shape.lm_head_params(), *numels[1:]]
    return numels


def _frozen_bytes(shape: ModelShape, opts: MemoryOptions, lm_head: bool = True) -> int:
    """Weights of the frozen base under LoRA (16-bit, or NF4 with load_in_4bit); 0 otherwise."""
    if not opts.lora_r:
        return 0
    return base_weight_bytes(
        shape, DTYPE_BYTES[opts.dtype], opts.load_in_4bit, opts.double_quant, lm_head
    )


def _activation_rows(
    shape: ModelShape, opts: MemoryOptions, share: int, prefix: str
) -> dict[str, int]:
    """One network's saved activations on the GPU, and in host memory when offloaded."""
    width = DTYPE_BYTES[opts.dtype]
    mask = 1 if opts.device == "cuda" else width  # dropout's mask: bool on CUDA only
    lora = lora_activation_bytes(
        shape, opts.lora_r, opts.lora_targets, opts.lora_dropout, width, mask
    )
    inputs = linear_input_bytes(shape, width, opts.lora_r, opts.lora_targets, opts.lora_dropout)
    frozen = opts.lora_r > 0
    gpu, host = activation_split(
        shape, opts.batch, opts.prompt_len, opts.update_completion_len, width,
        opts.gradient_checkpointing, share, lora, opts.activation_offloading,
        layer_activation_bytes(shape, width, inputs, frozen), frozen,
    )  # fmt: skip
    rows = {f"{prefix} activations": gpu}
    if host:
        rows[HOST_ACTS] = host
    return rows


def _common_rows(shape: ModelShape, opts: MemoryOptions) -> dict[str, int]:
    """Rows both algorithms have: the policy, its activations and logits, the KV cache and
    the sampler's logits of generation, the reference and the reward model."""
    opts.validate()
    width = DTYPE_BYTES[opts.dtype]
    engine = resolved_engine(shape, opts)
    generation_width = DTYPE_BYTES[generation_dtype(opts)]
    rows = _network_rows("policy", _frozen_bytes(shape, opts), _trained_numels(shape, opts), opts)
    if opts.load_in_4bit:
        rows[DEQUANT] = dequantised_linear_bytes(shape, width)
    if shape.has_layer_shapes:
        group = opts.group_size
        # padding_free packs each sequence whole (its own prompt), so no prompt is shared.
        shared = opts.share_prompt and opts.batch % group == 0 and not opts.padding_free
        share = group if shared else 1
        rows.update(_activation_rows(shape, opts, share, "policy"))
        if shape.vocab is not None:
            rows[LOGITS] = logits_bytes(
                shape.vocab, opts.batch, opts.update_completion_len, opts.logprob_impl,
                opts.logprob_chunk_size, width,
            )  # fmt: skip
        sequences = opts.batch * opts.grad_accum
        prompts = max(1, sequences // opts.group_size)
        static = engine == "static"
        if static:
            tokens = opts.prompt_len + opts.completion_len
            slots = static_slots(tokens, opts.device, opts.cuda_graphs)
            rows[KV_CACHE] = static_kv_cache_bytes(
                shape, sequences // opts.group_size, sequences, slots, generation_width
            )
        else:
            slots = opts.prompt_len  # the HF engine's prompt cache holds the prompts alone
            rows[KV_CACHE] = kv_cache_bytes(
                shape, sequences, opts.prompt_len, opts.completion_len, width
            )
        if shape.vocab is not None:
            rows[GENERATION_LOGITS] = generation_logits_bytes(shape.vocab, sequences, width)
        rows[PREFILL] = prefill_bytes(
            shape, prompts, prefill_prompts(engine, prompts, opts.prompt_len), slots,
            opts.prompt_len, generation_width if static else width,
        )  # fmt: skip
    if engine == "static" and static_copies_weights(opts.lora_r):
        rows[GENERATION_WEIGHTS] = shape.num_params() * generation_width
        if shape.has_layer_shapes:
            rows[STATIC_LOAD] = block_weight_bytes(shape, width)
    if opts.beta > 0:
        # LoRA: the reference is the base with the adapter disabled, no second copy.
        rows[REF_WEIGHTS] = 0 if opts.lora_r else shape.num_params() * width
    if opts.reward_model_params:
        rows[RM_WEIGHTS] = opts.reward_model_params * width
    return rows


def _gpu_overheads(rows: dict[str, int], opts: MemoryOptions) -> dict[str, int]:
    """The rows with the CUDA context and the allocator's slack over the tensors' peak."""
    if opts.allocator_slack:
        rows[ALLOCATOR] = round(opts.allocator_slack * total_bytes(rows))
    if opts.cuda_context_bytes:
        rows[CUDA_CONTEXT] = opts.cuda_context_bytes
    return rows


def generation_dtype(opts: MemoryOptions) -> str:
    """The dtype of the static engine's weight copy."""
    return opts.generation_dtype or opts.dtype


def plan_grpo(shape: ModelShape, opts: MemoryOptions) -> dict[str, int]:
    """Bytes per component for GRPO: policy, reference (beta > 0), reward model (if any)."""
    return _ordered(_gpu_overheads(_common_rows(shape, opts), opts))


def critic_split(shape: ModelShape, opts: MemoryOptions) -> tuple[int, int]:
    """(frozen, trained) parameters of PPO's critic: the backbone without the LM head plus a
    value head (hidden -> 1, with bias); with LoRA the backbone is frozen and gets an adapter."""
    head = shape.hidden + 1 if shape.hidden is not None else 0
    backbone = shape.num_params() - shape.lm_head_params()
    if opts.lora_r:
        return backbone, shape.lora_params(opts.lora_r, opts.lora_targets) + head
    return 0, backbone + head


def plan_ppo(shape: ModelShape, opts: MemoryOptions) -> dict[str, int]:
    """Bytes per component for PPO: GRPO's rows plus a trained critic and its activations.
    groupwise's PPO samples the same G completions per prompt and computes the policy's
    log-probs as GRPO does (prompt shared); the critic runs every completion with its own copy
    of the prompt."""
    rows = _common_rows(shape, opts)
    head = [shape.hidden, 1] if shape.hidden is not None else []
    trained = _trained_numels(shape, opts, lm_head=False) + head
    rows.update(_network_rows("critic", _frozen_bytes(shape, opts, lm_head=False), trained, opts))
    if POLICY_ACTS in rows:
        critic = _activation_rows(shape, opts, 1, "critic")
        rows[CRITIC_ACTS] = critic[CRITIC_ACTS]
        if HOST_ACTS in critic:
            rows[HOST_ACTS] += critic[HOST_ACTS]
    return _ordered(_gpu_overheads(rows, opts))


def _ordered(rows: dict[str, int]) -> dict[str, int]:
    return {k: rows[k] for k in ROW_ORDER if k in rows}


def total_bytes(components: dict[str, int]) -> int:
    """Peak: resident rows + max(generation phase, update phase, the optimizer step with the
    gradients, the static engine's sync, the prefill).
    Components of other
    accountings (quoted, weights-only) are all resident, i.e. summed."""
    generation = sum(v for k, v in components.items() if k in GENERATION_PHASE)
    update = sum(v for k, v in components.items() if k in UPDATE_PHASE)
    sync = sum(v for k, v in components.items() if k in SYNC_PHASE)
    prefill = sum(v for k, v in components.items() if k in PREFILL_PHASE)
    own = sum(v for k, v in components.items() if k in STEP_PHASE)
    step = own + sum(v for k, v in components.items() if k in GRADIENT_ROWS) if own else 0
    host = sum(v for k, v in components.items() if k in HOST_ROWS)
    resident = sum(components.values()) - generation - update - sync - own - host - prefill
    return resident + max(generation, update, sync, step, prefill)


def missing_rows(shape: ModelShape) -> dict[str, str]:
    """Rows that cannot be computed for this shape, with what they need."""
    notes: dict[str, str] = {}
    if not shape.has_layer_shapes:
        need = _flags(shape.missing("layers", "hidden", "heads", "intermediate"))
        for row in (POLICY_ACTS, LOGITS, KV_CACHE, CRITIC_ACTS):
            notes[row] = f"needs {need}"
    elif shape.vocab is None:
        notes[LOGITS] = "needs --vocab"
    return notes


# ------------------------------------------------------------------------------------------------
# The accountings behind the often-quoted 7B figures


def quoted_weights_only(params: int, dtype_bytes: int) -> dict[str, dict[str, int]]:
    """Weights only: one copy per network. PPO: actor, reference, reward model, critic; GRPO:
    actor, reference, reward model (the quoted PPO setting has a learned reward model)."""
    copy = params * dtype_bytes
    grpo = {"actor weights": copy, "reference weights": copy, "reward model weights": copy}
    return {"ppo": {**grpo, "critic weights": copy}, "grpo": grpo}


def quoted_trained_only(params: int, dtype_bytes: int) -> dict[str, dict[str, int]]:
    """The accounting that gives the quoted 112 GB vs 56 GB for 7B fp16: every trained network
    holds weights, gradients, Adam m and v all in the 16-bit dtype (4 copies, 8 B per parameter
    in fp16); frozen networks (reference, reward model) are not counted."""
    per = 4 * params * dtype_bytes
    label = f"weights + gradients + Adam m, v ({4 * dtype_bytes} B/param)"
    return {
        "ppo": {f"actor: {label}": per, f"critic: {label}": per},
        "grpo": {f"actor: {label}": per},
    }


# ------------------------------------------------------------------------------------------------
# The plan


@dataclass
class MemoryPlan:
    shape: ModelShape
    options: MemoryOptions
    accounting: str
    ppo: dict[str, int]
    grpo: dict[str, int]
    missing: dict[str, str] = field(default_factory=dict)
    alternatives: dict[str, tuple[int | None, int | None]] = field(default_factory=dict)

    @property
    def ppo_total(self) -> int:
        return total_bytes(self.ppo)

    @property
    def grpo_total(self) -> int:
        return total_bytes(self.grpo)

    @property
    def ratio(self) -> float:
        return self.grpo_total / self.ppo_total if self.ppo_total else float("nan")

    def to_json(self) -> dict[str, Any]:
        return {
            "ppo": {"components": dict(self.ppo), "total_bytes": self.ppo_total},
            "grpo": {"components": dict(self.grpo), "total_bytes": self.grpo_total},
            "ratio": self.ratio,
        }


def make_plan(shape: ModelShape, opts: MemoryOptions, accounting: str = "full") -> MemoryPlan:
    opts.validate()
    if accounting not in ACCOUNTINGS:
        raise MemoryPlanError(f"--accounting {accounting!r} is not one of {list(ACCOUNTINGS)}")
    width = DTYPE_BYTES[opts.dtype]
    if accounting == "quoted":
        parts = quoted_trained_only(shape.num_params(), width)
        return MemoryPlan(shape, opts, accounting, parts["ppo"], parts["grpo"])
    if accounting == "weights-only":
        parts = quoted_weights_only(shape.num_params(), width)
        return MemoryPlan(shape, opts, accounting, parts["ppo"], parts["grpo"])
    plan = MemoryPlan(shape, opts, accounting, plan_ppo(shape, opts), plan_grpo(shape, opts))
    plan.missing = missing_rows(shape)
    if resolved_engine(shape, opts) == "vllm":
        plan.missing[GENERATION_WEIGHTS] = VLLM_NOT_COUNTED
    # The alternatives the options did not choose, shown but not added to the totals.
    if shape.has_layer_shapes:
        other = replace(opts, gradient_checkpointing=not opts.gradient_checkpointing)
        label = "activations " + (
            "without gradient checkpointing" if opts.gradient_checkpointing else
            "with gradient checkpointing"
        )  # fmt: skip
        ppo_alt, grpo_alt = plan_ppo(shape, other), plan_grpo(shape, other)
        plan.alternatives[f"policy {label}"] = (ppo_alt[POLICY_ACTS], grpo_alt[POLICY_ACTS])
        plan.alternatives[f"critic {label}"] = (ppo_alt[CRITIC_ACTS], None)
        if shape.vocab is not None:
            impl = "naive" if opts.logprob_impl == "chunked" else "chunked"
            alt = replace(opts, logprob_impl=impl)
            text = (
                "logits, naive (full [tokens x vocab] fp32 buffers)" if impl == "naive" else
                f"logits, chunked ({opts.logprob_chunk_size} tokens x vocab per chunk)"
            )  # fmt: skip
            plan.alternatives[text] = (plan_ppo(shape, alt)[LOGITS], plan_grpo(shape, alt)[LOGITS])
    return plan
