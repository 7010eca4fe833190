"""Sequential top-up within a step (``select_top_up``, with ``curriculum: select``; Reinforce-Ada's
adaptive sampling): roll out a few completions per prompt first, then spend the rest of the
step's planned rollouts on the groups that are still uninformative.

    budget = sum(plan.counts)                              # the selector's plan, unchanged
    round 1: min(n_i, first) rollouts per prompt           # first = select_top_up_first
    then, round after round (:func:`next_round`): each group whose correctness is still uniform
        (all-correct or all-wrong, population std <= 1e-6 over *all* its rows so far) gets up
        to ``first`` more, never beyond ``n_max`` (rollout_max), dealt one at a time in group
        order while the unspent budget lasts
    stop when the budget is spent, no group is uniform, or every uniform group is at n_max
        (budget left then is not spent: ``curriculum/select/top_up_unspent``)

The step trains on every round's rollouts, joined per group (:func:`merge_groups`): advantages
use the whole group, so the baseline is the mean over all rounds, and the plan's counts (and the
selector's ``num_generations / n_i`` weights) become the realised group sizes before the prompt
weighting and the selector's posterior update see them. Every round is scored once, as it is
generated; the rounds need no random numbers of their own (the engine's generator, already
checkpointed, draws the completions), so a resumed run takes the same rounds.

One process only: :class:`TopUp` is refused under data parallel (each rank would have to take
the same rounds on the global view, and an FSDP generation is a collective every rank joins).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..algo.advantages import informative_groups
from ..errors import ConfigError
from ..rewards.scoring import Scores
from ..rollout import Rollout
from ..runtime.distributed import DistributedContext
from ..sections import CurriculumSection
from .base import Plan, PromptBatch
from .dynamic import Draw, Group, _joined, _pad_right, join_groups, split_groups

STOPS = ("budget", "informative", "max")


def first_round(counts: Sequence[int], first: int) -> list[int]:
    """Round 1: min(n_i, first) rollouts per prompt."""
    return [min(int(n), first) for n in counts]


def next_round(
    uniform: Sequence[bool], sizes: Sequence[int], left: int, step: int, n_max: int
) -> tuple[list[int], str | None]:
    """The next round's extra rollouts per group and, when there is no next round, why:
    ``"budget"`` (``left`` <= 0), ``"informative"`` (no group is uniform) or ``"max"`` (every
    uniform group is at ``n_max``). A uniform group may take up to min(step, n_max - size);
    the ``left`` rollouts are dealt one at a time to those groups in order, round-robin, so a
    short budget is spread over the groups rather than spent on the first."""
    zeros = [0] * len(sizes)
    if left <= 0:
        return zeros, "budget"
    if not any(uniform):
        return zeros, "informative"
    room = [min(step, n_max - s) if u else 0 for u, s in zip(uniform, sizes, strict=True)]
    if not any(r > 0 for r in room):
        return zeros, "max"
    extra = list(zeros)
    while left > 0 and any(e < r for e, r in zip(extra, room, strict=True)):
        for i, r in enumerate(room):
            if left > 0 and extra[i] < r:
                extra[i] += 1
                left -= 1
    return extra, None


def merge_groups(a: Group, b: Group, pad_token_id: int) -> Group:
    """Group ``a`` with ``b``'s rows (the same prompt, a later round) appended."""
    width = max(int(a.completion_ids.shape[1]), int(b.completion_ids.shape[1]))

    def cat(x: Any, y: Any, value: float) -> Any:
        return None if x is None or y is None else _pad_right([x, y], width, value)

    return dataclasses.replace(
        a,
        completion_ids=cat(a.completion_ids, b.completion_ids, pad_token_id),
        completion_mask=cat(a.completion_mask, b.completion_mask, 0),
        loss_mask=cat(a.loss_mask, b.loss_mask, 0),
        sampling_logprobs=cat(a.sampling_logprobs, b.sampling_logprobs, 0),
        truncated=torch.cat([a.truncated, b.truncated]),
        texts=a.texts + b.texts,
        conversations=_joined([a.conversations, b.conversations]),
        env_states=_joined([a.env_states, b.env_states]),
        rewards=torch.cat([a.rewards, b.rewards]),
        per_func=torch.cat([a.per_func, b.per_func]),
        correctness=torch.cat([a.correctness, b.correctness]),
    )


class TopUp:
    """The rounds of one step (see the module docstring); ``logs`` holds the last step's
    ``curriculum/select/top_up_*`` metrics. No state: the rounds follow from the scores."""

    def __init__(self, enabled: bool, first: int, n_max: int, pad_token_id: int,
                 tol: float = 1e-6) -> None:  # fmt: skip
        self.enabled, self.first, self.n_max, self.tol = enabled, first, n_max, tol
        self.pad_token_id = pad_token_id
        self.logs: dict[str, float] = {}
        self.stop: str | None = None  # why the last step's rounds ended (STOPS)

    @classmethod
    def from_section(
        cls, args: CurriculumSection, dist: DistributedContext, pad_token_id: int
    ) -> TopUp:
        """From the run's ``curriculum`` section (``select_top_up``, ``select_top_up_first``,
        ``rollout_max``); refused when the run has more than one process."""
        world_size = dist.world_size
        if args.select_top_up and world_size > 1:
            raise ConfigError(
                "select_top_up runs in one process only (data parallel would need every rank to "
                f"take the same rounds), got world_size={world_size}; set select_top_up: false"
            )
        return cls(args.select_top_up, args.select_top_up_first, args.rollout_max, pad_token_id)

    def uniform(self, group: Group) -> bool:
        ids = torch.zeros(group.rows, dtype=torch.long)
        return not bool(informative_groups(group.correctness, ids, self.tol, 1)[0])

    def start(
        self, batch: PromptBatch, plan: Plan,
        weigh: Callable[[list[int]], list[float]] | None = None, *, prompt_weighting: str,
    ) -> TopUpRounds:  # fmt: skip
        """One step's rounds over ``batch`` with ``plan``'s budget. The step generates and
        scores each :attr:`TopUpRounds.request`, hands the result to :meth:`TopUpRounds.add`
        until no request is left, then takes :meth:`TopUpRounds.result`."""
        return TopUpRounds(self, batch, plan, weigh, prompt_weighting)


# A round's generation: the prompt ids, the rollouts per prompt and the prompts' rows.
Request = tuple[list[list[int]], list[int], list[dict[str, Any]]]


class TopUpRounds:
    """One step's rounds, fed by the step: :attr:`request` is the next round to generate (None
    when the rounds are over), :meth:`add` takes its rollout and scores, :meth:`result` is the
    step's draw: every round's rollouts joined per group, with the plan's counts (and weights,
    by ``weigh(counts)`` when given) set to the realised group sizes, and the row weights that
    follow with the run's ``prompt_weighting`` (:meth:`Draw.weighed`)."""

    def __init__(
        self, top_up: TopUp, batch: PromptBatch, plan: Plan,
        weigh: Callable[[list[int]], list[float]] | None, prompt_weighting: str,
    ) -> None:  # fmt: skip
        self.top_up, self.batch, self.plan = top_up, batch, plan
        self.weigh, self.prompt_weighting = weigh, prompt_weighting
        self.sizes = first_round(plan.counts, top_up.first)
        self.left = sum(plan.counts) - sum(self.sizes)
        self.groups: list[Group] = []
        self.uniform: list[bool] = []
        self.before = self.rounds = 0
        self.device: torch.device | None = None
        self.positions: list[int] = []  # the groups the pending round tops up
        self.extra: list[int] = []
        self.request: Request | None = (batch.prompt_ids, list(self.sizes), batch.rows)

    def add(self, rollout: Rollout, scores: Scores) -> Request | None:
        """The rollout and scores of :attr:`request`; returns the next request (None: done)."""
        top_up, batch = self.top_up, self.batch
        if not self.groups:  # round 1: every prompt
            self.device = rollout.completion_ids.device
            first = Plan(batch, self.sizes, [1.0] * len(self.sizes))
            self.groups = split_groups(Draw(batch, first, rollout, scores, None))
            self.uniform = [top_up.uniform(g) for g in self.groups]
            self.before = len(self.groups) - sum(self.uniform)
        else:
            sub, counts = self._sub_batch()
            parts = split_groups(Draw(sub, Plan(sub, counts, [1.0] * len(counts)), rollout,
                                      scores, None))  # fmt: skip
            for j, g in zip(self.positions, parts, strict=True):
                self.groups[j] = merge_groups(self.groups[j], g, top_up.pad_token_id)
                self.sizes[j] += self.extra[j]
                self.uniform[j] = top_up.uniform(self.groups[j])
            self.left -= sum(self.extra)
        extra, stop = next_round(self.uniform, self.sizes, self.left, top_up.first, top_up.n_max)
        if stop is not None:
            top_up.stop, self.request = stop, None
            return None
        self.rounds += 1
        self.extra, self.positions = extra, [j for j, e in enumerate(extra) if e > 0]
        sub, counts = self._sub_batch()
        self.request = (sub.prompt_ids, counts, sub.rows)
        return self.request

    def _sub_batch(self) -> tuple[PromptBatch, list[int]]:
        """The prompts the pending round tops up, and how many rollouts each gets."""
        batch, pos = self.batch, self.positions
        sub = PromptBatch(
            [batch.indices[j] for j in pos],
            slice(0, len(pos)),
            [batch.rows[j] for j in pos],
            [batch.prompt_ids[j] for j in pos],
        )
        return sub, [self.extra[j] for j in pos]

    def result(self) -> Draw:
        top_up, batch, plan, sizes = self.top_up, self.batch, self.plan, self.sizes
        assert self.request is None, "the rounds are not over"
        first = sum(first_round(plan.counts, top_up.first))
        weights = self.weigh(sizes) if self.weigh is not None else list(plan.weights)
        joined = join_groups(self.groups, batch.indices, batch.mine, sizes, weights,
                             top_up.pad_token_id, self.device,
                             prompt_weighting=self.prompt_weighting)  # fmt: skip
        top_up.logs = {
            "curriculum/select/top_up_rounds": float(self.rounds),
            "curriculum/select/top_up_rollouts": float(sum(sizes) - first),
            "curriculum/select/top_up_unspent": float(self.left),
            "curriculum/select/informative_before_top_up": float(self.before),
            "curriculum/select/informative_after_top_up": float(
                len(self.groups) - sum(self.uniform)
            ),
        }
        # The joined draw's row weights are those of this plan: same counts, weights and share.
        return Draw(batch, Plan(batch, sizes, weights, plan.bins), joined.rollout, joined.scores,
                    joined.row_weights)  # fmt: skip
