"""The trained model and its update: :class:`Policy` (:mod:`.policy`: the model, its frozen
reference, its forwards and its weights in and out), the micro-batched update
and its batching (:mod:`.update`), the optimizer (:mod:`.optimizer`), the GRPO loss bound to the run's options
(:mod:`.loss`), completion log-probs (:mod:`.logprobs`), the
reference (:mod:`.reference`), FSDP / DDP wrapping (:mod:`.parallel`) and PPO's critic
(:mod:`.critic`)."""

from .loss import GRPOLoss
from .policy import Policy, Trainable
from .update import PolicyInputs, PolicyOptions, UpdateStats
from .weights import CheckpointMismatch

__all__ = [
    "CheckpointMismatch",
    "GRPOLoss",
    "Policy",
    "PolicyInputs",
    "PolicyOptions",
    "Trainable",
    "UpdateStats",
]
