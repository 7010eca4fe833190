"""What the update works on: which rows of a rollout go together (micro-batches that share a
prompt's forward, mini-batches of whole groups, padding trimmed per micro-batch; pure functions
on row indices and lengths) and the records of a prepared batch and of its passes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..algo.variants import BatchCounts, MicroBatch
from ..rollout import Rollout

# ----------------------------------------------------------------------------------------------
# What an update pass works on


@dataclass
class UpdateStats:
    """What the passes over one batch did: weighted metric sums (each pass counted
    1 / passes), the entropy sum over tokens, the last pass's gradient norms and per-sequence
    loss, and whether an update was skipped for a NaN/inf loss or gradient."""

    sums: dict[str, float] = field(default_factory=dict)
    entropy_sum: float = 0.0
    grad_norms: list[Tensor] = field(default_factory=list)
    sequence_loss: Tensor | None = None
    mismatch: list[tuple[Tensor, Tensor]] = field(default_factory=list)
    skipped: bool = False
    passes: int = 0
    tokens: Tensor | float = 1.0  # the global batch's trained tokens (entropy is per token)

    @property
    def grad_norm(self) -> Tensor:
        return self.grad_norms[0] if self.grad_norms else torch.tensor(0.0)


@dataclass
class PolicyInputs:
    """A prepared batch: the rollout, its micro-batches (and FSDP padding passes), the
    rollout-time log-probs per micro-batch, the global counts, and the stats of the passes."""

    rollout: Rollout
    mask: Tensor
    advantages: Tensor | None
    row_weights: Tensor | None
    micro_batches: list[Tensor]
    padding: list[Tensor]
    old_logprobs: list[Tensor | None]
    ref_logprobs: list[Tensor | None]
    counts: BatchCounts
    passes: int
    correction: list[Tensor | None] = field(default_factory=list)
    stats: UpdateStats = field(default_factory=UpdateStats)

    def micro_batch(self, k: int, device: torch.device) -> MicroBatch:
        rows = self.micro_batches[k]
        return MicroBatch(
            rows=rows,
            mask=self.mask[rows],
            advantages=None if self.advantages is None else self.advantages[rows],
            old_logprobs=self.old_logprobs[k],
            ref_logprobs=self.ref_logprobs[k],
            correction=self.correction[k],
            row_weights=None if self.row_weights is None else self.row_weights[rows].to(device),
            counts=self.counts,
            sampling_logprobs=(
                None
                if self.rollout.sampling_logprobs is None
                else self.rollout.sampling_logprobs[rows].to(device)
            ),
        )


@dataclass
class GenerationBatch:
    """One generation batch as the optimizer sees it: its mini-batches (one optimizer step each
    per pass; TRL's steps_per_generation), each prepared with the sampling policy's log-probs.
    ``rows[j]``: mini-batch j's rows in the rollout (None: the whole rollout, one mini-batch)."""

    rollout: Rollout
    rows: list[Tensor | None]
    inputs: list[PolicyInputs]


def merge_stats(parts: Sequence[UpdateStats], rows: Sequence[Tensor], n_rows: int) -> UpdateStats:
    """The stats of a generation batch from its mini-batches' (``rows[j]``: mini-batch j's rows
    in the rollout): loss and metric sums averaged over the mini-batches (so over every
    optimizer step), entropy summed with its token count, the last optimizer step's gradient
    norms, each row's policy term from the mini-batch it was trained in, skipped if any was."""
    merged = UpdateStats(passes=parts[0].passes, tokens=sum(p.tokens for p in parts))
    for part in parts:
        for key, value in part.sums.items():
            merged.sums[key] = merged.sums.get(key, 0.0) + value / len(parts)
        merged.entropy_sum += part.entropy_sum
        merged.mismatch += part.mismatch
        merged.skipped |= part.skipped
    merged.grad_norms = parts[-1].grad_norms
    if all(p.sequence_loss is not None for p in parts):
        merged.sequence_loss = torch.zeros(n_rows)
        for part, index in zip(parts, rows, strict=True):
            merged.sequence_loss[index] = part.sequence_loss
    return merged


# ----------------------------------------------------------------------------------------------
# Micro-batches of a rollout: which rows go together, and how each shares its prompt forward (the
# policy and PPO's critic run one forward per micro-batch, padded only to that micro-batch's
# longest completion)


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
    lengths: torch.Tensor,
    size: int,
    group_size: int | None,
    *,
    by_length: bool = True,
    group_ids: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """Split the rows of a rollout into micro-batches of at most ``size`` rows (LongTensors of
    row indices), laid out so that each can share its prompt forward (see :func:`prompt_blocks`).

    With uniform groups of ``group_size`` rows (rows of a group contiguous): if ``size`` is a
    multiple of it, micro-batches hold whole groups; if it divides it, each micro-batch holds
    ``size`` rows of one group (with ``by_length``, a group's longest rows go together).
    Otherwise, given each row's group (``group_ids``; groups of any sizes, e.g. a curriculum's
    rollout counts), the rows are laid out group after group and cut every ``size`` rows: a
    micro-batch holds whole groups and at most two pieces of groups, each piece contiguous, so
    every prompt in it is encoded once; with ``by_length`` groups go longest first (a group
    counts as its longest completion) and a group's longest rows first. Without ``group_ids``
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
    elif group_ids is not None:
        return list(group_order(lengths, group_ids, by_length).split(size))
    else:
        units = rows.view(-1, 1)
    if by_length:
        order = torch.sort(lengths[units].max(dim=1).values, descending=True, stable=True)
        units = units[order.indices]
    return list(units.reshape(-1).split(size))


def group_order(lengths: torch.Tensor, group_ids: torch.Tensor, by_length: bool) -> torch.Tensor:
    """The rows group after group (groups of any sizes, each group's rows contiguous in
    ``group_ids``): with ``by_length``, groups by their longest completion and each group's rows
    by length, longest first (stable for ties); else in rollout order."""
    if not by_length:
        return torch.arange(int(lengths.numel()))
    groups = torch.unique_consecutive(group_ids)
    if groups.unique().numel() != groups.numel():
        raise ValueError("the rows of each group must be contiguous")
    longest = torch.stack([lengths[group_ids == g].max() for g in groups.tolist()])
    pieces = []
    for g in groups[torch.sort(longest, descending=True, stable=True).indices].tolist():
        members = torch.nonzero(group_ids == g).flatten()
        within = torch.sort(lengths[members], descending=True, stable=True).indices
        pieces.append(members[within])
    return torch.cat(pieces)


def prompt_blocks(row_groups: torch.Tensor) -> tuple[torch.Tensor, list[int]] | None:
    """How a micro-batch can share its prompt forward: ``(prompts, counts)`` when its rows form
    consecutive runs, one per prompt (``counts[i]`` rows answer ``prompts[i]``, the layout
    ``completion_logprobs(group_size=counts)`` takes), else None: no prompt has two rows, or a
    prompt's rows are not together. ``row_groups``: the prompt (group) index of each row."""
    if row_groups.numel() == 0:
        return None
    prompts, counts = torch.unique_consecutive(row_groups, return_counts=True)
    if prompts.numel() == row_groups.numel() or prompts.unique().numel() != prompts.numel():
        return None
    return prompts, counts.tolist()


def scatter_rows(
    parts: Sequence[torch.Tensor], micro_batches: Sequence[torch.Tensor]
) -> torch.Tensor:
    """Re-assemble per-micro-batch results [n_k, ...] into rollout row order [N, ...]."""
    index = torch.cat(list(micro_batches)).to(parts[0].device)
    out = parts[0].new_empty((index.numel(), *parts[0].shape[1:]))
    out[index] = torch.cat(list(parts))
    return out
