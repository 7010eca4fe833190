"""The policy: the language model being trained, its frozen reference, its forwards and its
weights in and out.

:class:`Policy` composes two parts: the trained network under data parallel
(:class:`~groupwise.policy.optimizer.Trainable`: its DDP wrapper or FSDP2 root, AdamW and LR
schedule) and the frozen reference (:class:`Reference`: a copy, offloaded or not, or the LoRA
adapter disabled). The update (:mod:`groupwise.policy.update`) drives it: its forwards
(:meth:`Policy.logprobs`, :meth:`Policy.reference_logprobs`) and its network's optimizer.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel
from transformers import PreTrainedModel

from ..errors import ConfigError
from ..rollout import Rollout
from ..runtime.distributed import DistributedContext, any_rank
from ..runtime.precision import Precision
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
from .batches import prompt_blocks, trimmed_completions
from .logprobs import completion_logprobs
from .optimizer import Trainable
from .parallel import LogprobModule, fsdp_full_weights, shard_fsdp
from .weights import (
    OffloadedWeights,
    frozen_copy,
    full_state_dict,
    load_weights,
    mix_weights,
    save_pretrained,
)


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
# The frozen reference policy pi_ref of the KL term (DeepSeekMath eq. 3: beta * KL[pi, pi_ref]).
# A full fine-tune keeps a frozen copy of the initial weights, in one of three layouts:
#
# - resident: on the policy's device, beside the policy;
# - offloaded (``ref_model_offload``): in pinned CPU memory; each step copies it to the GPU once
#   (asynchronously, from page-locked memory), computes every micro-batch's reference log-probs,
#   and drops the GPU copy. Nothing is copied back: the weights are frozen;
# - sharded (``data_parallel: fsdp``): FSDP2-sharded like the policy, each rank holding 1/N; its
#   full weights are gathered once per step for the no-grad forwards.
#
# The copy is made tensor by tensor straight onto its target (policy/weights.py), so an offloaded
# reference never exists twice on the GPU. With LoRA there is no copy at all: the reference is the
# policy with its adapter disabled. "Frozen" unless ``sync_ref_model`` (TRL's TR-DPO option) mixes
# the policy into it every ``ref_model_sync_steps`` optimizer steps (``mix_weights``).


class Reference:
    """The frozen copy of the policy's initial weights (``module``) and :meth:`weights`, the
    block inside which its forwards run.

    ``shard``: the FSDP2 sharding function (``parallel.shard_fsdp`` bound to the run's mesh)
    when the policy is sharded; ``gather``: the matching full-weights context
    (``parallel.fsdp_full_weights``)."""

    def __init__(
        self,
        model: torch.nn.Module,
        device: torch.device,
        *,
        offload: bool = False,
        shard: Callable[[torch.nn.Module], Any] | None = None,
        gather: Callable[[Any], contextlib.AbstractContextManager] | None = None,
    ) -> None:
        if offload and shard is not None:
            raise ConfigError(
                "ref_model_offload with data_parallel=fsdp: the reference is already sharded "
                "over the ranks (1/N of it per GPU); drop ref_model_offload"
            )
        offload = offload and device.type != "cpu"
        target = torch.device("cpu") if offload else device
        self.module = frozen_copy(model, target, pin=offload and torch.cuda.is_available())
        self.offloaded = OffloadedWeights(self.module, device) if offload else None
        self.root = shard(self.module) if shard is not None else None
        self._gather = gather

    def mix_from(self, policy: torch.nn.Module, alpha: float) -> None:
        """The soft update of :func:`mix_weights` from the policy (same layout: both sharded
        alike under FSDP, each rank mixing its own shards)."""
        mix_weights(self.module, policy, alpha)

    @contextlib.contextmanager
    def weights(self) -> Iterator[None]:
        """The full reference weights on the policy's device for the block: moved there
        (offloaded), gathered (sharded), or already there."""
        if self.offloaded is not None:
            with self.offloaded.on_device():
                yield
        elif self.root is not None and self._gather is not None:
            with self._gather(self.root):
                yield
        else:
            yield


# ----------------------------------------------------------------------------------------------
# The policy


class Policy:
    """The language model being trained, its reference and its forwards; its network and
    optimizer are :attr:`network`'s (a :class:`~groupwise.policy.optimizer.Trainable`), which
    the update (:mod:`groupwise.policy.update`) steps.

    Data parallel (torchrun): with ``data_parallel: ddp`` the training forward goes through
    DistributedDataParallel (constructing it broadcasts rank 0's parameters); with ``fsdp`` the
    model is sharded in place (FSDP2) and no-grad calls of the Hugging Face model run inside
    :meth:`full_weights`.

    ``options`` holds the sections it reads (:class:`PolicyOptions`,
    made by ``PolicyOptions.from_sections(config.sections())``)."""

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
                shard=functools.partial(
                    shard_fsdp, ctx=dist, device=device, bf16_compute=self.precision.autocast
                )
                if fsdp
                else None,
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
        self.dist = dist
        self.network = Trainable(model, wrapper, optimization, dist, optimization.learning_rate)
        self._full_weights_depth = 0

    def sync_reference(self) -> None:
        """After each optimizer step, with ``sync_ref_model``, TR-DPO's reference update every
        ``ref_model_sync_steps`` optimizer steps (the schedule counts them, across a resume)."""
        reference = self.options.reference
        if reference.sync_ref_model and self.reference is not None:
            if self.network.scheduler.last_epoch % reference.ref_model_sync_steps == 0:
                self.reference.mix_from(self.model, reference.ref_model_mixup_alpha)

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
        outermost = self.network.sharded and self._full_weights_depth == 0
        self._full_weights_depth += 1
        try:
            with fsdp_full_weights(self.network.wrapper) if outermost else contextlib.nullcontext():
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
        # Share the prompt forward across the rows of a prompt: whole groups of any sizes, or
        # pieces of them (micro_batch_rows lays each prompt's rows out together).
        runtime = self.options.runtime
        blocks = prompt_blocks(rollout.host_group_ids[rows])
        share = blocks is not None and not runtime.gradient_checkpointing
        policy_grad = model is self.model and torch.is_grad_enabled()
        if policy_grad and self.network.sharded:
            # FSDP2 all-gathers each layer in every decoder call, and the shared path makes two
            # (prompt, then completions; one when width is 1): every rank must take the same
            # path for this micro-batch (ranks run equally many, see prepare's padding).
            share = not any_rank(not (share and width > 1), self.dist)
        group_size: int | list[int] = 1
        if share:
            prompts, group_size = blocks
            prompt_ids, prompt_mask = rollout.prompt_ids[prompts], rollout.prompt_mask[prompts]
        else:
            index = rollout.group_ids[rows]
            prompt_ids, prompt_mask = rollout.prompt_ids[index], rollout.prompt_mask[index]
        # The policy's forward with gradients goes through the DDP / FSDP wrapper when data
        # parallel; without gradients, FSDP gathers the full weights around the plain call.
        wrapper = self.network.wrapper
        forward = (
            wrapper
            if policy_grad and wrapper is not None
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
                padding_free=runtime.padding_free,
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
        (:func:`groupwise.policy.policy.full_state_dict`)."""
        return full_state_dict(self.model, self.network.sharded)

    def save_pretrained(self, folder: Path, weights: dict[str, Tensor] | None) -> None:
        save_pretrained(self.model, folder, weights)

    def load_weights(self, path: Path) -> None:
        """Load the weights ``save_pretrained`` wrote into ``path`` (the adapter with LoRA);
        :class:`CheckpointMismatch` when they are missing or do not fit."""
        load_weights(
            self.model, path, use_peft=self.options.model.use_peft, sharded=self.network.sharded
        )
