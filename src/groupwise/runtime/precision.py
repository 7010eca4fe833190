"""A run's numerics: the dtype the weights are stored and updated in, bf16 autocast for the
forward and backward passes, the numerics of generation, and TF32 matmuls on CUDA.

The modes (docs/gpu.md), as the options resolve them:

==================  ===========================  ========  ============  ===============  ==========
mode                options                      weights   fwd / bwd     AdamW state      TRL / HF
==================  ===========================  ========  ============  ===============  ==========
fp32                CPU default                  fp32      fp32          fp32             bf16=False
bf16 mixed          CUDA default,                fp32      bf16          fp32             bf16=True
                    ``bf16_autocast: true``                autocast
bf16 generation     ``generation_dtype:          fp32      fp32 (gen.:   fp32             vLLM in
                    bfloat16``                             bf16)                          bf16
pure bf16           ``dtype: bfloat16``          bf16      bf16          bf16 (warns)     none
LoRA                ``use_peft: true``           base bf16 bf16 autocast adapters fp32    bf16=True
                                                 on CUDA,  on CUDA                        + peft
                                                 adapters
                                                 fp32
==================  ===========================  ========  ============  ===============  ==========

Why fp32 master weights: bf16 keeps 8 significant bits, so an update smaller than about 2^-9 of
a weight's magnitude rounds to nothing. AdamW's step is about ``learning_rate`` per element, so at
1e-6 a weight of magnitude above ~5e-4 never moves, norm weights (magnitude 1) least of all.
Mixed precision (Micikevicius et al. 2018, "Mixed Precision Training") keeps the weights and the
optimizer state in fp32 and runs the matmuls in bf16 under autocast; it is what TRL's and the HF
Trainer's ``bf16=True`` and verl's FSDP actor do. A LoRA run's base weights are frozen, so they
can be stored in bf16 at no cost to the update; peft keeps the adapters in fp32.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass

import torch


class PrecisionWarning(UserWarning):
    """A precision choice that makes training lose updates or run slower than it should."""


PURE_BF16_WARNING = (
    "dtype=bfloat16 stores the trained weights and AdamW's state in bfloat16, with no fp32 "
    "master copy: an update smaller than about 1/512 of a weight's magnitude is rounded away, "
    "so at learning_rate={lr:g} most elements of the weights (norm weights first) never change "
    "and training looks stuck. Use dtype: auto (fp32 weights) with bf16_autocast: true for bf16 "
    "speed without the loss (TRL's bf16=True), or LoRA (use_peft: true), whose adapters stay fp32"
)


@dataclass(frozen=True)
class Precision:
    """What a run computes in. ``weights``: the dtype of the model's parameters (the trained
    ones and, with LoRA, the frozen base; adapters stay fp32); ``autocast``: bf16 autocast
    around every forward and backward of the policy and around generation; ``generation_only``:
    bf16 autocast around generation alone (the update stays in ``weights``), so the sampler's
    log-probs differ from the trainer's and rollout correction applies."""

    weights: torch.dtype
    autocast: bool
    generation_only: bool = False
    trained: torch.dtype = torch.float32  # a fully trained network's dtype (the PPO critic)

    @property
    def name(self) -> str:
        if self.weights == torch.bfloat16:
            return "bf16 weights" if not self.autocast else "bf16 weights, bf16 autocast"
        if self.autocast:
            return "bf16 mixed"
        return "fp32, bf16 generation" if self.generation_only else "fp32"

    def context(self, device: torch.device) -> contextlib.AbstractContextManager:
        """The autocast region of a training forward/backward (a no-op without autocast)."""
        if not self.autocast:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)

    def generation_context(self, device: torch.device) -> contextlib.AbstractContextManager:
        """The autocast region of generation: the training numerics, or bf16 alone."""
        if self.generation_only:
            return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
        return self.context(device)


def bf16_capable(device: torch.device) -> bool:
    """Whether ``device`` runs bf16 matmuls natively (CUDA compute capability 8.0+)."""
    return device.type == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False)


def resolve_precision(
    dtype: str,
    bf16_autocast: bool | None,
    generation_dtype: str,
    device: torch.device,
    *,
    use_peft: bool = False,
) -> Precision:
    """The run's :class:`Precision` from its options on ``device``.

    ``dtype``: auto | float32 | bfloat16. auto stores trained weights in fp32 everywhere; with
    LoRA on a bf16-capable GPU the frozen base is stored in bf16. ``bf16_autocast``: None (auto)
    is on exactly on a bf16-capable GPU. ``generation_dtype: bfloat16`` asks for bf16 generation
    with an update in fp32 (nothing to add when the update already runs in bf16)."""
    trained = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    weights = trained
    if dtype == "auto" and use_peft and bf16_capable(device):
        weights = torch.bfloat16  # the frozen base; the adapters stay fp32
    autocast = bf16_capable(device) if bf16_autocast is None else bool(bf16_autocast)
    generation_only = generation_dtype == "bfloat16" and not autocast and weights != torch.bfloat16
    return Precision(weights, autocast, generation_only, trained)


def warn_lost_updates(precision: Precision, learning_rate: float, use_peft: bool) -> None:
    """Warn when trained weights are stored in bf16 (a LoRA base is frozen: nothing is lost)."""
    if precision.weights == torch.bfloat16 and not use_peft:
        warnings.warn(PURE_BF16_WARNING.format(lr=learning_rate), PrecisionWarning, stacklevel=3)


def configure_tf32(enabled: bool | None, device: torch.device) -> None:
    """TF32 tensor-core matmuls and convolutions for fp32 work on CUDA (Ampere and newer): fp32
    range with a 10-bit mantissa, several times faster than full fp32. It touches only the fp32
    matmuls that autocast leaves (or all of them in an fp32 run); the weights stay fp32.
    ``None`` leaves torch's settings as they are (TrainingArguments' tf32=None)."""
    if device.type != "cuda" or enabled is None:
        return
    # "high" is TF32 for fp32 matmuls; the long-standing API, understood by every torch release.
    torch.set_float32_matmul_precision("high" if enabled else "highest")
    torch.backends.cudnn.allow_tf32 = enabled
