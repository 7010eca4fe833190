"""The micro-batched update of a policy, and what it works on.

A step's two calls on the policy (:class:`groupwise.policy.policy.Policy`):

    inputs = policy.prepare(rollout, advantages, row_weights)  # pi_old (mu > 1), pi_ref (beta > 0)
    stats = policy.update(inputs, loss)                        # one optimizer pass

``loss`` is any callable ``loss(logprobs, micro_batch) -> LossTerms``
(:class:`groupwise.policy.loss.GRPOLoss` for GRPO). Losses are normalised over the *global* batch
(:class:`~groupwise.algo.losses.BatchCounts`: every rank's rows, tokens and micro-batches), so data
parallel gives the single-process gradient. The update is functions of the policy
(:class:`UpdatedPolicy`: its forwards and its network's optimizer calls), which its methods call;
each step of the update goes back through the policy's methods (``prepare``, ``update``,
``micro_batches``, ``step``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor

from ..algo.losses import BatchCounts, LossTerms, MicroBatch, rollout_correction_weights
from ..rollout import Rollout
from ..rollout.base import select_prompts
from ..runtime.distributed import DistributedContext, all_reduce_sum, any_rank, max_over_ranks
from ..runtime.offload import OffloadActivations
from ..sections import (
    BatchOptions,
    GenerationOptions,
    LossOptions,
    ModelOptions,
    OptimizationOptions,
    ReferenceOptions,
    RuntimeOptions,
    SectionGroup,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel


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
# The options a policy reads


@dataclass(frozen=True)
class PolicyOptions(SectionGroup):
    """The sections of the run's options that the policy reads, and only those: LoRA
    (``model``), the batch arithmetic (``batch``), the loss options the update applies itself
    (``loss``: beta, masks, rollout correction), the reference (``reference``), the sampling
    temperature its log-probs divide by (``generation``), AdamW and its schedule
    (``optimization``) and the forward's numerics and data parallelism (``runtime``)."""

    model: ModelOptions
    batch: BatchOptions
    loss: LossOptions
    reference: ReferenceOptions
    generation: GenerationOptions
    optimization: OptimizationOptions
    runtime: RuntimeOptions


# ----------------------------------------------------------------------------------------------
# Micro-batches of a rollout: which rows go together, and how each shares its prompt forward
# (pure functions on row indices and lengths; the policy and PPO's critic run one forward per
# micro-batch, padded only to that micro-batch's longest completion)


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


# ----------------------------------------------------------------------------------------------
# The update: functions of the policy, which calls them from its methods


class TrainedNetwork(Protocol):
    """A network the update steps (:class:`groupwise.policy.policy.Trainable`, or the policy,
    which steps its own): gradient accumulation, clipping and the optimizer step."""

    def zero_grad(self) -> None: ...
    def gradient_sync(self, sync: bool) -> contextlib.AbstractContextManager: ...
    def clip_grad_norm(self) -> Tensor: ...
    def step(self) -> None: ...


class UpdatedPolicy(TrainedNetwork, Protocol):
    """What the update functions use of the policy (:class:`groupwise.policy.policy.Policy`):
    its options, device and processes, its forwards (completion log-probs, the reference's, the
    training numerics and, under FSDP, the full weights for no-grad forwards) and its network's
    optimizer calls. The update calls the policy's own methods (``prepare``, ``update``,
    ``micro_batches``, ``step``), so a subclass or a wrapper of one changes the whole update."""

    options: PolicyOptions
    model: PreTrainedModel
    device: torch.device
    dist: DistributedContext
    sharded: bool
    optimizer_steps_per_generation: int

    def micro_batches(self, rollout: Rollout) -> list[Tensor]: ...
    def autocast(self) -> contextlib.AbstractContextManager: ...
    def full_weights(self) -> contextlib.AbstractContextManager: ...
    def logprobs(
        self, rollout: Rollout, rows: Tensor, model: PreTrainedModel | None = None,
        entropy_grad: bool = False,
    ) -> tuple[Tensor, Tensor]: ...  # fmt: skip
    def reference_logprobs(self, rollout: Rollout, rows: Tensor) -> Tensor: ...
    def reference_weights(self) -> contextlib.AbstractContextManager: ...
    def prepare(
        self, rollout: Rollout, advantages: Tensor | None, row_weights: Tensor | None = None,
        *, need_old: bool | None = None, exclude_rows: Tensor | None = None,
    ) -> PolicyInputs: ...  # fmt: skip
    def update(
        self, inputs: PolicyInputs, loss: Callable[[Tensor, MicroBatch], LossTerms],
        also: Sequence[TrainedNetwork] = (),
    ) -> UpdateStats: ...  # fmt: skip


def micro_batches(options: PolicyOptions, rollout: Rollout) -> list[Tensor]:
    """Row-index micro-batches of ``per_device_train_batch_size`` rows (whole groups when
    the groups are uniform and fit, sorted by length with ``group_by_length``)."""
    batch = options.batch
    group = batch.num_generations
    sizes = torch.bincount(rollout.host_group_ids)
    uniform = bool((sizes == group).all())
    return micro_batch_rows(
        rollout.host_lengths,
        batch.per_device_train_batch_size,
        group if uniform else None,
        by_length=options.runtime.group_by_length,
    )


# -- the two calls of a step ----------------------------------------------------------------
def prepare(
    policy: UpdatedPolicy,
    rollout: Rollout,
    advantages: Tensor | None,
    row_weights: Tensor | None = None,
    *,
    need_old: bool | None = None,
    exclude_rows: Tensor | None = None,
) -> PolicyInputs:
    """Micro-batches, the trained-token mask (``loss_mask``; truncated completions dropped
    with ``mask_truncated_completions``; ``exclude_rows`` dropped), rollout-time log-probs
    (pi_old when ``need_old``, default mu > 1; pi_ref when beta > 0) and the global counts."""
    loss_options, passes = policy.options.loss, policy.options.batch.num_iterations
    mask = rollout.loss_mask.float()
    if exclude_rows is not None:
        mask = mask * (~exclude_rows).float().to(mask.device)[:, None]
    if loss_options.mask_truncated_completions:
        mask = mask * (~rollout.truncated).float()[:, None]
    micro_batches = policy.micro_batches(rollout)
    # FSDP2 gathers weights in every training forward and backward, which are collectives,
    # so every rank runs as many micro-batches (ranks can hold different numbers of rows,
    # e.g. Rollout-GDRO's): the short ones repeat their last with weight 0. DDP needs none:
    # only the last micro-batch's backward synchronises.
    padding: list[Tensor] = []
    if policy.sharded:
        most = max_over_ranks(len(micro_batches), policy.dist)
        padding = [micro_batches[-1]] * (most - len(micro_batches))
    need_old = passes > 1 if need_old is None else need_old
    old: list[Tensor | None] = [None] * len(micro_batches)
    ref: list[Tensor | None] = [None] * len(micro_batches)
    # FSDP: the full weights are gathered once for each loop, so the no-grad forwards hold
    # no collective (ranks may run different numbers of them). The policy's and the
    # reference's full weights are never held at once.
    with torch.no_grad(), policy.autocast():
        if need_old:  # the ratio is against the sampling policy
            with policy.full_weights():
                old = [policy.logprobs(rollout, rows)[0] for rows in micro_batches]
        if loss_options.beta > 0:
            with policy.reference_weights():
                ref = [policy.reference_logprobs(rollout, rows) for rows in micro_batches]
    # Row and micro-batch counts are host numbers (gloo under a mixed backend); the token
    # count stays on the device, read by the losses without a sync.
    local = torch.tensor([mask.shape[0], len(micro_batches)])
    rows_and_batches = all_reduce_sum(local, policy.dist)
    counts = BatchCounts(
        rows=int(rows_and_batches[0]),
        tokens=all_reduce_sum(mask.sum(), policy.dist).clamp(min=1),
        micro_batches=int(rows_and_batches[1]),
        world_size=policy.dist.world_size,
    )
    return PolicyInputs(
        rollout=rollout,
        mask=mask,
        advantages=None if advantages is None else advantages.to(policy.device),
        row_weights=row_weights,
        micro_batches=micro_batches,
        padding=padding,
        old_logprobs=old,
        ref_logprobs=ref,
        counts=counts,
        passes=passes,
        correction=[None] * len(micro_batches),
        stats=UpdateStats(tokens=counts.tokens),
    )


def prepare_generation(
    policy: UpdatedPolicy, rollout: Rollout, advantages: Tensor, row_weights: Tensor | None = None
) -> GenerationBatch:
    """Split a generation batch into ``optimizer_steps_per_generation`` mini-batches of
    whole prompt groups (:func:`~groupwise.policy.update.minibatch_prompts`) and prepare each.
    With several, pi_old is computed for all of them now, before any update: the later
    mini-batches are trained off-policy against the policy that sampled them (TRL). With
    one, this is :meth:`prepare` of the whole rollout (pi_old only when mu > 1)."""
    count = policy.optimizer_steps_per_generation
    if count == 1:
        inputs = policy.prepare(rollout, advantages, row_weights)
        return GenerationBatch(rollout, [None], [inputs])
    parts, rows = [], []
    for prompts in minibatch_prompts(rollout.prompt_ids.shape[0], count):
        part, index = select_prompts(rollout, prompts)
        weights = None if row_weights is None else row_weights[index]
        parts.append(policy.prepare(part, advantages[index], weights, need_old=True))
        rows.append(index)
    return GenerationBatch(rollout, rows, parts)


def _objective(
    policy: UpdatedPolicy,
    inputs: PolicyInputs,
    k: int,
    logps: Tensor,
    entropy: Tensor,
    loss: Callable[[Tensor, MicroBatch], LossTerms],
) -> tuple[MicroBatch, LossTerms, Tensor]:
    """Micro-batch ``k`` (with its entropies), its loss terms and its part of the batch's
    objective: the loss times the micro-batch's share, plus the entropy bonus."""
    mb = inputs.micro_batch(k, policy.device)
    mb.entropy = entropy
    terms = loss(logps, mb)
    objective = terms.loss * terms.weight
    if terms.bonus is not None:
        objective = objective + terms.bonus
    return mb, terms, objective


def loss_value(
    policy: UpdatedPolicy,
    rollout: Rollout,
    advantages: Tensor,
    loss: Callable[[Tensor, MicroBatch], LossTerms],
) -> float:
    """The objective of a batch without gradients or an update (TRL's ``eval_loss``): every
    micro-batch's loss weighted as in :meth:`update`, on-policy (pi_old = pi_theta), summed
    over ranks into the global batch's loss. Every rank calls it (one all-reduce)."""
    inputs = policy.prepare(rollout, advantages, need_old=False)
    total = torch.zeros((), dtype=torch.float64, device=policy.device)
    # FSDP: the full weights are gathered once, so the forwards hold no collective.
    with torch.no_grad(), policy.autocast(), policy.full_weights():
        for k, rows in enumerate(inputs.micro_batches):
            logps, entropy = policy.logprobs(rollout, rows)
            _, _, value = _objective(policy, inputs, k, logps, entropy, loss)
            total = total + value.double()
    # Each rank's share carries the world size (as DDP's gradient mean expects): the mean
    # over ranks is the global batch's loss.
    return float(all_reduce_sum(total, policy.dist)) / policy.dist.world_size


def train_generation(
    policy: UpdatedPolicy, batch: GenerationBatch, loss: Callable[[Tensor, MicroBatch], LossTerms]
) -> UpdateStats:
    """``num_iterations`` passes, each one optimizer step per mini-batch in order (TRL's
    order: mini-batches inside, passes outside); the stats of the whole generation batch."""
    for _ in range(policy.options.batch.num_iterations):
        for inputs in batch.inputs:
            stats = policy.update(inputs, loss)
    if len(batch.inputs) == 1:
        return stats
    n_rows = batch.rollout.completion_ids.shape[0]
    return merge_stats([inputs.stats for inputs in batch.inputs], batch.rows, n_rows)


def update(
    policy: UpdatedPolicy,
    inputs: PolicyInputs,
    loss: Callable[[Tensor, MicroBatch], LossTerms],
    also: Sequence[TrainedNetwork] = (),
) -> UpdateStats:
    """One optimizer pass over the prepared batch: the loss of every micro-batch, weighted
    so their sum is the global batch's loss, accumulated, clipped and stepped. ``also``:
    other networks the loss trains (the PPO critic), stepped together. A NaN/inf loss or
    gradient on any rank skips the step on every rank, and the remaining passes. A loss with
    an entropy bonus gets differentiable entropies and is told when the step is taken."""
    stats = inputs.stats
    if stats.skipped:
        return stats
    networks = [policy, *also]
    entropy_grad = bool(getattr(loss, "entropy_grad", False))
    for net in networks:
        net.zero_grad()
    rollout, first = inputs.rollout, stats.passes == 0
    batches = inputs.micro_batches + inputs.padding
    # Metrics, the entropy sum, the non-finite flag and each row's policy term stay on the
    # device until the pass ends: one host sync per pass, not one per micro-batch.
    sums: dict[str, Tensor | float] = {}
    entropy_sum: Tensor | float = 0.0
    nonfinite: Tensor | bool = False
    sequence_parts: list[tuple[Tensor, Tensor]] = []
    for k, rows in enumerate(batches):
        sync = k == len(batches) - 1
        with contextlib.ExitStack() as stack:
            for net in networks:
                stack.enter_context(net.gradient_sync(sync))
            if k >= len(inputs.micro_batches):  # FSDP padding: adds nothing
                with policy.autocast(), _offload(policy):
                    logps, _ = policy.logprobs(rollout, rows)
                (logps.sum() * 0.0).backward()
                continue
            with policy.autocast(), _offload(policy):
                logps, entropy = policy.logprobs(rollout, rows, entropy_grad=entropy_grad)
            if first and rollout.sampling_logprobs is not None:
                inputs.correction[k] = _rollout_correction(policy, inputs, k, logps.detach())
            mb, terms, objective = _objective(policy, inputs, k, logps, entropy, loss)
            # A non-finite loss still goes through backward: its NaN gradients make every
            # rank skip the update together (no rank may leave the all-reduce).
            nonfinite = nonfinite | ~torch.isfinite(objective.detach())
            objective.backward()
        share = terms.weight / inputs.passes
        for key, value in {"loss": terms.loss.detach(), **terms.metrics}.items():
            sums[key] = sums.get(key, 0.0) + value * share
        if terms.bonus is not None:  # loss = policy_loss + bonus (Eq. 1 of policy/loss.py)
            sums["policy_loss"] = sums.get("policy_loss", 0.0) + terms.loss.detach() * share
            sums["loss"] = sums["loss"] + terms.bonus.detach() / inputs.passes
        entropy_sum = entropy_sum + (entropy.detach() * mb.mask).sum()
        if terms.sequence_loss is not None:
            sequence_parts.append((rows, terms.sequence_loss.detach().float()))
    stats.grad_norms = [net.clip_grad_norm() for net in networks]
    for norm in stats.grad_norms:
        nonfinite = nonfinite | ~torch.isfinite(norm)
    # The pass's one sync: every metric, the entropy and the flag in one transfer.
    keys = list(sums)
    values = [torch.as_tensor(sums[key], dtype=torch.float64) for key in keys]
    values += [torch.as_tensor(entropy_sum, dtype=torch.float64)]
    values += [torch.as_tensor(nonfinite, dtype=torch.float64)]
    host = torch.stack([v.to(policy.device) for v in values]).tolist()
    for key, value in zip(keys, host, strict=False):
        stats.sums[key] = stats.sums.get(key, 0.0) + value
    stats.entropy_sum += host[-2]
    if sequence_parts:
        stats.sequence_loss = torch.zeros(rollout.completion_ids.shape[0])
        index = torch.cat([rows for rows, _ in sequence_parts])
        stats.sequence_loss[index] = torch.cat([v for _, v in sequence_parts]).cpu()
    stats.skipped = any_rank(host[-1] > 0, policy.dist)
    stats.passes += 1
    for net in networks:
        # A NaN/inf loss or gradient: skip the update so the weights stay good; the run
        # logs the event and stops after max_bad_steps in a row.
        net.zero_grad() if stats.skipped else net.step()
    after_step = getattr(loss, "after_optimizer_step", None)
    if after_step is not None:
        after_step(policy.dist)
    return stats


def _offload(policy: UpdatedPolicy) -> contextlib.AbstractContextManager:
    """The training forward's saved activations in pinned host memory (activation_offloading;
    runtime/offload.py), else kept on the device."""
    if policy.options.runtime.activation_offloading:
        return OffloadActivations(policy.model)
    return contextlib.nullcontext()


def _rollout_correction(
    policy: UpdatedPolicy, inputs: PolicyInputs, k: int, current: Tensor
) -> Tensor | None:
    """Micro-batch k's rollout-correction weights pi_old / pi_rollout (None when switched
    off; the mismatch is logged either way), from the first pass's log-probs (equal to the
    old log-probs: the weights have no gradient)."""
    options, rows = policy.options.loss, inputs.micro_batches[k]
    old = inputs.old_logprobs[k] if inputs.old_logprobs[k] is not None else current
    sampling = inputs.rollout.sampling_logprobs[rows].to(policy.device)
    mask = inputs.mask[rows]
    weights = rollout_correction_weights(
        old,
        sampling,
        mask,
        mode=options.rollout_correction_mode,
        clip_min=options.rollout_correction_clip_min,
        clip_max=options.rollout_correction_clip_max,
    )
    keep = mask.bool()
    selected = weights.flatten() if weights.shape[1] == 1 else weights[keep]
    inputs.stats.mismatch.append(((old - sampling).abs()[keep], selected))
    return weights if options.rollout_correction else None
