"""The trainers and what runs around a step: one :class:`Trainer` (:mod:`.base`) with TRL's
constructor and names over a run record (:mod:`groupwise.wiring.run`), and its two algorithms,
:class:`GRPOTrainer` (:mod:`.grpo`, whose ``grpo_step`` is one GRPO step) and
:class:`PPOTrainer` (:mod:`.ppo`, ``ppo_step``); the trainer's services: the loop
(:mod:`.loop`), a step's metrics (:mod:`.metrics`), the run's files (:mod:`.records`),
checkpoints (:mod:`.checkpoints`), evaluation (:mod:`.evaluate`), failure warnings
(:mod:`.monitor`), loggers and the console, TRL's constructor forms and callbacks
(:mod:`.trl_api`) and transformers' post-training helpers (:mod:`.hf_api`)."""

from .base import Trainer
from .grpo import GRPOTrainer
from .ppo import PPOTrainer

__all__ = ["GRPOTrainer", "PPOTrainer", "Trainer"]
