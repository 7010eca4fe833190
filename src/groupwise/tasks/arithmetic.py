"""The built-in arithmetic task: integer expressions with a difficulty knob (digits and
operands), held-out problems split by their text (:mod:`groupwise.data.splits`)."""

from __future__ import annotations

import functools
import itertools
import random
from typing import Any

from ..data.splits import STALL_DRAWS, check_split, is_eval_problem
from ..errors import TaskSizeError

SYSTEM_PROMPT = (
    "You are a careful calculator. Think step by step inside <think> </think>, "
    "then give only the final number inside <answer> </answer>."
)


# One worked example as a prior chat turn: SmolLM2-135M-Instruct writes no tags from a system
# prompt alone (every reward would be 0), but it copies the format from an example.
WORKED_EXAMPLE = [
    {"role": "user", "content": "What is 4 * 2 - 1?"},
    {"role": "assistant", "content": "<think> 4 * 2 = 8, 8 - 1 = 7 </think> <answer> 7 </answer>"},
]


def arithmetic_expression(rng: random.Random, digits: int, num_operands: int, ops: str) -> str:
    low = 0 if digits == 1 else 10 ** (digits - 1)
    high = 10**digits - 1
    parts = [str(rng.randint(low, high))]
    for _ in range(num_operands - 1):
        parts += [rng.choice(ops), str(rng.randint(low, high))]
    return " ".join(parts)


# Spaces up to this many expressions are counted exactly (hashing each: well under a second).
_COUNTABLE = 400_000


def _arithmetic_space(digits: int, min_operands: int, max_operands: int, ops: str) -> int:
    values = 10 if digits == 1 else 9 * 10 ** (digits - 1)
    return sum(values**k * len(ops) ** (k - 1) for k in range(min_operands, max_operands + 1))


@functools.lru_cache(maxsize=32)
def arithmetic_split_size(
    digits: int, min_operands: int, max_operands: int, ops: str, split: str,
    eval_fraction: float = 0.25,
) -> int | None:  # fmt: skip
    """How many distinct ``split`` problems the arithmetic task has with these settings (the
    split is a hash of the expression, so they are counted); None when the space is too large
    to count and far larger than any training set."""
    if _arithmetic_space(digits, min_operands, max_operands, ops) > _COUNTABLE:
        return None
    low = 0 if digits == 1 else 10 ** (digits - 1)
    numbers = [str(n) for n in range(low, 10**digits)]
    want_eval = split == "eval"
    count = 0
    for k in range(min_operands, max_operands + 1):
        for operands in itertools.product(numbers, repeat=k):
            for operators in itertools.product(ops, repeat=k - 1):
                parts = [operands[0]]
                for op, operand in zip(operators, operands[1:], strict=True):
                    parts += [op, operand]
                count += is_eval_problem(" ".join(parts), eval_fraction) == want_eval
    return count


def arithmetic_dataset(
    num_problems: int,
    split: str = "train",
    seed: int = 0,
    digits: int = 1,
    min_operands: int = 2,
    max_operands: int = 2,
    ops: str = "+-*",
    eval_fraction: float = 0.25,
    few_shot: bool = True,
) -> list[dict[str, Any]]:
    """Seeded integer arithmetic problems, e.g. ``What is 7 * 3 - 2?``, as conversational rows
    ``{"prompt", "answer", "difficulty", "expression"}``. The ``train`` and ``eval`` splits
    never share an expression. Problems are distinct within a split; if the space is too small
    for ``num_problems``, a ValueError says how many exist."""
    want_eval = check_split(split)
    if digits < 1 or min_operands < 2 or max_operands < min_operands:
        raise ValueError(
            f"need digits >= 1 and 2 <= min_operands <= max_operands, got digits={digits}, "
            f"min_operands={min_operands}, max_operands={max_operands}"
        )
    if not ops or set(ops) - set("+-*"):
        raise ValueError(f"ops must be a non-empty subset of '+-*', got {ops!r}")
    settings = f" with digits={digits}, operands {min_operands}-{max_operands}, ops={ops!r}"
    size = arithmetic_split_size(digits, min_operands, max_operands, ops, split, eval_fraction)
    if size is not None and num_problems > size:
        raise TaskSizeError("arithmetic", split, num_problems, size, hint=settings)
    rng = random.Random(f"arithmetic-{split}-{seed}")
    seen: set[str] = set()
    rows = []
    misses = 0
    while len(rows) < num_problems:
        misses += 1
        if misses > STALL_DRAWS:
            raise TaskSizeError(
                "arithmetic", split, num_problems, len(rows), exact=False, hint=settings
            )
        num_operands = rng.randint(min_operands, max_operands)
        expression = arithmetic_expression(rng, digits, num_operands, ops)
        if expression in seen or is_eval_problem(expression, eval_fraction) != want_eval:
            continue
        seen.add(expression)
        misses = 0
        value = eval(expression, {"__builtins__": {}})  # digits and + - * only: safe
        messages = [{"role": "system", "content": SYSTEM_PROMPT}]
        if few_shot:
            messages += [dict(m) for m in WORKED_EXAMPLE]
        messages.append({"role": "user", "content": f"What is {expression}?"})
        rows.append(
            {
                "prompt": messages,
                "answer": str(value),
                "difficulty": digits * 10 + num_operands,
                "expression": expression,
            }
        )
    return rows
