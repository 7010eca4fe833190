"""The run's inputs: the model trained (:class:`ModelOptions`), the prompts
(:class:`DataOptions`), the rewards (:class:`RewardOptions`) and the tools or environment of
multi-turn rollouts (:class:`ToolOptions`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from ..errors import ConfigError
from .base import Section, at_least, choice, in_unit, positive, require


@dataclass(frozen=True)
class ModelOptions(Section):
    """What is loaded and trained: the model, its weights' dtype and attention kernel, LoRA,
    QLoRA's 4-bit base."""

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
    load_in_4bit: bool
    bnb_4bit_quant_type: str
    use_bnb_nested_quant: bool

    def validate(self) -> None:
        choice(self, "dtype", ("auto", "float32", "bfloat16"))
        choice(self, "bnb_4bit_quant_type", ("nf4", "fp4"))
        if self.load_in_4bit and not self.use_peft:
            raise ConfigError(
                "load_in_4bit=True needs use_peft=True: a 4-bit base is frozen (its weights are "
                "quantised constants, not parameters an optimizer can step), so only a LoRA "
                "adapter on top of it can train (QLoRA)"
            )
        if self.load_in_4bit and self.save_merged_model:
            raise ConfigError(
                "save_merged_model=True with load_in_4bit=True is not supported: merging into "
                "the 4-bit base would quantise the merged weights again; the run saves the "
                "adapter, which groupwise (and peft) load merged into the unquantised base"
            )
        choice(self, "attn_implementation", ("sdpa", "eager", "flash_attention_2"))
        at_least(self, 0, "lora_dropout")
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
        choice(self, "on_invalid_rows", ("error", "skip"))
        choice(self, "long_prompts", ("truncate", "skip", "error"))
        at_least(self, 1, "num_train_prompts")
        at_least(self, 0, "num_eval_prompts")
        at_least(self, 1, "max_prompt_length", optional=True)


@dataclass(frozen=True)
class RewardOptions(Section):
    """The reward functions, their weights, failure tolerance and the shaping rewards' options."""

    name: ClassVar[str] = "rewards"
    reward_funcs: tuple[str, ...] | None
    reward_weights: tuple[float, ...] | None
    reward_max_failure_fraction: float
    reward_timeout: float | None
    slow_call_warning: float | None
    accuracy_timeout: float
    overlong_buffer_len: int | None
    overlong_penalty_factor: float
    repetition_ngram_size: int
    repetition_max_penalty: float
    code_timeout: float
    remote_timeout: float

    def validate(self) -> None:
        in_unit(self, "reward_max_failure_fraction")
        timeout = self.reward_timeout
        require(self, ("reward_timeout", timeout is None or timeout > 0, "> 0 seconds or null"))
        slow = self.slow_call_warning
        require(self, ("slow_call_warning", slow is None or slow >= 0, ">= 0 seconds or null"))
        positive(self, "accuracy_timeout", "code_timeout", "remote_timeout", unit=" seconds")
        require(self, ("repetition_max_penalty", self.repetition_max_penalty <= 0, "<= 0"))
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
        at_least(self, 1, "max_turns", "max_tool_calls", "max_tool_output_tokens")
        positive(self, "tool_timeout", unit=" seconds")
