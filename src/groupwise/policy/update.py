"""The update: one generation batch's optimizer steps, read top to bottom.

    learn(policy, rollout, advantages, row_weights, loss, engine)
        prepare_generation   mini-batches of whole groups (TRL's steps_per_generation), each
                             prepared: micro-batches, pi_old (mu > 1 or several mini-batches)
                             and pi_ref (beta > 0) log-probs, the global counts   (prepare)
        train_generation     num_iterations passes, one optimizer step per mini-batch:
            update           per micro-batch: forward (log-probs, entropies), loss, backward;
                             then clip, the optimizer step (skipped on NaN/inf), TR-DPO's
                             reference sync
        engine.sync          the engine takes the new weights

The policy (:class:`groupwise.policy.policy.Policy`) is the network and its forwards; these
functions drive it, never the other way round. ``loss`` is any callable
``loss(logprobs, micro_batch) -> LossTerms`` (:class:`groupwise.policy.loss.GRPOLoss` for GRPO).
Losses are normalised over the *global* batch (:class:`~groupwise.algo.variants.BatchCounts`:
every rank's rows, tokens and micro-batches), so data parallel gives the single-process
gradient.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Protocol

import torch
from torch import Tensor

from ..algo.variants import BatchCounts, LossTerms, MicroBatch, rollout_correction_weights
from ..rollout import Rollout, RolloutEngine
from ..rollout.base import select_prompts
from ..runtime.distributed import all_reduce_sum, any_rank, max_over_ranks
from ..runtime.offload import OffloadActivations
from .batches import (
    GenerationBatch,
    PolicyInputs,
    UpdateStats,
    merge_stats,
    micro_batch_rows,
    minibatch_prompts,
)
from .policy import Policy, PolicyOptions


class TrainedNetwork(Protocol):
    """A network the update steps beside the policy's (PPO's critic: a
    :class:`groupwise.policy.optimizer.Trainable`): gradient accumulation, clipping and the
    optimizer step."""

    def zero_grad(self) -> None: ...
    def gradient_sync(self, sync: bool) -> contextlib.AbstractContextManager: ...
    def clip_grad_norm(self) -> Tensor: ...
    def step(self) -> None: ...


def learn(
    policy: Policy,
    rollout: Rollout,
    advantages: Tensor,
    row_weights: Tensor | None,
    loss: Callable[[Tensor, MicroBatch], LossTerms],
    engine: RolloutEngine,
    steps: int | None = None,
) -> UpdateStats:
    """One generation batch's whole update: its mini-batches prepared
    (:func:`prepare_generation`), ``num_iterations`` passes of ``loss``
    (:func:`train_generation`; only its first ``steps`` optimizer steps when given: the run's
    last batch stops at ``max_steps``), then ``engine`` takes the new weights (an engine with
    its own copy, static or vLLM, would otherwise sample from the old policy)."""
    generation = prepare_generation(policy, rollout, advantages, row_weights)
    stats = train_generation(policy, generation, loss, steps)
    engine.sync(policy.model)
    return stats


def micro_batches_of(options: PolicyOptions, rollout: Rollout) -> list[Tensor]:
    """Row-index micro-batches of ``per_device_train_batch_size`` rows, laid out so that each
    encodes a prompt once (whole groups, or pieces of groups, also when the groups' sizes
    differ), sorted by length with ``group_by_length``."""
    batch = options.batch
    group = batch.num_generations
    sizes = torch.bincount(rollout.host_group_ids)
    uniform = bool((sizes == group).all())
    return micro_batch_rows(
        rollout.host_lengths,
        batch.per_device_train_batch_size,
        group if uniform else None,
        by_length=options.runtime.group_by_length,
        group_ids=rollout.host_group_ids,
    )


# -- a batch prepared, then trained --------------------------------------------------------
def prepare(
    policy: Policy,
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
    micro_batches = micro_batches_of(policy.options, rollout)
    # FSDP2 gathers weights in every training forward and backward, which are collectives,
    # so every rank runs as many micro-batches (ranks can hold different numbers of rows,
    # e.g. Rollout-GDRO's): the short ones repeat their last with weight 0. DDP needs none:
    # only the last micro-batch's backward synchronises.
    padding: list[Tensor] = []
    if policy.network.sharded:
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
    policy: Policy, rollout: Rollout, advantages: Tensor, row_weights: Tensor | None = None
) -> GenerationBatch:
    """Split a generation batch into ``optimizer_steps_per_generation`` mini-batches of
    whole prompt groups (:func:`~groupwise.policy.batches.minibatch_prompts`) and prepare each.
    With several, pi_old is computed for all of them now, before any update: the later
    mini-batches are trained off-policy against the policy that sampled them (TRL). With
    one, this is :func:`prepare` of the whole rollout (pi_old only when mu > 1)."""
    count = policy.options.batch.optimizer_steps_per_generation
    if count == 1:
        inputs = prepare(policy, rollout, advantages, row_weights)
        return GenerationBatch(rollout, [None], [inputs])
    parts, rows = [], []
    for prompts in minibatch_prompts(rollout.prompt_ids.shape[0], count):
        part, index = select_prompts(rollout, prompts)
        weights = None if row_weights is None else row_weights[index]
        parts.append(prepare(policy, part, advantages[index], weights, need_old=True))
        rows.append(index)
    return GenerationBatch(rollout, rows, parts)


def _objective(
    policy: Policy,
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
    policy: Policy,
    rollout: Rollout,
    advantages: Tensor,
    loss: Callable[[Tensor, MicroBatch], LossTerms],
) -> float:
    """The objective of a batch without gradients or an update (TRL's ``eval_loss``): every
    micro-batch's loss weighted as in :func:`update`, on-policy (pi_old = pi_theta), summed
    over ranks into the global batch's loss. Every rank calls it (one all-reduce)."""
    inputs = prepare(policy, rollout, advantages, need_old=False)
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
    policy: Policy,
    batch: GenerationBatch,
    loss: Callable[[Tensor, MicroBatch], LossTerms],
    steps: int | None = None,
) -> UpdateStats:
    """``num_iterations`` passes, each one optimizer step per mini-batch in order (TRL's
    order: mini-batches inside, passes outside), stopping after ``steps`` optimizer steps when
    given (TRL stops at ``max_steps`` inside a generation batch); the stats of the whole
    generation batch."""
    order = [inputs for _ in range(policy.options.batch.num_iterations) for inputs in batch.inputs]
    for inputs in order[:steps]:
        stats = update(policy, inputs, loss)
    if len(batch.inputs) == 1:
        return stats
    n_rows = batch.rollout.completion_ids.shape[0]
    return merge_stats([inputs.stats for inputs in batch.inputs], batch.rows, n_rows)


def update(
    policy: Policy,
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
    networks = [policy.network, *also]
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
    if not stats.skipped:
        policy.sync_reference()
    after_step = getattr(loss, "after_optimizer_step", None)
    if after_step is not None:
        after_step(policy.dist)
    return stats


def _offload(policy: Policy) -> contextlib.AbstractContextManager:
    """The training forward's saved activations in pinned host memory (activation_offloading;
    runtime/offload.py), else kept on the device."""
    if policy.options.runtime.activation_offloading:
        return OffloadActivations(policy.model)
    return contextlib.nullcontext()


def _rollout_correction(
    policy: Policy, inputs: PolicyInputs, k: int, current: Tensor
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
