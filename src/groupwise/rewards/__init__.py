"""Reward functions with TRL's signature ``f(prompts, completions, **columns) -> list[float|None]``.

Every built-in is importable from here and usable by name in ``reward_funcs`` (the names are
resolved by :mod:`groupwise.wiring.rewards`, which sits above this package: nothing here imports the
config or the tasks). A function that scores task success carries ``is_correctness = True``
(:func:`correctness_index` finds it). Modules: ``shaping`` (format, soft format, length and
repetition penalties), ``math`` (answer extraction and symbolic equivalence), ``code`` (tests run
in a sandbox), ``model`` (a learned reward model), ``remote`` (an HTTP verifier), ``combine``
(robust calls and the weighted sum).
"""

from .basic import RewardFunc, completion_text, correctness_index, parse_number, reward_func_name
from .code import code_reward, code_reward_binary, make_code_reward
from .math import accuracy_reward, extract_final_answer, make_accuracy_reward, verify_answer
from .model import RewardModel
from .remote import RemoteReward
from .scoring import RewardFunctionError, RewardScorer
from .shaping import format_reward, make_length_penalty, make_repetition_penalty, soft_format_reward

__all__ = [
    "RemoteReward",
    "RewardFunc",
    "RewardFunctionError",
    "RewardModel",
    "RewardScorer",
    "accuracy_reward",
    "code_reward",
    "code_reward_binary",
    "completion_text",
    "correctness_index",
    "extract_final_answer",
    "format_reward",
    "make_accuracy_reward",
    "make_code_reward",
    "make_length_penalty",
    "make_repetition_penalty",
    "parse_number",
    "reward_func_name",
    "soft_format_reward",
    "verify_answer",
]
