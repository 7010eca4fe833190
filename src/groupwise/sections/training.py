"""How the policy is trained on its rollouts: the batch arithmetic (:class:`BatchOptions`),
the objective (:class:`LossOptions`), the KL reference (:class:`ReferenceOptions`), advantages
(:class:`AdvantageOptions`), DAPO's dynamic sampling (:class:`DynamicSamplingOptions`), the
algorithm (:class:`AlgorithmOptions`) and the PPO baseline's own options (:class:`PPOOptions`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from ..errors import ConfigError
from .base import Section, at_least, choice, in_unit, positive, world_size_from_env

# cispo's importance-weight cap when epsilon_high is not given (TRL's docs, ScaleRL).
CISPO_DEFAULT_CAP = 5.0


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
    def optimizer_steps_per_batch(self) -> int:
        """Optimizer steps one generation batch trains: each mini-batch once per pass
        (``num_iterations``). ``max_steps`` and ``global_step`` count these, as TRL's do."""
        return self.optimizer_steps_per_generation * self.num_iterations

    @property
    def completions_per_generation(self) -> int:
        """Completions per generation batch, per rank (on average under Rollout-GDRO)."""
        return self.per_device_train_batch_size * self.micro_steps_per_generation

    @property
    def prompts_per_step(self) -> int:
        """Prompts per groupwise step (one generation batch), per rank."""
        return self.completions_per_generation // self.num_generations

    def validate(self) -> None:
        at_least(self, 1, "num_generations", "per_device_train_batch_size",
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
        at_least(self, 1, "steps_per_generation", optional=True)
        if spg is not None and gbs is not None:  # a TRL-resolved config fills both
            expected = self.per_device_train_batch_size * world_size_from_env() * spg
            if gbs != expected:
                raise ConfigError(
                    f"steps_per_generation={spg} and generation_batch_size={gbs} disagree: "
                    "generation_batch_size must be per_device_train_batch_size * ranks * "
                    f"steps_per_generation = {expected} (as TRL resolves them); set one of the two"
                )
        if gbs is not None:
            per_micro = self.per_device_train_batch_size * world_size_from_env()
            if gbs < 1 or gbs % per_micro:
                raise ConfigError(
                    f"generation_batch_size={gbs} must be a positive multiple of "
                    f"per_device_train_batch_size * ranks = {per_micro}"
                )
        if self.micro_steps_per_generation % self.gradient_accumulation_steps:
            raise ConfigError(self._split_step_message())

    def _split_step_message(self) -> str:
        """Why a generation batch that is not a whole number of optimizer steps is refused, and
        the nearest values that are (the generation batch's option, or the accumulation)."""
        micro, accum = self.micro_steps_per_generation, self.gradient_accumulation_steps
        per_micro = self.per_device_train_batch_size * world_size_from_env()
        below = micro // accum * accum
        steps = [n for n in (below, below + accum) if n > 0]
        if self.generation_batch_size is None:
            given = f"steps_per_generation={micro}"
            batch = " or ".join(f"steps_per_generation={n}" for n in steps)
        else:
            given = (
                f"generation_batch_size={self.generation_batch_size} ({micro} "
                f"micro-batch{'es' if micro > 1 else ''} of per_device_train_batch_size * ranks = "
                f"{per_micro})"
            )
            batch = " or ".join(f"generation_batch_size={n * per_micro}" for n in steps)
        # Accumulations that divide the generation batch and keep whole groups per step.
        divisors = [
            d
            for d in range(1, micro + 1)
            if micro % d == 0 and self.per_device_train_batch_size * d % self.num_generations == 0
        ]
        nearest = [max((d for d in divisors if d < accum), default=None),
                   min((d for d in divisors if d > accum), default=None)]  # fmt: skip
        accums = " or ".join(f"gradient_accumulation_steps={d}" for d in nearest if d)
        return (
            f"{given} is not a multiple of gradient_accumulation_steps={accum}: groupwise takes "
            "every optimizer step on the rollouts of one generation batch, so a generation "
            "batch must hold whole optimizer steps (TRL would let an optimizer step span two "
            f"generation batches, groupwise does not); use {batch}"
            + (f", or {accums}" if accums else "")
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
        if self.epsilon_high is None and self.loss_type == "cispo":
            return CISPO_DEFAULT_CAP
        return self.clip_epsilon_high

    @property
    def clip_epsilon_high(self) -> float:
        """The upper clip of a clipped surrogate whatever ``loss_type`` says (PPO's, which
        has no loss variants): epsilon_high, else epsilon."""
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

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
        positive(self, "sapo_temperature_pos", "sapo_temperature_neg")
        at_least(self, 0, "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg")
        if self.loss_type == "vespo" and self.importance_sampling_level != "token":
            raise ConfigError(
                "loss_type=vespo forms its own sequence weight from the per-token ratios; "
                "importance_sampling_level must be token"
            )
        in_unit(self, "top_entropy_quantile")
        threshold = self.off_policy_mask_threshold
        if threshold is not None and not (math.isfinite(threshold) and threshold >= 0):
            raise ConfigError(
                "off_policy_mask_threshold is a mean log-ratio bound (delta of DeepSeek-V3.2 "
                f"Eq. 9), a number >= 0 such as 0.5, or None (off); got {threshold}"
            )
        if not math.isfinite(self.entropy_coef):
            raise ConfigError(f"entropy_coef must be a finite number, got {self.entropy_coef}")
        if self.use_adaptive_entropy:
            at_least(self, 0, "entropy_coef_delta")
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
        from ..algo.variants import IMPORTANCE_SAMPLING_LEVELS, LOSSES, ROLLOUT_CORRECTION_MODES

        choice(self, "loss_type", tuple(LOSSES))
        choice(self, "importance_sampling_level", IMPORTANCE_SAMPLING_LEVELS)
        choice(self, "rollout_correction_mode", ROLLOUT_CORRECTION_MODES)
        at_least(self, 0, "beta", "epsilon")
        at_least(self, 0, "epsilon_high", "rollout_correction_clip_min",
                 "rollout_correction_clip_max", optional=True)  # fmt: skip
        # TRL's GRPOConfig refuses both (its vllm_importance_sampling_clip_min / _max).
        low, high = self.rollout_correction_clip_min, self.rollout_correction_clip_max
        if low is not None and high is not None and low >= high:
            raise ConfigError(
                f"rollout_correction_clip_min ({low}) must be less than "
                f"rollout_correction_clip_max ({high}) (TRL: vllm_importance_sampling_clip_min / "
                "_clip_max)"
            )
        if (self.rollout_correction and self.rollout_correction_mode.endswith("_truncate")
                and low is None and high is None):  # fmt: skip
            raise ConfigError(
                f"rollout_correction_mode={self.rollout_correction_mode} truncates the weight at "
                "its bounds: set rollout_correction_clip_min or rollout_correction_clip_max "
                "(TRL: vllm_importance_sampling_clip_min / _clip_max), or use a *_mask mode"
            )


@dataclass(frozen=True)
class ReferenceOptions(Section):
    """The KL reference model: where it lives and TR-DPO's update of it."""

    name: ClassVar[str] = "reference"
    sync_ref_model: bool
    ref_model_mixup_alpha: float
    ref_model_sync_steps: int
    ref_model_offload: bool

    def validate(self) -> None:
        in_unit(self, "ref_model_mixup_alpha")
        at_least(self, 1, "ref_model_sync_steps")


@dataclass(frozen=True)
class AdvantageOptions(Section):
    """How rewards become advantages and how prompts weigh in the loss."""

    name: ClassVar[str] = "advantages"
    scale_rewards: str
    multi_objective_aggregation: str
    prompt_weighting: str

    def validate(self) -> None:
        from ..algo.advantages import AGGREGATIONS, SCALE_MODES

        choice(self, "scale_rewards", SCALE_MODES)
        choice(self, "multi_objective_aggregation", AGGREGATIONS)
        choice(self, "prompt_weighting", ("rollouts", "equal"))


@dataclass(frozen=True)
class DynamicSamplingOptions(Section):
    """DAPO's dynamic sampling (verl's filter_groups)."""

    name: ClassVar[str] = "dynamic_sampling"
    dynamic_sampling: bool
    max_num_gen_batches: int
    dynamic_sampling_std_tol: float

    def validate(self) -> None:
        at_least(self, 0, "max_num_gen_batches", "dynamic_sampling_std_tol")


@dataclass(frozen=True)
class AlgorithmOptions(Section):
    """The algorithm: GRPO (critic-free) or the PPO baseline (its options: :class:`PPOOptions`)."""

    name: ClassVar[str] = "algorithm"
    algorithm: str

    def validate(self) -> None:
        choice(self, "algorithm", ("grpo", "ppo"))


@dataclass(frozen=True)
class PPOOptions(Section):
    """What only the PPO baseline reads (algorithms.md 3.6): GAE's discount and lambda, the
    value loss's weight and clip, whitening, and the critic's model and learning rate. PPO's
    policy clip, KL penalty and passes are the ``loss`` and ``batch`` sections' (``epsilon``,
    ``beta``, ``num_iterations``)."""

    name: ClassVar[str] = "ppo"
    ppo_gamma: float
    ppo_lam: float
    vf_coef: float
    cliprange_value: float
    whiten_advantages: bool
    critic_model: str | None
    critic_learning_rate: float | None

    def validate(self) -> None:
        at_least(self, 0, "ppo_gamma", "ppo_lam", "vf_coef", "cliprange_value")
        if self.ppo_gamma > 1 or self.ppo_lam > 1:
            raise ConfigError(
                f"ppo_gamma and ppo_lam must be in [0, 1], got {self.ppo_gamma}, {self.ppo_lam}"
            )
