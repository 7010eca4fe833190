"""Micro-batches of a rollout: which rows go together, and how each shares its prompt forward.

Pure functions on row indices and lengths; the policy (:mod:`groupwise.policy.policy`) and the PPO
critic run one forward per micro-batch, padded only to that micro-batch's longest completion.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..rollout import Rollout


def minibatch_prompts(num_prompts: int, num_minibatches: int) -> list[torch.Tensor]:
    """Split a generation batch's prompts into ``num_minibatches`` mini-batches, one optimizer
    step each (TRL's steps_per_generation): consecutive blocks of equal size, in batch order
    (the sampler already shuffled it), so a prompt's group is never split and every mini-batch
    holds the same number of prompts. Returns LongTensors of prompt (group) indices."""
    if num_minibatches < 1 or num_prompts % num_minibatches:
        raise ValueError(
            f"{num_prompts} prompts do not split into {num_minibatches} equal mini-batches"
        )
    return list(torch.arange(num_prompts).split(num_prompts // num_minibatches))






def trimmed_completions(
    rollout: Rollout, rows: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The completion ids and mask of ``rows``, cut to their longest completion (at least one
    column), and that width: a micro-batch's forward pays only for its own padding."""
    width = max(int(rollout.host_lengths[rows].max()), 1) if len(rows) else 1
    mask = rollout.completion_mask[rows]
    return rollout.completion_ids[rows, :width], mask[:, :width], width


def micro_batch_rows(
    lengths: torch.Tensor, size: int, group_size: int | None, *, by_length: bool = True
) -> list[torch.Tensor]:
    """Split the rows of a rollout into micro-batches of at most ``size`` rows (LongTensors of
    row indices), laid out so that each can share its prompt forward (see :func:`prompt_blocks`).

    With uniform groups of ``group_size`` rows (rows of a group contiguous): if ``size`` is a
    multiple of it, micro-batches hold whole groups; if it divides it, each micro-batch holds
    ``size`` rows of one group (with ``by_length``, a group's longest rows go together). Else
    the units are single rows. With ``by_length`` the units are ordered longest first (a unit
    counts as its longest completion; stable for ties), so each micro-batch pads to a similar
    width. A single micro-batch keeps the rollout's order. Every row appears exactly once.
    """
    n_rows = int(lengths.numel())
    if size >= n_rows:
        return [torch.arange(n_rows)]
    rows = torch.arange(n_rows)
    uniform = group_size is not None and n_rows % group_size == 0
    if uniform and size % group_size == 0:
        units = rows.view(-1, group_size)  # whole groups
    elif uniform and group_size % size == 0:
        units = rows.view(-1, group_size)
        if by_length:
            within = torch.sort(lengths.view(-1, group_size), dim=1, descending=True, stable=True)
            units = units.gather(1, within.indices)
        units = units.reshape(-1, size)  # pieces of one group
    else:
        units = rows.view(-1, 1)
    if by_length:
        order = torch.sort(lengths[units].max(dim=1).values, descending=True, stable=True)
        units = units[order.indices]
    return list(units.reshape(-1).split(size))


def prompt_blocks(row_groups: torch.Tensor, group_size: int) -> tuple[torch.Tensor, int] | None:
    """How a micro-batch can share its prompt forward: ``(prompts, block)`` when its rows form
    consecutive blocks of ``block`` rows answering the same prompt (row r answers
    ``prompts[r // block]``, the layout ``completion_logprobs(group_size=block)`` takes), else
    None. ``row_groups``: the prompt (group) index of each row. Tried: every row one prompt
    (block = all rows), then blocks of ``group_size``."""
    n_rows = int(row_groups.numel())
    if n_rows == 0:
        return None
    if bool((row_groups == row_groups[0]).all()):
        return row_groups[:1], n_rows
    if n_rows % group_size == 0:
        blocks = row_groups.view(-1, group_size)
        if bool((blocks == blocks[:, :1]).all()):
            return blocks[:, 0], group_size
    return None


def scatter_rows(
    parts: Sequence[torch.Tensor], micro_batches: Sequence[torch.Tensor]
) -> torch.Tensor:
    """Re-assemble per-micro-batch results [n_k, ...] into rollout row order [N, ...]."""
    index = torch.cat(list(micro_batches)).to(parts[0].device)
    out = parts[0].new_empty((index.numel(), *parts[0].shape[1:]))
    out[index] = torch.cat(list(parts))
    return out
