"""Python function-writing problems, scored by assert tests in the code sandbox.

The problems live in ``python_problems.jsonl`` (package data, read with
:mod:`importlib.resources`): one object per line with ``name``, ``difficulty`` (1..3),
``prompt`` (the problem statement), ``tests`` (3-6 assert strings) and ``solution`` (a reference
solution that passes them all).

Answer format: ``<think> ... </think> <answer>`` followed by one fenced ````` ```python `````
block (fences on lines of their own) and ``</answer>``. The strict ``format`` reward accepts
it, and the ``code`` reward runs the completion's **last** fenced python block (so the block
inside ``<answer>`` counts, whatever the reasoning contains before it) against the row's
``tests`` column.

Rows: ``{"prompt", "answer" (the reference solution), "difficulty", "task": "python",
"tests", "entry_point" (the problem's name)}``. The split is by a hash of the problem statement;
the problem set is small (a few dozen), so when more rows are asked for than a split holds the
rows cycle through the split's problems (each pass in a seeded order).
"""

from __future__ import annotations

import functools
import json
from functools import cache
from importlib import resources
from typing import Any

from ..data.splits import check_split, is_eval_problem
from . import TaskRequest, build_task

SYSTEM_PROMPT = (
    "You are a careful Python programmer. Think step by step inside <think> </think>, then give "
    "your solution inside <answer> </answer> as a single ```python code block that defines the "
    "requested function."
)
WORKED_EXAMPLE = (
    "Write a function `double(x)` that returns twice the number `x`.",
    "<think> Multiplying by two gives twice the number. </think> <answer>\n```python\n"
    "def double(x):\n    return 2 * x\n```\n</answer>",
)
PROMPT = (SYSTEM_PROMPT, WORKED_EXAMPLE)


@cache
def load_problems() -> tuple[dict[str, Any], ...]:
    """All problems of ``python_problems.jsonl``, in file order."""
    text = resources.files(__package__).joinpath("python_problems.jsonl").read_text("utf-8")
    return tuple(json.loads(line) for line in text.splitlines() if line.strip())


def split_problems(split: str, difficulty: int | None = None) -> list[dict[str, Any]]:
    """The problems of ``split`` (at ``difficulty``, or all levels when None)."""
    want_eval = check_split(split)
    return [
        p
        for p in load_problems()
        if is_eval_problem(p["prompt"]) == want_eval
        and (difficulty is None or p["difficulty"] == difficulty)
    ]


def python_rows(request: TaskRequest) -> list[dict[str, Any]]:
    """Rows of the python task (see the module docstring)."""
    num_problems, split, difficulty = request.num_problems, request.split, request.level
    problems = split_problems(split, difficulty)
    if not problems and num_problems:
        raise ValueError(f"python task: no {split} problems at difficulty {difficulty}")
    rng = request.rng()
    rows: list[dict[str, Any]] = []
    while len(rows) < num_problems:
        order = list(problems)
        rng.shuffle(order)
        for p in order[: num_problems - len(rows)]:
            rows.append(
                request.row(
                    PROMPT,
                    p["prompt"],
                    p["solution"],
                    int(p["difficulty"]),
                    tests=list(p["tests"]),
                    entry_point=p["name"],
                )
            )
    return rows


python_dataset = functools.partial(build_task, "python")
"""``python_dataset(num_problems, split, seed, difficulty, few_shot)``: the python task's rows
(:func:`python_rows`)."""
