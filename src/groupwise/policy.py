"""The policy: the language model being trained, its frozen reference and its forwards.

:class:`Policy` is the trained network under data parallel (:class:`~groupwise.trainable.Trainable`:
its DDP wrapper or FSDP2 root, AdamW and LR schedule) with the language-model side: the frozen
reference (a copy, offloaded or not, or the LoRA adapter disabled) and micro-batched completion
log-probs. The two calls of a step come from :class:`~groupwise.update.PolicyUpdate`:

    inputs = policy.prepare(rollout, advantages, row_weights)  # pi_old (mu > 1), pi_ref (beta > 0)
    stats = policy.update(inputs, loss)                        # one optimizer pass

``loss`` is any callable ``loss(logprobs, micro_batch) -> LossTerms``;
:class:`~groupwise.grpo_loss.GRPOLoss` binds a registered loss variant
(:data:`groupwise.losses.LOSSES`) to the run's options. The weights go in and out through
:mod:`groupwise.policy_weights`.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel
from transformers import PreTrainedModel

from . import policy_weights
from .batching import prompt_blocks, trimmed_completions
from .distributed import (
    DistributedContext,
    LogprobModule,
    any_rank,
    fsdp_full_weights,
    shard_fsdp,
)
from .grpo_loss import GRPOLoss
from .logprobs import completion_logprobs
from .policy_weights import CheckpointMismatch, tied_parameter_names
from .precision import Precision
from .reference import Reference
from .rollout import Rollout, RolloutEngine
from .trainable import Trainable, apply_lora, lr_factor, optimizer_steps
from .update import (
    GenerationBatch,
    LossTerms,
    MicroBatch,
    PolicyInputs,
    PolicyOptions,
    PolicyUpdate,
    UpdateStats,
    merge_stats,
)

# Also offered here: the names callers have imported from this module.
__all__ = [
    "CheckpointMismatch",
    "GRPOLoss",
    "GenerationBatch",
    "LossTerms",
    "MicroBatch",
    "Policy",
    "PolicyInputs",
    "PolicyOptions",
    "Trainable",
    "UpdateStats",
    "apply_lora",
    "lr_factor",
    "merge_stats",
    "optimizer_steps",
    "tied_parameter_names",
]


class Policy(PolicyUpdate):
    """The language model being trained, its reference and its forwards; the update is
    :class:`~groupwise.update.PolicyUpdate`'s.

    Data parallel (torchrun): with ``data_parallel: ddp`` the training forward goes through
    DistributedDataParallel (constructing it broadcasts rank 0's parameters); with ``fsdp`` the
    model is sharded in place (FSDP2) and no-grad calls of the Hugging Face model run inside
    :meth:`full_weights`.

    ``options`` holds the sections it reads (:class:`~groupwise.update.PolicyOptions`, made by
    ``PolicyOptions.from_sections(config.sections())``)."""

    def __init__(
        self,
        model: PreTrainedModel,
        options: PolicyOptions,
        dist: DistributedContext,
        device: torch.device,
        precision: Precision | None = None,
    ) -> None:
        self.model, self.device, self.options = model, device, options
        self.precision = precision or Precision(weights=torch.float32, autocast=False)
        fsdp = dist.enabled and options.runtime.data_parallel == "fsdp"
        # The frozen reference exists only when the KL term is on (beta > 0). With LoRA it is
        # the same weights with the adapter disabled: no second copy. Copied before the policy
        # is sharded (its parameters then become shards).
        self.reference: Reference | None = None
        if options.loss.beta > 0 and not options.model.use_peft:
            self.reference = Reference(
                model,
                device,
                offload=options.reference.ref_model_offload,
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
        optimization = options.optimization
        super().__init__(
            model, wrapper, optimization, options.batch, dist, optimization.learning_rate
        )
        self._full_weights_depth = 0

    def step(self) -> None:
        """The optimizer step, then, with ``sync_ref_model``, TR-DPO's reference update every
        ``ref_model_sync_steps`` optimizer steps (the schedule counts them, across a resume)."""
        super().step()
        reference = self.options.reference
        if reference.sync_ref_model and self.reference is not None:
            if self.scheduler.last_epoch % reference.ref_model_sync_steps == 0:
                self.reference.mix_from(self.model, reference.ref_model_mixup_alpha)

    def learn(
        self,
        rollout: Rollout,
        advantages: Tensor,
        row_weights: Tensor | None,
        loss: Callable[[Tensor, MicroBatch], LossTerms],
        engine: RolloutEngine,
    ) -> UpdateStats:
        """One generation batch's whole update: its mini-batches prepared
        (:meth:`prepare_generation`), ``num_iterations`` passes of ``loss``
        (:meth:`train_generation`), then ``engine`` takes the new weights (an engine with its
        own copy, static or vLLM, would otherwise sample from the old policy)."""
        generation = self.prepare_generation(rollout, advantages, row_weights)
        stats = self.train_generation(generation, loss)
        engine.sync(self.model)
        return stats

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
        runtime = self.options.runtime
        blocks = prompt_blocks(rollout.host_group_ids[rows], self.options.batch.num_generations)
        share = blocks is not None and not runtime.gradient_checkpointing
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
        temperature = self.options.generation.temperature
        with gather:
            logps, entropy = forward(
                prompt_ids,
                prompt_mask,
                completion_ids,
                completion_mask,
                temperature=temperature if temperature > 0 else 1.0,
                chunk_size=runtime.logprob_chunk_size,
                group_size=group_size,
                impl=runtime.logprob_impl,
                entropy_grad=entropy_grad,
            )
        pad = (0, rollout.completion_ids.shape[1] - width)
        return torch.nn.functional.pad(logps, pad), torch.nn.functional.pad(entropy, pad)

    def reference_logprobs(self, rollout: Rollout, rows: Tensor) -> Tensor:
        """Log-probs under the frozen reference: the adapter-disabled model with LoRA, else the
        reference copy. Call it inside :meth:`reference_weights` (once around a whole batch:
        an offloaded reference visits the device once, a sharded one is gathered once)."""
        if self.options.model.use_peft:
            with self.model.disable_adapter():
                return self.logprobs(rollout, rows)[0]
        assert self.reference is not None
        return self.logprobs(rollout, rows, self.reference.module)[0]

    def reference_weights(self) -> contextlib.AbstractContextManager:
        """The block inside which :meth:`reference_logprobs` runs (with LoRA the policy's own
        weights: under FSDP gathered once for the block)."""
        if self.options.model.use_peft:
            return self.full_weights()
        if self.reference is None:
            return contextlib.nullcontext()
        return self.reference.weights()

    # -- weights in and out ---------------------------------------------------------------------
    def full_state_dict(self) -> dict[str, Tensor] | None:
        """Under FSDP the full model weights on rank 0 (a collective), else None
        (:func:`groupwise.policy_weights.full_state_dict`)."""
        return policy_weights.full_state_dict(self.model, self.sharded)

    def save_pretrained(self, folder: Path, weights: dict[str, Tensor] | None) -> None:
        policy_weights.save_pretrained(self.model, folder, weights)

    def load_weights(self, path: Path) -> None:
        """Load the weights ``save_pretrained`` wrote into ``path`` (the adapter with LoRA);
        :class:`CheckpointMismatch` when they are missing or do not fit."""
        policy_weights.load_weights(
            self.model, path, use_peft=self.options.model.use_peft, sharded=self.sharded
        )
