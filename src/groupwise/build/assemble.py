"""One step from a run's options to its parts: :func:`assemble` turns the config (with the
model, tokenizer, device and processes already given) into a frozen :class:`Components`, and
:func:`assemble_grpo` adds GRPO's own (curriculum, loss, dynamic sampling, top-up) from their
sections. ``Trainer.__init__`` and ``GRPOTrainer.setup`` read their attributes from these,
so what each part is built from is written once, here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..config.grpo_config import GRPOConfig
from ..curriculum import CURRICULA, Curriculum, NoCurriculum
from ..curriculum.base import PromptBatches
from ..curriculum.dynamic import DynamicSampling
from ..curriculum.scope import warn_inert_curriculum
from ..curriculum.topup import TopUp
from ..policy.loss import GRPOLoss
from ..policy.policy import Policy
from ..policy.update import PolicyOptions
from ..rewards import RewardFunc
from ..rewards.scoring import RolloutScorer
from ..rollout import RolloutEngine
from ..runtime.distributed import DistributedContext
from ..runtime.precision import Precision
from ..sections import CurriculumSection, Sections
from .rewards import ScorerOptions, build_scorer
from .rollout import EngineOptions, build_engine


@dataclass(frozen=True)
class Components:
    """What every trainer runs a step with: the options by section, the reward functions
    (``scorer``), the trained ``policy`` with its optimizer and reference, the ``engine`` that
    samples from it with ``generator``, the prompt batches and the curriculum (none until a
    trainer sets one up)."""

    options: Sections
    scorer: RolloutScorer
    policy: Policy
    generator: torch.Generator
    engine: RolloutEngine
    prompts: PromptBatches
    curriculum: Curriculum


def assemble(
    args: GRPOConfig,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    *,
    device: torch.device,
    precision: Precision,
    dist: DistributedContext,
    train_dataset: Sequence[dict[str, Any]],
    reward_funcs: RewardFunc | str | Sequence[RewardFunc | str] | None,
    reward_processing_classes: Any = None,
    interaction: Any = None,
    environment_rewards: Sequence[Callable[..., Any]] = (),
) -> Components:
    """The run's parts, built in the order their random draws depend on (the reward models,
    then the policy, then the engine's sampling generator seeded ``seed + rank``)."""
    options = args.sections()
    scorer = build_scorer(
        reward_funcs,
        ScorerOptions.from_sections(options),
        reward_processing_classes,
        device,
        environment_rewards,
    )
    policy = Policy(model, PolicyOptions.from_sections(options), dist, device, precision)
    # Each rank samples its own completions (the model and prompt order are shared).
    seed = options.runtime.seed
    generator = torch.Generator(device=device).manual_seed(seed + dist.rank)
    engine = build_engine(
        policy, tokenizer, EngineOptions.from_sections(options), generator, precision, interaction
    )
    prompts = PromptBatches(
        train_dataset,
        tokenizer,
        options.batch.prompts_per_step,
        options.data.max_prompt_length,
        seed,
        dist,
        getattr(engine, "prompt_text", None),  # with tools: shown in the prompt
        shuffle=options.data.shuffle_dataset,
    )
    if dist.rank == 0:  # a GDRO curriculum that the run's sizes leave uniform says so at start
        warn_inert_curriculum(options, prompts.dataset, args.max_steps, dist.world_size)
    return Components(
        options=options,
        scorer=scorer,
        policy=policy,
        generator=generator,
        engine=engine,
        prompts=prompts,
        curriculum=NoCurriculum(options.batch.num_generations),
        # Failure-mode warnings (checkpointed), reading the reward that says "solved".
    )


@dataclass(frozen=True)
class GRPOComponents:
    """GRPO's own parts: the curriculum's plan and observation, the loss of a micro-batch, DAPO's
    dynamic sampling and Reinforce-Ada's top-up rounds (both off unless configured)."""

    curriculum: Curriculum
    loss: GRPOLoss
    dynamic: DynamicSampling
    top_up: TopUp


def assemble_grpo(
    options: Sections, dist: DistributedContext, pad_token_id: int
) -> GRPOComponents:
    """GRPO's parts from their sections (``pad_token_id`` pads the groups joined across
    draws)."""
    batch = options.batch
    return GRPOComponents(
        curriculum=build_curriculum(
            options.curriculum, batch.num_generations, options.runtime.seed, dist
        ),
        loss=GRPOLoss(options.loss, options.generation.max_completion_length),
        dynamic=DynamicSampling.from_section(  # DAPO
            options.dynamic_sampling, batch.prompts_per_step, dist, pad_token_id
        ),
        top_up=TopUp.from_section(options.curriculum, dist, pad_token_id),  # Reinforce-Ada
    )


def build_curriculum(
    section: CurriculumSection, num_generations: int, seed: int, dist: DistributedContext
) -> Curriculum:
    """The ``curriculum`` option's class (:data:`groupwise.curriculum.CURRICULA`), built from
    the run's ``curriculum`` section with the mean group size ``num_generations`` and the
    ``seed`` of its own draws (the same on every rank): as the class's typed ``options_type``
    (:mod:`groupwise.sections.curriculum`), else as a mapping of those values."""
    kind = CURRICULA[section.curriculum]
    values = section.with_run(num_generations, seed)
    # A registered class without typed options is given them as a mapping (the seam's form).
    options = values if kind.options_type is None else kind.options_type.from_config(values)
    return kind.from_options(options, dist)
