"""Per-token log-probabilities of completion tokens, computed without full logits.

The decoder runs once over prompt + completion; only unmasked completion positions go through
the LM head. For the M selected rows h (hidden size H) and a head with weight W [V, H] and
optional bias b, with logit soft-capping c (Gemma's ``final_logit_softcapping``) and sampling
temperature T:

    x = h W^T + b,   s(x) = c * tanh(x / c)   (s = identity without a cap),   z = s(x) / T  (1)
    log p(y) = z_y - logsumexp(z)                                                          (2)
    entropy = logsumexp(z) - sum_v p_v z_v                                                 (3)

The entropy is differentiated only when asked (``entropy_grad``: an entropy bonus in the loss);
otherwise it is a detached by-product for logging and the top-entropy token mask.

Three implementations (``impl``):

- ``"chunked"`` (default): :class:`ChunkedLMHeadLogprob`, a custom autograd function that applies
  the head itself, ``chunk_size`` rows at a time, and keeps only logsumexp(z) per row. Its
  backward recomputes each chunk's logits and uses the closed-form gradient

      d log p(y) / dz = onehot(y) - p                                                     (4)
      dz / dx = (1 - tanh^2(x / c)) / T        (1 / T without a cap)                      (5)
      grad_h = g_x W,   grad_W = sum over chunks of g_x^T h,   grad_b = sum of g_x         (6)
      d entropy / dz = -p * (log p + entropy)                                              (7)

  with g_x the upstream gradient chained through (4) and (5). Neither pass holds more than
  [chunk_size x V] logits (the approach of Liger's fused linear cross-entropy, Unsloth and
  torchtune). Heads that are not a plain ``nn.Linear`` (LoRA or quantised wrappers, hooks)
  fall back to ``"checkpoint"``.
- ``"checkpoint"``: the head module is called per chunk under activation checkpointing; the
  same memory bound, but autograd rebuilds the chunk's graph in the backward pass.
- ``"naive"``: full [N, T, V] logits at every completion position and one log-softmax, from
  the same hidden states: the baseline for benchmarks (config option ``logprob_impl``).

With ``group_size`` G > 1 (rows ordered group by group, each group sharing one prompt), the
prompt is run once per group and its KV cache is repeated G times for the completions: exact,
since the prompt positions' activations are identical across the group, and autograd sums the G
gradient contributions through ``repeat_interleave``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable
from torch.nn.modules import module as nn_module
from torch.utils.checkpoint import checkpoint
from transformers import DynamicCache, PreTrainedModel

from ..runtime.kv_cache import cache_keyword, has_recurrent_state, returned_cache
from .packing import is_flash, pack_rows

IMPLS = ("chunked", "checkpoint", "naive")


def _math_dtype(dtype: torch.dtype) -> torch.dtype:
    """Softmax math never runs in 16 bits: fp32 for bf16/fp16/fp32 models, fp64 stays fp64."""
    return torch.promote_types(dtype, torch.float32)


def _scale_logits(
    raw: torch.Tensor, temperature: float, softcap: float | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """z of Eq. 1 in the math dtype, from raw head outputs x; also tanh(x / c) (for Eq. 5), or
    None without a cap. May return ``raw`` itself (fp32, T = 1, no cap): callers own ``raw``."""
    z = raw.to(_math_dtype(raw.dtype))
    tanh = None
    if softcap:
        tanh = torch.tanh(z / softcap)
        z = tanh * softcap
    if temperature != 1.0:
        z = z / temperature
    return z, tanh


def _scale_logits_(
    raw: torch.Tensor, temperature: float, softcap: float | None, keep_tanh: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """In-place version of :func:`_scale_logits` for the custom function, which owns ``raw``
    and runs outside autograd: fewer passes over [chunk, V]. With ``keep_tanh`` the cap's
    tanh(x / c) gets its own buffer (the backward needs it for Eq. 5)."""
    z = raw.to(_math_dtype(raw.dtype))
    if softcap:
        if keep_tanh:
            tanh = z.div_(softcap).tanh_()
            return tanh * (softcap / temperature), tanh
        return z.div_(softcap).tanh_().mul_(softcap / temperature), None
    if temperature != 1.0:
        z.div_(temperature)
    return z, None


class ChunkedLMHeadLogprob(torch.autograd.Function):
    """log p(target) (Eq. 2) and the entropy (Eq. 3) of softmax(z), z from Eq. 1, for hidden
    rows [M, H], without ever holding more than [chunk_size, V] logits.

    ``apply(hidden, targets, weight, bias, temperature, softcap, chunk_size, entropy_grad)``
    with ``weight`` [V, H] (for tied embeddings, the embedding matrix: autograd adds both
    gradients), ``bias`` [V] or None. Returns (logp [M], entropy [M]) in fp32 (fp64 for fp64
    inputs); the entropy is differentiable (Eq. 7) only with ``entropy_grad``. Saves only the
    inputs, logsumexp(z) [M] and (with ``entropy_grad``) the entropy [M] for the backward;
    gradients for inputs that do not require them (e.g. a frozen head under LoRA) are not
    computed.
    """

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        hidden: torch.Tensor,
        targets: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        temperature: float,
        softcap: float | None,
        chunk_size: int,
        entropy_grad: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n_rows = hidden.shape[0]
        math_dtype = _math_dtype(weight.dtype)
        log_z = hidden.new_empty(n_rows, dtype=math_dtype)
        logp = torch.empty_like(log_z)
        entropy = torch.empty_like(log_z)
        for begin in range(0, n_rows, chunk_size):
            rows = slice(begin, begin + chunk_size)
            raw = F.linear(hidden[rows], weight, bias)
            z, _ = _scale_logits_(raw, temperature, softcap, keep_tanh=False)
            # log Z = m + log sum exp(z - m) with m the row max; the exponentials are kept for
            # the entropy (Eq. 3): sum_v p_v z_v = sum_v e_v z_v / sum_v e_v.
            top = z.amax(dim=-1, keepdim=True)
            exps = (z - top).exp_()
            total = exps.sum(-1)
            chunk_log_z = top.squeeze(-1) + total.log()
            log_z[rows] = chunk_log_z
            logp[rows] = z.gather(-1, targets[rows, None]).squeeze(-1) - chunk_log_z  # Eq. 2
            entropy[rows] = chunk_log_z - exps.mul_(z).sum(-1) / total  # Eq. 3
            del raw, z, exps  # free this chunk's [chunk, V] buffers before the next is made
        # The entropy is kept only when its gradient (Eq. 7) will be needed.
        kept_entropy = entropy if entropy_grad else None
        ctx.save_for_backward(hidden, targets, weight, bias, log_z, kept_entropy)
        ctx.temperature, ctx.softcap, ctx.chunk_size = temperature, softcap, chunk_size
        ctx.entropy_grad = entropy_grad
        if not entropy_grad:
            ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    @once_differentiable
    def backward(
        ctx: torch.autograd.function.FunctionCtx,
        grad_logp: torch.Tensor,
        grad_entropy: torch.Tensor | None,
    ) -> tuple[torch.Tensor | None, ...]:
        hidden, targets, weight, bias, log_z, entropy = ctx.saved_tensors
        need_hidden, _, need_weight, need_bias = ctx.needs_input_grad[:4]
        if not ctx.entropy_grad:
            grad_entropy = None
        math_dtype = log_z.dtype
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        # Head gradients are sums over all chunks: accumulate in (at least) fp32, cast at the end.
        grad_weight = torch.zeros_like(weight, dtype=math_dtype) if need_weight else None
        grad_bias = torch.zeros_like(bias, dtype=math_dtype) if need_bias else None
        for begin in range(0, hidden.shape[0], ctx.chunk_size):
            rows = slice(begin, begin + ctx.chunk_size)
            h, g = hidden[rows], grad_logp[rows].to(math_dtype)
            raw = F.linear(h, weight, bias)
            z, tanh = _scale_logits_(raw, ctx.temperature, ctx.softcap, keep_tanh=True)
            # Eq. 4 times the upstream gradient g and Eq. 5's 1 / T, in place over z:
            # g_z = (g / T) * (onehot(y) - p),  p = exp(z - log Z).
            g = g / ctx.temperature
            log_p = z.sub_(log_z[rows, None])
            if grad_entropy is None:
                g_z = log_p.exp_().mul_(-g[:, None])
            else:
                # Plus Eq. 7 times its upstream gradient g_H (and 1 / T):
                # g_z = -p * (g + g_H * (log p + H)), then + g at the target.
                g_h = grad_entropy[rows].to(math_dtype) / ctx.temperature
                p = log_p.exp()
                factor = log_p.add_(entropy[rows, None]).mul_(g_h[:, None]).add_(g[:, None])
                g_z = p.mul_(factor).neg_()
                del factor
            g_z.scatter_add_(-1, targets[rows, None], g[:, None])
            if tanh is not None:  # Eq. 5: the cap's derivative 1 - tanh^2(x / c)
                g_z.mul_(tanh.square_().neg_().add_(1.0))
            g_x = g_z.to(weight.dtype)
            # Eq. 6.
            if need_hidden:
                grad_hidden[rows] = g_x @ weight
            if need_weight:
                if grad_weight.dtype == weight.dtype:
                    grad_weight.addmm_(g_x.T, h)
                else:
                    grad_weight += g_x.T @ h
            if need_bias:
                grad_bias += g_z.sum(0)
            del raw, z, tanh, g_z, g_x  # as in the forward: one chunk's buffers at a time
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        if grad_bias is not None:
            grad_bias = grad_bias.to(bias.dtype)
        return grad_hidden, None, grad_weight, grad_bias, None, None, None, None


def _is_plain_linear(head: torch.nn.Module) -> bool:
    """True when head(h) is exactly F.linear(h, head.weight, head.bias), so the custom function
    may bypass the module. Anything else (LoRA or quantised wrappers, Linear subclasses and
    parametrisations, module or global hooks, a forward patched on the instance as accelerate
    does) must run through the module itself."""
    if type(head) is not torch.nn.Linear or "forward" in vars(head):
        return False
    hooks = (
        head._forward_hooks,
        head._forward_pre_hooks,
        head._backward_hooks,
        head._backward_pre_hooks,
        getattr(nn_module, "_global_forward_hooks", None),
        getattr(nn_module, "_global_forward_pre_hooks", None),
        getattr(nn_module, "_global_backward_hooks", None),
        getattr(nn_module, "_global_backward_pre_hooks", None),
    )
    if any(hooks):
        return False
    plain = (torch.Tensor, torch.nn.Parameter)
    return type(head.weight) in plain and (head.bias is None or type(head.bias) in plain)


def _token_logprobs_and_entropy(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    lm_head: torch.nn.Module,
    temperature: float,
    softcap: float | None,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eqs. 2 and 3 for [M, H] rows through the head module (``"checkpoint"`` path)."""
    logits, _ = _scale_logits(lm_head(hidden), temperature, softcap)
    log_z = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets[:, None]).squeeze(-1) - log_z
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        probs = torch.exp(logits - log_z[:, None])
        entropy = log_z - (probs * logits).sum(-1)
    return logp, entropy


def _naive_logprobs_and_entropy(
    hidden: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    lm_head: torch.nn.Module,
    temperature: float,
    softcap: float | None,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eqs. 2 and 3 from full [N, T, V] logits at every completion position (``"naive"``)."""
    logits, _ = _scale_logits(lm_head(hidden), temperature, softcap)
    log_probs = torch.log_softmax(logits, dim=-1)
    logp = log_probs.gather(-1, completion_ids[..., None]).squeeze(-1)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropy = -(log_probs.exp() * log_probs).sum(-1)
    padding = ~completion_mask.bool()
    return logp.masked_fill(padding, 0.0), entropy.masked_fill(padding, 0.0)


def _trim_left(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop columns that are padding in every row (left padding shared by the batch)."""
    used = mask.any(dim=0).nonzero()
    start = int(used[0]) if used.numel() else 0
    return ids[:, start:], mask[:, start:]


def _packed_hidden(
    decoder: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    one_row: bool,
) -> torch.Tensor:
    """The hidden states [M, H] that predict the unmasked completion tokens (row-major order),
    from one forward over the sequences packed without padding (policy/packing.py)."""
    packed = pack_rows(prompt_ids, prompt_mask, completion_ids, completion_mask, one_row=one_row)
    # No attention mask and no cache: transformers then reads the restarting position ids as
    # packed sequences and makes the attention block-diagonal (with a cache it would not).
    hidden = decoder(
        input_ids=packed.input_ids,
        position_ids=packed.position_ids,
        use_cache=False,
        **packed.flash_kwargs,
    ).last_hidden_state
    return hidden.flatten(0, 1)[packed.predict]


def completion_logprobs(
    model: PreTrainedModel,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = 512,
    group_size: int | Sequence[int] = 1,
    impl: str = "chunked",
    entropy_grad: bool = False,
    padding_free: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs [N, T] of ``completion_ids`` under ``model`` (0 at masked positions) and the
    per-token entropy [N, T] (0 at masked positions; detached unless ``entropy_grad``).

    prompt_ids/prompt_mask: [P, Lp], left-padded; ``group_size`` rows of the completions per
    prompt, in prompt order (an int: every prompt's; a sequence: prompt i's own count, the
    unequal groups of a curriculum), so each prompt is encoded once and its KV cache and last
    hidden state are repeated for its rows. completion_ids/mask: [N, T], right-padded. Logits
    are divided by ``temperature`` so the log-probs are those of the sampling distribution (as
    TRL does). ``impl`` picks how the LM head and log-softmax run (module docstring): ``"chunked"``
    (custom autograd function, default), ``"checkpoint"`` or ``"naive"`` (full logits).
    Results are fp32 (fp64 for an fp64 model). ``padding_free``: one forward over the
    sequences packed without padding (policy/packing.py; the same values), except for models
    with a recurrent state, whose state would flow across packed sequences.
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    n_rows, width = completion_ids.shape
    counts = [group_size] * prompt_ids.shape[0] if isinstance(group_size, int) else list(group_size)
    if len(counts) != prompt_ids.shape[0] or sum(counts) != n_rows or min(counts, default=1) < 1:
        raise ValueError(
            f"{prompt_ids.shape[0]} prompts with group_size {group_size} != {n_rows} completions"
        )
    shared = max(counts, default=1) > 1
    row_prompt = None  # row r's prompt, for unequal counts (output_size: no sync on CUDA)
    if len(set(counts)) > 1:
        repeats = torch.tensor(counts, device=prompt_ids.device)
        prompts = torch.arange(len(counts), device=repeats.device)
        row_prompt = torch.repeat_interleave(prompts, repeats, output_size=n_rows)

    def per_row(t: torch.Tensor) -> torch.Tensor:
        """A per-prompt tensor (dim 0) once per row of its prompt."""
        if row_prompt is not None:
            return t[row_prompt]
        return t if not counts or counts[0] == 1 else t.repeat_interleave(counts[0], dim=0)

    prompt_ids, prompt_mask = _trim_left(prompt_ids, prompt_mask)
    decoder = model.get_decoder()
    lm_head = model.get_output_embeddings()
    softcap = getattr(model.config, "final_logit_softcapping", None)
    prompt_len = prompt_ids.shape[1]
    prompt_pos = (prompt_mask.cumsum(-1) - 1).clamp(min=0)

    cache = DynamicCache(config=model.config)
    if shared and has_recurrent_state(cache):
        # A recurrent (Mamba) state cannot be shared by repeating it and then continued with
        # gradients through it as a KV cache is: each row encodes its own prompt.
        prompt_ids, prompt_mask = per_row(prompt_ids), per_row(prompt_mask)
        prompt_pos = per_row(prompt_pos)
        counts, row_prompt, shared = [1] * n_rows, None, False
    select = completion_mask.bool()
    packed = padding_free and not has_recurrent_state(cache)
    if packed:
        # Each row its own prompt again: packing runs every prompt token once per sequence.
        rows_hidden = _packed_hidden(
            decoder,
            per_row(prompt_ids),
            per_row(prompt_mask),
            completion_ids,
            completion_mask,
            one_row=is_flash(model),
        )
        hidden = None
        if impl == "naive":
            hidden = rows_hidden.new_zeros((n_rows, width, rows_hidden.shape[-1]))
            hidden = hidden.masked_scatter(select[..., None], rows_hidden)
    elif not shared:
        ids = torch.cat([per_row(prompt_ids), completion_ids], dim=1)
        mask = torch.cat([per_row(prompt_mask), completion_mask.to(prompt_mask.dtype)], dim=1)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        hidden = decoder(
            input_ids=ids, attention_mask=mask, position_ids=positions
        ).last_hidden_state
        # The hidden state at position p predicts token p + 1.
        hidden = hidden[:, prompt_len - 1 : prompt_len - 1 + width]
    else:
        keyword = cache_keyword(decoder)
        out = decoder(
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            position_ids=prompt_pos,
            use_cache=True,
            **{keyword: cache},
        )
        cache = returned_cache(out)
        if cache is None or cache.get_seq_length() != prompt_len:
            # e.g. gradient checkpointing in training mode makes transformers drop the cache.
            raise RuntimeError("the decoder returned no prompt KV cache; use group_size=1")
        # Each prompt's KV, once per row of its own.
        if row_prompt is None:
            cache.batch_repeat_interleave(counts[0])
        else:
            cache.batch_select_indices(row_prompt)
        last_prompt_hidden = per_row(out.last_hidden_state[:, -1:])
        comp_mask = completion_mask.to(prompt_mask.dtype)
        mask = torch.cat([per_row(prompt_mask), comp_mask], dim=1)
        start = per_row(prompt_pos[:, -1:]) + 1
        positions = start + torch.arange(width, device=start.device)[None, :]
        if width > 1:
            comp_hidden = decoder(
                input_ids=completion_ids[:, :-1],
                attention_mask=mask[:, :-1],
                position_ids=positions[:, :-1],
                use_cache=True,
                **{keyword: cache},
            ).last_hidden_state
            hidden = torch.cat([last_prompt_hidden, comp_hidden], dim=1)
        else:
            hidden = last_prompt_hidden

    if impl == "naive":
        return _naive_logprobs_and_entropy(
            hidden, completion_ids, completion_mask, lm_head, temperature, softcap, entropy_grad
        )
    # LM head + log-softmax only at unmasked completion positions, chunk by chunk.
    if not packed:
        rows_hidden = hidden[select]  # [M, H]
    targets = completion_ids[select]
    out_dtype = _math_dtype(rows_hidden.dtype)
    logprobs = rows_hidden.new_zeros((n_rows, width), dtype=out_dtype)
    entropies = rows_hidden.new_zeros((n_rows, width), dtype=out_dtype)
    if rows_hidden.shape[0] == 0:
        return logprobs, entropies
    if impl == "chunked" and _is_plain_linear(lm_head):
        # Under autocast the head runs in the weight's dtype in both passes: the backward
        # (outside autocast) recomputes exactly the logits the forward used.
        weight = lm_head.weight
        with torch.autocast(device_type=rows_hidden.device.type, enabled=False):
            logp, entropy = ChunkedLMHeadLogprob.apply(
                rows_hidden.to(weight.dtype), targets, weight, lm_head.bias, temperature,
                softcap, chunk_size, entropy_grad,
            )  # fmt: skip
    else:
        logp_parts, entropy_parts = [], []
        for begin in range(0, rows_hidden.shape[0], chunk_size):
            h, y = rows_hidden[begin : begin + chunk_size], targets[begin : begin + chunk_size]
            if torch.is_grad_enabled() and h.requires_grad:
                logp, entropy = checkpoint(
                    _token_logprobs_and_entropy,
                    h,
                    y,
                    lm_head,
                    temperature,
                    softcap,
                    entropy_grad,
                    use_reentrant=False,
                )
            else:
                logp, entropy = _token_logprobs_and_entropy(h, y, lm_head, temperature, softcap)
            logp_parts.append(logp)
            entropy_parts.append(entropy)
        logp, entropy = torch.cat(logp_parts), torch.cat(entropy_parts)
    logprobs = logprobs.masked_scatter(select, logp.to(out_dtype))
    entropy = entropy if entropy_grad else entropy.detach()
    entropies = entropies.masked_scatter(select, entropy.to(out_dtype))
    return logprobs, entropies


def full_logits_logprobs(
    model: PreTrainedModel,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Reference implementation: full logits through ``model.forward`` and one log-softmax.
    Used by tests and benchmarks to check :func:`completion_logprobs`; memory-hungry."""
    ids = torch.cat([prompt_ids, completion_ids], dim=1)
    mask = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], dim=1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits.float()
    width = completion_ids.shape[1]
    logits = logits[:, prompt_ids.shape[1] - 1 : prompt_ids.shape[1] - 1 + width] / temperature
    logp = F.log_softmax(logits, dim=-1).gather(-1, completion_ids[..., None]).squeeze(-1)
    return logp * completion_mask
