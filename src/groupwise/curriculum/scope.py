"""When a GDRO curriculum cannot act: the start-time warnings (docs/curriculum.md, "When each
curriculum acts").

Both GDRO curricula decide from history: a prompt's bin (and, for Rollout-GDRO, its variance)
comes from its own earlier outcomes. A prompt planned before it was ever observed sits in the
unseen group (``gdro_unseen: unseen``; bin 0 with ``hardest``), so when almost every prompt is
planned once, every prompt of every step shares one group: Prompt-GDRO gives them one weight and
Rollout-GDRO one variance, hence the same group size, and the run is uniform GRPO by
construction. ``gdro_unseen: difficulty`` bins an unseen prompt by its level's pooled success
rate, which is learned from other prompts of the level, so it acts from the first revisit of a
*level*, not of a prompt.

Prompt-GDRO's paper signal (``gdro_signal: pg_loss``) is the per-sequence policy term with
unweighted advantages (GDRO eqs. 5-6). With one optimizer step per generation and one pass
(``num_iterations: 1``) the ratio is exactly 1 (pi_old is the policy itself), so for the
clipped surrogate the signal is -A_i, whose mean over a group, hence over a bin, is 0: every
bin keeps score 0 and weight 1 (docs/algorithms.md 1.1). Whether a loss variant's on-policy
signal is centred this way is probed on the variant itself (:func:`pg_loss_is_centred`), so a
newly registered variant is judged by its own ``token_loss``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from ..algo.grpo import sequence_surrogate
from ..sections import Sections
from ..sections.training import LossOptions
from .bins import level_key

GDRO_CURRICULA = ("prompt_gdro", "rollout_gdro")
# A prompt informs its own plan from its second appearance on; with fewer than this many
# revisits on average (appearances - 1) most of a run's plans see no history of their prompt.
MIN_REVISITS = 2.0


class CurriculumWarning(UserWarning):
    """A curriculum that, with this run's sizes and options, is uniform GRPO."""


def planned_per_prompt(
    pool_size: int, batches: int, prompts_per_step: int, world_size: int = 1
) -> float:
    """How many times each prompt of the pool is planned on average: ``batches`` generation
    batches of ``prompts_per_step`` prompts on each of ``world_size`` ranks over ``pool_size``
    prompts (more with dynamic sampling, which draws extra batches)."""
    return batches * prompts_per_step * world_size / max(1, pool_size)


def difficulty_levels(rows: Sequence[Any], enough: int = 2) -> int:
    """Distinct ``difficulty`` values among ``rows`` (None / NaN not counted), counting up to
    ``enough``: the level prior can separate prompts once there are two. A columnar dataset
    (``column_names``) is read by column."""
    names = getattr(rows, "column_names", None)
    if names is not None:
        if "difficulty" not in names:
            return 0
        values = rows["difficulty"]
    else:
        values = (row.get("difficulty") if hasattr(row, "get") else None for row in rows)
    seen: set[str] = set()
    for value in values:
        key = level_key(value)
        if key is not None:
            seen.add(key)
            if len(seen) >= enough:
                break
    return len(seen)


def pg_loss_is_centred(loss: LossOptions) -> bool:
    """Whether the loss variant's on-policy ``pg_loss`` signal has mean 0 over every group of
    group-centred advantages: the signal of :func:`sequence_surrogate` with pi_old = pi (ratio
    1) on one group of advantages (1.5, -0.5, -0.5, -0.5) and arbitrary log-probs. True for the
    clipped surrogate (-A_i), and for sapo with equal temperatures (-2 A_i / tau); false for
    cispo and vespo (-w A_i log pi) and sapo with unequal temperatures."""
    gen = torch.Generator().manual_seed(0)
    logprobs = -3.0 * torch.rand((4, 5), generator=gen, dtype=torch.float64)
    mask = torch.ones((4, 5), dtype=torch.bool)
    mask[1, 3:] = False  # completions of unequal length
    advantages = torch.tensor([1.5, -0.5, -0.5, -0.5], dtype=torch.float64)
    signal = sequence_surrogate(
        logprobs, None, advantages, mask, loss_type=loss.loss_type, epsilon_low=loss.epsilon,
        epsilon_high=loss.effective_epsilon_high,
        importance_sampling_level=loss.importance_sampling_level,
        variant_options=loss.variant_options(),
    )  # fmt: skip
    return abs(float(signal.mean())) <= 1e-9


def gdro_start_warnings(
    *,
    curriculum: str,
    gdro_signal: str,
    gdro_unseen: str,
    pool_size: int,
    levels: int,
    max_steps: int,
    prompts_per_step: int,
    world_size: int,
    optimizer_steps_per_generation: int,
    num_iterations: int,
    signal_centred: bool,
) -> list[str]:
    """The reasons a GDRO curriculum is uniform GRPO in this run (empty: it can act).
    ``levels``: distinct ``difficulty`` values in the pool (:func:`difficulty_levels`);
    ``signal_centred``: :func:`pg_loss_is_centred` for the run's loss."""
    if curriculum not in GDRO_CURRICULA:
        return []
    if (
        curriculum == "prompt_gdro"
        and gdro_signal == "pg_loss"
        and optimizer_steps_per_generation == 1
        and num_iterations == 1
        and signal_centred
    ):
        return [
            "curriculum=prompt_gdro with gdro_signal=pg_loss is exactly uniform GRPO in this "
            "run: with one optimizer step per generation and num_iterations=1 every row is "
            "trained on-policy (ratio 1), so its pg_loss signal is a fixed multiple of -A_i, "
            "whose mean over every group, hence every bin, is 0, and every bin keeps the same "
            "weight (docs/curriculum.md). To let it act: gdro_signal: failure_rate (with "
            "gdro_share_normalize: false), or several optimizer steps per generation "
            "(steps_per_generation a multiple of gradient_accumulation_steps above it; the "
            "paper uses 4), or num_iterations > 1"
        ]
    if gdro_unseen == "difficulty" and levels >= 2:
        return []  # the level prior separates prompts before any of them is revisited
    # max_steps counts optimizer steps; each generation batch trains per_batch of them
    per_batch = optimizer_steps_per_generation * num_iterations
    batches = math.ceil(max_steps / per_batch)
    planned = planned_per_prompt(pool_size, batches, prompts_per_step, world_size)
    if planned - 1 >= MIN_REVISITS:
        return []
    if gdro_unseen == "difficulty":
        fix = ("the pool has fewer than two difficulty levels, so gdro_unseen: difficulty "
               "puts every unseen prompt in one group too; ")  # fmt: skip
    elif levels >= 2:
        fix = ("gdro_unseen: difficulty (the pool has difficulty levels: an unseen prompt is "
               "then binned by its level's success rate), or ")  # fmt: skip
    else:
        fix = ""
    need = (MIN_REVISITS + 1) * pool_size / (prompts_per_step * world_size) * per_batch
    return [
        f"curriculum={curriculum} can barely act in this run: each of the {pool_size} prompts is "
        f"planned about {planned:.2f} times ({batches} generation batches x "
        f"{prompts_per_step * world_size} "
        f"prompts per step / {pool_size}), so most plans see no history of their prompt; every "
        f"such prompt falls in one group ({'bin 0' if gdro_unseen == 'hardest' else 'unseen'}), "
        "gets the same weight and the same group size, and the run is close to uniform GRPO "
        f"(docs/curriculum.md). To let it act: {fix}more epochs (num_train_epochs, or max_steps "
        f">= {need:.0f}) or a smaller pool, so that each prompt is revisited at least "
        f"{MIN_REVISITS:.0f} times"
    ]


def warn_inert_curriculum(
    options: Sections, rows: Sequence[Any], max_steps: int, world_size: int
) -> list[str]:
    """Warn (:class:`CurriculumWarning`) for each reason :func:`gdro_start_warnings` finds with
    this run's options, prompt pool ``rows`` and ``max_steps``; returns the messages."""
    section, batch = options.curriculum, options.batch
    if section.curriculum not in GDRO_CURRICULA:
        return []
    messages = gdro_start_warnings(
        curriculum=section.curriculum,
        gdro_signal=section.gdro_signal,
        gdro_unseen=section.gdro_unseen,
        pool_size=len(rows),
        levels=difficulty_levels(rows),
        max_steps=max_steps,
        prompts_per_step=batch.prompts_per_step,
        world_size=world_size,
        optimizer_steps_per_generation=batch.optimizer_steps_per_generation,
        num_iterations=batch.num_iterations,
        signal_centred=pg_loss_is_centred(options.loss),
    )
    for message in messages:
        warnings.warn(message, CurriculumWarning, stacklevel=3)
    return messages
