"""A run as one record: :class:`Run`, everything a training step and the trainer around it
read, built once from the options by :func:`groupwise.wiring.assemble.assemble_run`.

The record is frozen: a part is never patched after construction; a trainer that swaps one (a
test wrapping the engine, say) holds a new record with that part replaced. What only one
algorithm has sits in its own record, :attr:`Run.algorithm`: :class:`GRPOParts` (the loss,
dynamic sampling, top-up) or :class:`PPOParts` (its options and the critic).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..curriculum import Curriculum
from ..curriculum.base import PromptBatches
from ..curriculum.dynamic import DynamicSampling
from ..curriculum.topup import TopUp
from ..policy.critic import Critic
from ..policy.loss import GRPOLoss
from ..policy.policy import Policy
from ..rewards.scoring import RolloutScorer
from ..rollout import RolloutEngine
from ..runtime.distributed import DistributedContext
from ..runtime.precision import Precision
from ..sections import PPOOptions, Sections
from .rollout import Interaction


@dataclass(frozen=True)
class GRPOParts:
    """GRPO's own parts: the loss of a micro-batch, DAPO's dynamic sampling and Reinforce-Ada's
    top-up rounds (both off unless configured)."""

    loss: GRPOLoss
    dynamic: DynamicSampling
    top_up: TopUp

    def components(self) -> dict[str, Any]:
        """The parts a checkpoint holds, by name (``state_dict``/``load_state_dict``)."""
        parts: dict[str, Any] = {"dynamic_sampling": self.dynamic}
        if hasattr(self.loss, "state_dict"):  # any callable may stand in for GRPOLoss
            parts["loss"] = self.loss
        return parts

    def state_dict(self) -> dict[str, Any]:
        """Nothing beyond :meth:`components` (the checkpoint's ``extra`` entry is PPO's)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None


@dataclass(frozen=True)
class PPOParts:
    """PPO's own parts: its options (the ``ppo`` section) and the critic, a value model trained
    by its own AdamW beside the policy."""

    options: PPOOptions
    critic: Critic

    def components(self) -> dict[str, Any]:
        """None beyond the critic's state (:meth:`state_dict`)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """The critic's weights, optimizer and schedule (the checkpoint's ``extra`` entry)."""
        network = self.critic.network
        return {
            "critic": self.critic.module.state_dict(),
            "critic_optimizer": network.optimizer.state_dict(),
            "critic_scheduler": network.scheduler.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (a checkpoint without the schedule keeps
        the fresh one)."""
        network = self.critic.network
        self.critic.module.load_state_dict(state["critic"])
        network.optimizer.load_state_dict(state["critic_optimizer"])
        if "critic_scheduler" in state:
            network.scheduler.load_state_dict(state["critic_scheduler"])


Parts = TypeVar("Parts", GRPOParts, PPOParts)


@dataclass(frozen=True)
class Run(Generic[Parts]):
    """One run's parts: the options by section, the processes and device, the numerics, the
    tokenizer, the trained ``policy`` (model, optimizer, reference), the reward functions
    (``scorer``), the ``engine`` that samples from the policy with ``generator``, the prompt
    batches, the curriculum, the tools or environments of a multi-turn run (``interaction``,
    None without) and the algorithm's own parts."""

    options: Sections
    dist: DistributedContext
    device: torch.device
    precision: Precision
    tokenizer: PreTrainedTokenizerBase
    policy: Policy
    scorer: RolloutScorer
    generator: torch.Generator
    engine: RolloutEngine
    prompts: PromptBatches
    curriculum: Curriculum
    interaction: Interaction | None
    algorithm: Parts

    @property
    def model(self) -> PreTrainedModel:
        """The trained model (the policy's)."""
        return self.policy.model

    def components(self) -> dict[str, Any]:
        """The stateful parts a checkpoint holds, by name (``state_dict``/``load_state_dict``):
        the prompt sampler, the curriculum and the algorithm's own."""
        return {"sampler": self.prompts, "curriculum": self.curriculum,
                **self.algorithm.components()}  # fmt: skip
