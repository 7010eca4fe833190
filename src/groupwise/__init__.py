"""groupwise: critic-free RL for language models (GRPO and its variants)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Each public name and the module that defines it. They are imported on first use (PEP 562):
# torch and transformers take seconds to import, and `groupwise --help` needs neither.
_EXPORTS = {
    "ConfigError": ".errors",
    "GRPOConfig": ".config",
    "group_advantages": ".algo",
    "kl_k3": ".algo",
    "pass_at_k": ".algo",
    "policy_loss": ".algo",
    "PPOTrainer": ".trainer",
    "accuracy_reward": ".rewards",
    "format_reward": ".rewards",
    "GRPOTrainer": ".trainer",
    # the rest of a TRL script's `from trl import ...` line (docs/trl.md "TRL scripts")
    "ModelConfig": ".config.trl_parser",
    "ScriptArguments": ".config.trl_parser",
    "TrlParser": ".config.trl_parser",
    "get_kbit_device_map": ".config.trl_parser",
    "get_peft_config": ".config.trl_parser",
    "get_quantization_config": ".config.trl_parser",
    "DatasetMixtureConfig": ".config.trl_datasets",
    "get_dataset": ".config.trl_datasets",
}

if TYPE_CHECKING:
    from .algo import group_advantages, kl_k3, pass_at_k, policy_loss
    from .config import GRPOConfig
    from .config.trl_datasets import DatasetMixtureConfig, get_dataset
    from .config.trl_parser import (
        ModelConfig,
        ScriptArguments,
        TrlParser,
        get_kbit_device_map,
        get_peft_config,
        get_quantization_config,
    )
    from .errors import ConfigError
    from .rewards import accuracy_reward, format_reward
    from .trainer import GRPOTrainer, PPOTrainer

__all__ = [
    "ConfigError",
    "DatasetMixtureConfig",
    "GRPOConfig",
    "GRPOTrainer",
    "ModelConfig",
    "PPOTrainer",
    "ScriptArguments",
    "TrlParser",
    "accuracy_reward",
    "format_reward",
    "get_dataset",
    "get_kbit_device_map",
    "get_peft_config",
    "get_quantization_config",
    "group_advantages",
    "kl_k3",
    "pass_at_k",
    "policy_loss",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'groupwise' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
