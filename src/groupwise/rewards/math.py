"""Math accuracy reward: answer extraction with reward-hacking guards, and equivalence checking.

The reward is what the policy optimises, so every leniency here is a possible exploit and every
strictness a possible false negative. The choices below lean strict where a lenient reading would
let a model earn credit without committing to one value, and lenient where the answer is plainly
the same value written another way.

Pipeline for one completion (see :func:`make_accuracy_reward`):

1. :func:`extract_final_answer` finds the single final answer outside the ``<think>`` block: the
   ``<answer>...</answer>`` block, else the last ``\\boxed{...}``, else (opt-in) the last number.
   Empty answers, several answer tags, and several candidate answers in one answer earn nothing.
2. :func:`verify_answer` compares it with the ground truth:

   - **Number literals** (``12``, ``-3.5``, ``1,024``, ``1e3``, ``1.5 \\times 10^{3}``, ``1/2``,
     ``\\frac{1}{2}``, ``\\dfrac12``, optionally with a percent sign or units) are compared
     exactly with :class:`fractions.Fraction`, in process, in microseconds, without sympy.
     When the ground truth is a number literal, the prediction must be one too, or a closed form
     math-verify finds equal (``\\sqrt{4}`` for 2, ``2^{10}`` for 1024) that does not restate the
     prompt's expression: plain arithmetic such as ``3 * 4`` is not a final answer (it would
     otherwise let a model restate the arithmetic task's question and collect the reward).
   - **Text answers** (``\\text{Evelyn}``, ``yes``) are compared as case-insensitive strings.
   - **Everything else** (``x+1``, ``\\sqrt{2}/2``, intervals, sets, equations) goes to
     `math-verify <https://github.com/huggingface/Math-Verify>`_ + sympy, run in a persistent
     worker process with a hard per-call timeout (:class:`_SympyWorker`).

POSIX only (the worker is read with ``select`` and interrupted with ``SIGALRM``).
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import math
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from enum import Enum
from fractions import Fraction
from pathlib import Path
from typing import Any

from .basic import RewardFunc, completion_text, parse_number

__all__ = [
    "AccuracyStats",
    "accuracy_reward",
    "extract_final_answer",
    "make_accuracy_reward",
    "verify_answer",
]

#: Extracted answers longer than this are not final answers (and would only feed sympy work).
MAX_ANSWER_CHARS = 1000
#: Extra time the parent grants the worker beyond ``timeout_s`` before it kills it: the worker
#: normally stops itself at ``timeout_s``; the kill is for code that ignores its alarm.
HARD_KILL_GRACE_S = 1.0
#: How long a fresh worker may take to import math-verify and sympy (not part of any deadline).
WORKER_STARTUP_TIMEOUT_S = 120.0
#: Address-space cap of the worker, so that an expression that explodes in memory (e.g.
#: ``(x+1)^{100000}`` expanded) raises MemoryError in the worker instead of swapping the machine.
WORKER_MEMORY_LIMIT_BYTES = 4 << 30

# =============================================================================================
# Extraction
# =============================================================================================

_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL)
_BOX_START = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER_OPEN, _ANSWER_CLOSE = "<answer>", "</answer>"

# A number with optional sign, thousands separators, decimals and exponent. The sign is only
# taken when it cannot be a binary minus ("5-3" gives 3, "x = -3" gives -3).
_LAST_NUMBER = re.compile(
    r"(?:(?<![\w.)\]}])-)?(?<![\w.])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][+-]?\d+)?(?!\.?\d)"
)

# Thousands separators: LaTeX writes 1{,}024, 10,\!000 or 1\,024; all become 1,024 first.
_LATEX_THOUSANDS = re.compile(r"(?<=\d)(?:\{,\}|,\\!|\\!,|\\,|,\\,)(?=\d{3}(?!\d))")
# A correctly grouped number: 1-3 leading digits, then groups of exactly 3 ("3,4" is not one).
_THOUSANDS_NUMBER = re.compile(r"(?<![\d.,])\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\d])")
_LATEX_ENVIRONMENT = re.compile(r"\\begin\{(\w+\*?)\}.*?\\end\{\1\}", re.DOTALL)
_SPACING_MACROS = re.compile(r"\\(?:quad|qquad|[,;: ])|~")
_OR_WORD = re.compile(r"(?<![A-Za-z\\])or(?![A-Za-z])|\\lor(?![A-Za-z])", re.IGNORECASE)
_CHOICE_LABEL = re.compile(r"(?:^|(?<=\s))\(?[A-Ea-e][.):](?=\s|$)")
_JUXTAPOSED_NUMBERS = re.compile(r"\d\s+[+-]?\.?\d")
_LINE_BREAK = re.compile(r"\\\\(?![A-Za-z])")  # LaTeX \\ (not an over-escaped \\frac)


def _strip_thinking(text: str) -> str:
    """The part of a completion that is not reasoning.

    Closed ``<think>...</think>`` blocks are removed; a stray ``</think>`` (templates such as
    DeepSeek-R1's put the opening tag in the prompt) means everything before it was reasoning; an
    unclosed ``<think>`` (a truncated completion) means everything after it is.
    """
    text = _THINK_BLOCK.sub(" ", text)
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    if "<think>" in text:
        text = text.split("<think>", 1)[0]
    return text


def _matching_brace(text: str, open_index: int) -> int | None:
    """Index of the ``}`` closing the ``{`` at ``open_index``; escaped ``\\{ \\}`` don't count."""
    depth = 0
    i = open_index
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2  # skip the escaped character (\{, \}, \\)
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def _boxed_contents(text: str) -> list[str | None]:
    """Contents of the top-level ``\\boxed{...}`` / ``\\fbox{...}`` in order (nested braces
    matched, boxes inside boxes skipped); None for a box that is never closed."""
    contents: list[str | None] = []
    position = 0
    while (match := _BOX_START.search(text, position)) is not None:
        close = _matching_brace(text, match.end() - 1)
        if close is None:
            contents.append(None)
            break
        contents.append(text[match.end() : close])
        position = close + 1
    return contents


def _top_level_items(answer: str) -> list[str]:
    """``answer`` split at top-level commas that are not thousands separators (commas inside
    ``() [] {}`` or LaTeX environments belong to one tuple, interval, set or matrix)."""
    masked = _LATEX_ENVIRONMENT.sub("M", _LATEX_THOUSANDS.sub(",", answer))
    masked = _THOUSANDS_NUMBER.sub(lambda m: m.group().replace(",", "_"), masked)
    items, depth, start = [], 0, 0
    for i, char in enumerate(masked):
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth = max(depth - 1, 0)
        elif char == "," and depth == 0:
            items.append(masked[start:i])
            start = i + 1
    items.append(masked[start:])
    return [item.strip() for item in items]


def _has_several_candidates(answer: str, allow_list: bool = False) -> bool:
    """True if ``answer`` hedges between several answers instead of committing to one.

    The rule (a model must not be able to list options and collect credit for any of them):

    - the word ``or`` (also inside ``\\text{ or }``, and ``\\lor``) anywhere;
    - at the top level (outside ``() [] {}`` and LaTeX environments): a ``;``, a line break
      (newline or ``\\\\``), or a comma that is not part of a correctly grouped number
      (``1,024`` and ``1,000,000.5`` are one number; ``3,4``, ``3, 4`` and ``1,0245`` are
      two items). Commas are allowed when ``allow_list`` (the ground truth is itself a list);
    - two numbers separated only by spacing (``3 4``, ``3 \\quad 4``: math-verify would read
      ``3 4`` as 7) -- so ``1 024`` with a space as thousands separator is rejected too;
    - two or more multiple-choice labels (``A) 3 B) 4``, ``(a) 1 (b) 2``).
    """
    if _OR_WORD.search(answer):
        return True
    flat = _LATEX_ENVIRONMENT.sub("M", _LATEX_THOUSANDS.sub(",", answer))
    if len(_CHOICE_LABEL.findall(flat)) >= 2:
        return True
    if _JUXTAPOSED_NUMBERS.search(_SPACING_MACROS.sub(" ", flat)):
        return True
    depth = 0
    for i, char in enumerate(flat):
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth = max(depth - 1, 0)
        elif depth == 0 and (char in ";\n" or _LINE_BREAK.match(flat, i)):
            return True
    return not allow_list and len(_top_level_items(answer)) > 1


def _checked_answer(answer: str | None, allow_list: bool) -> str | None:
    """``answer`` stripped, or None if it is missing, empty, too long, or hedges."""
    if answer is None:
        return None
    answer = answer.strip()
    if not answer or len(answer) > MAX_ANSWER_CHARS:
        return None
    if _has_several_candidates(answer, allow_list):
        return None
    return answer


def extract_final_answer(
    text: str, fallback_last_number: bool = False, *, allow_list: bool = False
) -> str | None:
    """The final answer of a completion, as written; None if it gave no single final answer.

    Only text outside the reasoning counts (see :func:`_strip_thinking`): an answer that appears
    only inside ``<think>`` earns nothing, since the model had not committed to it. In order:

    1. The content of the ``<answer>...</answer>`` block. If the answer holds a ``\\boxed{}``,
       the box's content is the answer (several boxes in it: none).
    2. Else the content of the last ``\\boxed{...}`` or ``\\fbox{...}`` (braces matched, so
       ``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``; a last box never closed gives none).
    3. Else, only if ``fallback_last_number``, the last number in the text (``-3``, ``1,024``,
       ``2.5``, ``1e3``; a fraction ``1/2`` gives ``2``). Off by default: a model would learn to
       end with a number and drop the format.

    Reward-hacking guards, always on; each returns None (no credit):

    - an answer tag more than once (several answer blocks: the model would be answering several
      times), or an opening tag without its closing one (a truncated or malformed answer);
    - an empty answer (``<answer> </answer>``, ``\\boxed{}``), or one longer than
      :data:`MAX_ANSWER_CHARS`;
    - several candidate answers in the answer: ``3 or 4``, ``3, 4``, ``3; 4``, ``A) 3 B) 4``,
      see :func:`_has_several_candidates` for the exact rule. ``allow_list`` permits top-level
      commas, for ground truths that are themselves lists (``-2, 1``).
    """
    visible = _strip_thinking(text)
    opens, closes = visible.count(_ANSWER_OPEN), visible.count(_ANSWER_CLOSE)
    if opens or closes:
        start, end = visible.find(_ANSWER_OPEN), visible.find(_ANSWER_CLOSE)
        if opens != 1 or closes != 1 or end < start:
            return None
        answer = visible[start + len(_ANSWER_OPEN) : end]
        boxes = _boxed_contents(answer)
        if len(boxes) > 1:
            return None
        if boxes:
            answer = boxes[0]
        return _checked_answer(answer, allow_list)
    boxes = _boxed_contents(visible)
    if boxes:
        return _checked_answer(boxes[-1], allow_list)
    if fallback_last_number:
        numbers = _LAST_NUMBER.findall(visible)
        return numbers[-1] if numbers else None
    return None


# =============================================================================================
# Normalisation of an answer (both sides)
# =============================================================================================

_MATH_DELIMITERS = (("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)"), ("$", "$"))
_TEXT_GROUP = r"\\(?:text|textrm|textbf|textit|mbox|mathrm|mathbf|operatorname)\s*\{([^{}]*)\}"
_WHOLE_TEXT = re.compile(rf"^{_TEXT_GROUP}$")
_TRAILING_TEXT_UNIT = re.compile(rf"\s*{_TEXT_GROUP}\s*(?:\^\s*\{{?\s*\d\s*\}}?)?$")
_DEGREES = re.compile(r"\s*(?:\^\s*\{?\s*\\circ\s*\}?|°|\\degree)\s*(?:[CF](?![A-Za-z]))?\s*$")
_PERCENT = re.compile(
    r"\s*(?:\\%|%|\\text\{\s*\\?%\s*\}|\b(?:percent|percentage|per\s*cent|pct)\b)\s*$"
)
_CURRENCY = re.compile(r"^(?:\\\$|\$|€|£|¥)\s*")
_ASSIGNMENT = re.compile(r"^[A-Za-z](?:_\{?\w+\}?)?\s*=\s*")
_PLAIN_SCIENTIFIC = re.compile(r"(?<![\w.\\])(\d+(?:\.\d*)?|\.\d+)[eE]([+-]?\d+)(?![\w.])")
# Words after a number that change its value, so are never stripped as units.
_NUMBER_WORDS = frozenset(
    "hundred hundreds thousand thousands million millions billion billions trillion dozen "
    "dozens half halves third thirds quarter quarters fourth fourths fifth fifths tenth tenths "
    "squared cubed pi e i inf infinity sqrt percent percentage pct".split()
)
# One-letter unit symbols (5 m, 2 s, 3 L); other single letters are more likely variables.
_SINGLE_LETTER_UNITS = frozenset("m g s l L K A V W J N h".split())
_TRAILING_WORD = re.compile(r"(?<=[\d}).\s])\s*([A-Za-z]+)\.?\s*(?:\^\s*\{?\s*\d\s*\}?)?\s*$")

# Number literals (after units, percent and thousands separators are gone).
_DECIMAL = r"(?:\d+\.?\d*|\.\d+)"
_POWER_OF_TEN = r"10\s*\^\s*(?:\{\s*(?P<braced>[+-]?\d+)\s*\}|(?P<bare>[+-]?\d+))"
_DECIMAL_LITERAL = re.compile(
    rf"^(?P<mantissa>{_DECIMAL})"
    rf"(?:[eE](?P<exp>[+-]?\d+)|\s*(?:\\times|\\cdot|\*|×)\s*{_POWER_OF_TEN})?$"
)
_BARE_POWER_OF_TEN = re.compile(rf"^{_POWER_OF_TEN}$")
_FRACTION_ARG = r"(?:\{\s*([+-]?\d+)\s*\}|(\d))"
_LATEX_FRACTION = re.compile(rf"^\\[dtc]?frac\s*{_FRACTION_ARG}\s*{_FRACTION_ARG}$")
_SLASH_FRACTION = re.compile(r"^([+-]?\d+)\s*/\s*([+-]?\d+)$")
_MAX_EXPONENT = 400  # 10^400 is exact in a Fraction; 10^(10^9) would hang the fast path


@dataclass(frozen=True)
class _Normalized:
    """One side of a comparison after cleaning.

    ``text`` is what math-verify sees; ``value`` is set when the answer is a number literal
    (``inexact``: written with a decimal point or exponent, so a float tolerance is fair);
    ``percent``: the answer carried a percent sign; ``words``: a plain-text answer, compared as
    a case-insensitive string.
    """

    text: str
    percent: bool = False
    value: Fraction | None = None
    inexact: bool = False
    words: str | None = None


def _unwrap_delimiters(text: str) -> str:
    """``$x$``, ``$$x$$``, ``\\(x\\)``, ``\\[x\\]`` and a whole ``\\boxed{x}`` become ``x``."""
    changed = True
    while changed:
        changed = False
        text = text.strip()
        for left, right in _MATH_DELIMITERS:
            if (
                len(text) > len(left) + len(right)
                and text.startswith(left)
                and text.endswith(right)
            ):
                text, changed = text[len(left) : -len(right)], True
                break
        boxes = _boxed_contents(text)
        match = _BOX_START.match(text)
        if match and len(boxes) == 1 and boxes[0] is not None and text.endswith("}"):
            if _matching_brace(text, match.end() - 1) == len(text) - 1:
                text, changed = boxes[0], True
    return text


def _strip_units(text: str, single_letters: bool) -> str:
    """Drop trailing units: ``\\text{...}`` groups, degree signs, and plain words after a
    number (``5 cm``, ``12 apples``, ``3 square meters``), never words that change the value
    (``5 million``, ``2 pi``). One-letter unit symbols after a space (``5 m``) only if
    ``single_letters``: in a symbolic answer ``2 s`` the letter is more likely a variable."""
    for _ in range(4):
        stripped = _DEGREES.sub("", text)
        match = _TRAILING_TEXT_UNIT.search(stripped)
        if match and re.fullmatch(r"[A-Za-z .\s]*", match.group(1)):
            letters = sum(c.isalpha() for c in match.group(1))
            if letters >= 2 or (single_letters and letters == 1):
                stripped = stripped[: match.start()]
        match = _TRAILING_WORD.search(stripped)
        if match and match.group(1).lower() not in _NUMBER_WORDS:
            word, spaced = match.group(1), match.group(0)[:1].isspace()
            if len(word) >= 2 or (single_letters and spaced and word in _SINGLE_LETTER_UNITS):
                stripped = stripped[: match.start()]
        stripped = stripped.strip()
        if not stripped or stripped == text:
            break
        text = stripped
    return text


def _literal_value(text: str) -> tuple[Fraction, bool] | None:
    """The exact value of a number literal and whether it was written inexactly (decimal
    point or exponent); None if ``text`` is anything else (including an expression)."""
    text = text.strip()
    for left, right in (("(", ")"), ("{", "}")):
        if text.startswith(left) and text.endswith(right):
            text = text[1:-1].strip()
    sign = 1
    if text and text[0] in "+-":
        sign, text = (-1 if text[0] == "-" else 1), text[1:].lstrip()
    if _THOUSANDS_NUMBER.fullmatch(text):
        text = text.replace(",", "")
    try:
        if match := _DECIMAL_LITERAL.match(text):
            mantissa = match.group("mantissa")
            if parse_number(mantissa) is None:
                return None
            exponent_text = match.group("exp") or match.group("braced") or match.group("bare")
            exponent = int(exponent_text) if exponent_text else 0
            if abs(exponent) > _MAX_EXPONENT:
                return None
            value = Fraction(mantissa) * Fraction(10) ** exponent
            return sign * value, "." in mantissa or exponent_text is not None
        if match := _BARE_POWER_OF_TEN.match(text):
            exponent = int(match.group("braced") or match.group("bare"))
            if abs(exponent) > _MAX_EXPONENT:
                return None
            return sign * Fraction(10) ** exponent, False
        match = _LATEX_FRACTION.match(text) or _SLASH_FRACTION.match(text)
        if match:
            numerator, denominator = (int(g) for g in match.groups() if g is not None)
            return sign * Fraction(numerator, denominator), False
    except (ValueError, ZeroDivisionError):  # 1/0; int() of more than 4300 digits
        return None
    return None


def _normalize(answer: str) -> _Normalized:
    """Clean one answer (prediction or ground truth) the same way on both sides."""
    text = _unwrap_delimiters(answer.replace("\u2212", "-"))
    text = text.rstrip(". ").strip()  # a sentence's full stop ("12.") adds nothing
    whole_text = _WHOLE_TEXT.match(text)
    words = whole_text.group(1).strip() if whole_text else text
    if (
        re.fullmatch(r"[A-Za-z][A-Za-z '\-]*", words)
        and words.lower() not in _NUMBER_WORDS
        and (whole_text or any(len(w) >= 3 for w in words.split()))
    ):
        return _Normalized(text=text, words=" ".join(words.lower().split()))
    text = _CURRENCY.sub("", _LATEX_THOUSANDS.sub(",", text))
    text = _strip_units(text, single_letters=False)  # "50% of students" -> "50%"
    percent = bool(_PERCENT.search(text))
    text = _strip_units(_PERCENT.sub("", text), single_letters=False)
    # The literal reading may drop more: "x = 12" answers 12, "5 m" is 5 (a number with a
    # letter after it is a quantity, not an expression). math-verify keeps "x = 12" as is.
    bare = _ASSIGNMENT.sub("", text) if text.count("=") == 1 else text
    literal = _literal_value(_strip_units(bare, single_letters=True))
    text = _PLAIN_SCIENTIFIC.sub(r"\1\\times 10^{\2}", text)  # math-verify reads 1e3 as 1*e*3
    if literal is None:
        return _Normalized(text=text, percent=percent)
    return _Normalized(text=text, percent=percent, value=literal[0], inexact=literal[1])


def _literal_readings(side: _Normalized, use_percent: bool) -> list[tuple[Fraction, bool]]:
    assert side.value is not None
    readings = [(side.value, side.inexact)]
    if use_percent and side.percent:
        readings.append((side.value / 100, side.inexact))
    return readings


def _literals_match(gold: _Normalized, pred: _Normalized, float_rel_tol: float) -> bool:
    """Number literals: equal exactly; or, if either was written as a decimal and the ground
    truth is not an integer, within ``float_rel_tol`` relative difference.

    Integer ground truths demand an exact answer (12.0000001 is not 12, and 1000000001 is not
    1000000000). Percent: ``x%`` reads as ``x`` or ``x/100`` when only one side has the sign,
    as ``x`` when both do (otherwise 5000% would match 50% via 5000/100 = 50).
    """
    one_sided = gold.percent != pred.percent
    for g, g_inexact in _literal_readings(gold, one_sided):
        for p, p_inexact in _literal_readings(pred, one_sided):
            if g == p:
                return True
            if g.denominator == 1 and not g_inexact:
                continue
            if (g_inexact or p_inexact) and abs(g - p) <= float_rel_tol * max(abs(g), abs(p)):
                return True
    return False


# =============================================================================================
# Verification
# =============================================================================================


class _Verdict(Enum):
    CORRECT = "correct"
    WRONG = "wrong"
    GOLD_UNPARSABLE = "gold_unparsable"
    TIMEOUT = "timeout"  # the symbolic check did not finish in time (or its worker died)


def _gold_text(truth: Any) -> str | None:
    """The ground truth as a string; None for a missing value (None, NaN, empty). A ground
    truth that is a whole solution keeps only its last ``\\boxed{}``."""
    if truth is None or (isinstance(truth, float) and math.isnan(truth)):
        return None
    text = str(truth).strip()
    if "\\boxed" in text or "\\fbox" in text:
        boxes = _boxed_contents(text)
        text = (boxes[-1] or "").strip() if boxes else text
    return text or None


# Plain arithmetic of number literals: what an unevaluated computation is made of.
_ARITHMETIC_TOKENS = re.compile(r"\\times|\\cdot|\\div|\\left|\\right|[\d\s.,+\-*/()\[\]{}×÷]")


def _is_closed_form(text: str) -> bool:
    """Whether a non-literal answer is a closed form worth a symbolic check (``\\sqrt{4}``,
    ``2^{10}``, ``\\frac{\\pi}{2}``) rather than plain arithmetic of literals (``3 * 4``),
    which is a computation left undone, not a final answer."""
    return bool(text.strip()) and bool(_ARITHMETIC_TOKENS.sub("", text))


def _canonical_math(text: str) -> str:
    """``text`` without spacing and brace noise, for comparing an answer with a prompt."""
    text = text.lower().replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    for times in ("\\times", "\\cdot", "×"):
        text = text.replace(times, "*")
    for divide in ("\\div", "÷"):
        text = text.replace(divide, "/")
    text = re.sub(r"\\left|\\right|\\[,;!: ]|\$", "", text)
    return re.sub(r"[\s{}]", "", text)


def _prompt_plain_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, (list, tuple)):
        return " ".join(str(m.get("content", "")) for m in prompt if isinstance(m, dict))
    return ""


def restates_prompt(prediction: str, prompt: Any) -> bool:
    """Whether an answer that is not a number literal merely restates (part of) the prompt's
    expression: ``2^{10}`` for "Compute $2^{10}$." is the question, not its answer."""
    side = _normalize(prediction)
    if side.value is not None or side.words is not None:
        return False
    answer = _canonical_math(side.text)
    return len(answer) >= 2 and answer in _canonical_math(_prompt_plain_text(prompt))


@functools.lru_cache(maxsize=8192)
def _verdict(prediction: str | None, gold: str, timeout_s: float, float_rel_tol: float) -> _Verdict:
    """Compare an extracted answer (None: there was none) with a ground truth string.

    Cached: in GRPO a group's completions often share an answer, and an answer that timed out
    once should not cost ``timeout_s`` again for every completion that repeats it.
    """
    gold_side = _normalize(gold)
    if not gold_side.text:
        return _Verdict.GOLD_UNPARSABLE
    if gold_side.value is not None or gold_side.words is not None:
        if prediction is None:
            return _Verdict.WRONG
        pred_side = _normalize(prediction)
        if gold_side.words is not None:
            ok = pred_side.words == gold_side.words
        elif (
            pred_side.value is None
            and pred_side.words is None
            and _is_closed_form(pred_side.text)
            and len(pred_side.text) <= MAX_ANSWER_CHARS
        ):
            # An equivalent closed form (\sqrt{4} for 2, 2^{10} for 1024): math-verify decides.
            # An answer that restates the prompt is refused before (make_accuracy_reward).
            return _symbolic_verdict(pred_side, gold_side, float_rel_tol, timeout_s)
        else:
            ok = pred_side.value is not None and _literals_match(
                gold_side, pred_side, float_rel_tol
            )
        return _Verdict.CORRECT if ok else _Verdict.WRONG
    pred_side = _normalize(prediction) if prediction is not None else _Normalized(text="")
    if len(pred_side.text) > MAX_ANSWER_CHARS:
        pred_side = _Normalized(text="")
    return _symbolic_verdict(pred_side, gold_side, float_rel_tol, timeout_s)


def _symbolic_verdict(
    pred_side: _Normalized, gold_side: _Normalized, float_rel_tol: float, timeout_s: float
) -> _Verdict:
    """math-verify's verdict on two normalised answers, in the worker (killed past the timeout)."""
    return _WORKER.verdict(
        {
            "pred": pred_side.text,
            "pred_percent": pred_side.percent,
            "gold": gold_side.text,
            "gold_percent": gold_side.percent,
            "float_rel_tol": float_rel_tol,
            "timeout_s": timeout_s,
        },
        hard_timeout_s=timeout_s + HARD_KILL_GRACE_S,
    )


def verify_answer(
    prediction: str, gold: str, timeout_s: float = 5.0, float_rel_tol: float = 1e-6
) -> bool | None:
    """Whether ``prediction`` (an extracted final answer) is mathematically equal to ``gold``.

    Returns None if ``gold`` cannot be parsed (the question does not apply), False if the check
    timed out. What counts as equal:

    - numbers in any usual notation: ``12`` = ``12.0`` = ``+12``; ``1,024`` = ``1024``;
      ``1e3`` = ``1.5 \\times 10^{3}``-style scientific notation = ``1000``; ``0.5`` = ``1/2`` =
      ``\\frac{1}{2}`` = ``\\dfrac12``. Integers are exact; when the ground truth is not an
      integer, a prediction written as a decimal may differ by ``float_rel_tol`` (relative):
      ``0.3333333`` = ``1/3`` but ``0.33`` is not;
    - percentages: a percent sign is a unit that may be dropped *or* applied, so ``50%`` equals
      both ``50`` and ``0.5`` (but ``50`` is not ``0.5``, and ``5000%`` is not ``50%``). Unlike
      math-verify's own rule, which accepts ``50%`` for ``50`` but not ``12.5%`` for ``12.5``;
    - units are stripped: ``5 cm``, ``5 \\text{ meters}``, ``12 apples``, ``30^\\circ``, ``\\$5``;
      ``x = 12`` answers ``12``;
    - a ground truth that is a number literal needs a number literal or an equivalent closed
      form: ``\\sqrt{4}`` is accepted for ``2`` and ``2^{10}`` for ``1024`` (as math-verify
      does), but plain arithmetic of literals such as ``3 * 4`` is not accepted for ``12`` (a
      computation left undone), and the accuracy reward refuses a closed form that restates
      the prompt's expression (:func:`restates_prompt`: restating the question is not
      answering it);
    - anything else is decided by math-verify with sympy: ``x+1`` = ``1+x``,
      ``\\sqrt{2}/2`` = ``\\frac{1}{\\sqrt{2}}``, ``[1, 2)``, ``\\{1, 2\\}`` = ``\\{2, 1\\}``,
      ``x \\le 3`` = ``(-\\infty, 3]``, ``1.4142136`` = ``\\sqrt{2}`` (same tolerance rule).

    The symbolic check runs in a worker process and is abandoned after ``timeout_s`` seconds
    (hard limit ``timeout_s + HARD_KILL_GRACE_S``, see :class:`_SympyWorker`); safe to call
    from any thread.
    """
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    gold_text = _gold_text(gold)
    if gold_text is None:
        return None
    verdict = _verdict(prediction, gold_text, float(timeout_s), float(float_rel_tol))
    if verdict is _Verdict.GOLD_UNPARSABLE:
        return None
    return verdict is _Verdict.CORRECT


# =============================================================================================
# The sympy worker process
# =============================================================================================

_WORKER_BOOTSTRAP = """
import sys, types
for name, path in {packages!r}:
    module = types.ModuleType(name)
    module.__path__ = [path]
    sys.modules[name] = module
from groupwise.rewards.math import _worker_main
_worker_main()
"""


class _SympyWorker:
    """A persistent child process that runs math-verify, with a hard timeout per call.

    Why a process: math-verify's timeouts use ``signal.alarm``, which works only in the main
    thread (reward functions may run in a thread pool, where math-verify raises instead), has
    whole-second resolution, and cannot stop code that does not return to the interpreter.
    A child process can always be killed. The child runs one request at a time in its main
    thread under a ``setitimer`` alarm (``timeout_s``), so an ordinary timeout leaves it alive;
    if it has not answered ``HARD_KILL_GRACE_S`` later, the parent kills it and the next call
    starts a new one (~1 s, outside any call's deadline).

    The child imports only this module and math-verify (stub parent packages keep
    ``groupwise/__init__``, and so torch, out of it). It is started lazily, so tasks whose
    answers are all number literals never start it. Calls from several threads are serialised.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._owner_pid = os.getpid()
        self._buffer = b""
        self.starts = 0  # how many worker processes were started (restarts after kills)

    def verdict(self, request: dict[str, Any], hard_timeout_s: float) -> _Verdict:
        with self._lock:
            proc = self._ensure_started()
            assert proc.stdin is not None
            try:
                proc.stdin.write((json.dumps(request) + "\n").encode())
                proc.stdin.flush()
                line = self._read_line(time.monotonic() + hard_timeout_s)
            except OSError:  # the worker died under us (e.g. killed for memory)
                line = None
            if line is None:
                self._stop()
                return _Verdict.TIMEOUT
            return _Verdict(json.loads(line)["verdict"])

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _ensure_started(self) -> subprocess.Popen[bytes]:
        if self._owner_pid != os.getpid():  # we are a fork: the worker belongs to our parent
            self._proc, self._buffer, self._owner_pid = None, b"", os.getpid()
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self._stop()
        rewards_dir = Path(__file__).resolve().parent
        packages = [("groupwise", str(rewards_dir.parent)), ("groupwise.rewards", str(rewards_dir))]
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER_BOOTSTRAP.format(packages=packages)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
            start_new_session=True,  # a Ctrl-C in the terminal is for the parent, not for it
        )
        self.starts += 1
        if self._read_line(time.monotonic() + WORKER_STARTUP_TIMEOUT_S) != '{"ready": true}':
            self._stop()
            raise RuntimeError(
                "the math-verify worker process did not start (is math-verify installed? "
                "its error, if any, is on stderr)"
            )
        return self._proc

    def _read_line(self, deadline: float) -> str | None:
        """The worker's next line, or None at the deadline or if the worker exited."""
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    def _stop(self) -> None:
        proc, self._proc, self._buffer = self._proc, None, b""
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()


_WORKER = _SympyWorker()
atexit.register(_WORKER.close)


class _SoftTimeout(BaseException):
    """Raised by the worker's alarm. A BaseException, so that the ``except Exception`` blocks
    in math-verify and sympy don't swallow it."""


def _raise_soft_timeout(signum: int, frame: Any) -> None:
    raise _SoftTimeout


def _sympy_readings(expr: Any, use_percent: bool) -> list[Any]:
    import sympy

    readings = [expr]
    if use_percent and isinstance(expr, sympy.Expr):
        readings.append(expr * sympy.Rational(1, 100))
    return readings


def _sympy_equal(gold: Any, pred: Any, float_rel_tol: float) -> bool:
    """math-verify's equivalence, except that numbers involving a float compare with a
    relative tolerance (math-verify rounds to 6 decimal places, so 1.5e-8 would equal 1.6e-8)."""
    import sympy
    from math_verify import verify

    if isinstance(gold, sympy.Expr) and isinstance(pred, sympy.Expr):
        if gold.is_number and pred.is_number and (gold.has(sympy.Float) or pred.has(sympy.Float)):
            g, p = gold.evalf(30), pred.evalf(30)
            if g.is_real and p.is_real and g.is_finite and p.is_finite:
                if isinstance(gold, sympy.Integer):
                    return bool(g == p)
                return bool(abs(g - p) <= float_rel_tol * max(abs(g), abs(p)))
    return verify(gold, pred, timeout_seconds=None, allow_set_relation_comp=True)


def _sympy_verdict(request: dict[str, Any]) -> _Verdict:
    """The worker's comparison (math-verify's own timeouts off: they would cancel our alarm)."""
    from math_verify import LatexExtractionConfig, parse

    config = [LatexExtractionConfig(boxed_match_priority=0, try_extract_without_anchor=False)]

    def parse_one(text: str) -> list[Any]:
        if not text:
            return []
        parsed = parse("\\boxed{" + text + "}", config, "no_fallback", parsing_timeout=None)
        return parsed[:1]

    gold = parse_one(request["gold"])
    if not gold:
        return _Verdict.GOLD_UNPARSABLE
    pred = parse_one(request["pred"])
    if not pred:
        return _Verdict.WRONG
    one_sided = request["gold_percent"] != request["pred_percent"]
    for g in _sympy_readings(gold[0], one_sided):
        for p in _sympy_readings(pred[0], one_sided):
            if _sympy_equal(g, p, request["float_rel_tol"]):
                return _Verdict.CORRECT
    return _Verdict.WRONG


def _serve_request(request: dict[str, Any]) -> _Verdict:
    try:
        signal.setitimer(signal.ITIMER_REAL, request["timeout_s"])
        try:
            block_s = request.get("_test_block_alarm_s")
            if block_s:  # tests only: simulate code that never returns to the interpreter
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
                time.sleep(block_s)
            return _sympy_verdict(request)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGALRM})
    except _SoftTimeout:
        return _Verdict.TIMEOUT
    except Exception:  # sympy errors, RecursionError, MemoryError: not an answer we can credit
        return _Verdict.WRONG


def _worker_main() -> None:
    """Entry point of the worker process: one JSON request per line on stdin, one JSON reply
    per line on stdout; exits when stdin closes (the parent exited or closed it)."""
    protocol = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # anything sympy or math-verify prints goes to stderr, not into the protocol
    sys.stdout = sys.stderr
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if soft == resource.RLIM_INFINITY or soft > WORKER_MEMORY_LIMIT_BYTES:
            resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY_LIMIT_BYTES, hard))
    except (ImportError, ValueError, OSError):
        pass
    # Timeouts are counted by the parent; math-verify's "timeout disabled" notice is expected.
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    signal.signal(signal.SIGALRM, _raise_soft_timeout)
    _sympy_verdict(
        {
            "gold": "x+1",
            "pred": "1+x",
            "gold_percent": False,
            "pred_percent": False,
            "float_rel_tol": 1e-6,
        }
    )  # warm up imports and caches before "ready"
    protocol.write('{"ready": true}\n')
    protocol.flush()
    try:
        for line in sys.stdin:
            verdict = _serve_request(json.loads(line))
            protocol.write(json.dumps({"verdict": verdict.value}) + "\n")
            protocol.flush()
    except BrokenPipeError:  # the parent is gone
        pass


# =============================================================================================
# The reward function
# =============================================================================================


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
