"""The run around the training: the optimizer and the run's length
(:class:`OptimizationOptions`), the machine and numerics (:class:`RuntimeOptions`), what the
run writes (:class:`LoggingOptions`), evaluation (:class:`EvaluationOptions`) and the failure
monitor (:class:`MonitorOptions`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from ..errors import ConfigError
from .base import Section, at_least, choice, positive, require

# transformers' OptimizerNames that groupwise trains with: torch's AdamW, bitsandbytes' AdamW
# with 8-bit states (two spellings) and its paged variants (policy.optimizer.OPTIMIZERS).
OPTIM_CHOICES = (
    "adamw_torch",
    "adamw_torch_fused",
    "adamw_bnb_8bit",
    "adamw_8bit",
    "paged_adamw_8bit",
    "paged_adamw_32bit",
)


@dataclass(frozen=True)
class OptimizationOptions(Section):
    """AdamW (torch's or bitsandbytes' 8-bit / paged one), its schedule and the run's length."""

    name: ClassVar[str] = "optimization"
    optim: str
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
        require(
            self,
            *(
                (n, 0.0 <= getattr(self, n) < 1.0, "in [0, 1)")
                for n in ("adam_beta1", "adam_beta2")
            ),
            ("max_grad_norm", self.max_grad_norm > 0, "> 0 (inf: no clipping)"),
        )
        choice(self, "lr_scheduler_type", ("constant", "linear", "cosine"))
        if self.optim not in OPTIM_CHOICES:
            raise ConfigError(
                f"optim={self.optim!r} is not supported: groupwise trains with AdamW, one of "
                f"{list(OPTIM_CHOICES)} (torch's, or bitsandbytes' with 8-bit / paged states)"
            )
        at_least(self, 0, "learning_rate", "warmup_steps", "weight_decay")
        if self.max_steps < 1 and self.max_steps != -1:
            raise ConfigError(
                f"max_steps must be >= 1, or -1 to train for num_train_epochs, got {self.max_steps}"
            )
        if self.max_steps == -1 and not self.num_train_epochs > 0:
            raise ConfigError(
                f"num_train_epochs must be > 0 when max_steps=-1, got {self.num_train_epochs}"
            )
        require(self, ("warmup_ratio", 0.0 <= self.warmup_ratio < 1.0, "in [0, 1)"))
        positive(self, "adam_epsilon")


@dataclass(frozen=True)
class RuntimeOptions(Section):
    """The machine and the numerics of the training forward: device, seed, precision,
    log-prob chunking, memory savers and data parallelism."""

    name: ClassVar[str] = "runtime"
    device: str
    seed: int
    bf16_autocast: bool | None
    tf32: bool | None
    logprob_chunk_size: int
    logprob_impl: str
    gradient_checkpointing: bool
    group_by_length: bool
    data_parallel: str
    padding_free: bool
    activation_offloading: bool

    def validate(self) -> None:
        if self.device not in ("auto", "cpu", "cuda") and not str(self.device).startswith("cuda:"):
            raise ConfigError(f"device={self.device!r} is not one of ['auto', 'cpu', 'cuda']")
        choice(self, "logprob_impl", ("chunked", "naive"))
        choice(self, "data_parallel", ("ddp", "fsdp"))
        at_least(self, 1, "logprob_chunk_size")
        for name in ("padding_free", "activation_offloading"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")


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
    num_completions_to_print: int | None
    completions_sample_size: int
    report_to: tuple[str, ...] | None
    run_name: str | None
    disable_tqdm: bool

    def validate(self) -> None:
        if self.output_dir is not None and not str(self.output_dir).strip():
            raise ConfigError(
                "output_dir is empty; name the folder the run writes its model, config, "
                "metrics and checkpoints to, e.g. --output_dir runs/my-run"
            )
        choice(self, "save_strategy", ("steps", "epoch", "no"))
        positive(self, "logging_steps")  # below 1: a ratio of max_steps (transformers')
        at_least(self, 0, "save_steps", "log_completions_steps")
        at_least(self, 0, "num_completions_to_print", optional=True)  # None: all
        at_least(self, 1, "save_total_limit", optional=True)
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
        choice(self, "eval_strategy", ("steps", "epoch", "no"))
        at_least(self, 1, "per_device_eval_batch_size")
        at_least(self, 0, "eval_steps")
        if self.eval_ks is not None:
            bad = [k for k in self.eval_ks if k < 1 or k > max(self.eval_num_generations, 1)]
            if bad:
                raise ConfigError(
                    f"eval_ks {bad}: each k of pass@k must be in 1..eval_num_generations "
                    f"({self.eval_num_generations}); raise eval_num_generations or lower k"
                )


@dataclass(frozen=True)
class MonitorOptions(Section):
    """The failure monitor's thresholds (:class:`groupwise.trainer.monitor.TrainingMonitor`)."""

    name: ClassVar[str] = "monitor"
    max_bad_steps: int
    warn_zero_std_fraction: float
    warn_zero_std_steps: int
    warn_entropy_min: float
    warn_kl_max: float

    def validate(self) -> None:
        at_least(self, 0, "max_bad_steps", "warn_zero_std_steps")
