"""Shaping rewards: strict and soft format, DAPO soft overlong punishment, n-gram repetition.

All functions have TRL's signature ``f(prompts, completions, **columns) -> list[float]``;
``completions`` are strings or conversations (``[{"role": "assistant", "content": text}]``).

GRPO normalizes rewards within each group, so *any* reward difference between completions of
one prompt becomes a gradient, however small or unintended. A loophole that earns credit
without solving the task (an empty answer that is "well formatted", a padded completion, a
looped sentence) is therefore found and amplified quickly. Each function closes the loopholes
listed here:

- :func:`format_reward` (strict, 1.0 or 0.0). Exactly one ``<think>...</think>`` block and then
  exactly one ``<answer>...</answer>`` block, only whitespace before, between and after them.
  **Guard (on by default):** both blocks must contain non-whitespace content. Otherwise the
  cheapest way to earn format credit is ``<think></think><answer></answer>``, which a policy
  learns in a few steps and which then drowns the accuracy signal (every short empty completion
  in a group beats a long failed attempt). :func:`make_format_reward` with
  ``require_content=False`` gives the unguarded version.
- :func:`soft_format_reward` (0, 0.25, 0.5, 0.75 or 1.0). Partial credit per tag, for models
  that do not yet produce the format at all. 0.25 each for:

  1. ``<think>`` appearing exactly once;
  2. ``</think>`` appearing exactly once, *and* ``<think>`` appearing exactly once before it;
  3. ``<answer>`` appearing exactly once, *and* ``</think>`` appearing exactly once before it;
  4. ``</answer>`` appearing exactly once, *and* ``<answer>`` appearing exactly once before it.

  Each order condition looks at the preceding tag only (a tag whose predecessor is missing or
  repeated gets no credit, since "after it" is then undefined). Whitespace is free, as in the
  strict format. **Guards:** a tag only counts when it appears exactly once, so repeating tags
  earns nothing; and a completion that is nothing but these tags and whitespace scores 0, so an
  empty skeleton ``<think></think><answer></answer>`` is worth nothing. It does not look at
  text outside the blocks or at whether each block has content: it is a stepping stone and is
  meant to be combined with :func:`format_reward`, which does.
- :func:`make_length_penalty`: DAPO's soft overlong punishment (Yu et al. 2025, arXiv
  2503.14476) on completion *token* counts, ``len(completion_ids[i])``::

      0                                   if L <= Lmax - Lcache
      ((Lmax - Lcache) - L) / Lcache * f  if Lmax - Lcache < L <= Lmax
      -f                                  if L > Lmax

  (the same as verl's ``min(-(L - (Lmax - Lcache)) / Lcache * f, 0)`` up to the cap at -f).
  Counting tokens, not characters, means the penalty measures exactly what the generation
  budget measures. **Guard:** it never rewards length (0 at best), and ``penalty_factor`` must
  be >= 0, so a sign mistake cannot turn it into a bonus for rambling. Without
  ``completion_ids`` it raises instead of guessing a length from the text.
- :func:`make_repetition_penalty`: n-gram repetition (open-r1's ``repetition_penalty_reward``,
  from Yeo et al. 2025, arXiv 2502.03373), on lower-cased whitespace-split words::

      (1 - unique_ngrams / total_ngrams) * max_penalty,   0 with fewer than n words

  **Guards:** ``max_penalty`` must be <= 0 (it only ever penalizes, so it cannot pay for
  repetition); words are lower-cased, so alternating case does not dodge it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from .basic import RewardFunc, completion_text

__all__ = [
    "format_reward",
    "make_format_reward",
    "make_length_penalty",
    "make_repetition_penalty",
    "soft_format_reward",
]

_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_ANSWER_OPEN, _ANSWER_CLOSE = "<answer>", "</answer>"
_TAGS = (_THINK_OPEN, _THINK_CLOSE, _ANSWER_OPEN, _ANSWER_CLOSE)

_THINK_ANSWER = re.compile(
    r"^\s*<think>(?P<think>.*?)</think>\s*<answer>(?P<answer>.*?)</answer>\s*$", re.DOTALL
)


# ---------------------------------------------------------------------------------------------
# Format
# ---------------------------------------------------------------------------------------------


def _strict_format_ok(text: str, require_content: bool) -> bool:
    if any(text.count(tag) != 1 for tag in _TAGS):
        return False
    match = _THINK_ANSWER.match(text)
    if match is None:
        return False
    if require_content:
        return bool(match.group("think").strip()) and bool(match.group("answer").strip())
    return True


def format_reward(prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """1.0 if the completion is exactly one ``<think>...</think>`` block followed by exactly one
    ``<answer>...</answer>`` block, only whitespace around and between them, and **both blocks
    contain non-whitespace text**; else 0.0.

    ``"<think> 3 * 4 = 12 </think> <answer> 12 </answer>"`` scores 1.0;
    ``"<think></think><answer></answer>"`` and ``"<think> </think> <answer> 7 </answer>"``
    score 0.0 (reward-hacking guard; see the module docstring and :func:`make_format_reward`).
    """
    return [1.0 if _strict_format_ok(completion_text(c), True) else 0.0 for c in completions]


def make_format_reward(*, require_content: bool = True) -> RewardFunc:
    """The strict format reward, with the empty-block guard on (default, same as
    :func:`format_reward`) or off (``require_content=False``: tags-only completions such as
    ``<think></think><answer></answer>`` get 1.0)."""
    if not isinstance(require_content, bool):
        raise TypeError(f"require_content must be a bool, got {require_content!r}")
    if require_content:
        return format_reward

    def format_reward_unguarded(
        prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any
    ) -> list[float]:
        return [1.0 if _strict_format_ok(completion_text(c), False) else 0.0 for c in completions]

    format_reward_unguarded.__name__ = format_reward_unguarded.__qualname__ = "format_reward"
    return format_reward_unguarded


def _soft_format_score(text: str) -> float:
    rest = text
    for tag in _TAGS:
        rest = rest.replace(tag, "")
    if not rest.strip():  # empty, or nothing but tags and whitespace
        return 0.0
    counts = [text.count(tag) for tag in _TAGS]
    positions = [text.find(tag) for tag in _TAGS]
    score = 0.25 if counts[0] == 1 else 0.0
    for k in range(1, len(_TAGS)):
        if counts[k] == 1 and counts[k - 1] == 1 and positions[k] > positions[k - 1]:
            score += 0.25
    return score


def soft_format_reward(
    prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any
) -> list[float]:
    """Partial format credit: 0.25 for each of ``<think>``, ``</think>``, ``<answer>``,
    ``</answer>`` that appears exactly once, where each tag after the first also needs the tag
    before it (in that list) to appear exactly once and earlier in the text. A completion made
    of nothing but these tags and whitespace scores 0.

    ``"<think> a </think> <answer> 7 </answer>"`` scores 1.0, ``"<think> a </think>"`` 0.5,
    ``"<answer> 7 </answer> <think> a </think>"`` 0.75 (``<answer>`` is not after ``</think>``).
    """
    return [_soft_format_score(completion_text(c)) for c in completions]


# ---------------------------------------------------------------------------------------------
# Length
# ---------------------------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def make_length_penalty(
    max_completion_length: int, overlong_buffer_len: int, penalty_factor: float = 1.0
) -> RewardFunc:
    """DAPO soft overlong punishment on completion token counts (see the module docstring).

    With ``Lmax = max_completion_length``, ``Lcache = overlong_buffer_len`` and
    ``f = penalty_factor``: 0 up to ``Lmax - Lcache`` tokens, then linear down to ``-f`` at
    ``Lmax`` tokens, and ``-f`` beyond. E.g. Lmax=20, Lcache=5: L=15 -> 0, L=17 -> -0.4,
    L=20 -> -1.0, L=21 -> -1.0.

    The returned function is named ``length_penalty`` and reads the ``completion_ids`` keyword
    (one token-id sequence per completion, as the trainer and TRL pass it); it raises
    ``ValueError`` when that is missing or does not match ``completions``.
    """
    if not _is_int(max_completion_length):
        raise TypeError(
            f"max_completion_length must be an int, got {type(max_completion_length).__name__} "
            f"{max_completion_length!r}"
        )
    if max_completion_length <= 0:
        raise ValueError(f"max_completion_length must be > 0, got {max_completion_length}")
    if not _is_int(overlong_buffer_len):
        raise TypeError(
            f"overlong_buffer_len must be an int, got {type(overlong_buffer_len).__name__} "
            f"{overlong_buffer_len!r}"
        )
    if not 0 < overlong_buffer_len <= max_completion_length:
        raise ValueError(
            f"overlong_buffer_len must be in (0, max_completion_length={max_completion_length}], "
            f"got {overlong_buffer_len}"
        )
    if isinstance(penalty_factor, bool) or not isinstance(penalty_factor, (int, float)):
        raise TypeError(f"penalty_factor must be a number, got {penalty_factor!r}")
    if not (math.isfinite(penalty_factor) and penalty_factor >= 0):
        raise ValueError(f"penalty_factor must be finite and >= 0, got {penalty_factor}")

    l_max = max_completion_length
    l_cache = overlong_buffer_len
    factor = float(penalty_factor)
    threshold = l_max - l_cache

    def penalty(length: int) -> float:
        if length <= threshold:
            return 0.0
        if length <= l_max:
            value = (threshold - length) / l_cache * factor
        else:
            value = -factor
        return value + 0.0  # -0.0 (with factor 0) becomes 0.0

    def length_penalty(
        prompts: Sequence[Any],
        completions: Sequence[Any],
        completion_ids: Sequence[Sequence[int]] | None = None,
        **kwargs: Any,
    ) -> list[float]:
        if completion_ids is None:
            raise ValueError(
                "length_penalty needs completion_ids (one token-id list per completion) to "
                "count tokens; the groupwise trainer passes it, pass it yourself when calling "
                "the function directly"
            )
        if len(completion_ids) != len(completions):
            raise ValueError(
                f"length_penalty got {len(completion_ids)} completion_ids for "
                f"{len(completions)} completions"
            )
        return [penalty(len(ids)) for ids in completion_ids]

    return length_penalty


# ---------------------------------------------------------------------------------------------
# Repetition
# ---------------------------------------------------------------------------------------------


def make_repetition_penalty(ngram_size: int = 3, max_penalty: float = -1.0) -> RewardFunc:
    """n-gram repetition penalty on lower-cased whitespace-split words:
    ``(1 - unique_ngrams / total_ngrams) * max_penalty``, and 0 for completions with fewer than
    ``ngram_size`` words. E.g. ``"a b c a b c"`` with n=2 has the 2-grams ab bc ca ab bc, 5 in
    all and 3 distinct: ``(1 - 3/5) * -1 = -0.4``.

    ``ngram_size`` must be an int >= 1 and ``max_penalty`` a finite number <= 0. The returned
    function is named ``repetition_penalty``.
    """
    if not _is_int(ngram_size):
        raise TypeError(
            f"ngram_size must be an int, got {type(ngram_size).__name__} {ngram_size!r}"
        )
    if ngram_size < 1:
        raise ValueError(f"ngram_size must be >= 1, got {ngram_size}")
    if isinstance(max_penalty, bool) or not isinstance(max_penalty, (int, float)):
        raise TypeError(f"max_penalty must be a number, got {max_penalty!r}")
    if not math.isfinite(max_penalty) or max_penalty > 0:
        raise ValueError(
            f"max_penalty must be finite and <= 0 (a penalty, never a bonus), got {max_penalty}"
        )
    n = ngram_size
    scale = float(max_penalty)

    def penalty(text: str) -> float:
        words = text.lower().split()
        if len(words) < n:
            return 0.0
        ngrams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
        # "+ 0.0" turns -0.0 (no repetition times a negative scale) into 0.0.
        return (1.0 - len(set(ngrams)) / len(ngrams)) * scale + 0.0

    def repetition_penalty(
        prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any
    ) -> list[float]:
        return [penalty(completion_text(c)) for c in completions]

    return repetition_penalty
