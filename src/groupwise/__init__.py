"""groupwise: critic-free RL for language models (GRPO and its variants)."""

from .config import ConfigError, GRPOConfig
from .core import group_advantages, kl_k3, pass_at_k, policy_loss
from .ppo import PPOTrainer
from .rewards import accuracy_reward, format_reward
from .trainer import GRPOTrainer

__all__ = [
    "ConfigError",
    "GRPOConfig",
    "GRPOTrainer",
    "PPOTrainer",
    "accuracy_reward",
    "format_reward",
    "group_advantages",
    "kl_k3",
    "pass_at_k",
    "policy_loss",
]
__version__ = "0.1.0"
