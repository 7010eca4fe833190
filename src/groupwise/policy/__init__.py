"""The trained model and its update: :class:`Policy` (:mod:`.policy`: the model with its
network, its frozen reference and its forwards), the update that drives it (:mod:`.update`) over
micro-batches (:mod:`.batches`), the optimizer and its schedule (:mod:`.optimizer`), the weights
in and out (:mod:`.weights`), the losses bound to the run's options (:mod:`.loss`), completion
log-probs (:mod:`.logprobs`), FSDP / DDP wrapping (:mod:`.parallel`) and PPO's critic
(:mod:`.critic`)."""

from .batches import PolicyInputs, UpdateStats
from .loss import GRPOLoss
from .optimizer import Trainable
from .policy import Policy, PolicyOptions
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
