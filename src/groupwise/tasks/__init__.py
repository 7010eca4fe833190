"""Task registry: seeded prompt datasets with their default rewards.

Every task row is a dict with

- ``prompt``: a conversation ``[system, (worked example user, assistant), user]``; the system
  prompt asks for reasoning inside ``<think> </think>`` and the result inside
  ``<answer> </answer>``; with ``few_shot`` one worked example turn precedes the question;
- ``answer`` (str): the gold answer (for ``countdown`` one valid expression, for ``python``
  the reference solution);
- ``difficulty`` (int, higher = harder; the scale is per task, see :data:`LEVELS`);
- ``task``: the task name; plus task columns that reach reward functions by name.

Splits: a problem is in ``eval`` when a hash of its text falls below ``eval_fraction`` (0.25),
so ``train`` and ``eval`` never share a problem whatever the seed or size. Generation is
deterministic for a given ``(num_problems, split, seed, difficulty, few_shot)``.

:func:`build_task` checks the split, the count and the level once for every task and hands the
checked call (a :class:`TaskRequest`: its seeded generator, its row layout) to the task's row
builder (:data:`_DATASETS`); ``countdown_dataset`` and ``python_dataset`` are ``build_task`` of
their task.

Tasks (``difficulty`` is a level of :data:`LEVELS`; None picks :data:`DEFAULT_LEVEL`):

- ``arithmetic``: :func:`groupwise.tasks.arithmetic.arithmetic_dataset`; difficulty ``10 * digits +
  operands`` (as that function reports it), e.g. 12 = one digit, two operands (default).
- ``countdown``: reach a target with each given number once (:mod:`.countdown`); difficulty =
  how many numbers (3..6, default 4).
- ``python``: write a function, scored by its assert tests in a sandbox
  (:mod:`.python_tasks`); difficulty 1..3, None = all problems.
- ``gsm``: reasoning-gym ``gsm_symbolic`` word problems; one level (1).
- ``logic``: reasoning-gym ``knights_knaves``; difficulty = number of people (2..5, default 2).
- ``mixed``: a heavy-tailed mix of the above (:mod:`.mixed`); ``difficulty`` is ignored.

Reward names (:func:`task_reward_funcs`): ``format`` and ``accuracy`` / ``code`` are the
built-ins of :mod:`groupwise.rewards`; ``countdown``, ``reasoning_gym`` and ``task`` are this
package's (:func:`task_reward_func` returns them by name; each is marked ``is_correctness``).
:mod:`groupwise.wiring.rewards` resolves all of them by name.
"""

from __future__ import annotations

import importlib
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..data.splits import check_split, is_eval_problem
from ..errors import TaskSizeError
from ..rewards.basic import completion_text
from .arithmetic import arithmetic_dataset

TASKS = ("arithmetic", "countdown", "gsm", "logic", "python", "mixed")

LEVELS: dict[str, tuple[int, ...]] = {
    "arithmetic": (12, 13, 22, 23, 32, 33),
    "countdown": (3, 4, 5, 6),
    "gsm": (1,),
    "logic": (2, 3, 4, 5),
    "python": (1, 2, 3),
}
DEFAULT_LEVEL: dict[str, int | None] = {
    "arithmetic": 12,
    "countdown": 4,
    "gsm": 1,
    "logic": 2,
    "python": None,
}
EVAL_FRACTION = 0.25
MAX_ANSWER_CHARS = 1000

_REWARD_FUNCS = {
    "arithmetic": ["format", "accuracy"],
    "countdown": ["format", "countdown"],
    "gsm": ["format", "accuracy"],
    "logic": ["format", "reasoning_gym"],
    "python": ["code"],
    "mixed": ["format", "task"],
}

# Each task's row builder (a :class:`TaskRequest` -> rows), loaded on first use ("module:function",
# relative to this package): a task's dependencies (reasoning-gym, the code sandbox) are
# imported only by runs that use it.
_DATASETS = {
    "arithmetic": ".:arithmetic_rows",
    "countdown": ".countdown:countdown_rows",
    "gsm": ".reasoning_gym_tasks:reasoning_gym_rows",
    "logic": ".reasoning_gym_tasks:reasoning_gym_rows",
    "python": ".python_tasks:python_rows",
    "mixed": ".mixed:mixed_rows",
}
_TASK_REWARDS = {
    "countdown": ".countdown:countdown_reward",
    "reasoning_gym": ".reasoning_gym_tasks:reasoning_gym_reward",
    "task": ".mixed:task_reward",
}
# The correctness reward of each task's rows (mixed.task_reward routes rows by it).
CORRECTNESS_REWARDS = {
    "arithmetic": "..rewards.math:accuracy_reward",
    "gsm": "..rewards.math:accuracy_reward",
    "countdown": _TASK_REWARDS["countdown"],
    "logic": _TASK_REWARDS["reasoning_gym"],
    "python": "..rewards.code:code_reward",
}

_ANSWER_OPEN, _ANSWER_CLOSE = "<answer>", "</answer>"
_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL)


def _lazy(ref: str) -> Callable[..., Any]:
    """The function ``module:function`` names, importing its module relative to this package."""
    module, _, function = ref.partition(":")
    return getattr(importlib.import_module(module, __name__), function)


def chat_prompt(
    system: str, question: str, example: tuple[str, str] | None, few_shot: bool
) -> list[dict[str, str]]:
    """The conversation ``[system, (example user, example assistant), user]``."""
    messages = [{"role": "system", "content": system}]
    if few_shot and example is not None:
        messages += [
            {"role": "user", "content": example[0]},
            {"role": "assistant", "content": example[1]},
        ]
    messages.append({"role": "user", "content": question})
    return messages


def answer_block(text: str) -> str | None:
    """The stripped content of the completion's single ``<answer>...</answer>`` block outside
    ``<think>`` blocks; None if there is no such block, several, an unclosed one, an empty one
    or one longer than :data:`MAX_ANSWER_CHARS`."""
    visible = _THINK_BLOCK.sub(" ", text)
    if visible.count(_ANSWER_OPEN) != 1 or visible.count(_ANSWER_CLOSE) != 1:
        return None
    start, end = visible.find(_ANSWER_OPEN), visible.find(_ANSWER_CLOSE)
    if end < start:
        return None
    content = visible[start + len(_ANSWER_OPEN) : end].strip()
    if not content or len(content) > MAX_ANSWER_CHARS:
        return None
    return content


def level_name(task: str | None, level: Any) -> str:
    """A difficulty level in words, for tables: ``12`` of arithmetic is "1-digit operands, 2
    operands"; a level of a task without a known scale is ``difficulty <level>``."""
    try:
        value = int(level)
    except (TypeError, ValueError):
        return f"difficulty {level}"
    if task == "arithmetic" and value >= 10:
        digits, operands = divmod(value, 10)
        return f"{digits}-digit operands, {operands} operands"
    if task == "countdown":
        return f"{value} numbers"
    if task == "logic":
        return f"{value} people"
    if task == "python":
        return f"level {value} of 3"
    if task == "gsm":
        return "word problems"
    return f"difficulty {value}"


def check_level(task: str, difficulty: int | None) -> int | None:
    """The level to generate at: ``difficulty`` checked against :data:`LEVELS`, or the
    task's default when None."""
    if difficulty is None:
        return DEFAULT_LEVEL[task]
    if difficulty not in LEVELS[task]:
        raise ValueError(
            f"{task} task: difficulty must be one of {LEVELS[task]}, got {difficulty!r}"
        )
    return int(difficulty)


@dataclass(frozen=True)
class TaskRequest:
    """One :func:`build_task` call, checked: what a task's row builder gets."""

    task: str
    num_problems: int  # >= 0
    split: str  # "train" or "eval"
    seed: int
    level: int | None  # the difficulty, checked against LEVELS (None: all levels, or no scale)
    few_shot: bool

    @property
    def eval(self) -> bool:
        return self.split == "eval"

    def rng(self) -> random.Random:
        """The task's seeded generator: one stream per (task, split, seed, level)."""
        return random.Random(f"{self.task}-{self.split}-{self.seed}-{self.level}")

    def shortfall(self, got: int, hint: str) -> TaskSizeError:
        """The error for a split that stopped yielding new problems after ``got`` rows."""
        return TaskSizeError(self.task, self.split, self.num_problems, got, exact=False, hint=hint)

    def row(
        self,
        prompt: tuple[str, tuple[str, str]],
        question: str,
        answer: str,
        difficulty: int,
        **columns: Any,
    ) -> dict[str, Any]:
        """A row of the task: ``question`` as a conversation under ``prompt`` (the system prompt
        and the worked example, shown with ``few_shot``), plus the task's own ``columns``."""
        system, example = prompt
        return {
            "prompt": chat_prompt(system, question, example, self.few_shot),
            "answer": answer,
            "difficulty": difficulty,
            "task": self.task,
            **columns,
        }


def arithmetic_rows(request: TaskRequest) -> list[dict[str, Any]]:
    """Rows of the arithmetic task: :func:`groupwise.tasks.arithmetic.arithmetic_dataset` at the
    level's digits (tens) and operands (units)."""
    level = request.level
    assert level is not None
    rows = arithmetic_dataset(
        request.num_problems,
        split=request.split,
        seed=request.seed,
        digits=level // 10,
        min_operands=level % 10,
        max_operands=level % 10,
        few_shot=request.few_shot,
    )
    for row in rows:
        row["task"] = "arithmetic"
    return rows


def build_task(
    name: str,
    num_problems: int,
    split: str = "train",
    seed: int = 0,
    difficulty: int | None = None,
    few_shot: bool = True,
) -> list[dict[str, Any]]:
    """``num_problems`` rows of task ``name`` (see the module docstring); ``mixed`` ignores
    ``difficulty``."""
    if name not in _DATASETS:
        raise ValueError(f"unknown task {name!r}; choose from {', '.join(TASKS)}")
    check_split(split)
    if num_problems < 0:
        raise ValueError(f"num_problems must be >= 0, got {num_problems}")
    level = check_level(name, difficulty) if name in LEVELS else None
    return _lazy(_DATASETS[name])(TaskRequest(name, num_problems, split, seed, level, few_shot))


def answer_rewards(
    completions: Sequence[Any],
    columns: Sequence[Sequence[Any] | None],
    score: Callable[..., float],
) -> list[float | None]:
    """A correctness reward over each completion's single answer block (:func:`answer_block`):
    None for every row when a column is missing and for a row with a None value in one; 0.0
    for a completion without a valid answer block; else ``score(answer, *the row's values)``."""
    if any(column is None for column in columns):
        return [None] * len(completions)
    scores: list[float | None] = []
    for completion, *values in zip(completions, *columns, strict=True):  # type: ignore[arg-type]
        if any(value is None for value in values):
            scores.append(None)
            continue
        answer = answer_block(completion_text(completion))
        scores.append(0.0 if answer is None else score(answer, *values))
    return scores


def task_reward_funcs(name: str) -> list[str]:
    """The default reward function names of task ``name``."""
    if name not in _REWARD_FUNCS:
        raise ValueError(f"unknown task {name!r}; choose from {', '.join(TASKS)}")
    return list(_REWARD_FUNCS[name])


def task_reward_func(name: str) -> Callable[..., list[float | None]]:
    """This package's reward functions by name: ``countdown``, ``reasoning_gym``, ``task``."""
    if name not in _TASK_REWARDS:
        raise ValueError(f"unknown task reward {name!r}; choose from {', '.join(_TASK_REWARDS)}")
    return _lazy(_TASK_REWARDS[name])


__all__ = [
    "arithmetic_dataset",
    "DEFAULT_LEVEL",
    "LEVELS",
    "level_name",
    "TASKS",
    "answer_block",
    "is_eval_problem",
    "build_task",
    "task_reward_func",
    "task_reward_funcs",
]
