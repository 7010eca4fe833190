"""Whether an extracted answer equals the ground truth: number literals and text answers in
process (:mod:`.normalize`), everything else by math-verify in the worker process
(:mod:`.worker`), with the guard against answers that restate the prompt.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Any

from .extract import MAX_ANSWER_CHARS, _boxed_contents
from .normalize import _literals_match, _normalize, _Normalized
from .worker import _WORKER, HARD_KILL_GRACE_S, _Verdict


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
    (hard limit ``timeout_s + HARD_KILL_GRACE_S``, see :class:`.worker._SympyWorker`); safe to call
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
