"""The policy: everything that touches the trained weights.

:class:`Trainable` is one trained network under data parallel (its DDP wrapper or FSDP2 root, its
AdamW and LR schedule, gradient sync, clipping and the NaN-skip step); the PPO critic is one too.
:class:`Policy` adds the language-model side: the frozen reference (a copy, offloaded or not, or
the LoRA adapter disabled), micro-batched completion log-probs, and the two calls of a step:

    inputs = policy.prepare(rollout, advantages, row_weights)  # pi_old (mu > 1), pi_ref (beta > 0)
    stats = policy.update(inputs, loss)                        # one optimizer pass

``loss`` is any callable ``loss(logprobs, micro_batch) -> LossTerms``; :class:`GRPOLoss` binds a
registered loss variant (:data:`groupwise.core.LOSSES`) to the run's options. Losses are
normalised over the *global* batch (:class:`~groupwise.core.BatchCounts`: every rank's rows,
tokens and micro-batches), so data parallel gives the single-process gradient.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel
from transformers import PreTrainedModel

from .batching import (
    micro_batch_rows,
    minibatch_prompts,
    prompt_blocks,
    select_prompts,
    trimmed_completions,
)
from .core import (
    BatchCounts,
    get_loss,
    high_entropy_mask,
    off_policy_sequence_mask,
    policy_loss,
    rollout_correction_weights,
    sequence_surrogate,
)
from .distributed import (
    DistributedContext,
    LogprobModule,
    all_reduce_sum,
    any_rank,
    fsdp_full_weights,
    max_over_ranks,
    shard_fsdp,
)
from .entropy import EntropyControl, entropy_bonus
from .errors import first_line
from .logprobs import completion_logprobs
from .precision import Precision
from .reference import Reference
from .rollout import Rollout

if TYPE_CHECKING:
    from .config import GRPOConfig


class CheckpointMismatch(ValueError):
    """Saved weights that do not fit the model (the caller names the checkpoint)."""


def lr_factor(args: GRPOConfig, total_steps: int) -> Callable[[int], float]:
    """The LR multiplier per optimizer step: linear warm-up over ``warmup_steps`` (or
    ``ceil(warmup_ratio * total_steps)``), then constant, linear decay or cosine decay to 0 at
    ``total_steps``."""
    warmup = args.warmup_steps_for(total_steps)

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if args.lr_scheduler_type == "constant":
            return 1.0
        progress = (step - warmup) / max(1, total_steps - warmup)
        progress = min(max(progress, 0.0), 1.0)
        if args.lr_scheduler_type == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def optimizer_steps(args: GRPOConfig, steps: int) -> int:
    """Optimizer steps in ``steps`` groupwise steps (generation batches): every generation
    batch is split into ``optimizer_steps_per_generation`` mini-batches, each stepped once per
    pass, ``num_iterations`` passes."""
    return steps * args.optimizer_steps_per_generation * args.num_iterations


def apply_lora(
    model: PreTrainedModel, args: GRPOConfig, peft_config: Any | None = None
) -> PreTrainedModel:
    """Wrap ``model`` in a peft LoRA adapter; only the adapter's parameters train.
    ``peft_config`` (a ``peft.LoraConfig``, TRL's ``GRPOTrainer(peft_config=...)``) is used as
    given; otherwise one is made from ``lora_r``, ``lora_alpha``, ``lora_dropout`` and
    ``lora_target_modules``."""
    from peft import LoraConfig, get_peft_model

    if peft_config is not None:
        return get_peft_model(model, peft_config)
    config = LoraConfig(
        r=args.lora_r,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        # "all-linear": every nn.Linear except the output layer (peft's rule).
        target_modules=args.lora_target_modules or "all-linear",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


# ----------------------------------------------------------------------------------------------
# One trained network


class Trainable:
    """A network trained under data parallel: ``module`` (the plain network, which checkpoints
    and ``save_pretrained`` read), ``wrapper`` (what its training forward goes through: DDP, the
    FSDP2 root, or None in one process), AdamW and its LR schedule."""

    def __init__(
        self,
        module: torch.nn.Module,
        wrapper: Any,
        args: GRPOConfig,
        dist: DistributedContext,
        learning_rate: float,
    ) -> None:
        self.module, self.wrapper, self.args, self.dist = module, wrapper, args, dist
        self.optimizer = torch.optim.AdamW(
            [p for p in module.parameters() if p.requires_grad],
            lr=learning_rate,
            betas=(args.adam_beta1, args.adam_beta2),
            eps=args.adam_epsilon,
            weight_decay=args.weight_decay,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_factor(args, optimizer_steps(args, args.max_steps))
        )

    @property
    def sharded(self) -> bool:
        return self.wrapper is not None and not isinstance(self.wrapper, DistributedDataParallel)

    @contextlib.contextmanager
    def gradient_sync(self, sync: bool) -> Iterator[None]:
        """Gradient accumulation: DDP all-reduces (FSDP reduce-scatters) only when ``sync``."""
        if self.sharded:
            self.wrapper.set_requires_gradient_sync(sync)
        if isinstance(self.wrapper, DistributedDataParallel) and not sync:
            with self.wrapper.no_sync():
                yield
        else:
            yield

    def clip_grad_norm(self) -> Tensor:
        norm = torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.args.max_grad_norm)
        if hasattr(norm, "full_tensor"):  # FSDP: a DTensor (a partial norm per rank)
            norm = norm.full_tensor()
        return norm

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def step(self) -> None:
        self.optimizer.step()
        self.scheduler.step()

    def global_sum(self, value: Tensor) -> Tensor:
        """``value`` summed over every rank (itself in one process)."""
        return all_reduce_sum(value, self.dist)

    @property
    def learning_rate(self) -> float:
        return self.scheduler.get_last_lr()[0]

    def optimizer_state_dict(self) -> dict[str, Any]:
        """The optimizer state; under FSDP the full (unsharded) state keyed by parameter name,
        gathered to rank 0 (a collective; other ranks get an empty dict)."""
        if not self.sharded:
            return self.optimizer.state_dict()
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_optimizer_state_dict(self.module, self.optimizer, options=options)

    def load_optimizer_state_dict(self, state: dict[str, Any]) -> None:
        if not self.sharded:
            self.optimizer.load_state_dict(state)
            return
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        # Every rank read the full state (keyed by parameter name); each keeps its own shards.
        options = StateDictOptions(full_state_dict=True)
        set_optimizer_state_dict(self.module, self.optimizer, state, options=options)


# ----------------------------------------------------------------------------------------------
# What an update pass works on


@dataclass
class MicroBatch:
    """One micro-batch as a loss sees it: row indices into the rollout and their slices of the
    step's tensors (on the policy's device)."""

    rows: Tensor
    mask: Tensor  # [n, T] float: the tokens trained on
    advantages: Tensor | None  # [n] (GRPO) or [n, T] (PPO), None when the loss holds its own
    old_logprobs: Tensor | None  # [n, T] pi_old, None when on-policy (mu = 1)
    ref_logprobs: Tensor | None  # [n, T] pi_ref, None when beta = 0
    correction: Tensor | None  # [n, T] or [n, 1] rollout-correction weights
    row_weights: Tensor | None  # [n] a curriculum's weights
    counts: BatchCounts
    # [n, T] the policy's token entropies this pass (with grad only for an entropy bonus)
    entropy: Tensor | None = None
    # [n, T] the sampler's own log-probs (vLLM, bf16 generation), None when it gave none
    sampling_logprobs: Tensor | None = None


@dataclass
class LossTerms:
    """A loss's answer for one micro-batch: the loss (with grad), its ``weight`` in the global
    batch's loss (a float or a 0-d tensor), metrics (0-d detached tensors or floats, weighted
    like the loss when logged; read once per pass), the per-completion policy term a
    curriculum reads ([n], no grad; None if the loss has none) and ``bonus``, a term already in
    the global batch's units, added after the weight (the entropy bonus; None without)."""

    loss: Tensor
    weight: float | Tensor
    metrics: dict[str, float | Tensor]
    sequence_loss: Tensor | None = None
    bonus: Tensor | None = None


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
# The policy


class Policy(Trainable):
    """The language model being trained, its reference, and the update.

    Data parallel (torchrun): with ``data_parallel: ddp`` the training forward goes through
    DistributedDataParallel (constructing it broadcasts rank 0's parameters); with ``fsdp`` the
    model is sharded in place (FSDP2) and no-grad calls of the Hugging Face model run inside
    :meth:`full_weights`."""

    def __init__(
        self,
        model: PreTrainedModel,
        args: GRPOConfig,
        dist: DistributedContext,
        device: torch.device,
        precision: Precision | None = None,
    ) -> None:
        self.model, self.device = model, device
        self.precision = precision or Precision(weights=torch.float32, autocast=False)
        fsdp = dist.enabled and args.data_parallel == "fsdp"
        # The frozen reference exists only when the KL term is on (beta > 0). With LoRA it is
        # the same weights with the adapter disabled: no second copy. Copied before the policy
        # is sharded (its parameters then become shards).
        self.reference: Reference | None = None
        if args.beta > 0 and not args.use_peft:
            self.reference = Reference(
                model,
                device,
                offload=args.ref_model_offload,
                shard=functools.partial(shard_fsdp, ctx=dist, device=device,
                                        bf16_compute=self.precision.autocast) if fsdp else None,
                gather=fsdp_full_weights if fsdp else None,
            )
        # FSDP shards the model in place (its parameters become DTensor shards), so the
        # optimizer is built afterwards, on the shards.
        wrapper: Any = None
        if fsdp:
            wrapper = shard_fsdp(model, dist, device, bf16_compute=self.precision.autocast)
        elif dist.enabled:
            wrapper = DistributedDataParallel(
                LogprobModule(model),
                device_ids=[device.index] if device.type == "cuda" else None,
            )
        super().__init__(model, wrapper, args, dist, args.learning_rate)
        self._full_weights_depth = 0

    def step(self) -> None:
        """The optimizer step, then, with ``sync_ref_model``, TR-DPO's reference update every
        ``ref_model_sync_steps`` optimizer steps (the schedule counts them, across a resume)."""
        super().step()
        args = self.args
        if args.sync_ref_model and self.reference is not None:
            if self.scheduler.last_epoch % args.ref_model_sync_steps == 0:
                self.reference.mix_from(self.model, args.ref_model_mixup_alpha)

    @property
    def ref_model(self) -> PreTrainedModel | None:
        """The frozen reference copy (None with LoRA or beta = 0)."""
        return self.reference.module if self.reference is not None else None

    # -- numerics and weights -------------------------------------------------------------------
    def autocast(self) -> contextlib.AbstractContextManager:
        """The training forward's numerics: bf16 autocast in mixed precision, else none."""
        return self.precision.context(self.device)

    @contextlib.contextmanager
    def full_weights(self) -> Iterator[None]:
        """Under FSDP, the full weights for no-grad calls of the Hugging Face model (generation,
        evaluation, old log-probs); a no-op otherwise. Re-entrant."""
        outermost = self.sharded and self._full_weights_depth == 0
        self._full_weights_depth += 1
        try:
            with fsdp_full_weights(self.wrapper) if outermost else contextlib.nullcontext():
                yield
        finally:
            self._full_weights_depth -= 1

    # -- forwards -------------------------------------------------------------------------------
    def micro_batches(self, rollout: Rollout) -> list[Tensor]:
        """Row-index micro-batches of ``per_device_train_batch_size`` rows (whole groups when
        the groups are uniform and fit, sorted by length with ``group_by_length``)."""
        group = self.args.num_generations
        sizes = torch.bincount(rollout.host_group_ids)
        uniform = bool((sizes == group).all())
        return micro_batch_rows(
            rollout.host_lengths,
            self.args.per_device_train_batch_size,
            group if uniform else None,
            by_length=self.args.group_by_length,
        )

    def logprobs(
        self,
        rollout: Rollout,
        rows: Tensor,
        model: PreTrainedModel | None = None,
        entropy_grad: bool = False,
    ) -> tuple[Tensor, Tensor]:
        """Log-probs and entropies [n, T] of the completions ``rows`` (row indices into the
        rollout) under ``model`` (default: the policy); the entropies carry a gradient only with
        ``entropy_grad``. The forward runs on the rows' own longest completion (padding trimmed
        per micro-batch); the results are padded back to the rollout's width T with zeros."""
        model = self.model if model is None else model
        completion_ids, completion_mask, width = trimmed_completions(rollout, rows)
        # Share the prompt forward across the rows of a prompt: whole groups, or a micro-batch
        # that holds part of one group (micro_batch_rows lays them out so).
        blocks = prompt_blocks(rollout.host_group_ids[rows], self.args.num_generations)
        share = blocks is not None and not self.args.gradient_checkpointing
        policy_grad = model is self.model and torch.is_grad_enabled()
        if policy_grad and self.sharded:
            # FSDP2 all-gathers each layer in every decoder call, and the shared path makes two
            # (prompt, then completions; one when width is 1): every rank must take the same
            # path for this micro-batch (ranks run equally many, see prepare's padding).
            share = not any_rank(not (share and width > 1), self.dist)
        if share:
            prompts, group_size = blocks
            prompt_ids, prompt_mask = rollout.prompt_ids[prompts], rollout.prompt_mask[prompts]
        else:
            index = rollout.group_ids[rows]
            prompt_ids, prompt_mask = rollout.prompt_ids[index], rollout.prompt_mask[index]
            group_size = 1
        # The policy's forward with gradients goes through the DDP / FSDP wrapper when data
        # parallel; without gradients, FSDP gathers the full weights around the plain call.
        forward = (
            self.wrapper
            if policy_grad and self.wrapper is not None
            else functools.partial(completion_logprobs, model)
        )
        gather = (
            self.full_weights()
            if model is self.model and not policy_grad
            else contextlib.nullcontext()
        )
        with gather:
            logps, entropy = forward(
                prompt_ids,
                prompt_mask,
                completion_ids,
                completion_mask,
                temperature=self.args.temperature if self.args.temperature > 0 else 1.0,
                chunk_size=self.args.logprob_chunk_size,
                group_size=group_size,
                impl=self.args.logprob_impl,
                entropy_grad=entropy_grad,
            )
        pad = (0, rollout.completion_ids.shape[1] - width)
        return torch.nn.functional.pad(logps, pad), torch.nn.functional.pad(entropy, pad)

    def reference_logprobs(self, rollout: Rollout, rows: Tensor) -> Tensor:
        """Log-probs under the frozen reference: the adapter-disabled model with LoRA, else the
        reference copy. Call it inside :meth:`reference_weights` (once around a whole batch:
        an offloaded reference visits the device once, a sharded one is gathered once)."""
        if self.args.use_peft:
            with self.model.disable_adapter():
                return self.logprobs(rollout, rows)[0]
        assert self.reference is not None
        return self.logprobs(rollout, rows, self.reference.module)[0]

    def reference_weights(self) -> contextlib.AbstractContextManager:
        """The block inside which :meth:`reference_logprobs` runs (with LoRA the policy's own
        weights: under FSDP gathered once for the block)."""
        if self.args.use_peft:
            return self.full_weights()
        if self.reference is None:
            return contextlib.nullcontext()
        return self.reference.weights()

    # -- the two calls of a step ----------------------------------------------------------------
    def prepare(
        self,
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
        args = self.args
        mask = rollout.loss_mask.float()
        if exclude_rows is not None:
            mask = mask * (~exclude_rows).float().to(mask.device)[:, None]
        if args.mask_truncated_completions:
            mask = mask * (~rollout.truncated).float()[:, None]
        micro_batches = self.micro_batches(rollout)
        # FSDP2 gathers weights in every training forward and backward, which are collectives,
        # so every rank runs as many micro-batches (ranks can hold different numbers of rows,
        # e.g. Rollout-GDRO's): the short ones repeat their last with weight 0. DDP needs none:
        # only the last micro-batch's backward synchronises.
        padding: list[Tensor] = []
        if self.sharded:
            most = max_over_ranks(len(micro_batches), self.dist)
            padding = [micro_batches[-1]] * (most - len(micro_batches))
        need_old = args.num_iterations > 1 if need_old is None else need_old
        old: list[Tensor | None] = [None] * len(micro_batches)
        ref: list[Tensor | None] = [None] * len(micro_batches)
        # FSDP: the full weights are gathered once for each loop, so the no-grad forwards hold
        # no collective (ranks may run different numbers of them). The policy's and the
        # reference's full weights are never held at once.
        with torch.no_grad(), self.autocast():
            if need_old:  # the ratio is against the sampling policy
                with self.full_weights():
                    old = [self.logprobs(rollout, rows)[0] for rows in micro_batches]
            if args.beta > 0:
                with self.reference_weights():
                    ref = [self.reference_logprobs(rollout, rows) for rows in micro_batches]
        # Row and micro-batch counts are host numbers (gloo under a mixed backend); the token
        # count stays on the device, read by the losses without a sync.
        local = torch.tensor([mask.shape[0], len(micro_batches)])
        rows_and_batches = all_reduce_sum(local, self.dist)
        counts = BatchCounts(
            rows=int(rows_and_batches[0]),
            tokens=all_reduce_sum(mask.sum(), self.dist).clamp(min=1),
            micro_batches=int(rows_and_batches[1]),
            world_size=self.dist.world_size,
        )
        return PolicyInputs(
            rollout=rollout,
            mask=mask,
            advantages=None if advantages is None else advantages.to(self.device),
            row_weights=row_weights,
            micro_batches=micro_batches,
            padding=padding,
            old_logprobs=old,
            ref_logprobs=ref,
            counts=counts,
            passes=args.num_iterations,
            correction=[None] * len(micro_batches),
            stats=UpdateStats(tokens=counts.tokens),
        )

    def prepare_generation(
        self, rollout: Rollout, advantages: Tensor, row_weights: Tensor | None = None
    ) -> GenerationBatch:
        """Split a generation batch into ``optimizer_steps_per_generation`` mini-batches of
        whole prompt groups (:func:`~groupwise.batching.minibatch_prompts`) and prepare each.
        With several, pi_old is computed for all of them now, before any update: the later
        mini-batches are trained off-policy against the policy that sampled them (TRL). With
        one, this is :meth:`prepare` of the whole rollout (pi_old only when mu > 1)."""
        count = self.args.optimizer_steps_per_generation
        if count == 1:
            inputs = self.prepare(rollout, advantages, row_weights)
            return GenerationBatch(rollout, [None], [inputs])
        parts, rows = [], []
        for prompts in minibatch_prompts(rollout.prompt_ids.shape[0], count):
            part, index = select_prompts(rollout, prompts)
            weights = None if row_weights is None else row_weights[index]
            parts.append(self.prepare(part, advantages[index], weights, need_old=True))
            rows.append(index)
        return GenerationBatch(rollout, rows, parts)

    def loss_value(
        self, rollout: Rollout, advantages: Tensor, loss: Callable[[Tensor, MicroBatch], LossTerms]
    ) -> float:
        """The objective of a batch without gradients or an update (TRL's ``eval_loss``): every
        micro-batch's loss weighted as in :meth:`update`, on-policy (pi_old = pi_theta), summed
        over ranks into the global batch's loss. Every rank calls it (one all-reduce)."""
        inputs = self.prepare(rollout, advantages, need_old=False)
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        # FSDP: the full weights are gathered once, so the forwards hold no collective.
        with torch.no_grad(), self.autocast(), self.full_weights():
            for k, rows in enumerate(inputs.micro_batches):
                logps, entropy = self.logprobs(rollout, rows)
                mb = inputs.micro_batch(k, self.device)
                mb.entropy = entropy
                terms = loss(logps, mb)
                value = terms.loss * terms.weight
                if terms.bonus is not None:
                    value = value + terms.bonus
                total = total + value.double()
        # Each rank's share carries the world size (as DDP's gradient mean expects): the mean
        # over ranks is the global batch's loss.
        return float(all_reduce_sum(total, self.dist)) / self.dist.world_size

    def train_generation(
        self, batch: GenerationBatch, loss: Callable[[Tensor, MicroBatch], LossTerms]
    ) -> UpdateStats:
        """``num_iterations`` passes, each one optimizer step per mini-batch in order (TRL's
        order: mini-batches inside, passes outside); the stats of the whole generation batch."""
        for _ in range(self.args.num_iterations):
            for inputs in batch.inputs:
                stats = self.update(inputs, loss)
        if len(batch.inputs) == 1:
            return stats
        n_rows = batch.rollout.completion_ids.shape[0]
        return merge_stats([inputs.stats for inputs in batch.inputs], batch.rows, n_rows)

    def update(
        self,
        inputs: PolicyInputs,
        loss: Callable[[Tensor, MicroBatch], LossTerms],
        also: Sequence[Trainable] = (),
    ) -> UpdateStats:
        """One optimizer pass over the prepared batch: the loss of every micro-batch, weighted
        so their sum is the global batch's loss, accumulated, clipped and stepped. ``also``:
        other networks the loss trains (the PPO critic), stepped together. A NaN/inf loss or
        gradient on any rank skips the step on every rank, and the remaining passes. A loss with
        an entropy bonus gets differentiable entropies and is told when the step is taken."""
        stats = inputs.stats
        if stats.skipped:
            return stats
        networks = [self, *also]
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
                    with self.autocast():
                        logps, _ = self.logprobs(rollout, rows)
                    (logps.sum() * 0.0).backward()
                    continue
                with self.autocast():
                    logps, entropy = self.logprobs(rollout, rows, entropy_grad=entropy_grad)
                if first and rollout.sampling_logprobs is not None:
                    inputs.correction[k] = self._rollout_correction(inputs, k, logps.detach())
                mb = inputs.micro_batch(k, self.device)
                mb.entropy = entropy
                terms = loss(logps, mb)
                objective = terms.loss * terms.weight
                if terms.bonus is not None:
                    objective = objective + terms.bonus
                # A non-finite loss still goes through backward: its NaN gradients make every
                # rank skip the update together (no rank may leave the all-reduce).
                nonfinite = nonfinite | ~torch.isfinite(objective.detach())
                objective.backward()
            share = terms.weight / inputs.passes
            for key, value in {"loss": terms.loss.detach(), **terms.metrics}.items():
                sums[key] = sums.get(key, 0.0) + value * share
            if terms.bonus is not None:  # loss = policy_loss + bonus (Eq. 1 of entropy.py)
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
        host = torch.stack([v.to(self.device) for v in values]).tolist()
        for key, value in zip(keys, host, strict=False):
            stats.sums[key] = stats.sums.get(key, 0.0) + value
        stats.entropy_sum += host[-2]
        if sequence_parts:
            stats.sequence_loss = torch.zeros(rollout.completion_ids.shape[0])
            index = torch.cat([rows for rows, _ in sequence_parts])
            stats.sequence_loss[index] = torch.cat([v for _, v in sequence_parts]).cpu()
        stats.skipped = any_rank(host[-1] > 0, self.dist)
        stats.passes += 1
        for net in networks:
            # A NaN/inf loss or gradient: skip the update so the weights stay good; the run
            # logs the event and stops after max_bad_steps in a row.
            net.zero_grad() if stats.skipped else net.step()
        after_step = getattr(loss, "after_optimizer_step", None)
        if after_step is not None:
            after_step(self.dist)
        return stats

    def _rollout_correction(self, inputs: PolicyInputs, k: int, current: Tensor) -> Tensor | None:
        """Micro-batch k's rollout-correction weights pi_old / pi_rollout (None when switched
        off; the mismatch is logged either way), from the first pass's log-probs (equal to the
        old log-probs: the weights have no gradient)."""
        args, rows = self.args, inputs.micro_batches[k]
        old = inputs.old_logprobs[k] if inputs.old_logprobs[k] is not None else current
        sampling = inputs.rollout.sampling_logprobs[rows].to(self.device)
        mask = inputs.mask[rows]
        weights = rollout_correction_weights(
            old,
            sampling,
            mask,
            mode=args.rollout_correction_mode,
            clip_min=args.rollout_correction_clip_min,
            clip_max=args.rollout_correction_clip_max,
        )
        keep = mask.bool()
        selected = weights.flatten() if weights.shape[1] == 1 else weights[keep]
        inputs.stats.mismatch.append(((old - sampling).abs()[keep], selected))
        return weights if args.rollout_correction else None

    # -- weights in and out ---------------------------------------------------------------------
    def full_state_dict(self) -> dict[str, Tensor] | None:
        """Under FSDP the full model weights on rank 0, in CPU memory (a collective: every rank
        calls it; the others get an empty dict); None without FSDP (save_pretrained reads the
        model itself)."""
        if not self.sharded:
            return None
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        weights = get_model_state_dict(self.model, options=options)
        # Tied weights (the LM head) come back as separate copies; save_pretrained would keep
        # both. Drop the duplicates, as a plain save_pretrained does.
        for name, _ in tied_parameter_names(self.model):
            weights.pop(name, None)
        return weights

    def save_pretrained(self, folder: Path, weights: dict[str, Tensor] | None) -> None:
        if weights is None:
            self.model.save_pretrained(folder)
        else:
            self.model.save_pretrained(folder, state_dict=weights)

    def load_weights(self, path: Path) -> None:
        """Load the weights ``save_pretrained`` wrote into ``path`` (the adapter with LoRA);
        :class:`CheckpointMismatch` when they are missing or do not fit."""
        from safetensors.torch import load_file

        if self.args.use_peft:
            from peft import set_peft_model_state_dict

            file = path / "adapter_model.safetensors"
            if not file.is_file():
                raise CheckpointMismatch(f"{file.name} is missing")
            try:
                adapter = load_file(file)
            except Exception as err:  # noqa: BLE001 - a damaged file is named, not traced
                raise CheckpointMismatch(f"{file.name} cannot be read ({err}): damaged") from err
            result = set_peft_model_state_dict(self.model, adapter)
            if getattr(result, "unexpected_keys", None):
                raise CheckpointMismatch(
                    f"adapter does not match this model ({result.unexpected_keys[:3]} ...)"
                )
            return
        files = sorted(path.glob("model*.safetensors"))
        if not files:
            raise CheckpointMismatch("no model*.safetensors weights")
        weights: dict[str, Tensor] = {}
        for file in files:
            try:
                weights.update(load_file(file))
            except Exception as err:  # noqa: BLE001 - a damaged file is named, not traced
                message = first_line(err)
                raise CheckpointMismatch(
                    f"{file.name} cannot be read ({type(err).__name__}: {message}): the file is "
                    "damaged; resume from an earlier checkpoint, or start over"
                ) from err
        if self.sharded:
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                set_model_state_dict,
            )

            # Every rank read the full weights; each keeps its own shards.
            options = StateDictOptions(full_state_dict=True, strict=False)
            missing, unexpected = set_model_state_dict(self.model, weights, options=options)
        else:
            missing, unexpected = self.model.load_state_dict(weights, strict=False)
        tied = {name for name, _ in tied_parameter_names(self.model)}
        missing = [m for m in missing if m not in tied]
        if missing or unexpected:
            raise CheckpointMismatch(
                f"weights do not match the model (missing {missing[:3]}, "
                f"unexpected {unexpected[:3]})"
            )


class GRPOLoss:
    """The GRPO objective of one micro-batch: the registered variant ``loss_type``
    (:func:`groupwise.core.policy_loss`) with the run's clip, KL and GSPO options, its share of the
    global batch (:meth:`~groupwise.core.LossVariant.share`), and the per-completion policy term
    with unweighted advantages (:func:`groupwise.core.sequence_surrogate`, GDRO's signal), and
    the entropy bonus when the run has one (:mod:`groupwise.entropy`)."""

    def __init__(self, args: GRPOConfig) -> None:
        self.args, self.variant = args, get_loss(args.loss_type)
        self.epsilon_high = args.effective_epsilon_high
        self.variant_options = loss_variant_options(args)
        self.entropy = EntropyControl.from_args(args)

    @property
    def entropy_grad(self) -> bool:
        """Whether the entropies must carry a gradient (only the bonus differentiates them;
        otherwise they stay detached, saving the softmax graph's memory)."""
        return self.entropy is not None

    def after_optimizer_step(self, dist: DistributedContext) -> None:
        if self.entropy is not None:
            self.entropy.step(dist)

    def logs(self, stats: UpdateStats) -> dict[str, float]:
        """With an entropy bonus, TRL's ``policy_loss`` (the loss without the bonus) and
        ``entropy_coef`` (after this step's update); nothing otherwise."""
        if self.entropy is None:
            return {}
        return {"policy_loss": stats.sums.get("policy_loss", 0.0), **self.entropy.logs()}

    def state_dict(self) -> dict[str, float] | None:
        """The adapted entropy coefficient travels in checkpoints (None: nothing to keep)."""
        return None if self.entropy is None else self.entropy.state_dict()

    def load_state_dict(self, state: dict[str, float]) -> None:
        if self.entropy is not None:
            self.entropy.load_state_dict(state)

    def __call__(self, logps: Tensor, mb: MicroBatch) -> LossTerms:
        args = self.args
        assert mb.advantages is not None
        options = dict(
            loss_type=args.loss_type,
            epsilon_low=args.epsilon,
            epsilon_high=self.epsilon_high,
            importance_sampling_level=args.importance_sampling_level,
            variant_options=self.variant_options,
        )
        entropy_mask = None
        if args.top_entropy_quantile < 1.0:
            if mb.entropy is None:
                raise ValueError("top_entropy_quantile needs the policy's token entropies")
            entropy_mask = high_entropy_mask(
                mb.entropy.detach(), mb.mask, args.top_entropy_quantile
            )
        token_mask = entropy_mask
        if args.off_policy_mask_threshold is not None:
            # Measured against the sampler: its own log-probs when it gave them, else pi_old
            # (on-policy: the policy itself, so nothing is dropped).
            sampler = mb.sampling_logprobs if mb.sampling_logprobs is not None else mb.old_logprobs
            sampler = logps.detach() if sampler is None else sampler
            keep_rows = off_policy_sequence_mask(
                mb.advantages, logps, sampler, mb.mask, args.off_policy_mask_threshold
            )[:, None].expand_as(mb.mask)
            token_mask = keep_rows if token_mask is None else token_mask & keep_rows
        loss, metrics = policy_loss(
            logps,
            mb.old_logprobs,
            mb.ref_logprobs,
            mb.advantages,
            mb.mask,
            beta=args.beta,
            max_completion_length=args.max_completion_length,
            rollout_weights=mb.correction,
            row_weights=mb.row_weights,
            token_mask=token_mask,
            kl_ratio_correction=args.use_bias_correction_kl,
            **options,
        )
        weight = self.variant.share(len(mb.rows), mb.mask.sum(), mb.counts)
        signal = sequence_surrogate(logps, mb.old_logprobs, mb.advantages, mb.mask, **options)
        bonus = None
        if self.entropy is not None:
            assert mb.entropy is not None
            # Eq. 1 of groupwise.entropy: this micro-batch's token mean of H, weighted by its
            # share of the global batch's completion tokens, over the completion tokens (the
            # high-entropy ones with top_entropy_quantile; the off-policy mask does not apply,
            # as in TRL).
            keep = mb.mask if entropy_mask is None else mb.mask * entropy_mask.to(mb.mask.dtype)
            tokens = mb.mask.sum() / mb.counts.tokens * mb.counts.world_size
            mean_entropy = entropy_bonus(mb.entropy, keep, tokens)
            bonus = -self.entropy.applied * mean_entropy
            if torch.is_grad_enabled():  # a training pass: evaluation never moves the control
                self.entropy.observe(mb.entropy, keep)
        return LossTerms(loss, weight, metrics, signal, bonus)


def loss_variant_options(args: GRPOConfig) -> dict[str, float]:
    """The run's options of its loss variant (TRL's names): delta for the clipped surrogates,
    the gate temperatures for sapo, the gamma shapes for vespo."""
    if args.loss_type == "sapo":
        return {
            "temperature_pos": args.sapo_temperature_pos,
            "temperature_neg": args.sapo_temperature_neg,
        }
    if args.loss_type == "vespo":
        return {
            "k_pos": args.vespo_k_pos,
            "lambda_pos": args.vespo_lambda_pos,
            "k_neg": args.vespo_k_neg,
            "lambda_neg": args.vespo_lambda_neg,
        }
    if args.delta is not None:
        return {"delta": args.delta}
    return {}


def tied_parameter_names(model: torch.nn.Module) -> list[tuple[str, str]]:
    """(name, first name) pairs for parameters that share storage with an earlier one."""
    seen: dict[int, str] = {}
    tied = []
    for name, param in model.named_parameters(remove_duplicate=False):
        key = id(param)
        if key in seen:
            tied.append((name, seen[key]))
        else:
            seen[key] = name
    return tied
