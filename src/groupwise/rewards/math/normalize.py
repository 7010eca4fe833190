"""One answer (prediction or ground truth) cleaned the same way on both sides: delimiters, units,
percent signs and thousands separators dropped; a number literal read exactly as a Fraction;
a plain-text answer kept as lower-case words. Then the comparison of two number literals.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from ..basic import parse_number
from .extract import (
    _BOX_START,
    _LATEX_THOUSANDS,
    _THOUSANDS_NUMBER,
    _boxed_contents,
    _matching_brace,
)

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
