"""The run's options by concern: one frozen dataclass per section, read from the flat
``GRPOConfig`` (the facade users write as YAML, on the command line or in Python) by
:func:`sections`.

A component's constructor takes the sections it reads (``GRPOLoss(loss, max_completion_length)``,
``build_curriculum(curriculum, ...)``, ``TrainingMonitor(monitor)``), so its signature says what
it depends on. Every ``GRPOConfig`` field belongs to exactly one section (tests/test_sections.py
walks the fields). Each section checks its own fields when made (every error names the option);
the rules that join two sections live in :func:`check_across`. Choices read from registries
above this layer (the curricula) are checked by ``GRPOConfig.validate``.

Fields carry the config's own names, so an error names the option to change. List options
become tuples (a section is immutable).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from .errors import ConfigError

# cispo's importance-weight cap when epsilon_high is not given (TRL's docs, ScaleRL).
CISPO_DEFAULT_CAP = 5.0

# Rollout engines (generation_engine): hf = the Hugging Face / torch engine on the policy's own
# weights (rollout/hf.py); static = a lean Llama-family decoder with its own copy of the weights
# and a static KV cache (rollout/static.py); vllm = a colocated vLLM engine with its own copy of
# the weights (rollout/vllm.py). build_rollout.build_engine dispatches on the name; a new engine
# adds its name here and its branch there.
GENERATION_ENGINES: tuple[str, ...] = ("hf", "static", "vllm")

PPO_MULTI_TURN = (
    "tools and environments work with algorithm=grpo only: PPO's critic would value every token "
    "of a conversation, tool replies included (GAE has no notion of inserted context)"
)
STATIC_MULTI_TURN = (
    "generation_engine=static does not run tools or environments (multi-turn rollouts continue "
    "from the HF engine's KV cache); use generation_engine: hf with tools / environment"
)
VLLM_MULTI_TURN = (
    "generation_engine=vllm does not run tools or environments (multi-turn rollouts continue "
    "from the HF engine's KV cache); use generation_engine: hf with tools / environment"
)

_Section = TypeVar("_Section", bound="Section")


def world_size_from_env() -> int:
    """The number of ranks torchrun announces (WORLD_SIZE), 1 for a single process."""
    try:
        return max(int(os.environ.get("WORLD_SIZE", "1")), 1)
    except ValueError:
        return 1


def _choice(section: object, name: str, valid: Any) -> None:
    value = getattr(section, name)
    if value not in valid:
        raise ConfigError(f"{name}={value!r} is not one of {list(valid)}")


def _at_least(section: object, low: float, *names: str) -> None:
    for name in names:
        if getattr(section, name) < low:
            raise ConfigError(f"{name} must be >= {low:g}, got {getattr(section, name)}")


def _in_unit(section: object, *names: str) -> None:
    for name in names:
        if not 0.0 <= getattr(section, name) <= 1.0:
            raise ConfigError(f"{name} must be in [0, 1], got {getattr(section, name)}")


@dataclass(frozen=True)
class Section:
    """A frozen group of options, checked when made (:meth:`validate`)."""

    name: ClassVar[str] = ""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise :class:`~groupwise.errors.ConfigError` naming the first bad option."""

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_config(cls: type[_Section], config: Any) -> _Section:
        """This section of ``config`` (a ``GRPOConfig``, or any object or mapping with the
        fields' names); lists become tuples."""
        values = {}
        for name in cls.field_names():
            value = config[name] if isinstance(config, Mapping) else getattr(config, name)
            values[name] = tuple(value) if isinstance(value, list) else value
        return cls(**values)


@dataclass(frozen=True)
class ModelOptions(Section):
    """What is loaded and trained: the model, its weights' dtype and attention kernel, LoRA."""

    name: ClassVar[str] = "model"
    model: str
    trust_remote_code: bool
    dtype: str
    attn_implementation: str
    use_peft: bool
    lora_r: int
    lora_alpha: int
    lora_dropout: float
    lora_target_modules: tuple[str, ...] | None
    save_merged_model: bool

    def validate(self) -> None:
        _choice(self, "dtype", ("auto", "float32", "bfloat16"))
        _choice(self, "attn_implementation", ("sdpa", "eager", "flash_attention_2"))
        _at_least(self, 0, "lora_dropout")
        if self.use_peft and (self.lora_r < 1 or self.lora_alpha < 1):
            raise ConfigError(
                f"lora_r and lora_alpha must be >= 1, got {self.lora_r} and {self.lora_alpha}"
            )


@dataclass(frozen=True)
class DataOptions(Section):
    """The task's prompts: built-in task generation, file columns, prompt length and order."""

    name: ClassVar[str] = "data"
    task: str
    digits: int
    min_operands: int
    max_operands: int
    ops: str
    few_shot: bool
    num_train_prompts: int
    num_eval_prompts: int
    eval_task: str | None
    prompt_column: str
    answer_column: str
    system_prompt: str | None
    prompt_template: str | None
    on_invalid_rows: str
    long_prompts: str
    max_prompt_length: int | None
    shuffle_dataset: bool
    chat_template_kwargs: Mapping[str, Any] | None

    def validate(self) -> None:
        if not self.ops or set(self.ops) - set("+-*"):
            raise ConfigError(f"ops must be a non-empty subset of '+-*', got {self.ops!r}")
        _choice(self, "on_invalid_rows", ("error", "skip"))
        _choice(self, "long_prompts", ("truncate", "skip", "error"))
        _at_least(self, 1, "num_train_prompts")
        _at_least(self, 0, "num_eval_prompts")
        if self.max_prompt_length is not None and self.max_prompt_length < 1:
            raise ConfigError(
                f"max_prompt_length must be >= 1 or null, got {self.max_prompt_length}"
            )


@dataclass(frozen=True)
class RewardOptions(Section):
    """The reward functions, their weights, failure tolerance and the shaping rewards' options."""

    name: ClassVar[str] = "rewards"
    reward_funcs: tuple[str, ...] | None
    reward_weights: tuple[float, ...] | None
    reward_max_failure_fraction: float
    reward_timeout: float | None
    accuracy_timeout: float
    overlong_buffer_len: int | None
    overlong_penalty_factor: float
    repetition_ngram_size: int
    repetition_max_penalty: float
    code_timeout: float
    remote_timeout: float

    def validate(self) -> None:
        if not 0.0 <= self.reward_max_failure_fraction <= 1.0:
            raise ConfigError(
                "reward_max_failure_fraction must be in [0, 1], "
                f"got {self.reward_max_failure_fraction}"
            )
        if self.reward_timeout is not None and self.reward_timeout <= 0:
            raise ConfigError(
                f"reward_timeout must be > 0 seconds or null, got {self.reward_timeout}"
            )
        for name in ("accuracy_timeout", "code_timeout", "remote_timeout"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0 seconds, got {getattr(self, name)}")
        if self.repetition_max_penalty > 0:
            raise ConfigError(
                f"repetition_max_penalty must be <= 0, got {self.repetition_max_penalty}"
            )
        funcs = self.reward_funcs
        if funcs is not None and (not funcs or any(not str(f).strip() for f in funcs)):
            raise ConfigError("reward_funcs must name at least one reward function")
        if funcs is not None and self.reward_weights is not None:
            if len(self.reward_weights) != len(funcs):
                raise ConfigError(
                    f"reward_weights has {len(self.reward_weights)} entries but reward_funcs "
                    f"has {len(funcs)} ({list(funcs)})"
                )


@dataclass(frozen=True)
class ToolOptions(Section):
    """Multi-turn rollouts: the tools or environment and their limits (docs/tools.md)."""

    name: ClassVar[str] = "tools"
    tools: tuple[str, ...] | None
    environment: str | None
    max_turns: int
    max_tool_calls: int
    tool_timeout: float
    max_tool_output_tokens: int
    tool_examples: bool

    @property
    def multi_turn(self) -> bool:
        return bool(self.tools or self.environment)

    def validate(self) -> None:
        _at_least(self, 1, "max_turns", "max_tool_calls", "max_tool_output_tokens")
        if self.tool_timeout <= 0:
            raise ConfigError(f"tool_timeout must be > 0 seconds, got {self.tool_timeout}")


@dataclass(frozen=True)
class BatchOptions(Section):
    """The batch arithmetic (docs/concepts.md "Batch arithmetic"): group size, micro-batches,
    generation batches and passes over them."""

    name: ClassVar[str] = "batch"
    num_generations: int
    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    steps_per_generation: int | None
    generation_batch_size: int | None
    num_iterations: int

    @property
    def completions_per_step(self) -> int:
        """Completions per optimizer step, per rank (one mini-batch)."""
        return self.per_device_train_batch_size * self.gradient_accumulation_steps

    @property
    def micro_steps_per_generation(self) -> int:
        """TRL's steps_per_generation, resolved: micro-batches per generation batch, per rank
        (from generation_batch_size with the world size torchrun sets in WORLD_SIZE)."""
        if self.steps_per_generation is not None:
            return self.steps_per_generation
        if self.generation_batch_size is not None:
            ranks = world_size_from_env()
            return self.generation_batch_size // (self.per_device_train_batch_size * ranks)
        return self.gradient_accumulation_steps

    @property
    def optimizer_steps_per_generation(self) -> int:
        """Mini-batches per generation batch: each is one optimizer step (per pass)."""
        return self.micro_steps_per_generation // self.gradient_accumulation_steps

    @property
    def completions_per_generation(self) -> int:
        """Completions per generation batch, per rank (on average under Rollout-GDRO)."""
        return self.per_device_train_batch_size * self.micro_steps_per_generation

    @property
    def prompts_per_step(self) -> int:
        """Prompts per groupwise step (one generation batch), per rank."""
        return self.completions_per_generation // self.num_generations

    def validate(self) -> None:
        _at_least(self, 1, "num_generations", "per_device_train_batch_size",
                  "gradient_accumulation_steps", "num_iterations")  # fmt: skip
        if self.completions_per_step % self.num_generations != 0:
            raise ConfigError(
                "per_device_train_batch_size * gradient_accumulation_steps (completions per step, "
                f"here {self.per_device_train_batch_size} * {self.gradient_accumulation_steps} = "
                f"{self.completions_per_step}) must be a multiple of num_generations "
                f"({self.num_generations}) so that every prompt gets a full group"
            )
        # steps_per_generation / generation_batch_size, as TRL checks them, plus what groupwise
        # needs: whole optimizer steps (and so whole prompt groups) per generation batch.
        spg, gbs = self.steps_per_generation, self.generation_batch_size
        if spg is not None and gbs is not None:
            raise ConfigError(
                "steps_per_generation and generation_batch_size are mutually exclusive (as in "
                f"TRL): got steps_per_generation={spg} and generation_batch_size={gbs}; set one"
            )
        if spg is not None and spg < 1:
            raise ConfigError(f"steps_per_generation must be >= 1 or null, got {spg}")
        if gbs is not None:
            per_micro = self.per_device_train_batch_size * world_size_from_env()
            if gbs < 1 or gbs % per_micro:
                raise ConfigError(
                    f"generation_batch_size={gbs} must be a positive multiple of "
                    f"per_device_train_batch_size * ranks = {per_micro}"
                )
        micro = self.micro_steps_per_generation
        if micro % self.gradient_accumulation_steps:
            name = "steps_per_generation" if gbs is None else "generation_batch_size"
            raise ConfigError(
                f"{name}: a generation batch of {micro} micro-batches per rank is not a whole "
                f"number of optimizer steps of gradient_accumulation_steps="
                f"{self.gradient_accumulation_steps} micro-batches; use a multiple"
            )


@dataclass(frozen=True)
class LossOptions(Section):
    """The GRPO objective: the loss variant and its clip, KL, GSPO, masks, entropy bonus and the
    rollout-correction weights (docs/concepts.md "Loss variants")."""

    name: ClassVar[str] = "loss"
    loss_type: str
    beta: float
    epsilon: float
    epsilon_high: float | None
    delta: float | None
    sapo_temperature_pos: float
    sapo_temperature_neg: float
    vespo_k_pos: float
    vespo_lambda_pos: float
    vespo_k_neg: float
    vespo_lambda_neg: float
    importance_sampling_level: str
    top_entropy_quantile: float
    entropy_coef: float
    use_adaptive_entropy: bool
    entropy_target: float
    entropy_coef_delta: float
    entropy_coef_min: float
    entropy_coef_max: float
    use_bias_correction_kl: bool
    off_policy_mask_threshold: float | None
    mask_truncated_completions: bool
    rollout_correction: bool
    rollout_correction_mode: str
    rollout_correction_clip_min: float | None
    rollout_correction_clip_max: float | None

    @property
    def effective_epsilon_high(self) -> float:
        """The upper clip: epsilon_high, else epsilon, else for cispo (whose epsilon_high is the
        weight cap itself) 5.0, the value TRL's docs and ScaleRL (arXiv 2510.13786) advise.
        TRL falls back to epsilon there too (a cap of 0.2 scales every on-policy weight by
        0.2 and so only the learning rate); groupwise refuses caps below 1."""
        if self.epsilon_high is not None:
            return self.epsilon_high
        return CISPO_DEFAULT_CAP if self.loss_type == "cispo" else self.epsilon

    def variant_options(self) -> dict[str, float]:
        """The options of the loss variant (TRL's names): delta for the clipped surrogates,
        the gate temperatures for sapo, the gamma shapes for vespo."""
        if self.loss_type == "sapo":
            return {
                "temperature_pos": self.sapo_temperature_pos,
                "temperature_neg": self.sapo_temperature_neg,
            }
        if self.loss_type == "vespo":
            return {
                "k_pos": self.vespo_k_pos,
                "lambda_pos": self.vespo_lambda_pos,
                "k_neg": self.vespo_k_neg,
                "lambda_neg": self.vespo_lambda_neg,
            }
        if self.delta is not None:
            return {"delta": self.delta}
        return {}

    def validate(self) -> None:
        if self.loss_type == "cispo" and self.epsilon_high is not None and self.epsilon_high < 1:
            raise ConfigError(
                "loss_type=cispo caps the importance weight at epsilon_high itself (TRL's "
                f"meaning), so it must be >= 1, got {self.epsilon_high}; e.g. epsilon_high: 5.0 "
                "(the default for cispo)"
            )
        clipped = ("grpo", "bnpo", "dapo", "dr_grpo", "luspo")
        if self.delta is not None:
            if self.loss_type not in clipped:
                raise ConfigError(
                    f"delta (two-sided clipping) caps the clipped surrogate's ratio; "
                    f"loss_type={self.loss_type} has no such ratio (use one of {list(clipped)})"
                )
            if not self.delta > 1:
                raise ConfigError(f"delta must be > 1 (a cap on the ratio), got {self.delta}")
        for name in ("sapo_temperature_pos", "sapo_temperature_neg"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        _at_least(self, 0, "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg")
        if self.loss_type == "vespo" and self.importance_sampling_level != "token":
            raise ConfigError(
                "loss_type=vespo forms its own sequence weight from the per-token ratios; "
                "importance_sampling_level must be token"
            )
        _in_unit(self, "top_entropy_quantile")
        threshold = self.off_policy_mask_threshold
        if threshold is not None and not (math.isfinite(threshold) and threshold >= 0):
            raise ConfigError(
                "off_policy_mask_threshold is a mean log-ratio bound (delta of DeepSeek-V3.2 "
                f"Eq. 9), a number >= 0 such as 0.5, or None (off); got {threshold}"
            )
        if not math.isfinite(self.entropy_coef):
            raise ConfigError(f"entropy_coef must be a finite number, got {self.entropy_coef}")
        if self.use_adaptive_entropy:
            if self.entropy_coef_delta < 0:
                raise ConfigError(
                    f"entropy_coef_delta must be >= 0, got {self.entropy_coef_delta}"
                )
            if not self.entropy_coef_min <= self.entropy_coef <= self.entropy_coef_max:
                raise ConfigError(
                    "use_adaptive_entropy needs entropy_coef_min <= entropy_coef <= "
                    f"entropy_coef_max, got {self.entropy_coef_min} <= {self.entropy_coef} <= "
                    f"{self.entropy_coef_max}"
                )
            if self.entropy_target < 0:
                raise ConfigError(
                    f"entropy_target is a mean token entropy in nats, >= 0; got "
                    f"{self.entropy_target}"
                )
        # The registries are read now, so a variant registered before the config is valid
        # (imported here: they need torch, which `groupwise --help` never loads).
        from .losses import IMPORTANCE_SAMPLING_LEVELS, LOSSES, ROLLOUT_CORRECTION_MODES

        _choice(self, "loss_type", tuple(LOSSES))
        _choice(self, "importance_sampling_level", IMPORTANCE_SAMPLING_LEVELS)
        _choice(self, "rollout_correction_mode", ROLLOUT_CORRECTION_MODES)
        _at_least(self, 0, "beta", "epsilon")
        if self.epsilon_high is not None and self.epsilon_high < 0:
            raise ConfigError(f"epsilon_high must be >= 0, got {self.epsilon_high}")
        for name in ("rollout_correction_clip_min", "rollout_correction_clip_max"):
            if getattr(self, name) is not None and getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0 or null, got {getattr(self, name)}")


@dataclass(frozen=True)
class ReferenceOptions(Section):
    """The KL reference model: where it lives and TR-DPO's update of it."""

    name: ClassVar[str] = "reference"
    sync_ref_model: bool
    ref_model_mixup_alpha: float
    ref_model_sync_steps: int
    ref_model_offload: bool

    def validate(self) -> None:
        _in_unit(self, "ref_model_mixup_alpha")
        if self.ref_model_sync_steps < 1:
            raise ConfigError(f"ref_model_sync_steps must be >= 1, got {self.ref_model_sync_steps}")


@dataclass(frozen=True)
class AdvantageOptions(Section):
    """How rewards become advantages and how prompts weigh in the loss."""

    name: ClassVar[str] = "advantages"
    scale_rewards: str
    multi_objective_aggregation: str
    prompt_weighting: str

    def validate(self) -> None:
        from .advantages import AGGREGATIONS, SCALE_MODES

        _choice(self, "scale_rewards", SCALE_MODES)
        _choice(self, "multi_objective_aggregation", AGGREGATIONS)
        _choice(self, "prompt_weighting", ("rollouts", "equal"))


@dataclass(frozen=True)
class DynamicSamplingOptions(Section):
    """DAPO's dynamic sampling (verl's filter_groups)."""

    name: ClassVar[str] = "dynamic_sampling"
    dynamic_sampling: bool
    max_num_gen_batches: int
    dynamic_sampling_std_tol: float

    def validate(self) -> None:
        _at_least(self, 0, "max_num_gen_batches", "dynamic_sampling_std_tol")


@dataclass(frozen=True)
class AlgorithmOptions(Section):
    """The algorithm, and the PPO baseline's critic and GAE (algorithms.md 3.6)."""

    name: ClassVar[str] = "algorithm"
    algorithm: str
    ppo_gamma: float
    ppo_lam: float
    vf_coef: float
    cliprange_value: float
    whiten_advantages: bool
    critic_model: str | None
    critic_learning_rate: float | None

    def validate(self) -> None:
        _choice(self, "algorithm", ("grpo", "ppo"))
        _at_least(self, 0, "ppo_gamma", "ppo_lam", "vf_coef", "cliprange_value")
        if self.ppo_gamma > 1 or self.ppo_lam > 1:
            raise ConfigError(
                f"ppo_gamma and ppo_lam must be in [0, 1], got {self.ppo_gamma}, {self.ppo_lam}"
            )


@dataclass(frozen=True)
class CurriculumSection(Section):
    """The curriculum and its ``gdro_*``, ``rollout_*`` and ``select_*`` options; a curriculum's
    typed options (:mod:`groupwise.curriculum.options`) also need the mean group size and the
    seed (:meth:`with_run`)."""

    name: ClassVar[str] = "curriculum"
    curriculum: str
    gdro_num_bins: int
    gdro_bin_edges: tuple[float, ...] | None
    gdro_window: int
    gdro_hysteresis: float
    gdro_correct_threshold: float
    gdro_classifier_signal: str
    gdro_unseen: str
    gdro_eta: float
    gdro_gamma: float
    gdro_ema_beta: float
    gdro_clip: float | None
    gdro_weight_cap: float
    gdro_share_normalize: bool
    gdro_signal: str
    rollout_min: int
    rollout_max: int
    rollout_allocator: str
    rollout_variance: str
    rollout_variance_prior: float
    rollout_dual_lr: float
    rollout_score_decay: float
    rollout_arm_choice: str
    rollout_mu_update: str
    select_rule: str
    select_oversample: int | None
    select_keep: float
    select_keep_floor: float
    select_discount: float
    select_prior_strength: float
    select_retry_half_life: float
    select_uniform_mix: float
    select_allocator: str
    select_equal_prompt_weight: bool
    select_top_up: bool
    select_top_up_first: int

    def with_run(self, num_generations: int, seed: int) -> dict[str, Any]:
        """This section's values with the two run-wide ones the curricula read."""
        values = {f: getattr(self, f) for f in self.field_names()}
        return {**values, "num_generations": num_generations, "seed": seed}

    def validate(self) -> None:
        if self.select_top_up_first < 2:
            raise ConfigError(
                f"select_top_up_first must be >= 2 (a group of one has no variance), got "
                f"{self.select_top_up_first}"
            )


@dataclass(frozen=True)
class GenerationOptions(Section):
    """Sampling the rollouts and the engine that does it (docs/speed-memory.md)."""

    name: ClassVar[str] = "generation"
    max_completion_length: int
    temperature: float
    top_p: float
    top_k: int
    min_p: float | None
    repetition_penalty: float
    generation_kwargs: Mapping[str, Any] | None
    generation_engine: str
    generation_dtype: str
    static_compile: bool | None
    static_compile_min_steps: int
    static_eos_check_every: int
    vllm_mode: str
    vllm_gpu_memory_utilization: float
    vllm_max_model_length: int | None
    vllm_enable_sleep_mode: bool
    vllm_tensor_parallel_size: int
    vllm_enable_prefix_caching: bool

    def validate(self) -> None:
        if self.generation_kwargs:
            self._check_generation_kwargs()
        if not self.temperature > 0:
            raise ConfigError(
                f"temperature must be > 0, got {self.temperature} (GRPO samples its groups; at "
                "temperature 0 every completion of a prompt is the same and nothing is learned)"
            )
        _at_least(self, 1, "max_completion_length")
        _at_least(self, 0, "top_k")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.min_p is not None and not 0.0 <= self.min_p <= 1.0:
            raise ConfigError(f"min_p must be in [0, 1] or null, got {self.min_p}")
        if not self.repetition_penalty > 0:
            raise ConfigError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        _choice(self, "generation_dtype", ("auto", "bfloat16"))
        _choice(self, "generation_engine", GENERATION_ENGINES)
        _choice(self, "vllm_mode", ("colocate", "server"))
        if not 0.0 < self.vllm_gpu_memory_utilization <= 1.0:
            raise ConfigError(
                "vllm_gpu_memory_utilization must be in (0, 1], "
                f"got {self.vllm_gpu_memory_utilization}"
            )
        if self.vllm_max_model_length is not None and self.vllm_max_model_length < 1:
            raise ConfigError(
                f"vllm_max_model_length must be >= 1 or null, got {self.vllm_max_model_length}"
            )
        _at_least(self, 1, "vllm_tensor_parallel_size", "static_eos_check_every")
        _at_least(self, 0, "static_compile_min_steps")
        if self.generation_engine != "vllm":
            return
        if self.vllm_mode == "server":
            raise ConfigError(
                "vllm_mode=server is not supported: groupwise runs vLLM colocated in the "
                "training process (vllm_mode: colocate), where weights are pushed in memory "
                "after every step; a separate vLLM server and its weight-transfer channel are "
                "not implemented"
            )
        if self.vllm_tensor_parallel_size != 1:
            raise ConfigError(
                f"vllm_tensor_parallel_size={self.vllm_tensor_parallel_size} is not supported: "
                "each rank runs its own colocated vLLM holding the whole model (tensor parallel "
                "size 1); use a model that fits one GPU, or generation_engine: hf with "
                "data_parallel: fsdp"
            )


    def _check_generation_kwargs(self) -> None:
        """generation_kwargs are options of transformers' generate(), which only the hf engine
        calls (single-turn rollouts: :func:`check_across`)."""
        keys = ", ".join(sorted(self.generation_kwargs or {}))
        if self.generation_engine != "hf":
            raise ConfigError(
                f"generation_kwargs ({keys}) need generation_engine: hf, got "
                f"{self.generation_engine!r}: only the hf engine can hand them to transformers' "
                "generate(); the static and vllm engines sample with temperature, top_p, top_k, "
                "min_p and repetition_penalty only"
            )
        if self.generation_dtype == "bfloat16":
            raise ConfigError(
                f"generation_kwargs ({keys}) are not supported with generation_dtype: "
                "bfloat16: its rollout correction needs the sampler's log-probs, which "
                "transformers' generate() (beam search) does not record"
            )

@dataclass(frozen=True)
class OptimizationOptions(Section):
    """AdamW, its schedule and the run's length."""

    name: ClassVar[str] = "optimization"
    learning_rate: float
    lr_scheduler_type: str
    warmup_steps: int
    warmup_ratio: float
    weight_decay: float
    adam_beta1: float
    adam_beta2: float
    adam_epsilon: float
    max_grad_norm: float
    max_steps: int
    num_train_epochs: float

    def warmup_steps_for(self, total_steps: int) -> int:
        """Warmup steps of a schedule of ``total_steps``: warmup_steps, else
        ceil(warmup_ratio * total_steps) (TrainingArguments.get_warmup_steps)."""
        return self.warmup_steps or math.ceil(self.warmup_ratio * total_steps)

    def validate(self) -> None:
        for name in ("adam_beta1", "adam_beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.max_grad_norm <= 0:
            raise ConfigError(
                f"max_grad_norm must be > 0 (inf: no clipping), got {self.max_grad_norm}"
            )
        _choice(self, "lr_scheduler_type", ("constant", "linear", "cosine"))
        _at_least(self, 0, "learning_rate", "warmup_steps", "weight_decay")
        if self.max_steps < 1 and self.max_steps != -1:
            raise ConfigError(
                f"max_steps must be >= 1, or -1 to train for num_train_epochs, got {self.max_steps}"
            )
        if self.max_steps == -1 and not self.num_train_epochs > 0:
            raise ConfigError(
                f"num_train_epochs must be > 0 when max_steps=-1, got {self.num_train_epochs}"
            )
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise ConfigError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if self.adam_epsilon <= 0:
            raise ConfigError(f"adam_epsilon must be > 0, got {self.adam_epsilon}")


@dataclass(frozen=True)
class RuntimeOptions(Section):
    """The machine and the numerics of the training forward: device, seed, precision,
    log-prob chunking, memory savers and data parallelism."""

    name: ClassVar[str] = "runtime"
    device: str
    seed: int
    bf16_autocast: bool | None
    tf32: bool
    logprob_chunk_size: int
    logprob_impl: str
    gradient_checkpointing: bool
    group_by_length: bool
    data_parallel: str

    def validate(self) -> None:
        if self.device not in ("auto", "cpu", "cuda") and not str(self.device).startswith("cuda:"):
            raise ConfigError(f"device={self.device!r} is not one of ['auto', 'cpu', 'cuda']")
        _choice(self, "logprob_impl", ("chunked", "naive"))
        _choice(self, "data_parallel", ("ddp", "fsdp"))
        _at_least(self, 1, "logprob_chunk_size")


@dataclass(frozen=True)
class LoggingOptions(Section):
    """What the run writes: its folder, metrics, completions, loggers, checkpoints."""

    name: ClassVar[str] = "logging"
    output_dir: str | None
    overwrite_output_dir: bool
    resume_from_checkpoint: str | None
    logging_steps: int
    save_steps: int
    save_strategy: str
    save_total_limit: int | None
    log_completions: bool
    log_completions_steps: int
    num_completions_to_print: int
    completions_sample_size: int
    report_to: tuple[str, ...] | None
    disable_tqdm: bool

    def validate(self) -> None:
        if self.output_dir is not None and not str(self.output_dir).strip():
            raise ConfigError(
                "output_dir is empty; name the folder the run writes its model, config, "
                "metrics and checkpoints to, e.g. --output_dir runs/my-run"
            )
        _choice(self, "save_strategy", ("steps", "epoch", "no"))
        _at_least(self, 1, "logging_steps")
        _at_least(self, 0, "save_steps", "log_completions_steps", "num_completions_to_print")
        if self.save_total_limit is not None and self.save_total_limit < 1:
            raise ConfigError(f"save_total_limit must be >= 1 or null, got {self.save_total_limit}")
        if self.report_to:
            unknown = [r for r in self.report_to if r not in ("tensorboard", "wandb")]
            if unknown:
                raise ConfigError(
                    f"report_to: unknown logger(s) {unknown}; expected tensorboard and/or wandb"
                )


@dataclass(frozen=True)
class EvaluationOptions(Section):
    """When and how the run and ``groupwise eval`` evaluate."""

    name: ClassVar[str] = "evaluation"
    eval_steps: int
    eval_on_start: bool
    eval_strategy: str
    per_device_eval_batch_size: int
    eval_num_generations: int
    eval_loss: bool
    eval_ks: tuple[int, ...] | None
    eval_output: str | None
    compare_model: str | None

    def validate(self) -> None:
        _choice(self, "eval_strategy", ("steps", "epoch", "no"))
        _at_least(self, 1, "per_device_eval_batch_size")
        _at_least(self, 0, "eval_steps")
        if self.eval_ks is not None:
            bad = [k for k in self.eval_ks if k < 1 or k > max(self.eval_num_generations, 1)]
            if bad:
                raise ConfigError(
                    f"eval_ks {bad}: each k of pass@k must be in 1..eval_num_generations "
                    f"({self.eval_num_generations}); raise eval_num_generations or lower k"
                )


@dataclass(frozen=True)
class MonitorOptions(Section):
    """The failure monitor's thresholds (:class:`groupwise.monitor.TrainingMonitor`)."""

    name: ClassVar[str] = "monitor"
    max_bad_steps: int
    warn_zero_std_fraction: float
    warn_zero_std_steps: int
    warn_entropy_min: float
    warn_kl_max: float

    def validate(self) -> None:
        _at_least(self, 0, "max_bad_steps", "warn_zero_std_steps")


SECTION_TYPES: tuple[type[Section], ...] = (
    ModelOptions, DataOptions, RewardOptions, ToolOptions, BatchOptions, LossOptions,
    ReferenceOptions, AdvantageOptions, DynamicSamplingOptions, AlgorithmOptions,
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
    curriculum: CurriculumSection
    generation: GenerationOptions
    optimization: OptimizationOptions
    runtime: RuntimeOptions
    logging: LoggingOptions
    evaluation: EvaluationOptions
    monitor: MonitorOptions

    def __post_init__(self) -> None:
        check_across(self)


def sections(config: Any) -> Sections:
    """``config`` (a ``GRPOConfig``, or a mapping of its fields) split into its sections, each
    checked, then the rules across sections (:func:`check_across`)."""
    return Sections(**{kind.name: kind.from_config(config) for kind in SECTION_TYPES})


def check_across(s: Sections) -> None:
    """The rules that join options of different sections, each error naming the options."""
    loss, ref, algorithm = s.loss, s.reference, s.algorithm.algorithm
    curriculum, c = s.curriculum.curriculum, s.curriculum
    if ref.sync_ref_model and (loss.beta == 0 or s.model.use_peft):
        why = "beta=0 loads no reference model" if loss.beta == 0 else (
            "with use_peft the reference is the adapter-disabled policy, not a copy to mix"
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
    multi_turn = s.tools.multi_turn
    if s.generation.generation_engine == "static" and multi_turn:
        raise ConfigError(STATIC_MULTI_TURN)
    if s.generation.generation_engine == "vllm" and multi_turn:
        raise ConfigError(VLLM_MULTI_TURN)
    if s.generation.generation_kwargs and multi_turn:
        raise ConfigError(
            f"generation_kwargs ({', '.join(sorted(s.generation.generation_kwargs))}) are not "
            "supported with tools or an environment: multi-turn rollouts decode token by token "
            "to stop at tool calls and insert their replies, which transformers' generate() "
            "does not do"
        )
    # How the select_* options combine with the rest of the run (their own ranges:
    # curriculum.options.SelectOptions).
    if curriculum == "select" and c.select_equal_prompt_weight and (
        s.advantages.prompt_weighting == "equal"
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
    from .curriculum.options import GDROOptions, SelectOptions

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
