"""Tasks from reasoning-gym: ``gsm`` (``gsm_symbolic`` grade-school word problems) and
``logic`` (``knights_knaves`` truth-teller/liar puzzles).

Entries come from ``reasoning_gym.create_dataset(name, size=..., seed=...)`` in chunks with
derived seeds until the split has enough distinct questions; the split is by a hash of the
question. Difficulty: ``gsm`` has one level (1; its generator has no working difficulty knob),
``logic`` is the number of people (2..5, passed as ``n_people``).

Rows: ``{"prompt", "answer", "difficulty", "task", "rg_dataset", "rg_entry"}`` where
``rg_dataset`` is the reasoning-gym dataset name and ``rg_entry`` the full entry (question,
answer, metadata) **as a JSON string** (a plain string column stays Arrow-friendly whatever the
metadata holds). An entry that is not JSON-serialisable is skipped.

:func:`reasoning_gym_reward` scores the content of the completion's single ``<answer>`` block
(outside ``<think>``; see :func:`groupwise.tasks.answer_block`) with the dataset's own
``score_answer`` (``reasoning_gym.get_score_answer_fn``); that score is in [0, 1] and for some
datasets gives partial credit. No valid answer block scores 0.0; rows without ``rg_dataset`` get
None. For ``gsm`` the answer is a number, so the built-in ``accuracy`` reward also applies (the
default); the ``logic`` answer is a sentence, which ``accuracy`` cannot compare.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cache
from typing import Any

from ..data.splits import is_eval_problem
from . import TaskRequest, answer_rewards, build_task

RG_NAMES = {"gsm": "gsm_symbolic", "logic": "knights_knaves"}
Rows = list[dict[str, Any]]
CHUNK = 256

SYSTEM_PROMPTS = {
    "gsm": (
        "You are a careful math tutor. Think step by step inside <think> </think>, then give "
        "only the final number inside <answer> </answer>."
    ),
    "logic": (
        "You are a careful logician. Think step by step inside <think> </think>, then give only "
        "the final answer, in the format the question asks for, inside <answer> </answer>."
    ),
}
WORKED_EXAMPLES = {
    "gsm": (
        "Tom has 3 bags with 4 apples each. He eats 2 apples. How many apples are left? "
        "Give the result as your final answer. Do not include units.",
        "<think> 3 * 4 = 12 apples, 12 - 2 = 10 </think> <answer> 10 </answer>",
    ),
    "logic": (
        "A very special island is inhabited only by knights and knaves. Knights always tell the "
        'truth, and knaves always lie. You meet 2 inhabitants: Ann and Bob. Ann says, "Bob is a '
        'knave". Bob says, "Ann and I are both knights". So who is a knight and who is a knave? '
        '(Format your answer like: "Ann is a knight/knave, and Bob is a knight/knave")',
        "<think> If Bob were a knight, Ann would be a knight too, but then her claim that Bob is "
        "a knave would be true: impossible. So Bob is a knave, Ann's claim is true and Ann is a "
        "knight. </think> <answer> Ann is a knight, and Bob is a knave </answer>",
    ),
}


def _create(rg_name: str, size: int, seed: int, level: int) -> Any:
    import reasoning_gym

    kwargs = {"n_people": level} if rg_name == "knights_knaves" else {}
    return reasoning_gym.create_dataset(rg_name, size=size, seed=seed, **kwargs)


def reasoning_gym_dataset(name: str, num_problems: int, *args: Any, **kwargs: Any) -> Rows:
    """Rows of task ``name`` (``gsm`` or ``logic``): :func:`~groupwise.tasks.build_task` for a
    reasoning-gym task (the same options after ``num_problems``)."""
    if name not in RG_NAMES:
        raise ValueError(f"not a reasoning-gym task: {name!r}")
    return build_task(name, num_problems, *args, **kwargs)


def reasoning_gym_rows(request: TaskRequest) -> Rows:
    """Rows of task ``gsm`` or ``logic``; see the module docstring."""
    name, num_problems, level = request.task, request.num_problems, request.level
    assert level is not None
    rg_name = RG_NAMES[name]
    prompt = (SYSTEM_PROMPTS[name], WORKED_EXAMPLES[name])
    seeds = request.rng()
    seen: set[str] = set()
    rows: list[dict[str, Any]] = []
    stale = 0  # chunks in a row that added no new problem
    while len(rows) < num_problems:
        stale += 1
        if stale > 50:
            raise request.shortfall(len(rows), f" at difficulty {level}")
        before = len(rows)
        dataset = _create(rg_name, CHUNK, seeds.randrange(2**31), level)
        for i in range(len(dataset)):
            entry = dataset[i]
            question = entry["question"]
            if question in seen or is_eval_problem(question) != request.eval:
                continue
            try:
                entry_json = json.dumps(entry)
            except (TypeError, ValueError):
                continue
            seen.add(question)
            answer = str(entry["answer"])
            columns = {"rg_dataset": rg_name, "rg_entry": entry_json}
            rows.append(request.row(prompt, question, answer, level, **columns))
            if len(rows) == num_problems:
                break
        if len(rows) > before:
            stale = 0
    return rows


@cache
def _score_fn(rg_name: str) -> Any:
    import reasoning_gym

    return reasoning_gym.get_score_answer_fn(rg_name)


def reasoning_gym_reward(
    prompts: Sequence[Any],
    completions: Sequence[Any],
    rg_dataset: Sequence[Any] | None = None,
    rg_entry: Sequence[Any] | None = None,
    **kwargs: Any,
) -> list[float | None]:
    """The reasoning-gym dataset's own ``score_answer`` of the ``<answer>`` content (see the
    module docstring); 0.0 without a valid answer block, None for rows of no dataset."""
    names = None if rg_dataset is None else [name or None for name in rg_dataset]
    return answer_rewards(completions, [names, rg_entry], _score)


def _score(answer: str, rg_name: str, entry: Any) -> float:
    """The dataset's score of ``answer``, clamped to [0, 1]."""
    if isinstance(entry, str):
        entry = json.loads(entry)
    try:
        score = float(_score_fn(rg_name)(answer, entry))
    except Exception:  # a scorer crashing on odd model output: no credit
        score = 0.0
    return min(1.0, max(0.0, score))


reasoning_gym_reward.is_correctness = True  # type: ignore[attr-defined]
