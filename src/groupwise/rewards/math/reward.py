"""The accuracy reward function: extraction, then verification, with counters."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ..basic import RewardFunc, completion_text
from .extract import _top_level_items, extract_final_answer
from .normalize import _normalize
from .verify import _gold_text, _verdict, restates_prompt
from .worker import _Verdict


@dataclass
class AccuracyStats:
    """Counters of one accuracy reward function, cumulative since creation or :meth:`reset`.

    ``completions``: completions scored. ``no_answer``: completions with no single final answer
    (missing, empty, several tags or candidates, only inside ``<think>``); they score 0.0.
    ``gold_unparsable``: completions whose ground truth could not be parsed; they score None.
    ``timeouts``: completions whose symbolic check timed out (or whose worker died); they score
    0.0, and a repeated identical answer counts again. ``restated``: closed-form answers equal
    to a number ground truth that restate the prompt's expression; they score 0.0. Updated
    without a lock: exact when the function is called from one thread at a time.
    """

    completions: int = 0
    no_answer: int = 0
    gold_unparsable: int = 0
    timeouts: int = 0
    restated: int = 0

    def reset(self) -> None:
        self.completions = self.no_answer = self.gold_unparsable = self.timeouts = 0
        self.restated = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def make_accuracy_reward(
    fallback_last_number: bool = False,
    timeout_s: float = 5.0,
    answer_column: str = "answer",
    float_rel_tol: float = 1e-6,
) -> RewardFunc:
    """An accuracy reward function with TRL's signature ``f(prompts, completions, **columns)``.

    It scores 1.0 when the completion's final answer (:func:`extract_final_answer`) equals the
    ``answer_column`` ground truth (:func:`verify_answer`), 0.0 otherwise, and None where the
    ground truth is missing or unparsable. A ground truth that is a list (``-2, 1``) allows a
    listed answer, compared as a set. Its counters are in ``.stats`` (:class:`AccuracyStats`).
    The name is ``accuracy_reward``, with ``_<column>`` for another column and ``_last_number``
    with the fallback, so that logs tell configurations apart.
    """
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    stats = AccuracyStats()

    def reward(prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list:
        if answer_column not in columns:
            raise TypeError(f"{name}() needs the dataset column {answer_column!r}")
        scores: list[float | None] = []
        for prompt, completion, truth in zip(
            prompts, completions, columns[answer_column], strict=True
        ):
            stats.completions += 1
            gold = _gold_text(truth)
            if gold is None:
                stats.gold_unparsable += 1
                scores.append(None)
                continue
            allow_list = len(_top_level_items(gold)) > 1
            prediction = extract_final_answer(
                completion_text(completion), fallback_last_number, allow_list=allow_list
            )
            verdict = _verdict(prediction, gold, float(timeout_s), float(float_rel_tol))
            if (
                verdict is _Verdict.CORRECT
                and prediction is not None
                and _normalize(gold).value is not None
                and restates_prompt(prediction, prompt)
            ):
                verdict = _Verdict.WRONG  # restating the question is not answering it
                stats.restated += 1
            if verdict is _Verdict.GOLD_UNPARSABLE:
                stats.gold_unparsable += 1
                scores.append(None)
                continue
            stats.no_answer += prediction is None
            stats.timeouts += verdict is _Verdict.TIMEOUT
            scores.append(1.0 if verdict is _Verdict.CORRECT else 0.0)
        return scores

    name = "accuracy_reward"
    if answer_column != "answer":
        name += f"_{answer_column}"
    if fallback_last_number:
        name += "_last_number"
    reward.__name__ = reward.__qualname__ = name
    reward.__doc__ = (
        f"1.0 if the final answer equals the {answer_column!r} column, else 0.0; None where it "
        f"is unparsable (fallback_last_number={fallback_last_number}, timeout_s={timeout_s}, "
        f"float_rel_tol={float_rel_tol}). See groupwise.rewards.math.make_accuracy_reward."
    )
    reward.stats = stats  # type: ignore[attr-defined]
    reward.is_correctness = True  # type: ignore[attr-defined]
    return reward


accuracy_reward = make_accuracy_reward()
