"""The static engine: a lean decoder with a static KV cache.

The reference engine (:mod:`.hf`) decodes through the Hugging Face forward on the policy's own
weights. On a small model that forward is dominated by per-op overhead rather than by
arithmetic: about fifteen modules per layer, and under bf16 autocast a cast before every matmul on
every token besides (autocast keeps the bf16 weights for the whole generation, but casts the
activations, and the KV cache, which transformers holds in fp32 there, is cast for attention at
every step). This engine does what a serving engine does instead:

- **its weights** (:mod:`.static_weights`): for full fine-tuning its own copy in the generation
  dtype (bf16 by default), refreshed in :meth:`sync` after every optimizer step with ``copy_``
  into the same storage, one layer at a time, so no forward ever casts a weight; for a LoRA
  adapter, and a 4-bit base under it, the policy's own layers read in place with the adapters
  unmerged, so no second copy of the base exists;
- **fused projections** in its copy: one [q; k; v] matmul and one [gate; up] matmul per layer
  (as vLLM's ``QKVParallelLinear`` and ``MergedColumnParallelLinear``), on a CPU held pre-packed
  in oneDNN's blocked layout (what inductor's CPU freezing does), so no matmul re-blocks its
  weight;
- **a static KV cache** [layers, rows, kv_heads, slots, head_dim] allocated once per call: the
  prompt occupies slots ``[0, Lp)`` (left-padded), token t of every row goes to slot ``Lp + t``,
  so a decode step's shapes never depend on the step and it can be compiled (``torch.compile``)
  and, on a GPU, replayed as a CUDA graph (:mod:`.static_graphs`: one launch per token; the
  graph and its buffers are released when the rollout ends, so they never sit through the
  update, and a capture that fails falls back to the eager step, logged);
- **attention**: the prefill through ``F.scaled_dot_product_attention``; a decode step written
  out as three small batched matmuls (one query per row makes torch's CPU attention kernels
  several times slower than that);
- **few host syncs**: whether every row has finished is read every ``eos_check_every`` tokens,
  not after each token; in between, finished rows decode tokens that are discarded. At a check,
  finished rows leave the batch (``compact``, the default on a CPU, where compute follows the
  rows) or stay in it, masked (fixed shapes, the better trade on a GPU).

The architecture is the Llama family's decoder (Llama, Mistral without sliding windows, Qwen2
with q/k/v biases, Qwen3 with per-head q/k norms); :func:`supports` says whether a model fits,
and the engine is refused for one that does not. The numbers are the reference forward's up to
the order of floating-point additions: greedy completions are the same tokens, and with
``dtype=float32`` the sampler's log-probs equal the trainer's within 1e-5.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..runtime.quantization import is_4bit
from .base import Engine, Request, Rollout, SamplingParams
from .hf import (
    eos_token_ids,
    finish_rollout,
    left_pad,
    sample_next_token,
    seen_tokens,
    token_logprobs,
)
from .static_graphs import DecodeGraphs
from .static_weights import DecoderWeights, base_model, linear, packing_available

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
# Prompt tokens per prefill forward (whole prompts; at least one): bounds the prefill's
# activations, one layer of them at a time, to this many tokens (memory/engine.py counts it).
PREFILL_TOKENS = 4096


def supports(model: torch.nn.Module) -> str | None:
    """None when the static engine can decode ``model``; otherwise why not (one line)."""
    config = getattr(base_model(model), "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        return (
            f"model_type {model_type!r} is not one the static engine implements "
            f"({', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act {config.hidden_act!r} (the static engine implements silu)"
    if getattr(config, "mlp_bias", False):
        return "mlp_bias=True"
    if getattr(config, "use_sliding_window", False) or (
        model_type == "mistral" and getattr(config, "sliding_window", None)
    ):
        return "sliding-window attention"
    quantizer = getattr(base_model(model), "hf_quantizer", None)
    quantized = getattr(config, "quantization_config", None) is not None or quantizer is not None
    if quantized and not is_4bit(model):
        # Only bitsandbytes' 4-bit layers run through their own matmul in place.
        return "quantized weights other than bitsandbytes 4-bit (quantization_config)"
    peft_configs = dict(getattr(getattr(model, "module", model), "peft_config", None) or {})
    for peft_config in peft_configs.values():
        kind = str(getattr(peft_config, "peft_type", "LORA")).rsplit(".", 1)[-1].upper()
        if kind != "LORA":
            return f"a {kind} adapter (the static engine applies LoRA adapters)"
        if getattr(peft_config, "use_dora", False):
            return "a DoRA adapter (use_dora), which the static engine does not apply"
    return None


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """Llama's RMSNorm, x / sqrt(mean(x^2) + eps) * weight, accumulated in fp32: torch's fused
    kernel (one op where the Hugging Face module runs seven)."""
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """RoPE, the half-split form Llama uses: x * cos + rotate_half(x) * sin."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def attention_bias(key_mask: Tensor, group: int) -> Tensor:
    """The additive mask [B, 1, group * L, S] (0: attend, -inf: not) of :func:`attend`'s
    grouped query rows, from ``key_mask`` [B, L, S]; built once per forward, not per layer."""
    b, length, slots = key_mask.shape
    bias = torch.zeros(key_mask.shape, dtype=torch.float32, device=key_mask.device)
    bias.masked_fill_(~key_mask, float("-inf"))
    return bias[:, None, None].expand(b, 1, group, length, slots).reshape(b, 1, -1, slots)


def attend(q: Tensor, k: Tensor, v: Tensor, bias: Tensor) -> Tensor:
    """softmax(q k^T / sqrt(D) + bias) v with grouped-query heads: q [B, H, L, D], k and v
    [B, Hkv, S, D], bias from :func:`attention_bias`. Head h reads kv head h // (H / Hkv), as
    transformers' ``repeat_kv`` does, so the H / Hkv query heads of a kv head are one batched
    matmul's rows. Written out because at one query per row torch's CPU attention kernels cost
    several times these small batched matmuls; the softmax runs in fp32 as eager attention's."""
    b, h_n, length, d = q.shape
    kv_n = k.shape[1]
    q = q.reshape(b, kv_n, (h_n // kv_n) * length, d)
    scores = torch.matmul(q, k.transpose(-1, -2)).float().mul_(1.0 / math.sqrt(d)).add_(bias)
    probs = scores.softmax(dim=-1).to(v.dtype)
    return torch.matmul(probs, v).view(b, h_n, length, d)


def forward(
    w: DecoderWeights,
    tokens: Tensor,
    positions: Tensor,
    cache_k: Tensor,
    cache_v: Tensor,
    slot: int | Tensor,
    key_mask: Tensor,
) -> Tensor:
    """Run ``tokens`` [B, L] through the decoder, writing their keys and values to cache slots
    ``slot .. slot + L`` and attending over every slot ``key_mask`` [B, L, S] allows. Returns
    the last position's hidden state [B, d] after the final norm.

    A prefill (``slot`` an int) attends through ``F.scaled_dot_product_attention`` over the
    slots filled so far (``key_mask`` needs only those), so the [L, L] scores of a long prompt
    are never held for every layer; a decode step (``slot`` a tensor) through :func:`attend`."""
    b, length = tokens.shape
    h_n, kv_n, d, dt = w.heads, w.kv_heads, w.head_dim, w.dtype
    cos = w.cos[positions][:, :, None]  # [B, L, 1, D] fp32
    sin = w.sin[positions][:, :, None]
    prefill = isinstance(slot, int)
    if prefill:  # a fused kernel over the slots filled so far: no [L, S] score tensor stored
        filled = slot + length
        mask = key_mask[:, None, :, :filled]
    else:
        bias = attention_bias(key_mask, h_n // kv_n)
    # The residual stream, the norms and RoPE stay in fp32; only the matmuls and attention run
    # in ``dt``: the numerics of bf16 autocast over fp32 weights, which keeps a bf16 sampler
    # close to an fp32 trainer (bf16 residual adds would round every layer's update).
    x = F.embedding(tokens, w.embed).float()  # [B, L, hidden]
    for i, layer in enumerate(w.layers):
        h = rms_norm(x, layer.ln1, w.eps).to(dt)
        qkv = linear(h, layer.qkv, layer.qkv_bias).view(b, length, h_n + 2 * kv_n, d)
        qk, v = qkv[:, :, : h_n + kv_n].float(), qkv[:, :, h_n + kv_n :]
        if layer.q_norm is not None:  # Qwen3: RMSNorm over each head's dims before RoPE
            q, k = qk.split([h_n, kv_n], dim=2)
            qk = torch.cat([rms_norm(q, layer.q_norm, w.eps), rms_norm(k, layer.k_norm, w.eps)], 2)
        qk = rotate(qk, cos, sin).to(dt)  # q and k heads in one go
        q, k = qk[:, :, :h_n].transpose(1, 2), qk[:, :, h_n:].transpose(1, 2)
        v = v.transpose(1, 2)
        if prefill:
            cache_k[i, :, :, slot:filled] = k
            cache_v[i, :, :, slot:filled] = v
            keys, values = cache_k[i, :, :, :filled], cache_v[i, :, :, :filled]
            attn = F.scaled_dot_product_attention(q, keys, values, mask, enable_gqa=True)
        else:  # one decode token at a tensor slot (keeps a compiled step free of recompiles)
            cache_k[i].index_copy_(2, slot, k)
            cache_v[i].index_copy_(2, slot, v)
            attn = attend(q, cache_k[i], cache_v[i], bias)
        x = x + linear(attn.transpose(1, 2).reshape(b, length, h_n * d), layer.o, layer.o_bias)
        h = rms_norm(x, layer.ln2, w.eps).to(dt)
        gate, up = linear(h, layer.gate_up).chunk(2, dim=-1)
        x = x + linear(F.silu(gate) * up, layer.down)
    return rms_norm(x[:, -1], w.norm, w.eps).to(dt)


def decode_step(
    w: DecoderWeights,
    token: Tensor,
    position: Tensor,
    cache_k: Tensor,
    cache_v: Tensor,
    slot: Tensor,
    valid: Tensor,
) -> Tensor:
    """One token per row at cache slot ``slot`` (a 1-element tensor): marks the slot valid,
    runs the decoder and returns fp32 logits [B, V]."""
    valid.index_fill_(1, slot, True)
    hidden = forward(w, token[:, None], position[:, None], cache_k, cache_v, slot, valid[:, None])
    return linear(hidden, w.lm_head).float()


class StaticEngine(Engine):
    """:class:`~groupwise.rollout.base.RolloutEngine` on a lean decoder with its own copy of the
    weights (see the module docstring).

    ``dtype``: the copy's dtype (bf16: the engine's numerics differ from an fp32 trainer's, so
    the rollout carries ``sampling_logprobs`` and the trainer applies rollout correction).
    ``compile``: compile the decode step with ``torch.compile``; the first call of each new shape
    pays the compile time. ``compact``: drop finished rows at each EOS check (None: on a CPU).
    ``eos_check_every``: tokens between the host reads of "has every row finished" (the run's
    ``static_eos_check_every``).
    ``pack_weights``: hold the projections pre-packed for oneDNN (None: on a CPU whose torch
    build can, when not compiling).
    ``cuda_graphs``: replay the decode step (eager or compiled) as CUDA graphs over static
    buffers (None: on a CUDA device whenever rows are not compacted; needs fixed shapes; the
    run's ``static_cuda_graphs``).
    ``decode_graphs``: the :class:`~groupwise.rollout.static_graphs.DecodeGraphs` to run it
    through instead (tests pass one with ``capture=False`` on a CPU).
    ``weights``: a context in which the policy's full weights are readable (FSDP gathers them).
    ``in_place``: read the policy's layers in place instead of copying them (None: for a LoRA
    adapter or a 4-bit base; :mod:`.static_weights`).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        params: SamplingParams,
        generator: torch.Generator | None = None,
        *,
        eos_check_every: int,
        cuda_graphs: bool | None,
        dtype: torch.dtype = torch.bfloat16,
        compile: bool = False,
        compact: bool | None = None,
        pack_weights: bool | None = None,
        decode_graphs: DecodeGraphs | None = None,
        records_logprobs: bool = True,
        weights: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
        device: torch.device | None = None,
        in_place: bool | None = None,
    ) -> None:
        reason = supports(model)
        if reason is not None:
            raise ValueError(f"the static engine cannot decode this model: {reason}")
        self.tokenizer, self.params, self.generator = tokenizer, params, generator
        self.dtype, self.eos_check_every = dtype, max(1, int(eos_check_every))
        self.records_logprobs, self.weights = records_logprobs, weights
        self._device = device or next(model.parameters()).device
        with weights():
            self.decoder = DecoderWeights(model, dtype, self._device, in_place)
        self.eos = eos_token_ids(base_model(model), tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        # Dropping finished rows saves compute in proportion on a CPU; on a GPU fixed shapes
        # (one compiled graph) are worth more than the rows saved.
        self.compact = (self._device.type == "cpu") if compact is None else compact
        self.compiled = compile
        if pack_weights is None:
            pack_weights = (
                self._device.type == "cpu"
                and not compile
                and not self.decoder.in_place
                and packing_available(self.decoder.dtype)
            )
        elif pack_weights and self.decoder.in_place:
            raise ValueError(
                "pack_weights=True: the weights are read in place from the policy (LoRA or a "
                "4-bit base), not copied, so there is no copy to pre-pack"
            )
        elif pack_weights and not packing_available(self.decoder.dtype):
            raise ValueError(
                f"pack_weights=True: this torch build or CPU cannot pre-pack {self.decoder.dtype} "
                "weights for oneDNN (bf16 needs AVX512-BW/VL/DQ or AVX-NE-CONVERT); leave "
                "pack_weights unset to pack only where it can"
            )
        if pack_weights:
            self.decoder.pack()
        self._step = decode_step
        if compile:
            # The batch dimension shrinks when rows are compacted: compile it as a symbol.
            self._step = torch.compile(decode_step, dynamic=self.compact or None)
        cuda = self._device.type == "cuda"
        if cuda_graphs is None:
            cuda_graphs = cuda and not self.compact
        elif cuda_graphs and (not cuda or self.compact):
            raise ValueError(
                "cuda_graphs=True needs a CUDA device and fixed shapes (compact=False); got "
                f"device {self._device}, compact={self.compact}"
            )
        self.graphs = decode_graphs
        if self.graphs is None and cuda_graphs:
            self.graphs = DecodeGraphs(self._step)  # captures the compiled step when compiling
        if self.graphs is not None:
            if self.compact:
                raise ValueError("decode_graphs need fixed shapes: compact=False")
            self._step = self.graphs

    @property
    def device(self) -> torch.device:
        return self._device

    def sync(self, policy: torch.nn.Module) -> None:
        """Refresh the engine's weights from the policy's, in place (a copy: overwritten one
        layer at a time; layers read in place: their norms)."""
        with self.weights():
            self.decoder.load(policy)

    @torch.no_grad()
    def sample(self, request: Request) -> Rollout:
        """Completions for every prompt (see :class:`~groupwise.rollout.base.RolloutEngine`).
        Layers read in place are read inside ``weights`` (FSDP's full weights)."""
        with self.weights() if self.decoder.in_place else contextlib.nullcontext():
            return self._sample(request)

    def _sample(self, request: Request) -> Rollout:
        prompts, counts = request.prompt_ids, request.counts
        params, generator = request.params, request.generator
        n_prompts = len(prompts)
        w, device = self.decoder, self._device
        prompt_ids, prompt_mask = left_pad(prompts, self.pad_id)
        prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
        row_prompt = torch.arange(n_prompts, device=device).repeat_interleave(
            torch.tensor(counts, device=device)
        )
        n_rows, width, max_new = int(sum(counts)), prompt_ids.shape[1], params.max_completion_length
        slots = width + max_new if self.graphs is None else self.graphs.slots(width + max_new)
        shape = (w.layers_n, n_prompts, w.kv_heads, slots, w.head_dim)

        # 1. Prefill each prompt once: causal attention over its non-pad tokens (a pad query
        # attends to itself, so no row is all-masked), PREFILL_TOKENS prompt tokens at a time,
        # so a layer's activations stay that size however many and long the prompts are.
        cache_k = torch.zeros(shape, dtype=self.dtype, device=device)
        cache_v = torch.zeros(shape, dtype=self.dtype, device=device)
        valid = torch.zeros((n_prompts, slots), dtype=torch.bool, device=device)
        valid[:, :width] = prompt_mask.bool()
        positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
        causal = torch.ones((width, width), dtype=torch.bool, device=device).tril()
        key_mask = causal[None] & valid[:, None, :width]
        key_mask |= torch.eye(width, dtype=torch.bool, device=device)[None]
        chunk = max(1, PREFILL_TOKENS // width)
        hidden = torch.cat([
            forward(w, prompt_ids[c : c + chunk], positions[c : c + chunk],
                    cache_k[:, c : c + chunk], cache_v[:, c : c + chunk], 0,
                    key_mask[c : c + chunk])
            for c in range(0, n_prompts, chunk)
        ])  # fmt: skip
        logits = linear(hidden, w.lm_head).float()

        # 2. Every rollout of a prompt starts from its prompt's cache rows (with graphs: copied
        # into the graph's static buffers, whose addresses the captured step reads).
        if self.graphs is not None:
            buf = self.graphs.buffers((shape[0], n_rows, *shape[2:]), self.dtype, device)
            torch.index_select(cache_k, 1, row_prompt, out=buf.cache_k)
            torch.index_select(cache_v, 1, row_prompt, out=buf.cache_v)
            buf.valid.copy_(valid[row_prompt])
            cache_k, cache_v, valid = buf.cache_k, buf.cache_v, buf.valid
            logits = logits[row_prompt]
        elif n_rows != n_prompts or counts != [1] * n_prompts:
            cache_k, cache_v = cache_k[:, row_prompt], cache_v[:, row_prompt]
            valid, logits = valid[row_prompt], logits[row_prompt]
        position = positions[row_prompt, -1] + 1
        seen = None  # the repetition penalty's history: prompt, then completion tokens
        if params.repetition_penalty != 1.0:
            seen = seen_tokens(prompt_ids, prompt_mask, logits.shape[-1])[row_prompt]

        # 3. Decode. Rows that emitted EOS keep decoding (their tokens are discarded) until the
        # next check, every ``eos_check_every`` tokens: one host sync there, none per token.
        # At a check, ``compact`` drops the finished rows from the batch and the cache (compute
        # follows the live set, the right trade on a CPU); without it the shapes never change.
        eos = torch.tensor(self.eos, device=device)
        tokens = torch.full((n_rows, max_new), self.pad_id, dtype=torch.long, device=device)
        logps = torch.zeros((n_rows, max_new), device=device) if self.records_logprobs else None
        lengths = torch.full((n_rows,), max_new, dtype=torch.long, device=device)
        finished = torch.zeros(n_rows, dtype=torch.bool, device=device)  # per output row
        live = torch.arange(n_rows, device=device)  # the output row of each batch row
        done_live = torch.zeros(n_rows, dtype=torch.bool, device=device)  # per batch row
        pad = torch.tensor(self.pad_id, device=device)
        slot = torch.tensor([width], device=device)  # the cache slot of the token being fed
        for t in range(max_new):
            token = sample_next_token(logits, params, generator, seen)
            if logps is not None:  # log mu(token), the distribution it was drawn from
                logp = token_logprobs(logits, token, params, seen)
                logps[live, t] = logp.masked_fill(done_live, 0.0)
            if seen is not None:
                seen[torch.arange(token.shape[0], device=device), token] = True
            tokens[live, t] = torch.where(done_live, pad, token)
            ends = torch.isin(token, eos) & ~done_live
            lengths[live] = torch.where(ends, t + 1, lengths[live])
            done_live = done_live | ends
            if t == max_new - 1:
                break
            if (t + 1) % self.eos_check_every == 0:
                n_done = int(done_live.sum())
                if n_done == done_live.numel():
                    break
                if self.compact and n_done > 0:
                    finished[live] = done_live
                    keep = (~done_live).nonzero().squeeze(-1)
                    live, token, position = live[keep], token[keep], position[keep]
                    valid, done_live = valid[keep], done_live[keep]
                    seen = None if seen is None else seen[keep]
                    cache_k, cache_v = cache_k[:, keep], cache_v[:, keep]
            logits = self._step(w, token, position, cache_k, cache_v, slot, valid)
            position, slot = position + 1, slot + 1
        finished[live] = done_live
        if self.graphs is not None:  # the KV buffers would otherwise sit through the update
            self.graphs.release()

        return finish_rollout(
            self.tokenizer, prompt_ids, prompt_mask, row_prompt, tokens, lengths, finished, logps
        )


__all__ = ["StaticEngine", "packing_available", "supports"]
