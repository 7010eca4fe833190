"""Reward functions with TRL's signature ``f(prompts, completions, **columns) -> list[float|None]``.

Importable from here and usable by name in ``reward_funcs`` (see :data:`REWARD_FUNCS`).
"""

from .basic import (
    REWARD_FUNCS,
    RewardFunc,
    accuracy_reward,
    completion_text,
    extract_answer,
    format_reward,
    get_reward_func,
    parse_number,
    reward_func_name,
)

__all__ = [
    "REWARD_FUNCS",
    "RewardFunc",
    "accuracy_reward",
    "completion_text",
    "extract_answer",
    "format_reward",
    "get_reward_func",
    "parse_number",
    "reward_func_name",
]
