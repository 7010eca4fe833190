"""Per-token log-probabilities of completion tokens, computed without full logits.

The decoder runs once over prompt + completion; only completion positions that are unmasked go
through the LM head, in chunks of ``chunk_size`` tokens, each chunk wrapped in activation
checkpointing when gradients are needed. A [batch x length x vocab] fp32 tensor never exists;
at most [chunk_size x vocab] does, and it is recomputed in the backward pass instead of stored.

With ``group_size`` G > 1 (rows ordered group by group, each group sharing one prompt), the
prompt is run once per group and its KV cache is repeated G times for the completions: exact,
since the prompt positions' activations are identical across the group, and autograd sums the G
gradient contributions through ``repeat_interleave``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from transformers import DynamicCache, PreTrainedModel


def _token_logprobs_and_entropy(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    lm_head: torch.nn.Module,
    temperature: float,
    softcap: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """log softmax(head(h) / T)[target] and the entropy of that distribution, for [M, H] rows."""
    logits = lm_head(hidden).float()
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    if temperature != 1.0:
        logits = logits / temperature
    log_z = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets[:, None]).squeeze(-1) - log_z
    with torch.no_grad():
        probs = torch.exp(logits - log_z[:, None])
        entropy = log_z - (probs * logits).sum(-1)
    return logp, entropy


def _trim_left(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop columns that are padding in every row (left padding shared by the batch)."""
    used = mask.any(dim=0).nonzero()
    start = int(used[0]) if used.numel() else 0
    return ids[:, start:], mask[:, start:]


def completion_logprobs(
    model: PreTrainedModel,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = 512,
    group_size: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs [N, T] of ``completion_ids`` under ``model`` (0 at masked positions) and the
    per-token entropy [N, T] (detached).

    prompt_ids/prompt_mask: [N / group_size, Lp], left-padded; row r of the completions belongs
    to prompt r // group_size. completion_ids/mask: [N, T], right-padded. Logits are divided by
    ``temperature`` so the log-probs are those of the sampling distribution (as TRL does).
    """
    n_rows, width = completion_ids.shape
    if prompt_ids.shape[0] * group_size != n_rows:
        raise ValueError(
            f"{prompt_ids.shape[0]} prompts x group_size {group_size} != {n_rows} completions"
        )
    prompt_ids, prompt_mask = _trim_left(prompt_ids, prompt_mask)
    decoder = model.get_decoder()
    lm_head = model.get_output_embeddings()
    softcap = getattr(model.config, "final_logit_softcapping", None)
    prompt_len = prompt_ids.shape[1]
    prompt_pos = (prompt_mask.cumsum(-1) - 1).clamp(min=0)

    if group_size == 1:
        ids = torch.cat([prompt_ids, completion_ids], dim=1)
        mask = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], dim=1)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        hidden = decoder(
            input_ids=ids, attention_mask=mask, position_ids=positions
        ).last_hidden_state
        # The hidden state at position p predicts token p + 1.
        hidden = hidden[:, prompt_len - 1 : prompt_len - 1 + width]
    else:
        cache = DynamicCache()
        out = decoder(
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            position_ids=prompt_pos,
            past_key_values=cache,
            use_cache=True,
        )
        cache = out.past_key_values
        if cache is None or cache.get_seq_length() != prompt_len:
            # e.g. gradient checkpointing in training mode makes transformers drop the cache.
            raise RuntimeError("the decoder returned no prompt KV cache; use group_size=1")
        cache.batch_repeat_interleave(group_size)
        last_prompt_hidden = out.last_hidden_state[:, -1:].repeat_interleave(group_size, dim=0)
        comp_mask = completion_mask.to(prompt_mask.dtype)
        mask = torch.cat([prompt_mask.repeat_interleave(group_size, dim=0), comp_mask], dim=1)
        start = prompt_pos[:, -1:].repeat_interleave(group_size, dim=0) + 1
        positions = start + torch.arange(width, device=start.device)[None, :]
        if width > 1:
            comp_hidden = decoder(
                input_ids=completion_ids[:, :-1],
                attention_mask=mask[:, :-1],
                position_ids=positions[:, :-1],
                past_key_values=cache,
                use_cache=True,
            ).last_hidden_state
            hidden = torch.cat([last_prompt_hidden, comp_hidden], dim=1)
        else:
            hidden = last_prompt_hidden

    # LM head + log-softmax only at unmasked completion positions, chunk by chunk.
    select = completion_mask.bool()
    rows_hidden = hidden[select]  # [M, H]
    targets = completion_ids[select]
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
                use_reentrant=False,
            )
        else:
            logp, entropy = _token_logprobs_and_entropy(h, y, lm_head, temperature, softcap)
        logp_parts.append(logp)
        entropy_parts.append(entropy)
    logprobs = hidden.new_zeros((n_rows, width), dtype=torch.float32)
    entropies = torch.zeros((n_rows, width), dtype=torch.float32, device=hidden.device)
    if logp_parts:
        logprobs = logprobs.masked_scatter(select, torch.cat(logp_parts))
        entropies = entropies.masked_scatter(select, torch.cat(entropy_parts).detach())
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
