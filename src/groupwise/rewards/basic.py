"""Reward functions with TRL's signature ``f(prompts, completions, **columns) -> list[float|None]``.

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

_THINK_ANSWER = re.compile(
    r"^\s*<think>(?P<think>.*?)</think>\s*<answer>(?P<answer>.*?)</answer>\s*$", re.DOTALL
)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")


def completion_text(completion: Any) -> str:
    """The text of one completion, whether plain (str) or conversational (list of messages)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    raise TypeError(f"completion must be a string or a list of messages, got {type(completion)}")


def format_reward(prompts: Sequence[Any], completions: Sequence[Any], **kwargs) -> list[float]:
    """1.0 if the completion is exactly one ``<think>...</think>`` block followed by exactly one
    ``<answer>...</answer>`` block (only whitespace around them), else 0.0."""
    scores = []
    for completion in completions:
        text = completion_text(completion)
        match = _THINK_ANSWER.match(text)
        ok = (
            match is not None
            and text.count("<think>") == 1
            and text.count("</think>") == 1
            and text.count("<answer>") == 1
            and text.count("</answer>") == 1
        )
        scores.append(1.0 if ok else 0.0)
    return scores


def extract_answer(text: str) -> str | None:
    """Content of the last ``<answer>...</answer>`` block, stripped; None if there is none."""
    found = _ANSWER.findall(text)
    return found[-1].strip() if found else None


def parse_number(text: str) -> float | None:
    """A plain decimal number ("7", "-3", "1,024", "2.50"); None if the text is anything else."""
    cleaned = text.strip().replace(",", "").replace(" ", "")
    if cleaned.endswith("."):
        cleaned = cleaned[:-1]
    if not _NUMBER.match(cleaned):
        return None
    value = float(cleaned)
    return value if math.isfinite(value) else None


def accuracy_reward(
    prompts: Sequence[Any], completions: Sequence[Any], answer: Sequence[Any], **kwargs
) -> list[float | None]:
    """1.0 if the number inside the last ``<answer>`` block equals the ground truth ``answer``
    column as a number, else 0.0; None for rows whose ground truth is not a number."""
    scores: list[float | None] = []
    for completion, truth in zip(completions, answer, strict=True):
        target = parse_number(str(truth))
        if target is None:
            scores.append(None)
            continue
        given = extract_answer(completion_text(completion))
        value = parse_number(given) if given is not None else None
        # Integers compare exactly (a relative tolerance would accept 1000000001 for 1e9).
        ok = value is not None and (
            value == target
            if value.is_integer() and target.is_integer()
            else math.isclose(value, target, rel_tol=0.0, abs_tol=1e-9)
        )
        scores.append(1.0 if ok else 0.0)
    return scores


REWARD_FUNCS: dict[str, RewardFunc] = {
    "format": format_reward,
    "accuracy": accuracy_reward,
}


def get_reward_func(spec: str | RewardFunc) -> RewardFunc:
    """A reward function by built-in name (``format``, ``accuracy``), or a callable as is."""
    if callable(spec):
        return spec
    if spec in REWARD_FUNCS:
        return REWARD_FUNCS[spec]
    raise ValueError(f"unknown reward function {spec!r}; built-in ones are {sorted(REWARD_FUNCS)}")


def reward_func_name(func: RewardFunc) -> str:
    return getattr(func, "__name__", None) or type(func).__name__
