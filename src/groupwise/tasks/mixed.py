"""A mix of tasks and difficulty levels with a heavy-tailed difficulty distribution.

Each row draws, from a seeded RNG, a task uniformly from ``tasks`` and a difficulty **rank**
``k`` in ``1..MAX_RANK`` with Zipf (power-law) weights ``k ** -exponent`` (default exponent
1.5 over 6 ranks: about 55 % rank 1, 19 % rank 2, 10 % rank 3, 7 %, 5 % and 4 % for ranks 4-6),
so most rows are easy and a long tail is hard. Rank ``k`` is the task's ``k``-th level in
:data:`groupwise.tasks.LEVELS`, clamped to its hardest level (``gsm`` has one level, so every
``gsm`` row is level 1). Rows keep ``task``, ``difficulty`` (the task's own level) and ``level``
(the rank); every row has every column of the mix, None where its task has none (the trainer
takes the column names from the first row). The problems of one ``(task, rank)`` come from one
:func:`groupwise.tasks.build_task` call with a derived seed, so splits stay disjoint.

:func:`task_reward` routes each row to its task's reward: ``accuracy`` for arithmetic and gsm,
:func:`~groupwise.tasks.countdown.countdown_reward` for countdown,
:func:`~groupwise.tasks.reasoning_gym_tasks.reasoning_gym_reward` for logic (its answer is a
sentence, which ``accuracy`` cannot compare) and ``code`` for python; None for rows of any
other task.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from ..data.splits import check_split
from ..errors import TaskSizeError
from . import CORRECTNESS_REWARDS, LEVELS, TaskRequest, _lazy, build_task

MIXED_TASKS = ("arithmetic", "countdown", "gsm", "logic", "python")
MAX_RANK = 6
ZIPF_EXPONENT = 1.5
# Keyword arguments that are not dataset columns (passed through whole, never sliced).
_NOT_COLUMNS = frozenset({"completion_ids", "trainer_state", "log_extra", "log_metric"})


def rank_weights(max_rank: int = MAX_RANK, exponent: float = ZIPF_EXPONENT) -> list[float]:
    """Normalised Zipf weights of ranks ``1..max_rank``."""
    raw = [k**-exponent for k in range(1, max_rank + 1)]
    total = sum(raw)
    return [w / total for w in raw]


def task_level(task: str, rank: int) -> int:
    levels = LEVELS[task]
    return levels[min(rank, len(levels)) - 1]


def mixed_dataset(
    num_problems: int,
    split: str = "train",
    seed: int = 0,
    tasks: Sequence[str] = MIXED_TASKS,
    exponent: float = ZIPF_EXPONENT,
    max_rank: int = MAX_RANK,
    few_shot: bool = True,
) -> list[dict[str, Any]]:
    """``num_problems`` rows of the mix (see the module docstring)."""
    check_split(split)
    tasks = list(tasks)
    unknown = [t for t in tasks if t not in LEVELS]
    if not tasks or unknown:
        raise ValueError(f"mixed: tasks must be a non-empty subset of {sorted(LEVELS)}")
    rng = random.Random(f"mixed-{split}-{seed}")
    weights = rank_weights(max_rank, exponent)
    draws = [
        (rng.choice(tasks), rng.choices(range(1, max_rank + 1), weights)[0])
        for _ in range(num_problems)
    ]
    # One build per (task, level); ranks clamped to the same level share it.
    wanted: dict[tuple[str, int], int] = {}
    for task, rank in draws:
        key = (task, task_level(task, rank))
        wanted[key] = wanted.get(key, 0) + 1
    pools = {}
    for (task, level), count in sorted(wanted.items()):
        try:
            pools[(task, level)] = iter(
                build_task(
                    task, count, split, seed=seed * 1000 + level, difficulty=level,
                    few_shot=few_shot,
                )
            )  # fmt: skip
        except TaskSizeError as err:  # one level's share is over what that level has
            raise TaskSizeError(
                "mixed",
                split,
                num_problems,
                err.maximum * num_problems // count,
                exact=False,
                hint=f" (it draws {count} of them from {task} level {level}, which has "
                f"{'about ' if not err.exact else ''}{err.maximum})",
            ) from err
    rows = []
    for task, rank in draws:
        row = next(pools[(task, task_level(task, rank))])
        row["level"] = rank
        rows.append(row)
    keys: dict[str, None] = {}
    for row in rows:
        keys.update(dict.fromkeys(row))
    return [{key: row.get(key) for key in keys} for row in rows]


def mixed_rows(request: TaskRequest) -> list[dict[str, Any]]:
    """The ``mixed`` task of :func:`~groupwise.tasks.build_task`: the default mix."""
    return mixed_dataset(
        request.num_problems, request.split, request.seed, few_shot=request.few_shot
    )


def _reward_for(task: Any) -> Any:
    """The correctness reward of ``task``'s rows; None for a task without one here."""
    ref = CORRECTNESS_REWARDS.get(task)
    return _lazy(ref) if ref is not None else None


def task_reward(
    prompts: Sequence[Any], completions: Sequence[Any], task: Sequence[Any], **columns: Any
) -> list[float | None]:
    """Each row scored by its own task's reward (see the module docstring); None where the
    task has no reward here. Columns of length ``len(completions)`` are sliced per task."""
    n = len(completions)
    if len(task) != n:
        raise ValueError(f"{len(task)} values in column 'task' for {n} completions")
    groups: dict[Any, list[int]] = {}
    for i, name in enumerate(task):
        groups.setdefault(name, []).append(i)
    scores: list[float | None] = [None] * n
    for name, idx in groups.items():
        func = _reward_for(name)
        if func is None:
            continue
        sub = {
            key: (
                [value[i] for i in idx]
                if key not in _NOT_COLUMNS and isinstance(value, (list, tuple)) and len(value) == n
                else value
            )
            for key, value in columns.items()
        }
        results = func([prompts[i] for i in idx], [completions[i] for i in idx], **sub)
        for i, score in zip(idx, results, strict=True):
            scores[i] = score
    return scores


task_reward.__name__ = "task_reward"
task_reward.is_correctness = True  # type: ignore[attr-defined]
