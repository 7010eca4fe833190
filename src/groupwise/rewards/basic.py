"""Shared helpers of the reward functions: completion text, plain numbers, names, correctness.

``completions`` is a list of strings for plain-text prompts, or a list of conversations
(``[{"role": "assistant", "content": text}]``) for conversational prompts, exactly as TRL passes
them. ``None`` means "not applicable" and becomes NaN in the trainer.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

RewardFunc = Callable[..., list[float | None]]

_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")


def completion_text(completion: Any) -> str:
    """The text of one completion, whether plain (str) or conversational (list of messages)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    raise TypeError(f"completion must be a string or a list of messages, got {type(completion)}")


def parse_number(text: str) -> float | None:
    """A plain decimal number ("7", "-3", "1,024", "2.50"); None if the text is anything else."""
    cleaned = text.strip().replace(",", "").replace(" ", "")
    if cleaned.endswith("."):
        cleaned = cleaned[:-1]
    if not _NUMBER.match(cleaned):
        return None
    value = float(cleaned)
    return value if math.isfinite(value) else None


def reward_func_name(func: RewardFunc) -> str:
    return getattr(func, "__name__", None) or type(func).__name__


def correctness_index(funcs: Sequence[Any]) -> int | None:
    """Index of the first function that scores task success (``is_correctness = True``: the
    built-in accuracy, code, countdown, reasoning-gym and task rewards, or a user's function
    marked so), or None. The monitor, curriculum, report and evaluation use that one."""
    flagged = (j for j, f in enumerate(funcs) if getattr(f, "is_correctness", False) is True)
    return next(flagged, None)
