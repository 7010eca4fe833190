"""The trained model and its update: :class:`Policy` (:mod:`.policy`: the model with its
network and optimizer, its frozen reference and its forwards), the micro-batched update and its
batching (:mod:`.update`), the weights in and out (:mod:`.weights`), the GRPO loss bound to the
run's options (:mod:`.loss`), completion log-probs (:mod:`.logprobs`), FSDP / DDP wrapping
(:mod:`.parallel`) and PPO's critic (:mod:`.critic`)."""

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
