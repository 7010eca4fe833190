"""One trained network under data parallel, and its optimizer schedule.

:class:`Trainable` is a network with its DDP wrapper or FSDP2 root, its AdamW and LR schedule,
gradient sync, clipping and the optimizer step; the policy (:class:`groupwise.policy.policy.Policy`)
and the PPO critic are each one. :func:`apply_lora` makes only a LoRA adapter's parameters
train.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel

from ..runtime.distributed import DistributedContext, all_reduce_sum

if TYPE_CHECKING:
    from ..sections import BatchOptions, OptimizationOptions


def lr_factor(optimization: OptimizationOptions, total_steps: int) -> Callable[[int], float]:
    """The LR multiplier per optimizer step: linear warm-up over ``warmup_steps`` (or
    ``ceil(warmup_ratio * total_steps)``), then constant, linear decay or cosine decay to 0 at
    ``total_steps``."""
    warmup = optimization.warmup_steps_for(total_steps)
    schedule = optimization.lr_scheduler_type

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
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
        self.optimizer = torch.optim.AdamW(
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
        self.scheduler.step()
        if self.after_step is not None:
            self.after_step()

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
