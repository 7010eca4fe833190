"""The trainers and what runs around a step: :class:`GRPOTrainer` (:mod:`.grpo`, whose
``train_step`` is one GRPO step) and :class:`PPOTrainer` (:mod:`.ppo`) on the shared
:class:`Trainer` (:mod:`.base`), with its services: the loop (:mod:`.loop`), a step's metrics
(:mod:`.metrics`), the run's files (:mod:`.records`), checkpoints (:mod:`.checkpoints`),
evaluation (:mod:`.evaluate`), failure warnings (:mod:`.monitor`), loggers and the console, and
the TRL / transformers surface (:mod:`.trl_api`)."""

from .base import Trainer
from .grpo import GRPOTrainer
from .ppo import PPOTrainer

__all__ = ["GRPOTrainer", "PPOTrainer", "Trainer"]
