"""DAPO dynamic sampling (Yu et al. 2025, arXiv 2503.14476; verl's ``algorithm.filter_groups``):
groups whose *correctness* has zero variance are dropped and further prompt batches are drawn
until the step holds its normal number of informative groups.

    collection = sampling.start(prompt_weighting)     # the step feeds it draws:
    draw = draw()                         # one prompt batch: plan, generate, score (the step's)
    collection.add(draw)                  # flags = informative_groups(...): 0 < variance
    ... repeat until the global count of informative groups reaches the target (the step's
    normal global batch of prompts) or ``max_num_gen_batches`` batches were drawn ...
    keep the first ``target`` informative groups in draw order (excess trimmed, deterministic)

The filter reads ``Scores.correctness`` (the reward that declares correctness; the total only
when no function does), never the shaped total: a group whose answers are all right (or all
wrong) but whose length penalties differ would otherwise be trained on length alone.

Data parallel: each rank draws its share of every prompt batch, as without dynamic sampling;
the informative flags are gathered, so every rank sees the same global count and loops the same
number of times, and the kept groups are the same as one process drawing the global batches.
The kept groups are then dealt out to the ranks in consecutive, balanced shares (groups generated
on another rank travel pickled), so ranks hold at most one group more than each other. When fewer
informative groups than ranks are found (only when the cap stops the search), the first
zero-variance groups fill up to one group per rank, so every rank has rows to run; they are
trained as plain GRPO trains them (their correctness is uniform, so only a shaped part of the
reward, if any, and the KL term act on them) and logged as ``dynamic/filler_groups``.

Everything here but :class:`DynamicSampling` and its :class:`DrawCollection` is a pure function
of its arguments.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from ..algo.advantages import informative_groups
from ..rewards.scoring import Scores
from ..rollout import Rollout
from ..rollout.base import pick
from ..runtime.distributed import DistributedContext, all_gather_objects
from ..sections import DynamicSamplingOptions
from .base import Draw, Plan, PromptBatch

# ----------------------------------------------------------------------------------------------
# Pure helpers


@dataclass
class Group:
    """One prompt's group, detached from its batch: where it came from (``key`` = (draw, position
    in the global batch)), its dataset index, row, tokenised prompt, plan entry, its completions
    (CPU tensors trimmed to the group's longest completion) and scores."""

    key: tuple[int, int]
    index: int
    row: dict[str, Any]
    prompt_tokens: list[int]
    count: int
    weight: float
    prompt: Tensor  # [Lp] the rollout's prompt ids without padding
    completion_ids: Tensor  # [n, T]
    completion_mask: Tensor
    loss_mask: Tensor
    truncated: Tensor  # [n]
    texts: list[str]
    conversations: list | None  # multi-turn rollouts: messages and environment state per row
    env_states: list | None
    sampling_logprobs: Tensor | None
    rewards: Tensor  # [n]
    per_func: Tensor  # [n, F]
    correctness: Tensor  # [n]
    extra: dict[str, list] = field(default_factory=dict)  # reward functions' log_extra columns

    @property
    def rows(self) -> int:
        return int(self.completion_ids.shape[0])

    @property
    def tokens(self) -> int:
        return int(self.completion_mask.sum())


def split_groups(
    draw: Draw, draw_index: int = 0, positions: Collection[int] | None = None
) -> list[Group]:
    """This rank's groups of ``draw`` (those at the global ``positions`` when given), in order,
    each on its own (CPU tensors)."""
    batch, plan, rollout, scores = draw.batch, draw.plan, draw.rollout, draw.scores
    ids = rollout.group_ids.cpu()
    lengths = rollout.completion_mask.cpu().sum(dim=1)
    first = batch.mine.start
    groups = []
    for j in range(len(batch.rows)):
        p = first + j
        if positions is not None and p not in positions:
            continue
        rows = torch.nonzero(ids == j).flatten()
        width = max(int(lengths[rows].max()), 1)

        def take(t: Tensor, rows: Tensor = rows, width: int = width) -> Tensor:
            return t.detach().cpu()[rows][:, :width]

        keep = rollout.prompt_mask[j].cpu().bool()
        groups.append(
            Group(
                key=(draw_index, p),
                index=batch.indices[p],
                row=batch.rows[j],
                prompt_tokens=list(batch.prompt_ids[j]),
                count=plan.counts[p],
                weight=plan.weights[p],
                prompt=rollout.prompt_ids[j].cpu()[keep],
                completion_ids=take(rollout.completion_ids),
                completion_mask=take(rollout.completion_mask),
                loss_mask=take(rollout.loss_mask),
                truncated=rollout.truncated.cpu()[rows],
                texts=[rollout.texts[i] for i in rows.tolist()],
                conversations=pick(rollout.conversations, rows),
                env_states=pick(rollout.env_states, rows),
                sampling_logprobs=(
                    None if rollout.sampling_logprobs is None else take(rollout.sampling_logprobs)
                ),
                rewards=scores.rewards.cpu()[rows],
                per_func=scores.per_func.cpu()[rows],
                correctness=scores.correctness.cpu()[rows],
                extra={k: [v[i] for i in rows.tolist()] for k, v in scores.extra.items()},
            )
        )
    return groups


def _joined(parts: Sequence[list | None]) -> list | None:
    if any(p is None for p in parts):
        return None
    return [x for p in parts if p is not None for x in p]


def _pad_right(parts: Sequence[Tensor], width: int, value: float) -> Tensor:
    return torch.cat([torch.nn.functional.pad(t, (0, width - t.shape[1]), value=value)
                      for t in parts])  # fmt: skip


def join_groups(
    groups: Sequence[Group],
    indices: list[int],
    mine: slice,
    counts: list[int],
    weights: list[float],
    pad_token_id: int,
    device: torch.device | None = None,
    *,
    prompt_weighting: str,
) -> Draw:
    """The :class:`Draw` of ``groups`` (this rank's, at least one): prompts left-padded and
    completions right-padded with ``pad_token_id``, group ids renumbered 0..len-1, tensors on
    ``device``. ``indices``/``counts``/``weights`` describe the global batch (every rank's
    groups in order) and ``mine`` this rank's consecutive share of it; the row weights follow
    from them (:meth:`Draw.weighed`, with the run's ``prompt_weighting``)."""
    if not groups:
        raise ValueError("join_groups needs at least one group")
    batch = PromptBatch(list(indices), mine, [g.row for g in groups],
                        [list(g.prompt_tokens) for g in groups])  # fmt: skip
    plan = Plan(batch, list(counts), list(weights))
    lp = max(int(g.prompt.numel()) for g in groups)
    prompt_ids = torch.full((len(groups), lp), pad_token_id, dtype=groups[0].prompt.dtype)
    prompt_mask = torch.zeros((len(groups), lp), dtype=torch.long)
    for i, g in enumerate(groups):
        n = int(g.prompt.numel())
        prompt_ids[i, lp - n :] = g.prompt
        prompt_mask[i, lp - n :] = 1
    width = max(int(g.completion_ids.shape[1]) for g in groups)
    logps = [g.sampling_logprobs for g in groups]
    rollout = Rollout(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=_pad_right([g.completion_ids for g in groups], width, pad_token_id),
        completion_mask=_pad_right([g.completion_mask for g in groups], width, 0),
        truncated=torch.cat([g.truncated for g in groups]),
        group_ids=torch.arange(len(groups)).repeat_interleave(
            torch.tensor([g.rows for g in groups])
        ),
        texts=[t for g in groups for t in g.texts],
        sampling_logprobs=None if any(x is None for x in logps) else _pad_right(logps, width, 0),
        loss_mask=_pad_right([g.loss_mask for g in groups], width, 0),
        conversations=_joined([g.conversations for g in groups]),
        env_states=_joined([g.env_states for g in groups]),
    )
    if device is not None:
        for name in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask",
                     "truncated", "group_ids", "sampling_logprobs", "loss_mask"):  # fmt: skip
            value = getattr(rollout, name)
            if value is not None:
                setattr(rollout, name, value.to(device))
    scores = Scores(
        torch.cat([g.rewards for g in groups]),
        torch.cat([g.per_func for g in groups]),
        torch.cat([g.correctness for g in groups]),
        # the columns every group has (draws whose functions logged other columns drop theirs)
        {
            k: [x for g in groups for x in g.extra[k]]
            for k in groups[0].extra
            if all(k in g.extra for g in groups)
        },
    )
    return Draw.weighed(batch, plan, rollout, scores, prompt_weighting)


def select_keys(
    flags: Sequence[Sequence[bool]], target: int, min_groups: int = 1
) -> list[tuple[int, int]]:
    """The groups a step trains on, as (draw, position) keys in draw order: the first ``target``
    informative ones (``flags[k][p]``: group p of draw k is informative), topped up with the
    first zero-variance ones to ``min_groups`` when fewer were found."""
    ordered = [(k, p) for k, row in enumerate(flags) for p in range(len(row))]
    kept = [key for key in ordered if flags[key[0]][key[1]]][:target]
    if len(kept) < min_groups:
        fill = [key for key in ordered if not flags[key[0]][key[1]]]
        kept = sorted(kept + fill[: min_groups - len(kept)])
    return kept


def shares(total: int, parts: int) -> list[slice]:
    """``total`` items dealt into ``parts`` consecutive slices whose sizes differ by at most
    one (the first ``total % parts`` get one more)."""
    base, extra = divmod(total, parts)
    out, start = [], 0
    for r in range(parts):
        size = base + (1 if r < extra else 0)
        out.append(slice(start, start + size))
        start += size
    return out


# ----------------------------------------------------------------------------------------------
# The loop


class DynamicSampling:
    """Draws prompt batches until the step holds ``target`` informative groups (the step's
    global batch of prompts) or ``max_batches`` were drawn (0: no limit, verl's meaning), then
    keeps the first ``target`` of them. ``enabled=False``: one draw, untouched. Its state (the
    cumulative counters) goes into checkpoints."""

    def __init__(
        self,
        enabled: bool,
        target: int,
        max_batches: int,
        tol: float,
        pad_token_id: int,
        dist: DistributedContext | None = None,
    ) -> None:
        self.enabled, self.target, self.max_batches, self.tol = enabled, target, max_batches, tol
        self.pad_token_id = pad_token_id
        self.dist = dist or DistributedContext()
        self.totals = {"gen_batches": 0, "dropped_groups": 0, "dropped_rollouts": 0,
                       "dropped_tokens": 0}  # fmt: skip
        self.logs: dict[str, float] = {}

    @classmethod
    def from_section(
        cls,
        options: DynamicSamplingOptions,
        prompts_per_step: int,
        dist: DistributedContext,
        pad_token_id: int,
    ) -> DynamicSampling:
        """From the run's ``dynamic_sampling`` section; ``prompts_per_step`` per rank (the
        target is the global batch's prompts)."""
        return cls(options.dynamic_sampling, prompts_per_step * dist.world_size,
                   options.max_num_gen_batches, options.dynamic_sampling_std_tol, pad_token_id,
                   dist)  # fmt: skip

    def start(self, prompt_weighting: str) -> DrawCollection:
        """One step's collection of draws (enabled only): the step adds draws until it says
        there are enough informative groups, then takes :meth:`DrawCollection.result`. The kept
        groups' row weights come from their plan entries with the run's ``prompt_weighting``
        (:meth:`Draw.weighed`); ``self.logs`` then holds the step's metrics."""
        return DrawCollection(self, prompt_weighting)

    def _count(
        self, flags: list[list[bool]], sizes: list[list[tuple[int, int]]], kept: list
    ) -> None:
        kept_set = set(kept)
        zero = sum(not f for row in flags for f in row)
        informative = sum(f for row in flags for f in row)
        dropped = [(k, p) for k, row in enumerate(flags) for p in range(len(row))
                   if (k, p) not in kept_set]  # fmt: skip
        rollouts = sum(sizes[k][p][0] for k, p in dropped)
        tokens = sum(sizes[k][p][1] for k, p in dropped)
        step = {"gen_batches": len(flags), "dropped_groups": len(dropped),
                "dropped_rollouts": rollouts, "dropped_tokens": tokens}  # fmt: skip
        for key, value in step.items():
            self.totals[key] += value
        kept_informative = sum(flags[k][p] for k, p in kept)
        self.logs = {
            **{f"dynamic/{k}": float(v) for k, v in step.items()},
            **{f"dynamic/{k}_total": float(v) for k, v in self.totals.items()},
            "dynamic/zero_variance_groups": float(zero),
            "dynamic/trimmed_groups": float(informative - kept_informative),
            "dynamic/kept_groups": float(kept_informative),
            "dynamic/filler_groups": float(len(kept) - kept_informative),
            "dynamic/target_groups": float(self.target),
            "dynamic/capped": float(kept_informative < self.target),
        }

    def state_dict(self) -> dict[str, Any] | None:
        return dict(self.totals) if self.enabled else None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.totals.update({k: int(v) for k, v in state.items()})


class DrawCollection:
    """One step's dynamic sampling, fed by the step (see the module docstring): :meth:`add` each
    new draw until it returns True (enough informative groups, or ``max_batches`` drawn), then
    :meth:`result` is the step's batch. Only the groups that can still be kept are held (on the
    CPU) between draws: the first ``target`` informative ones and the first zero-variance one
    per rank."""

    def __init__(self, sampling: DynamicSampling, prompt_weighting: str) -> None:
        self.sampling, self.prompt_weighting = sampling, prompt_weighting
        self.flags: list[list[bool]] = []  # per draw, per global position
        self.sizes: list[list[tuple[int, int]]] = []  # per draw, per global position: rows, tokens
        self.held: dict[tuple[int, int], Group] = {}  # this rank's groups that may be kept
        self.owners: dict[tuple[int, int], int] = {}  # (draw, position) -> the rank that drew it
        self.entries: dict[tuple[int, int], tuple[int, int, float]] = {}  # index, count, weight
        self.first: Draw | None = None
        self.last: Draw | None = None
        self.informative = self.uniform = 0

    def add(self, d: Draw) -> bool:
        """Take the next draw; True when the step has what it needs (every rank answers the
        same: the flags are gathered)."""
        sampling, world = self.sampling, self.sampling.dist.world_size
        k = len(self.flags)
        self.first, self.last = (d if k == 0 else None), d
        local = informative_groups(d.scores.correctness, d.rollout.group_ids, sampling.tol,
                                   len(d.batch.rows))  # fmt: skip
        ids = d.rollout.group_ids.cpu()
        mask = d.rollout.completion_mask.cpu()
        mine = [(int((ids == j).sum()), int(mask[ids == j].sum()))
                for j in range(len(d.batch.rows))]  # fmt: skip
        parts = all_gather_objects((local.tolist(), mine), sampling.dist)
        self.flags.append([f for part in parts for f in part[0]])
        self.sizes.append([s for part in parts for s in part[1]])
        wanted = set()
        for p, f in enumerate(self.flags[-1]):
            if (self.informative if f else self.uniform) < (sampling.target if f else world):
                wanted.add(p)
                self.owners[k, p] = p // len(d.batch.rows)
                self.entries[k, p] = (d.batch.indices[p], d.plan.counts[p], d.plan.weights[p])
            self.informative, self.uniform = self.informative + f, self.uniform + (not f)
        self.held.update({g.key: g for g in split_groups(d, k, wanted)})
        capped = sampling.max_batches and len(self.flags) >= sampling.max_batches
        return self.informative >= sampling.target or bool(capped)

    def result(self) -> Draw:
        """The step's batch: the first ``target`` informative groups in draw order (fillers up
        to one group per rank), dealt out to the ranks in balanced shares."""
        sampling, held, last = self.sampling, self.held, self.last
        assert last is not None, "no draw was added"
        world, rank = sampling.dist.world_size, sampling.dist.rank
        kept = select_keys(self.flags, sampling.target, min_groups=world)
        sampling._count(self.flags, self.sizes, kept)
        if self.first is not None and len(kept) == len(self.flags[0]):  # the first, as drawn
            return self.first
        share = [kept[s] for s in shares(len(kept), world)]
        if any(self.owners[key] != r for r in range(world) for key in share[r]):
            send = {key: g for key, g in held.items()
                    if any(key in share[r] for r in range(world) if r != rank)}  # fmt: skip
            for part in all_gather_objects(send, sampling.dist):
                held.update(part)
        indices, counts, weights = ([self.entries[key][i] for key in kept] for i in range(3))
        start = sum(len(share[r]) for r in range(rank))
        return join_groups([held[key] for key in share[rank]], indices,
                           slice(start, start + len(share[rank])), counts, weights,
                           sampling.pad_token_id, last.rollout.completion_ids.device,
                           prompt_weighting=self.prompt_weighting)  # fmt: skip
