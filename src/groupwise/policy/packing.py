"""Padding-free layout of a micro-batch: its sequences (prompt + completion) packed into rows.

A padded micro-batch of N sequences costs N x (longest prompt + longest completion) token
positions; packed, it costs about the sum of the real lengths. Each sequence keeps its own
position ids (0, 1, ... restarting at every sequence, as in the padded forward where left
padding is skipped), and attention never crosses a sequence boundary:

- under ``flash_attention_2`` (and the other flash kernels) all sequences go into ONE row and
  the kernel runs varlen over ``cu_seq_lens`` (TRL's ``padding_free``, transformers'
  ``DataCollatorWithFlattening``): exact, with no padding at all;
- under ``sdpa`` / ``eager`` (CPU) the attention is a dense mask, so one row of L tokens would
  cost L^2: sequences are packed first-fit decreasing into rows of at most ``budget`` tokens
  (default: the micro-batch's longest sequence, so no row attends over more than the padded
  forward does), and transformers builds the block-diagonal causal 4-D mask from the
  restarting position ids (``masking_utils.find_packed_sequence_indices``; sliding-window
  layers keep their window inside each block). The few padding tokens at a row's end form
  their own block and are never read.

The loss math is untouched: the same micro-batches, the same per-token log-probs, scattered
back to the padded [N, T] layout the losses read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

FLASH_PREFIX = "flash"  # flash_attention_2, flash_attention_3, kernels-community flash


@dataclass(frozen=True)
class PackedRows:
    """One micro-batch packed: ``input_ids`` and ``position_ids`` [R, W]; ``predict`` [M], the
    flat index into [R * W] of the hidden state that predicts each completion token (in the
    row-major order of ``completion_mask``, the order of ``completion_ids[completion_mask]``);
    ``flash_kwargs``: the varlen boundaries for flash kernels (empty otherwise)."""

    input_ids: Tensor
    position_ids: Tensor
    predict: Tensor
    flash_kwargs: dict


def first_fit_decreasing(lengths: list[int], budget: int) -> list[list[int]]:
    """Bins of sequence indices whose lengths sum to at most ``budget`` each: longest first,
    each into the first bin with room (FFD, at most 11/9 OPT + 1 bins). A sequence longer than
    the budget gets a bin of its own."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order:
        for b, free in enumerate(room):
            if lengths[i] <= free:
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(budget - lengths[i])
    return bins


def is_flash(model: torch.nn.Module) -> bool:
    """Whether the model's attention is a flash kernel (varlen over one packed row)."""
    implementation = getattr(model.config, "_attn_implementation", None) or ""
    return implementation.startswith(FLASH_PREFIX)


def pack_rows(
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    *,
    one_row: bool = False,
    budget: int | None = None,
    pad_id: int = 0,
) -> PackedRows:
    """Pack N sequences (left-padded prompts [N, Lp], right-padded completions [N, T]) without
    padding. ``one_row``: every sequence in one row (flash varlen); else rows of at most
    ``budget`` tokens (default and minimum: the longest sequence)."""
    ids = torch.cat([prompt_ids, completion_ids], dim=1)
    keep = torch.cat([prompt_mask.bool(), completion_mask.bool()], dim=1)
    prompt_lengths = prompt_mask.bool().sum(1)
    completion_lengths = completion_mask.bool().sum(1)
    # The layout is decided on the host: one read of the lengths per micro-batch.
    host_prompt, host_completion = torch.stack([prompt_lengths, completion_lengths]).tolist()
    if min(host_prompt) == 0:
        raise ValueError("padding_free needs a non-empty prompt in every row")
    lengths = [p + c for p, c in zip(host_prompt, host_completion, strict=True)]
    n_rows, device = len(lengths), ids.device
    if one_row:
        bins = [list(range(n_rows))]
    else:
        bins = first_fit_decreasing(lengths, max(budget or 0, max(lengths)))
    row_of, offset, fills = [0] * n_rows, [0] * n_rows, []
    for r, members in enumerate(bins):
        filled = 0
        for i in members:
            row_of[i], offset[i] = r, filled
            filled += lengths[i]
        fills.append(filled)
    width = max(fills)
    length_t = torch.tensor(lengths, device=device)
    start_t = torch.tensor(row_of, device=device) * width + torch.tensor(offset, device=device)
    # Token t of sequence s (its real tokens in order) goes to flat slot start[s] + t.
    seq = torch.repeat_interleave(torch.arange(n_rows, device=device), length_t)
    first = torch.cumsum(length_t, 0) - length_t
    within = torch.arange(seq.numel(), device=device) - first[seq]
    slot = start_t[seq] + within
    flat_ids = ids.new_full((len(bins) * width,), pad_id)
    flat_ids[slot] = ids[keep]
    # A row's tail (after its last sequence) counts 0, 1, ...: a block of its own.
    columns = torch.arange(width, device=device)
    tail = columns[None, :] - torch.tensor(fills, device=device)[:, None]
    flat_pos = tail.reshape(-1).clone()
    flat_pos[slot] = within
    # Completion token i of sequence s is its token prompt_len + i, predicted by the hidden
    # state one slot before it.
    comp_seq = torch.repeat_interleave(torch.arange(n_rows, device=device), completion_lengths)
    comp_first = torch.cumsum(completion_lengths, 0) - completion_lengths
    comp_within = torch.arange(comp_seq.numel(), device=device) - comp_first[comp_seq]
    predict = start_t[comp_seq] + prompt_lengths[comp_seq] + comp_within - 1
    flash_kwargs: dict = {}
    if one_row:
        # Sequence boundaries for the varlen kernel, given so transformers need not infer them
        # from the position ids in every layer (a host sync each).
        bounds = torch.cumsum(torch.tensor([0, *lengths], device=device), 0).to(torch.int32)
        flash_kwargs = dict(
            cu_seq_lens_q=bounds, cu_seq_lens_k=bounds,
            max_length_q=max(lengths), max_length_k=max(lengths),
        )  # fmt: skip
    return PackedRows(
        input_ids=flat_ids.view(len(bins), width),
        position_ids=flat_pos.view(len(bins), width),
        predict=predict,
        flash_kwargs=flash_kwargs,
    )
