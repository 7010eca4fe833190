"""The run's options by concern: one frozen dataclass per section, read from the flat
``GRPOConfig`` (the facade users write as YAML, on the command line or in Python) by
:func:`sections`.

A component's constructor takes the sections it reads (``GRPOLoss(loss, max_completion_length)``,
``build_curriculum(curriculum, ...)``, ``TrainingMonitor(monitor)``), so its signature says what
it depends on. Every ``GRPOConfig`` field belongs to exactly one section
(tests/sections/test_sections.py walks the fields). Each section checks its own fields when made
(every error names the option); the rules that join two sections live in :func:`check_across`.
Choices read from registries above this layer (the curricula) are checked by
``GRPOConfig.validate``.

Fields carry the config's own names, so an error names the option to change. List options
become tuples (a section is immutable). The sections live by family: :mod:`.inputs` (model,
data, rewards, tools), :mod:`.training` (batch, loss, reference, advantages, dynamic sampling,
algorithm, ppo), :mod:`.curriculum`, :mod:`.generation` and :mod:`.run` (optimization, runtime,
logging, evaluation, monitor), on :mod:`.base`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TypeVar

from ..errors import ConfigError
from .base import Section, world_size_from_env
from .curriculum import CurriculumSection, GDROFields, GroupSizeFields, SelectFields
from .generation import GENERATION_ENGINES, STATIC_MULTI_TURN, GenerationOptions
from .inputs import DataOptions, ModelOptions, RewardOptions, ToolOptions
from .run import (
    EvaluationOptions,
    LoggingOptions,
    MonitorOptions,
    OptimizationOptions,
    RuntimeOptions,
)
from .training import (
    CISPO_DEFAULT_CAP,
    AdvantageOptions,
    AlgorithmOptions,
    BatchOptions,
    DynamicSamplingOptions,
    LossOptions,
    PPOOptions,
    ReferenceOptions,
)

__all__ = [
    "CISPO_DEFAULT_CAP",
    "GENERATION_ENGINES",
    "PPO_MULTI_TURN",
    "SECTION_TYPES",
    "STATIC_MULTI_TURN",
    "AdvantageOptions",
    "AlgorithmOptions",
    "BatchOptions",
    "CurriculumSection",
    "DataOptions",
    "DynamicSamplingOptions",
    "EvaluationOptions",
    "GDROFields",
    "GenerationOptions",
    "GroupSizeFields",
    "LoggingOptions",
    "LossOptions",
    "ModelOptions",
    "MonitorOptions",
    "OptimizationOptions",
    "PPOOptions",
    "ReferenceOptions",
    "RewardOptions",
    "RuntimeOptions",
    "Section",
    "SectionGroup",
    "SelectFields",
    "Sections",
    "ToolOptions",
    "check_across",
    "sections",
    "world_size_from_env",
]

_Group = TypeVar("_Group", bound="SectionGroup")

PPO_MULTI_TURN = (
    "tools and environments work with algorithm=grpo only: PPO's critic would value every token "
    "of a conversation, tool replies included (GAE has no notion of inserted context)"
)


SECTION_TYPES: tuple[type[Section], ...] = (
    ModelOptions, DataOptions, RewardOptions, ToolOptions, BatchOptions, LossOptions,
    ReferenceOptions, AdvantageOptions, DynamicSamplingOptions, AlgorithmOptions, PPOOptions,
    CurriculumSection, GenerationOptions, OptimizationOptions, RuntimeOptions, LoggingOptions,
    EvaluationOptions, MonitorOptions,
)  # fmt: skip


@dataclass(frozen=True)
class Sections:
    """Every section of one run's options (:func:`sections`)."""

    model: ModelOptions
    data: DataOptions
    rewards: RewardOptions
    tools: ToolOptions
    batch: BatchOptions
    loss: LossOptions
    reference: ReferenceOptions
    advantages: AdvantageOptions
    dynamic_sampling: DynamicSamplingOptions
    algorithm: AlgorithmOptions
    ppo: PPOOptions
    curriculum: CurriculumSection
    generation: GenerationOptions
    optimization: OptimizationOptions
    runtime: RuntimeOptions
    logging: LoggingOptions
    evaluation: EvaluationOptions
    monitor: MonitorOptions

    def __post_init__(self) -> None:
        check_across(self)


@dataclass(frozen=True)
class SectionGroup:
    """Base of the sections one component reads (``PolicyOptions``, ``EngineOptions``,
    ``ScorerOptions``): a frozen dataclass whose fields are named as sections, made by
    :meth:`from_sections`."""

    @classmethod
    def from_sections(cls: type[_Group], sections: Sections) -> _Group:
        return cls(**{f.name: getattr(sections, f.name) for f in dataclasses.fields(cls)})


def sections(config: Any) -> Sections:
    """``config`` (a ``GRPOConfig``, or a mapping of its fields) split into its sections, each
    checked, then the rules across sections (:func:`check_across`)."""
    return Sections(**{kind.name: kind.from_config(config) for kind in SECTION_TYPES})


def check_across(s: Sections) -> None:
    """The rules that join options of different sections, each error naming the options."""
    loss, ref, algorithm = s.loss, s.reference, s.algorithm.algorithm
    curriculum, c = s.curriculum.curriculum, s.curriculum
    if ref.sync_ref_model and (loss.beta == 0 or s.model.use_peft):
        why = (
            "beta=0 loads no reference model"
            if loss.beta == 0
            else ("with use_peft the reference is the adapter-disabled policy, not a copy to mix")
        )
        raise ConfigError(f"sync_ref_model=True has nothing to update: {why}")
    if ref.sync_ref_model and s.logging.resume_from_checkpoint is not None:
        raise ConfigError(
            "resume_from_checkpoint with sync_ref_model=True is not supported: checkpoints "
            "hold the policy, not the mixed reference weights, so the resumed run's KL "
            "term would be to a different reference"
        )
    if algorithm == "ppo" and s.batch.optimizer_steps_per_generation > 1:
        raise ConfigError(
            "steps_per_generation / generation_batch_size: algorithm=ppo takes one optimizer "
            "step per generation batch (per num_iterations pass); leave both unset"
        )
    _check_quantization(s)
    multi_turn = s.tools.multi_turn
    if s.generation.generation_engine == "static" and multi_turn:
        raise ConfigError(STATIC_MULTI_TURN)
    if s.generation.generation_engine == "vllm" and s.generation.vllm_mode == "server":
        if multi_turn:
            raise ConfigError(
                "tools and environments (multi-turn rollouts) run on the colocated vLLM engine "
                "only, not with vllm_mode: server; use vllm_mode: colocate"
            )
    if s.generation.generation_kwargs and multi_turn:
        raise ConfigError(
            f"generation_kwargs ({', '.join(sorted(s.generation.generation_kwargs))}) are not "
            "supported with tools or an environment: multi-turn rollouts decode token by token "
            "to stop at tool calls and insert their replies, which transformers' generate() "
            "does not do"
        )
    # How the select_* options combine with the rest of the run (their own ranges:
    # curriculum.options.SelectOptions).
    if (
        curriculum == "select"
        and c.select_equal_prompt_weight
        and (s.advantages.prompt_weighting == "equal")
    ):
        raise ConfigError(
            "prompt_weighting=equal with curriculum=select and select_equal_prompt_weight="
            "true would weight each prompt by mean(n)/n_x twice (GDRO eq. 17); set one of "
            "them: prompt_weighting: rollouts, or select_equal_prompt_weight: false"
        )
    if c.select_top_up and curriculum != "select":
        raise ConfigError(
            f"select_top_up works with curriculum=select only, got curriculum={curriculum}"
        )
    if c.select_top_up and s.dynamic_sampling.dynamic_sampling:
        raise ConfigError(
            "select_top_up cannot be combined with dynamic_sampling: both spend the step's "
            "rollouts on groups that are not all-correct or all-wrong; set one of them"
        )
    if c.select_top_up and algorithm == "ppo":
        raise ConfigError("select_top_up works with algorithm=grpo only")
    # The curricula's own options check themselves (each error names its option), whatever
    # the curriculum, so a bad value is refused when the config is made.
    from .curriculum import GDROOptions, SelectOptions

    values = c.with_run(s.batch.num_generations, s.runtime.seed)
    GDROOptions.from_config(values)
    SelectOptions.from_config(values)
    if algorithm == "ppo" and curriculum != "none":
        raise ConfigError("the curriculum works with algorithm=grpo only")
    if algorithm == "ppo" and multi_turn:
        raise ConfigError(PPO_MULTI_TURN)
    if s.dynamic_sampling.dynamic_sampling and algorithm == "ppo":
        raise ConfigError(
            "dynamic_sampling works with algorithm=grpo only: PPO's critic gives advantages "
            "to groups whose rewards are all equal, so no group is uninformative"
        )
    if s.dynamic_sampling.dynamic_sampling and curriculum != "none":
        raise ConfigError(
            f"dynamic_sampling cannot be combined with curriculum={curriculum}: the "
            "curriculum plans rollouts and weights per prompt batch, and dynamic sampling "
            "trains on groups gathered from several batches; set dynamic_sampling: false "
            "or curriculum: none"
        )
    if s.batch.num_generations < 2 and algorithm == "grpo":
        raise ConfigError(
            "num_generations must be >= 2: a group of one completion has no baseline "
            "(its advantage is always 0)"
        )


def _check_quantization(s: Sections) -> None:
    """QLoRA's 4-bit base and bitsandbytes' optimizers with the parts that cannot take them."""
    engine, algorithm = s.generation.generation_engine, s.algorithm.algorithm
    if s.model.load_in_4bit and engine == "vllm":
        raise ConfigError(
            "load_in_4bit=True with generation_engine=vllm is not supported: vLLM decodes from "
            "its own 16-bit copy of the weights, which a 4-bit base is there to avoid "
            "(docs/speed-memory.md, 'QLoRA'); use generation_engine: static (the 4-bit layers "
            "read in place) or hf"
        )
    if s.model.load_in_4bit and algorithm == "ppo":
        raise ConfigError(
            "load_in_4bit=True works with algorithm=grpo only: PPO's critic is a fully trained "
            "copy of the policy's weights, which a frozen 4-bit base cannot give"
        )
    sharded = s.runtime.data_parallel == "fsdp"
    if sharded and (s.model.load_in_4bit or s.optimization.optim not in _TORCH_OPTIMS):
        what = "load_in_4bit=True" if s.model.load_in_4bit else f"optim={s.optimization.optim}"
        raise ConfigError(
            f"{what} with data_parallel=fsdp is not supported: FSDP2 shards parameters into "
            "DTensors, which bitsandbytes' 4-bit layers and optimizers do not take; use "
            "data_parallel: ddp"
        )


_TORCH_OPTIMS = ("adamw_torch", "adamw_torch_fused")
