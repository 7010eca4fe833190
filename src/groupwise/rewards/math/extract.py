"""The final answer of a completion: the ``<answer>`` block or the last ``\\boxed{}`` outside the
reasoning, refused when it is empty, too long or hedges between several candidates.

Also the brace matching and list splitting that normalisation and the reward reuse.
"""

from __future__ import annotations

import re

#: Extracted answers longer than this are not final answers (and would only feed sympy work).
MAX_ANSWER_CHARS = 1000

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
