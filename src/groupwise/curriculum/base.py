"""The curriculum seam: what a curriculum sees before a step (:class:`PromptBatch`), what it decides
(:class:`Plan`: rollouts and weight per prompt) and what it learns from after the update
(:class:`Outcome`).

Every rank plans the *global* batch from the same state and keeps its own share; after the
update, :class:`GlobalBatchCurriculum` gathers every rank's rows so each rank observes the same
global outcome in the same order. The state therefore stays identical on every rank, and equal to
one process's on that batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..advantages import equal_prompt_factors
from ..distributed import DistributedContext, concat_over_ranks
from ..rollout import Rollout
from .options import CurriculumOptions


@dataclass
class PromptBatch:
    """One step's prompts: ``indices`` (dataset rows) of the global batch, in the same order on
    every rank; ``mine`` is this rank's consecutive share, whose ``rows`` and tokenised
    ``prompt_ids`` this rank rolls out; ``skipped``: dataset rows drawn as candidates that the
    curriculum chose not to roll out (:meth:`Curriculum.choose`)."""

    indices: list[int]
    mine: slice
    rows: list[dict[str, Any]]
    prompt_ids: list[list[int]]
    skipped: list[int] = field(default_factory=list)


@dataclass
class Plan:
    """A curriculum's decision for one global batch: ``counts[i]`` rollouts and weight
    ``weights[i]`` (multiplying its rollouts' policy term) for prompt ``batch.indices[i]``;
    ``bins`` are the difficulty bins the decision used (None when the curriculum has none)."""

    batch: PromptBatch
    counts: list[int]
    weights: list[float]
    bins: list[int] | None = None

    @property
    def local_counts(self) -> list[int]:
        """Rollouts per prompt of this rank's share."""
        return self.counts[self.batch.mine]

    def row_weights(
        self, rollout: Rollout, prompt_weighting: str = "rollouts"
    ) -> torch.Tensor | None:
        """Per row of this rank's rollout, its prompt's weight; None when every weight is 1.
        ``prompt_weighting="equal"`` multiplies it by GDRO eq. 17's ``mean(n) / n_x`` (the
        global batch's counts, :func:`groupwise.advantages.equal_prompt_factors`), so a prompt
        weighs the same whatever its number of rollouts."""
        mine = self.weights[self.batch.mine]
        if prompt_weighting == "equal":
            factors = equal_prompt_factors(self.counts)[self.batch.mine]
            mine = [w * f for w, f in zip(mine, factors, strict=True)]
        if all(w == 1.0 for w in mine):
            return None
        return torch.as_tensor(mine, dtype=torch.float32)[rollout.group_ids.cpu()]


@dataclass
class Outcome:
    """What one step produced on this rank: per row, the correctness score (the reward that
    declares correctness, NaN when not applicable), the total reward and the policy term the
    loss variant assigned (:func:`groupwise.grpo_loss.sequence_surrogate`); ``skipped`` when
    the update was not applied (a NaN/inf step), which a curriculum does not learn from."""

    rollout: Rollout
    correctness: torch.Tensor
    rewards: torch.Tensor
    sequence_loss: torch.Tensor
    skipped: bool = False


@dataclass
class GlobalRows:
    """Every rank's rows of one step, in rank order: per row, the index of its prompt in the
    global batch, its correctness score, its policy term and its reward."""

    prompt: list[int]
    correctness: list[float]
    loss: list[float]
    reward: list[float]


class Curriculum:
    """The protocol: :meth:`plan` before generation, :meth:`observe` after the update (returns
    metrics to log), and ``state_dict``/``load_state_dict`` for checkpoints (``None`` when the
    curriculum has no state). A class names the typed options its ``from_options`` takes in
    ``options_type`` (:mod:`.options`); without one it is given them as a mapping."""

    options_type: type[CurriculumOptions] | None = None

    def plan(self, batch: PromptBatch) -> Plan:
        raise NotImplementedError

    def observe(self, plan: Plan, outcome: Outcome) -> dict[str, float]:
        raise NotImplementedError

    def candidates(self, count: int) -> int:
        """How many prompts the sampler draws for a global batch of ``count``: more than
        ``count`` when the curriculum picks the batch among them (:meth:`choose`)."""
        return count

    def choose(self, indices: list[int], rows: list[dict[str, Any]], count: int) -> list[int]:
        """Positions in ``indices`` (the drawn dataset rows, with their ``rows``; the same on
        every rank) of the ``count`` prompts to roll out, before :meth:`plan`. The others are
        skipped for this epoch. Called only when :meth:`candidates` asked for more."""
        return list(range(count))

    def state_dict(self) -> dict | None:
        return None

    def load_state_dict(self, state: dict) -> None:
        return None


class NoCurriculum(Curriculum):
    """Plain GRPO: ``num_generations`` rollouts for every prompt, weight 1, nothing learned."""

    options_type = CurriculumOptions

    def __init__(self, num_generations: int) -> None:
        self.num_generations = num_generations

    @classmethod
    def from_options(
        cls, options: CurriculumOptions, dist: DistributedContext | None = None
    ) -> NoCurriculum:
        return cls(options.num_generations)

    def plan(self, batch: PromptBatch) -> Plan:
        n = len(batch.indices)
        return Plan(batch, [self.num_generations] * n, [1.0] * n)

    def observe(self, plan: Plan, outcome: Outcome) -> dict[str, float]:
        return {}


class GlobalBatchCurriculum(Curriculum):
    """A curriculum that learns from the global batch: :meth:`observe` gathers every rank's rows
    (prompt index within the global batch, correctness, policy term, reward) in rank order and
    hands them to :meth:`observe_global`."""

    def __init__(self, dist: DistributedContext | None = None) -> None:
        self.dist = dist or DistributedContext()

    def observe(self, plan: Plan, outcome: Outcome) -> dict[str, float]:
        if outcome.skipped:
            return {}
        first_prompt = plan.batch.mine.start
        columns = (
            (outcome.rollout.group_ids.cpu() + first_prompt).tolist(),
            outcome.correctness.tolist(),
            outcome.sequence_loss.cpu().tolist(),
            outcome.rewards.tolist(),
        )
        return self.observe_global(plan, GlobalRows(*concat_over_ranks(columns, self.dist)))

    def observe_global(self, plan: Plan, rows: GlobalRows) -> dict[str, float]:
        raise NotImplementedError
