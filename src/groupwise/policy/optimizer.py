"""The optimizer and its schedule: AdamW by TRL's ``optim`` names (torch's, or bitsandbytes'
with 8-bit block-wise and/or paged states; Dettmers et al. 2022), the learning-rate schedule
(warm-up, then constant, linear or cosine decay, as transformers' schedules), and
:class:`Trainable`, a network trained under data parallel with its optimizer: gradient sync,
clipping and the step. The policy and PPO's critic each hold one.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel

from ..errors import ConfigError
from ..runtime.distributed import DistributedContext, all_reduce_sum
from ..runtime.quantization import require_bitsandbytes

if TYPE_CHECKING:
    from ..sections import OptimizationOptions

# TRL's / transformers' ``optim`` names (transformers.training_args.OptimizerNames) that
# groupwise trains with -> (bitsandbytes class, or None for torch.optim.AdamW).
OPTIMIZERS: dict[str, str | None] = {
    "adamw_torch": None,
    "adamw_torch_fused": None,
    "adamw_bnb_8bit": "AdamW8bit",
    "adamw_8bit": "AdamW8bit",
    "paged_adamw_8bit": "PagedAdamW8bit",
    "paged_adamw_32bit": "PagedAdamW32bit",
}


def _device_type(params: list) -> str:
    """The device type of the first parameter (of a list of parameters or of groups)."""
    tensors = [t for p in params for t in (p["params"] if isinstance(p, dict) else [p])]
    return tensors[0].device.type if tensors else "cpu"


def check_optim_device(optim: str, device: torch.device) -> None:
    """Refuse a paged optimizer off CUDA: it pages its state between GPU and CPU memory through
    CUDA unified memory, and on a CPU bitsandbytes silently runs the unpaged one instead."""
    if optim.startswith("paged_") and device.type != "cuda":
        raise ConfigError(
            f"optim={optim} needs a CUDA GPU (device is {device.type}): a paged optimizer "
            "moves its state between GPU and CPU memory through CUDA unified memory, and off "
            "CUDA there is nothing to page; use optim=adamw_8bit (8-bit states) or adamw_torch"
        )


# transformers' Trainer.get_decay_parameter_names: parameters whose lower-cased name matches one
# of these, or that belong to an nn.LayerNorm, get no weight decay (biases and norm weights).
NO_DECAY_PATTERNS = (r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)")


def decay_parameter_names(model: torch.nn.Module) -> list[str]:
    """The names of ``model``'s parameters that weight decay applies to, as transformers'
    ``Trainer.get_decay_parameter_names``: all but biases, LayerNorm / RMSNorm weights and the
    parameters of ``nn.LayerNorm`` modules. Names are ``model.named_parameters()``'s."""
    from transformers.trainer_pt_utils import get_parameter_names

    return get_parameter_names(model, [torch.nn.LayerNorm], list(NO_DECAY_PATTERNS))


def parameter_groups(
    model: torch.nn.Module, weight_decay: float
) -> list[torch.nn.Parameter] | list[dict[str, Any]]:
    """``model``'s trainable parameters for the optimizer: with ``weight_decay`` two groups as
    the HF Trainer makes them (``weight_decay`` on :func:`decay_parameter_names`, 0.0 on the
    rest); without, one plain list, so the optimizer's state dict keeps one group and
    checkpoints saved with weight_decay 0 load as before."""
    trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    if not weight_decay:
        return [p for _, p in trainable]
    decay = set(decay_parameter_names(model))
    groups = [
        {"params": [p for name, p in trainable if name in decay], "weight_decay": weight_decay},
        {"params": [p for name, p in trainable if name not in decay], "weight_decay": 0.0},
    ]
    # An empty group (LoRA trains no bias or norm) would only be noise in the state dict.
    return [group for group in groups if group["params"]]


def build_optimizer(
    optim: str,
    params: Iterable[torch.nn.Parameter] | Iterable[dict[str, Any]],
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
) -> torch.optim.Optimizer:
    """The AdamW that ``optim`` names (:data:`OPTIMIZERS`): torch's, or bitsandbytes' with
    8-bit block-wise states (tensors of 4096+ elements; smaller ones keep 32-bit states, as
    bitsandbytes' ``min_8bit_size``) and/or paged ones. All take the same hyper-parameters.
    ``params``: parameters, or parameter groups (:func:`parameter_groups`) whose own
    ``weight_decay`` overrides ``weight_decay``. ``adamw_torch_fused`` on a GPU is torch's
    fused kernel (``fused=True``, as TRL runs it: one launch per step, no temporary copy of v);
    elsewhere, and for ``adamw_torch``, torch's default implementation."""
    name = OPTIMIZERS[optim]
    params = list(params)
    if name is None:
        fused = optim == "adamw_torch_fused" and _device_type(params) == "cuda"
        return torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                 fused=fused or None)  # fmt: skip
    require_bitsandbytes(f"optim={optim}")
    import bitsandbytes as bnb

    cls = getattr(bnb.optim, name)
    return cls(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


# ----------------------------------------------------------------------------------------------
# The learning-rate schedule and the trained network


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


class Trainable:
    """A network trained under data parallel: ``module`` (the plain network, which checkpoints
    and ``save_pretrained`` read), ``wrapper`` (what its training forward goes through: DDP, the
    FSDP2 root, or None in one process), AdamW and its LR schedule (from ``optimization``, over
    ``max_steps`` optimizer steps)."""

    def __init__(
        self,
        module: torch.nn.Module,
        wrapper: Any,
        optimization: OptimizationOptions,
        dist: DistributedContext,
        learning_rate: float,
    ) -> None:
        self.module, self.wrapper, self.dist = module, wrapper, dist
        self.optimization = optimization
        # torch's AdamW, or bitsandbytes' with 8-bit / paged states (TRL's optim names).
        self.optimizer = build_optimizer(
            optimization.optim,
            # the plain module's names, also under DDP (wrapper apart) and FSDP2 (in place)
            parameter_groups(module, optimization.weight_decay),
            lr=learning_rate,
            betas=(optimization.adam_beta1, optimization.adam_beta2),
            eps=optimization.adam_epsilon,
            weight_decay=optimization.weight_decay,
        )
        # The schedule spans the run's optimizer steps, max_steps (the sections are read
        # after max_steps=-1 is made concrete for the dataset).
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_factor(optimization, optimization.max_steps)
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
        """The optimizer step, then the schedule's."""
        self.optimizer.step()
        # The rate this step used, logged as learning_rate (transformers' Trainer reads it
        # before lr_scheduler.step(), which sets the next step's).
        self.last_lr = self.scheduler.get_last_lr()[0]
        self.scheduler.step()

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
