"""TRL's reward functions (``trl.rewards``, TRL 1.16) with TRL's names, signatures and outputs, so
that a script's ``from trl.rewards import ...`` becomes ``from groupwise.rewards.trl_rewards
import ...`` (docs/trl.md "TRL scripts").

They live apart from :mod:`groupwise.rewards` because two names would clash with different
meanings: TRL's ``accuracy_reward`` reads the ``solution`` column and takes the first LaTeX answer
math-verify finds (a ``\\boxed{}`` first), where groupwise's reads ``answer`` with the stricter
extraction of :mod:`groupwise.rewards.math`. The accuracy rewards here call math-verify with
TRL's own extraction settings, so they score exactly as TRL does.

- :func:`accuracy_reward`, :func:`reasoning_accuracy_reward`: 1.0 / 0.0 by math-verify, None
  where the gold solution does not parse (the example is then left out of the reward).
- :func:`think_format_reward`: 1.0 when the completion starts with one ``<think>...</think>``.
- :func:`get_soft_overlong_punishment`: DAPO eq. 13 (arXiv:2503.14476), on token counts.
- :func:`get_repetition_penalty_reward`, :func:`get_cosine_scaled_reward`: "Demystifying Long
  Chain-of-Thought Reasoning" (arXiv:2502.03373) App. C.2 and C.1.
"""

from __future__ import annotations

import logging
import math
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "accuracy_reward",
    "get_cosine_scaled_reward",
    "get_repetition_penalty_reward",
    "get_soft_overlong_punishment",
    "reasoning_accuracy_reward",
    "think_format_reward",
]

LogExtra = Callable[[str, list], None]


def _contents(completions: Sequence[Any]) -> list[str]:
    """TRL's conversational completions ``[{"role": "assistant", "content": ...}]``; plain text
    completions (a standard-format dataset) are taken as they are."""
    return [c if isinstance(c, str) else c[0]["content"] for c in completions]


def _timeouts() -> tuple[int | None, int | None]:
    """math-verify's (parse, verify) timeouts in seconds: they use SIGALRM, which only the main
    thread may set, so elsewhere they are off (TRL does the same)."""
    if threading.current_thread() is threading.main_thread():
        return 10, 5
    logging.getLogger("math_verify.parser").setLevel(logging.ERROR)
    logging.getLogger("math_verify.grader").setLevel(logging.ERROR)
    return None, None


def _verify(content: str, sol: str, parse_s: int | None, verify_s: int | None) -> tuple:
    """(reward, gold as parsed, answer as parsed) for one completion; reward None where the gold
    solution does not parse. The answer must be well-formed LaTeX, a ``\\boxed{}`` tried first,
    the first match kept (TRL's extraction settings)."""
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import LatexExtractionConfig, parse, verify

    gold = parse(sol, parsing_timeout=parse_s)
    if len(gold) == 0:
        return None, "[unparseable]", "[skipped]"
    config = LatexExtractionConfig(
        normalization_config=NormalizationConfig(units=True),
        boxed_match_priority=0,
        try_extract_without_anchor=False,
    )
    answer = parse(content, extraction_config=[config], extraction_mode="first_match",
                   parsing_timeout=parse_s)  # fmt: skip
    reward = float(verify(gold, answer, timeout_seconds=verify_s))
    return reward, str(gold), str(answer) if answer else "[unparseable]"


def _log(log_extra: LogExtra | None, solution: Sequence[str], golds: list, answers: list) -> None:
    if log_extra is not None:  # extra columns of the completions table
        log_extra("solution", list(solution))
        log_extra("gold_parsed", golds)
        log_extra("answer_parsed", answers)


def accuracy_reward(
    completions: Sequence[Any],
    solution: Sequence[str],
    log_extra: LogExtra | None = None,
    **kwargs: Any,
) -> list[float | None]:
    """TRL's ``accuracy_reward``: 1.0 when the completion's answer is math-verify-equal to the
    ``solution`` column, 0.0 otherwise, None where the solution does not parse."""
    parse_s, verify_s = _timeouts()
    rewards, golds, answers = [], [], []
    for content, sol in zip(_contents(completions), solution, strict=True):
        reward, gold, answer = _verify(content, sol, parse_s, verify_s)
        rewards.append(reward)
        golds.append(gold)
        answers.append(answer)
    _log(log_extra, solution, golds, answers)
    return rewards


def reasoning_accuracy_reward(
    completions: Sequence[Any],
    solution: Sequence[str],
    reasoning_delimiters: Sequence[str] | None = None,
    log_extra: LogExtra | None = None,
    **kwargs: Any,
) -> list[float | None]:
    """TRL's ``reasoning_accuracy_reward``: :func:`accuracy_reward` on the text after the last
    occurrence of the first delimiter found (default ``</think>``); 0.0 (not None: unfinished
    reasoning is penalised) when no delimiter occurs."""
    delimiters = ["</think>"] if reasoning_delimiters is None else list(reasoning_delimiters)
    parse_s, verify_s = _timeouts()
    rewards, golds, answers = [], [], []
    for content, sol in zip(_contents(completions), solution, strict=True):
        delim = next((d for d in delimiters if d in content), None)
        if delim is None:
            rewards.append(0.0)
            golds.append("[incomplete reasoning]")
            answers.append("[incomplete reasoning]")
            continue
        reward, gold, answer = _verify(content.split(delim)[-1], sol, parse_s, verify_s)
        rewards.append(reward)
        golds.append(gold)
        answers.append(answer)
    _log(log_extra, solution, golds, answers)
    return rewards


# Both score task success: groupwise's success rate and curricula read them (rewards.basic).
accuracy_reward.is_correctness = True  # type: ignore[attr-defined]
reasoning_accuracy_reward.is_correctness = True  # type: ignore[attr-defined]

_THINK = re.compile(r"^<think>(?!.*<think>)(.*?)</think>.*$", re.DOTALL | re.MULTILINE)


def think_format_reward(completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """TRL's ``think_format_reward``: 1.0 when the completion opens with ``<think>``, closes it
    with ``</think>`` and has no second ``<think>``; else 0.0."""
    return [1.0 if _THINK.match(content) else 0.0 for content in _contents(completions)]


class _SoftOverlongPunishment:
    """A class, not a closure, so that the function pickles (as TRL's); ``__name__`` is TRL's,
    so the logged metric keys match a TRL run's."""

    __name__ = "soft_overlong_punishment_reward"

    def __init__(self, max_completion_len: int, soft_punish_cache: int) -> None:
        self.max_completion_len = max_completion_len
        self.soft_punish_cache = soft_punish_cache

    def __call__(self, completion_ids: Sequence[Sequence[int]], **kwargs: Any) -> list[float]:
        start = self.max_completion_len - self.soft_punish_cache  # L_max - L_cache
        rewards = []
        for ids in completion_ids:
            n = len(ids)
            if n <= start:
                rewards.append(0.0)
            elif n <= self.max_completion_len:  # linear from 0 down to -1 over the cache
                rewards.append((start - n) / self.soft_punish_cache)
            else:
                rewards.append(-1.0)
        return rewards


def get_soft_overlong_punishment(max_completion_len: int, soft_punish_cache: int) -> Callable:
    """TRL's ``get_soft_overlong_punishment``: DAPO's soft overlong punishment (eq. 13), 0 up to
    ``L_max - L_cache`` tokens, ``((L_max - L_cache) - |y|) / L_cache`` up to ``L_max``, -1
    beyond."""
    return _SoftOverlongPunishment(max_completion_len, soft_punish_cache)


class _RepetitionPenalty:
    __name__ = "repetition_penalty_reward"

    def __init__(self, ngram_size: int, max_penalty: float) -> None:
        self.ngram_size = ngram_size
        self.max_penalty = max_penalty

    def __call__(self, completion_ids: Sequence[Sequence[int]], **kwargs: Any) -> list[float]:
        rewards = []
        for ids in completion_ids:
            ids = list(ids)
            if len(ids) < self.ngram_size:
                rewards.append(0.0)
                continue
            ngrams = [tuple(ids[i : i + self.ngram_size])
                      for i in range(len(ids) - self.ngram_size + 1)]  # fmt: skip
            repeated = 1 - len(set(ngrams)) / len(ngrams)
            rewards.append(repeated * self.max_penalty if repeated else 0.0)
        return rewards


def get_repetition_penalty_reward(ngram_size: int = 3, max_penalty: float = -1.0) -> Callable:
    """TRL's ``get_repetition_penalty_reward``: ``(1 - unique / total token n-grams) *
    max_penalty`` (0.0 under ``ngram_size`` tokens), arXiv:2502.03373 App. C.2."""
    if max_penalty > 0:
        raise ValueError(f"max_penalty {max_penalty} should not be positive")
    return _RepetitionPenalty(ngram_size, max_penalty)


class _CosineScaledReward:
    __name__ = "cosine_scaled_reward"

    def __init__(self, max_len: int, min_value_wrong: float, max_value_wrong: float,
                 min_value_correct: float, max_value_correct: float) -> None:  # fmt: skip
        self.max_len = max_len
        self.wrong = (max_value_wrong, min_value_wrong)  # swapped: shorter wrong is worse
        self.correct = (min_value_correct, max_value_correct)

    def __call__(
        self,
        completions: Sequence[Any],
        solution: Sequence[str],
        completion_ids: Sequence[Sequence[int]],
        **kwargs: Any,
    ) -> list[float | None]:
        rewards: list[float | None] = []
        correct = accuracy_reward(completions, solution)
        for is_correct, ids in zip(correct, completion_ids, strict=True):
            if is_correct is None:
                rewards.append(None)
                continue
            # Clamped at 1: cos is periodic, past max_len the schedule would climb back.
            progress = min(len(ids) / self.max_len, 1.0)
            low, high = self.correct if is_correct else self.wrong
            rewards.append(float(low + 0.5 * (high - low) * (1.0 + math.cos(progress * math.pi))))
        return rewards


def get_cosine_scaled_reward(
    max_len: int,
    min_value_wrong: float = -1.0,
    max_value_wrong: float = -0.5,
    min_value_correct: float = 0.5,
    max_value_correct: float = 1.0,
) -> Callable:
    """TRL's ``get_cosine_scaled_reward``: correctness (:func:`accuracy_reward`) scaled by the
    token length on a cosine schedule, ``v_min + (v_max - v_min)(1 + cos(pi |y| / L_max)) / 2``
    (arXiv:2502.03373 App. C.1): shorter correct answers earn more, shorter wrong ones lose more."""
    return _CosineScaledReward(max_len, min_value_wrong, max_value_wrong,
                               min_value_correct, max_value_correct)  # fmt: skip
