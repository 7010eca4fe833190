"""The curriculum seam: what a curriculum sees before a step (:class:`PromptBatch`), what it
decides (:class:`Plan`: rollouts and weight per prompt), the batch a step trains on
(:class:`Draw`: the plan's rollout, scores and row weights) and what it learns from after the
update (:class:`Outcome`); and the uniform draw of each step's prompts that it chooses from
(:class:`PromptBatches`: the same global batch on every rank, this rank's share tokenised).

Every rank plans the *global* batch from the same state and keeps its own share; after the
update, :class:`GlobalBatchCurriculum` gathers every rank's rows so each rank observes the same
global outcome in the same order. The state therefore stays identical on every rank, and equal to
one process's on that batch.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from ..algo.advantages import equal_prompt_factors
from ..data.prompts import tokenize_prompts
from ..rewards.scoring import Scores
from ..rollout import Rollout
from ..runtime.distributed import DistributedContext, concat_over_ranks
from ..sections.curriculum import CurriculumOptions


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

    def local_weights(self, prompt_weighting: str) -> torch.Tensor | None:
        """Per prompt of this rank's share, the weight of its rows; None when every weight is 1.
        ``prompt_weighting="equal"`` multiplies the plan's weight by GDRO eq. 17's
        ``mean(n) / n_x`` (the global batch's counts,
        :func:`groupwise.algo.advantages.equal_prompt_factors`), so a prompt weighs the same
        whatever its number of rollouts. Known with the plan, before any rollout: row i of a
        rollout takes entry ``group_ids[i]``."""
        mine = self.weights[self.batch.mine]
        if prompt_weighting == "equal":
            factors = equal_prompt_factors(self.counts)[self.batch.mine]
            mine = [w * f for w, f in zip(mine, factors, strict=True)]
        if all(w == 1.0 for w in mine):
            return None
        return torch.as_tensor(mine, dtype=torch.float32)

    def row_weights(
        self, rollout: Rollout, prompt_weighting: str = "rollouts"
    ) -> torch.Tensor | None:
        """Per row of this rank's rollout, its prompt's weight (:meth:`local_weights`); None
        when every weight is 1."""
        weights = self.local_weights(prompt_weighting)
        return None if weights is None else weights[rollout.group_ids.cpu()]


class Draw(NamedTuple):
    """One prompt batch as a step uses it: the prompts (this rank's share), the plan, the
    rollout, its scores and, per row of the rollout, its prompt's weight in the loss
    (``row_weights``; None when every weight is 1: :meth:`Plan.local_weights` of the plan,
    indexed by the rollout's ``group_ids``). The draw's maker weighs it, so the step reads the
    weights with the rows they belong to."""

    batch: PromptBatch
    plan: Plan
    rollout: Rollout
    scores: Scores
    row_weights: torch.Tensor | None

    @classmethod
    def weighed(
        cls,
        batch: PromptBatch,
        plan: Plan,
        rollout: Rollout,
        scores: Scores,
        prompt_weighting: str,
    ) -> Draw:
        """The draw with each row's weight from ``plan`` (:meth:`Plan.row_weights`: the plan's
        weight of its prompt, times GDRO eq. 17's ``mean(n) / n_x`` with
        ``prompt_weighting="equal"``)."""
        return cls(batch, plan, rollout, scores, plan.row_weights(rollout, prompt_weighting))


@dataclass
class Outcome:
    """What one step produced on this rank: per row, the correctness score (the reward that
    declares correctness, NaN when not applicable), the total reward and the policy term the
    loss variant assigned (:func:`groupwise.algo.grpo.sequence_surrogate`); ``skipped`` when
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
    ``options_type`` (:mod:`groupwise.sections.curriculum`); without one it is given them as a
    mapping."""

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


class PromptSampler:
    """Draws prompt indices without replacement within an epoch, reshuffling every epoch.

    A draw that crosses an epoch boundary holds no index twice (while it asks for at most
    ``size``): the new epoch's order is reshuffled, then the indices this draw already holds are
    moved, in their shuffled order, behind the others (:func:`defer`), so every epoch still
    visits every index exactly once."""

    def __init__(self, size: int, seed: int, shuffle: bool = True) -> None:
        if size < 1:
            raise ValueError("the training dataset is empty")
        self.size, self.shuffle = size, shuffle
        self.generator = torch.Generator().manual_seed(seed)
        self.order: list[int] = []
        self.epoch = 0

    def take(self, count: int) -> list[int]:
        batch: list[int] = []
        while len(batch) < count:
            if not self.order:
                order = (
                    torch.randperm(self.size, generator=self.generator).tolist()
                    if self.shuffle
                    else list(range(self.size))  # TRL's shuffle_dataset=False: dataset order
                )
                self.order = defer(order, batch)
                self.epoch += 1
            batch.append(self.order.pop(0))
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {
            "generator": self.generator.get_state(),
            "order": list(self.order),
            "epoch": self.epoch,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
        self.order = list(state["order"])
        self.epoch = int(state["epoch"])


def defer(order: Sequence[int], held: Sequence[int]) -> list[int]:
    """``order`` with the indices in ``held`` moved behind the others, each part keeping its
    order: a draw that continues into this order takes no index it already holds until it has
    taken every other one."""
    hold = set(held)
    return [i for i in order if i not in hold] + [i for i in order if i in hold]


class PromptBatches:
    """The step's global batch of ``prompts_per_step`` prompts per rank: every rank draws the
    global batch in the same order and keeps its own consecutive prompts, tokenised (prompts
    longer than ``max_prompt_length`` keep their last tokens, and ``cut_warning``, when given,
    is issued at the first such prompt)."""

    def __init__(
        self,
        dataset: Sequence[dict[str, Any]],
        tokenizer: Any,
        prompts_per_rank: int,
        max_prompt_length: int,
        seed: int,
        dist: DistributedContext,
        render: Callable[[Any], str] | None = None,
        shuffle: bool = True,
        cut_warning: Warning | None = None,
    ) -> None:
        self.dataset, self.tokenizer, self.dist = dataset, tokenizer, dist
        self.render = render  # prompt -> text (None: the chat template; tools: shown to the model)
        self.prompts_per_rank, self.max_prompt_length = prompts_per_rank, max_prompt_length
        self.sampler = PromptSampler(len(dataset), seed, shuffle)
        self.cut_warning = cut_warning  # said once, at the first prompt cut

    def next(self, curriculum: Curriculum | None = None) -> PromptBatch:
        """The step's batch; a ``curriculum`` that asks for more candidates than the batch holds
        (:meth:`~groupwise.curriculum.base.Curriculum.candidates`) chooses among them."""
        share = self.prompts_per_rank
        count = share * self.dist.world_size
        drawn = curriculum.candidates(count) if curriculum is not None else count
        # Candidates beyond the dataset's size would repeat prompts within the draw.
        drawn = max(count, min(drawn, len(self.dataset)))
        indices, skipped = self.sampler.take(drawn), []
        if drawn > count:
            assert curriculum is not None
            picked = curriculum.choose(indices, [self.dataset[i] for i in indices], count)
            if len(picked) != count or len(set(picked)) != count:
                raise ValueError(f"the curriculum chose {picked}, not {count} distinct prompts")
            chosen = set(picked)
            skipped = [i for k, i in enumerate(indices) if k not in chosen]
            indices = [indices[k] for k in sorted(picked)]
        mine = slice(self.dist.rank * share, (self.dist.rank + 1) * share)
        rows = [self.dataset[i] for i in indices[mine]]
        full = tokenize_prompts([r["prompt"] for r in rows], self.tokenizer, None, self.render)
        limit = self.max_prompt_length
        if limit is not None and any(len(ids) > limit for ids in full):
            if self.cut_warning is not None:
                warnings.warn(self.cut_warning, stacklevel=2)
                self.cut_warning = None
            full = [ids[-limit:] for ids in full]  # the last tokens, as tokenize_prompts keeps
        return PromptBatch(indices, mine, rows, full, skipped)

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)
