"""Countdown: combine the given numbers, each exactly once, with ``+ - * /`` and parentheses
to reach a target.

Generation: ``difficulty`` numbers (3..6) drawn from 1..25, combined in a random order by a
random binary expression tree; a division is used only where it is exact and the target is kept
only when it is an integer in ``[1, 999]``, so every problem is solvable and the ``answer``
column holds that construction expression (one solution of possibly many).

Scoring (:func:`countdown_reward`) never calls ``eval``: :func:`evaluate` parses the answer with
:mod:`ast` and accepts only integer literals, binary ``+ - * /``, unary minus/plus and
parentheses (``**``, names, calls, floats, comparisons... are rejected), computes with exact
:class:`fractions.Fraction` arithmetic (so a non-integer intermediate such as ``(1 / 2) * 4``
is allowed when the final value equals the target), and rejects division by zero, answers longer
than :data:`MAX_EXPRESSION_CHARS`, literals above :data:`MAX_LITERAL` and any intermediate whose
numerator or denominator exceeds :data:`MAX_MAGNITUDE`.
"""

from __future__ import annotations

import ast
import functools
import random
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from ..data.splits import STALL_DRAWS, is_eval_problem
from . import TaskRequest, answer_rewards, build_task

MAX_EXPRESSION_CHARS = 200
MAX_LITERAL = 10**6
MAX_MAGNITUDE = 10**12
MAX_TARGET = 999
MAX_NUMBER = 25

SYSTEM_PROMPT = (
    "You are a careful puzzle solver. Combine the given numbers, each exactly once, with "
    "+, -, *, / and parentheses to reach the target. Think step by step inside <think> </think>, "
    "then give only the expression inside <answer> </answer>."
)
WORKED_EXAMPLE = (
    "Using the numbers [3, 5, 2], each exactly once, make 16.",
    "<think> 3 + 5 = 8, 8 * 2 = 16 </think> <answer> (3 + 5) * 2 </answer>",
)
PROMPT = (SYSTEM_PROMPT, WORKED_EXAMPLE)

_UNICODE_OPS = str.maketrans({"×": "*", "÷": "/", "−": "-", "–": "-"})


class _Invalid(Exception):
    pass


def _check(value: Fraction) -> Fraction:
    if abs(value.numerator) > MAX_MAGNITUDE or value.denominator > MAX_MAGNITUDE:
        raise _Invalid("value too large")
    return value


def _eval_node(node: ast.AST, used: list[int]) -> Fraction:
    if isinstance(node, ast.Expression):
        return _eval_node(node.body, used)
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Invalid("only integer literals")
        if value > MAX_LITERAL:
            raise _Invalid("literal too large")
        used.append(value)
        return Fraction(value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _eval_node(node.operand, used)
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
        left = _eval_node(node.left, used)
        right = _eval_node(node.right, used)
        if isinstance(node.op, ast.Add):
            return _check(left + right)
        if isinstance(node.op, ast.Sub):
            return _check(left - right)
        if isinstance(node.op, ast.Mult):
            return _check(left * right)
        if right == 0:
            raise _Invalid("division by zero")
        return _check(left / right)
    raise _Invalid(f"{type(node).__name__} not allowed")


def evaluate(expression: str) -> tuple[Fraction, list[int]] | None:
    """The exact value of an arithmetic expression and the integer literals it uses (in order),
    or None if it is not a valid, safe expression (see the module docstring)."""
    if not isinstance(expression, str) or len(expression) > MAX_EXPRESSION_CHARS:
        return None
    text = expression.translate(_UNICODE_OPS).strip()
    if not text:
        return None
    try:
        tree = ast.parse(text, mode="eval")
        used: list[int] = []
        value = _eval_node(tree, used)
    except (SyntaxError, ValueError, RecursionError, MemoryError, _Invalid):
        return None
    return value, used


def check_solution(expression: str, numbers: Sequence[int], target: int) -> bool:
    """Whether ``expression`` is valid, uses exactly the multiset ``numbers`` and equals
    ``target``. A trailing ``= <target>`` (``(3 + 5) * 2 = 16``) is tolerated."""
    if not isinstance(expression, str):
        return False
    if expression.count("=") == 1:
        expression, rhs = expression.split("=")
        if rhs.strip() != str(target):
            return False
    result = evaluate(expression)
    if result is None:
        return False
    value, used = result
    return value == target and Counter(used) == Counter(int(n) for n in numbers)


def countdown_reward(
    prompts: Sequence[Any],
    completions: Sequence[Any],
    numbers: Sequence[Any] | None = None,
    target: Sequence[Any] | None = None,
    **kwargs: Any,
) -> list[float | None]:
    """1.0 if the completion's single ``<answer>`` block (outside ``<think>``) holds an
    expression that is valid, uses exactly the row's ``numbers`` (each once, none missing or
    extra) and equals its ``target`` (:func:`check_solution`); else 0.0. None for rows without
    ``numbers``/``target`` (not applicable)."""
    return answer_rewards(
        completions,
        [numbers, target],
        lambda answer, nums, goal: 1.0 if check_solution(answer, nums, goal) else 0.0,
    )


countdown_reward.is_correctness = True  # type: ignore[attr-defined]


def random_expression(rng: random.Random, numbers: Sequence[int]) -> tuple[str, Fraction] | None:
    """A random expression using each of ``numbers`` once, with its value; divisions only where
    exact. None if no exact division was possible at some step (the caller retries)."""
    items: list[tuple[str, Fraction, bool]] = [(str(n), Fraction(n), True) for n in numbers]
    rng.shuffle(items)
    while len(items) > 1:
        i, j = rng.sample(range(len(items)), 2)
        (a_text, a, a_atom), (b_text, b, b_atom) = items[i], items[j]
        op = rng.choice("+-*/")
        if op == "/" and (b == 0 or (a / b).denominator != 1):
            op = rng.choice("+*")
        if op == "-" and a < b:
            (a_text, a, a_atom), (b_text, b, b_atom) = (b_text, b, b_atom), (a_text, a, a_atom)
        value = {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else None}[op]
        if value is None:
            return None
        left = a_text if a_atom else f"({a_text})"
        right = b_text if b_atom else f"({b_text})"
        items = [x for k, x in enumerate(items) if k not in (i, j)]
        items.append((f"{left} {op} {right}", value, False))
    return items[0][0], items[0][1]


def countdown_problem(rng: random.Random, count: int) -> tuple[list[int], int, str]:
    """``(numbers, target, solution)`` with ``count`` numbers, solvable by construction."""
    while True:
        numbers = [rng.randint(1, MAX_NUMBER) for _ in range(count)]
        built = random_expression(rng, numbers)
        if built is None:
            continue
        expression, value = built
        if value.denominator == 1 and 1 <= value <= MAX_TARGET:
            return numbers, int(value), expression


def problem_text(numbers: Sequence[int], target: int) -> str:
    return f"Using the numbers {list(numbers)}, each exactly once, make {target}."


def countdown_rows(request: TaskRequest) -> list[dict[str, Any]]:
    """Rows ``{"prompt", "answer", "difficulty", "task", "numbers", "target"}``; problems are
    distinct within a split, and the split is decided by the sorted numbers and the target (so a
    reordering of an eval problem never lands in train)."""
    count, rng = request.level, request.rng()
    assert count is not None
    seen: set[str] = set()
    rows: list[dict[str, Any]] = []
    misses = 0
    while len(rows) < request.num_problems:
        misses += 1
        if misses > STALL_DRAWS:
            raise request.shortfall(len(rows), f" with {count} numbers (difficulty {count})")
        numbers, target, solution = countdown_problem(rng, count)
        key = f"countdown {sorted(numbers)} -> {target}"
        if key in seen or is_eval_problem(key) != request.eval:
            continue
        seen.add(key)
        misses = 0
        question = problem_text(numbers, target)
        rows.append(request.row(PROMPT, question, solution, count, numbers=numbers, target=target))
    return rows


countdown_dataset = functools.partial(build_task, "countdown")
"""``countdown_dataset(num_problems, split, seed, difficulty, few_shot)``: the countdown task's
rows (:func:`countdown_rows`)."""
