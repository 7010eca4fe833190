"""The policy: the language model being trained, its frozen reference, its forwards and its
weights in and out.

:class:`Policy` composes three parts: the trained network under data parallel
(:class:`~groupwise.policy.policy.Trainable`: its DDP wrapper or FSDP2 root, AdamW and LR
schedule), the frozen reference (:class:`~groupwise.policy.policy.Reference`: a copy,
offloaded or not, or the LoRA adapter disabled) and the micro-batched update
(:mod:`groupwise.policy.update`, functions that run this policy's forwards). The two calls of
a step:

    inputs = policy.prepare(rollout, advantages, row_weights)  # pi_old (mu > 1), pi_ref (beta > 0)
    stats = policy.update(inputs, loss)                        # one optimizer pass

``loss`` is any callable ``loss(logprobs, micro_batch) -> LossTerms``;
:class:`~groupwise.policy.loss.GRPOLoss` binds a registered loss variant
(:data:`groupwise.algo.losses.LOSSES`) to the run's options.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel
from transformers import PreTrainedModel

from ..algo.losses import LossTerms, MicroBatch
from ..errors import ConfigError
from ..rollout import Rollout, RolloutEngine
from ..runtime.distributed import DistributedContext, all_reduce_sum, any_rank
from ..runtime.precision import Precision
from ..runtime.quantization import build_optimizer
from . import update
from .logprobs import completion_logprobs
from .parallel import LogprobModule, fsdp_full_weights, shard_fsdp
from .update import (
    GenerationBatch,
    PolicyInputs,
    PolicyOptions,
    TrainedNetwork,
    UpdateStats,
    prompt_blocks,
    trimmed_completions,
)
from .weights import (
    OffloadedWeights,
    frozen_copy,
    full_state_dict,
    load_weights,
    mix_weights,
    save_pretrained,
)

if TYPE_CHECKING:
    from ..sections import BatchOptions, OptimizationOptions


# ----------------------------------------------------------------------------------------------
# The trained network: a network with its DDP wrapper or FSDP2 root, its AdamW and LR schedule,
# gradient sync, clipping and the optimizer step. The policy and PPO's critic each hold one.


def lr_factor(optimization: OptimizationOptions, total_steps: int) -> Callable[[int], float]:
    """The LR multiplier of optimizer step ``step`` (0-based): linear warm-up from 0 over
    ``warmup_steps`` (or ``ceil(warmup_ratio * total_steps)``), then constant, linear decay or
    cosine decay to 0 at ``total_steps``; transformers' get_constant_schedule_with_warmup,
    get_linear_schedule_with_warmup and get_cosine_schedule_with_warmup, step for step (the
    first step runs at lr * 0 / warmup)."""
    warmup = optimization.warmup_steps_for(total_steps)
    schedule = optimization.lr_scheduler_type

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return step / warmup
        if schedule == "constant":
            return 1.0
        progress = (step - warmup) / max(1, total_steps - warmup)
        progress = min(max(progress, 0.0), 1.0)
        if schedule == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def optimizer_steps(batch: BatchOptions, steps: int) -> int:
    """Optimizer steps in ``steps`` groupwise steps (generation batches): every generation
    batch is split into ``optimizer_steps_per_generation`` mini-batches, each stepped once per
    pass, ``num_iterations`` passes."""
    return steps * batch.optimizer_steps_per_generation * batch.num_iterations


class Trainable:
    """A network trained under data parallel: ``module`` (the plain network, which checkpoints
    and ``save_pretrained`` read), ``wrapper`` (what its training forward goes through: DDP, the
    FSDP2 root, or None in one process), AdamW and its LR schedule (from ``optimization``, over
    the optimizer steps that ``batch`` makes of ``max_steps``)."""

    def __init__(
        self,
        module: torch.nn.Module,
        wrapper: Any,
        optimization: OptimizationOptions,
        batch: BatchOptions,
        dist: DistributedContext,
        learning_rate: float,
        after_step: Callable[[], None] | None = None,
    ) -> None:
        self.module, self.wrapper, self.dist = module, wrapper, dist
        self.optimization, self.after_step = optimization, after_step
        # torch's AdamW, or bitsandbytes' with 8-bit / paged states (TRL's optim names).
        self.optimizer = build_optimizer(
            optimization.optim,
            [p for p in module.parameters() if p.requires_grad],
            lr=learning_rate,
            betas=(optimization.adam_beta1, optimization.adam_beta2),
            eps=optimization.adam_epsilon,
            weight_decay=optimization.weight_decay,
        )
        # The schedule spans the run's optimizer steps: max_steps generation batches (the
        # sections are read after max_steps=-1 is made concrete for the dataset).
        total = optimizer_steps(batch, optimization.max_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_factor(optimization, total)
        )
        self.last_lr: float | None = None

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
        max_norm = self.optimization.max_grad_norm
        norm = torch.nn.utils.clip_grad_norm_(self.module.parameters(), max_norm)
        if hasattr(norm, "full_tensor"):  # FSDP: a DTensor (a partial norm per rank)
            norm = norm.full_tensor()
        return norm

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def step(self) -> None:
        """The optimizer step and the schedule's, then ``after_step`` (the policy's: TR-DPO's
        reference update)."""
        self.optimizer.step()
        # The rate this step used, logged as learning_rate (transformers' Trainer reads it
        # before lr_scheduler.step(), which sets the next step's).
        self.last_lr = self.scheduler.get_last_lr()[0]
        self.scheduler.step()
        if self.after_step is not None:
            self.after_step()

    def global_sum(self, value: Tensor) -> Tensor:
        """``value`` summed over every rank (itself in one process)."""
        return all_reduce_sum(value, self.dist)

    @property
    def learning_rate(self) -> float:
        """The rate of the latest optimizer step; before any, the first step's."""
        return self.last_lr if self.last_lr is not None else self.scheduler.get_last_lr()[0]

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

    ``shard``: the FSDP2 sharding function (``distributed.shard_fsdp`` bound to the run's mesh)
    when the policy is sharded; ``gather``: the matching full-weights context
    (``distributed.fsdp_full_weights``)."""

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
    optimizer are :attr:`network`'s (a :class:`~groupwise.policy.policy.Trainable`), its
    update the functions of :mod:`groupwise.policy.update`, which call back into its methods.

    Data parallel (torchrun): with ``data_parallel: ddp`` the training forward goes through
    DistributedDataParallel (constructing it broadcasts rank 0's parameters); with ``fsdp`` the
    model is sharded in place (FSDP2) and no-grad calls of the Hugging Face model run inside
    :meth:`full_weights`.

    ``options`` holds the sections it reads (:class:`~groupwise.policy.update.PolicyOptions`,
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
        self.dist = dist
        self.network = Trainable(
            model, wrapper, optimization, options.batch, dist, optimization.learning_rate,
            after_step=self._sync_reference,
        )  # fmt: skip
        # A derived count of the batch section, read once (the update runs every step).
        self.optimizer_steps_per_generation = options.batch.optimizer_steps_per_generation
        self._full_weights_depth = 0

    def _sync_reference(self) -> None:
        """After each optimizer step, with ``sync_ref_model``, TR-DPO's reference update every
        ``ref_model_sync_steps`` optimizer steps (the schedule counts them, across a resume)."""
        reference = self.options.reference
        if reference.sync_ref_model and self.reference is not None:
            if self.scheduler.last_epoch % reference.ref_model_sync_steps == 0:
                self.reference.mix_from(self.model, reference.ref_model_mixup_alpha)

    # -- the update (policy/update.py): each call goes through these methods --------------------
    def micro_batches(self, rollout: Rollout) -> list[Tensor]:
        """Row-index micro-batches of ``per_device_train_batch_size`` rows (whole groups when
        the groups are uniform and fit, sorted by length with ``group_by_length``)."""
        return update.micro_batches(self.options, rollout)

    def prepare(
        self,
        rollout: Rollout,
        advantages: Tensor | None,
        row_weights: Tensor | None = None,
        *,
        need_old: bool | None = None,
        exclude_rows: Tensor | None = None,
    ) -> PolicyInputs:
        """The batch prepared for :meth:`update` (:func:`groupwise.policy.update.prepare`)."""
        return update.prepare(
            self, rollout, advantages, row_weights, need_old=need_old, exclude_rows=exclude_rows
        )

    def update(
        self,
        inputs: PolicyInputs,
        loss: Callable[[Tensor, MicroBatch], LossTerms],
        also: Sequence[TrainedNetwork] = (),
    ) -> UpdateStats:
        """One optimizer pass over a prepared batch (:func:`groupwise.policy.update.update`)."""
        return update.update(self, inputs, loss, also)

    def prepare_generation(
        self, rollout: Rollout, advantages: Tensor, row_weights: Tensor | None = None
    ) -> GenerationBatch:
        """A generation batch's mini-batches, each prepared
        (:func:`groupwise.policy.update.prepare_generation`)."""
        return update.prepare_generation(self, rollout, advantages, row_weights)

    def train_generation(
        self, batch: GenerationBatch, loss: Callable[[Tensor, MicroBatch], LossTerms]
    ) -> UpdateStats:
        """``num_iterations`` passes over a prepared generation batch
        (:func:`groupwise.policy.update.train_generation`)."""
        return update.train_generation(self, batch, loss)

    def loss_value(
        self, rollout: Rollout, advantages: Tensor, loss: Callable[[Tensor, MicroBatch], LossTerms]
    ) -> float:
        """The batch's objective without an update (:func:`groupwise.policy.update.loss_value`)."""
        return update.loss_value(self, rollout, advantages, loss)

    # -- the network and its optimizer (Trainable) ------------------------------------------------
    @property
    def wrapper(self) -> Any:
        return self.network.wrapper

    @property
    def sharded(self) -> bool:
        return self.network.sharded

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.network.optimizer

    @property
    def scheduler(self) -> torch.optim.lr_scheduler.LambdaLR:
        return self.network.scheduler

    @property
    def learning_rate(self) -> float:
        return self.network.learning_rate

    def zero_grad(self) -> None:
        self.network.zero_grad()

    def gradient_sync(self, sync: bool) -> contextlib.AbstractContextManager:
        return self.network.gradient_sync(sync)

    def clip_grad_norm(self) -> Tensor:
        return self.network.clip_grad_norm()

    def step(self) -> None:
        """The optimizer step (then TR-DPO's reference update, with ``sync_ref_model``)."""
        self.network.step()

    def global_sum(self, value: Tensor) -> Tensor:
        return self.network.global_sum(value)

    def optimizer_state_dict(self) -> dict[str, Any]:
        return self.network.optimizer_state_dict()

    def load_optimizer_state_dict(self, state: dict[str, Any]) -> None:
        self.network.load_optimizer_state_dict(state)

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
        return full_state_dict(self.model, self.sharded)

    def save_pretrained(self, folder: Path, weights: dict[str, Tensor] | None) -> None:
        save_pretrained(self.model, folder, weights)

    def load_weights(self, path: Path) -> None:
        """Load the weights ``save_pretrained`` wrote into ``path`` (the adapter with LoRA);
        :class:`CheckpointMismatch` when they are missing or do not fit."""
        load_weights(
            self.model, path, use_peft=self.options.model.use_peft, sharded=self.sharded
        )
