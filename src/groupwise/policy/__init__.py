"""The trained model and its update: :class:`Policy` (:mod:`.policy`: the model, its frozen
reference, its forwards and its weights in and out), the micro-batched update
(:mod:`.update`), the optimizer (:mod:`.optimizer`), the GRPO loss bound to the run's options
(:mod:`.loss`), completion log-probs (:mod:`.logprobs`), batching (:mod:`.batching`), the
reference (:mod:`.reference`), FSDP / DDP wrapping (:mod:`.parallel`) and PPO's critic
(:mod:`.critic`)."""

from .loss import GRPOLoss
from .optimizer import Trainable
from .policy import CheckpointMismatch, Policy
from .update import PolicyInputs, PolicyOptions, PolicyUpdate, UpdateStats

__all__ = [
    "CheckpointMismatch",
    "GRPOLoss",
    "Policy",
    "PolicyInputs",
    "PolicyOptions",
    "PolicyUpdate",
    "Trainable",
    "UpdateStats",
]
