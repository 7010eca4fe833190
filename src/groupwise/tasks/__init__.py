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

Tasks (``difficulty`` is a level of :data:`LEVELS`; None picks :data:`DEFAULT_LEVEL`):

- ``arithmetic``: :func:`groupwise.data.arithmetic_dataset`; difficulty ``10 * digits +
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
:mod:`groupwise.build` resolves all of them by name.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from typing import Any

from ..data import is_eval_problem

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

# Loaded on first use ("module:function", relative to this package): a task's dependencies
# (reasoning-gym, the code sandbox) are imported only by runs that use it.
_DATASETS = {
    "countdown": ".countdown:countdown_dataset",
    "python": ".python_tasks:python_dataset",
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


def check_split(split: str) -> bool:
    """True for ``eval``, False for ``train``; ValueError otherwise."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    return split == "eval"


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


def build_task(
    name: str,
    num_problems: int,
    split: str = "train",
    seed: int = 0,
    difficulty: int | None = None,
    few_shot: bool = True,
) -> list[dict[str, Any]]:
    """``num_problems`` rows of task ``name`` (see the module docstring)."""
    check_split(split)
    if num_problems < 0:
        raise ValueError(f"num_problems must be >= 0, got {num_problems}")
    if name == "arithmetic":
        from ..data import arithmetic_dataset

        level = check_level(name, difficulty)
        assert level is not None
        rows = arithmetic_dataset(
            num_problems,
            split=split,
            seed=seed,
            digits=level // 10,
            min_operands=level % 10,
            max_operands=level % 10,
            few_shot=few_shot,
        )
        for row in rows:
            row["task"] = "arithmetic"
        return rows
    if name in ("gsm", "logic"):
        from .reasoning_gym_tasks import reasoning_gym_dataset

        return reasoning_gym_dataset(name, num_problems, split, seed, difficulty, few_shot)
    if name == "mixed":
        from .mixed import mixed_dataset

        return mixed_dataset(num_problems, split, seed, few_shot=few_shot)
    if name in _DATASETS:  # (num_problems, split, seed, difficulty, few_shot)
        return _lazy(_DATASETS[name])(num_problems, split, seed, difficulty, few_shot)
    raise ValueError(f"unknown task {name!r}; choose from {', '.join(TASKS)}")


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
