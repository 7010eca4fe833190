"""One step from a run's options to the run: :func:`assemble_run` turns the config, the model
(a name, a path or a loaded model) and the processes into a frozen :class:`~.run.Run`: the
device and numerics, the model and tokenizer, the reward functions, the policy, the rollout
engine and its sampling generator, the prompt batches, the curriculum and the algorithm's own
parts (:func:`assemble_grpo`, :func:`assemble_ppo`), each from the sections it reads. A trainer
takes the arguments in TRL's forms and calls it once; what each part is built from is written
here, and nothing is attached to a part after it is built.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..config.grpo_config import GRPOConfig
from ..config.trl_parity import prompt_cut_warning
from ..curriculum import CURRICULA, Curriculum, NoCurriculum
from ..curriculum.base import PromptBatches
from ..curriculum.dynamic import DynamicSampling
from ..curriculum.scope import warn_inert_curriculum
from ..curriculum.topup import TopUp
from ..policy.critic import Critic, build_value_model
from ..policy.loss import GRPOLoss
from ..policy.policy import Policy, PolicyOptions
from ..rewards import RewardFunc
from ..runtime.distributed import DistributedContext, resolve_device
from ..runtime.precision import Precision
from ..sections import CurriculumSection, Sections
from .model import build_model, resolve_run_precision
from .rewards import ScorerOptions, build_scorer
from .rollout import EngineOptions, Interaction, build_engine
from .run import GRPOParts, PPOParts, Run


def assemble_run(
    args: GRPOConfig,
    model: str | PreTrainedModel,
    *,
    algorithm: str,
    dist: DistributedContext,
    train_dataset: Sequence[dict[str, Any]],
    reward_funcs: RewardFunc | str | Sequence[RewardFunc | str] | None,
    processing_class: PreTrainedTokenizerBase | None = None,
    peft_config: Any | None = None,
    reward_processing_classes: Any = None,
    interaction: Interaction | None = None,
    trainer_state: Callable[[], Any] | None = None,
    before_load: Callable[[torch.device], None] | None = None,
) -> Run:
    """The run of ``args`` for ``algorithm`` ("grpo" or "ppo": which own parts it gets), built
    in the order the random draws depend on: the model, the reward models, the policy, the
    engine's sampling generator (seeded ``seed + rank``), then the algorithm's parts.
    ``trainer_state`` gives the reward functions TRL's ``trainer_state`` keyword;
    ``before_load(device)`` is called once the device is known, before any weight is loaded."""
    device = resolve_device(args.device)
    if device.type == "cuda" and dist.enabled:
        device = torch.device("cuda", dist.local_rank)
    if before_load is not None:
        before_load(device)
    # fp32 weights with bf16 autocast on a bf16 GPU, fp32 on CPU (docs/gpu.md).
    precision = resolve_run_precision(args, device)
    model, tokenizer = build_model(
        model, processing_class, args, device, precision.weights, peft_config
    )
    options = args.sections()
    environments = interaction.environments if interaction is not None else None
    scorer = build_scorer(
        reward_funcs,
        ScorerOptions.from_sections(options),
        reward_processing_classes,
        device,
        environments.reward_funcs if environments is not None else (),
        trainer_state,
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
        cut_warning=prompt_cut_warning(options.data.max_prompt_length),
    )
    if dist.rank == 0:  # a GDRO curriculum that the run's sizes leave uniform says so at start
        warn_inert_curriculum(options, prompts.dataset, args.max_steps, dist.world_size)
    parts: GRPOParts | PPOParts
    if algorithm == "ppo":
        curriculum: Curriculum = NoCurriculum(options.batch.num_generations)
        parts = assemble_ppo(options, policy.model, dist, device, precision)
    else:
        curriculum = build_curriculum(
            options.curriculum, options.batch.num_generations, seed, dist
        )
        parts = assemble_grpo(options, dist, tokenizer.pad_token_id or 0)
    return Run(
        options=options,
        dist=dist,
        device=device,
        precision=precision,
        tokenizer=tokenizer,
        policy=policy,
        scorer=scorer,
        generator=generator,
        engine=engine,
        prompts=prompts,
        curriculum=curriculum,
        interaction=interaction,
        algorithm=parts,
    )


def assemble_grpo(options: Sections, dist: DistributedContext, pad_token_id: int) -> GRPOParts:
    """GRPO's own parts from their sections (``pad_token_id`` pads the groups joined across
    draws)."""
    batch = options.batch
    return GRPOParts(
        loss=GRPOLoss(options.loss, options.generation.max_completion_length),
        dynamic=DynamicSampling.from_section(  # DAPO
            options.dynamic_sampling, batch.prompts_per_step, dist, pad_token_id
        ),
        top_up=TopUp.from_section(options.curriculum, dist, pad_token_id),  # Reinforce-Ada
    )


def assemble_ppo(
    options: Sections,
    model: PreTrainedModel,
    dist: DistributedContext,
    device: torch.device,
    precision: Precision,
) -> PPOParts:
    """PPO's own parts: the ``ppo`` section and the critic, a value head on a copy of the
    policy's decoder (or on ``critic_model``'s), in the trained dtype with an fp32 head, with
    its own AdamW (:class:`~groupwise.policy.critic.Critic`)."""
    ppo = options.ppo
    value_model = build_value_model(model, ppo.critic_model, options.runtime.seed)
    value_model.backbone.to(device=device, dtype=precision.trained)
    value_model.head.to(device=device, dtype=torch.float32)
    if options.runtime.gradient_checkpointing:
        value_model.backbone.activation_checkpointing_enable()  # the deprecated alias warns
        value_model.backbone.config.use_cache = False
    value_model.train()
    return PPOParts(ppo, Critic(value_model, options, dist, device))


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
