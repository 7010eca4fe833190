"""Prompts -> the step's batch: which dataset rows a step trains on, on every rank.

:class:`PromptSampler` draws indices without replacement within an epoch (reshuffled every
epoch, checkpointed); :class:`PromptBatches` turns them into a :class:`PromptBatch`: every rank
draws the same global batch and keeps its own consecutive share, tokenised.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .curriculum.base import Curriculum, PromptBatch
from .data import tokenize_prompts
from .distributed import DistributedContext


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
    longer than ``max_prompt_length`` keep their last tokens)."""

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
    ) -> None:
        self.dataset, self.tokenizer, self.dist = dataset, tokenizer, dist
        self.render = render  # prompt -> text (None: the chat template; tools: shown to the model)
        self.prompts_per_rank, self.max_prompt_length = prompts_per_rank, max_prompt_length
        self.sampler = PromptSampler(len(dataset), seed, shuffle)

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
        prompt_ids = tokenize_prompts(
            [r["prompt"] for r in rows], self.tokenizer, self.max_prompt_length, self.render
        )
        return PromptBatch(indices, mine, rows, prompt_ids, skipped)

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)
