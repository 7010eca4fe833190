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
     worker process with a hard per-call timeout (:class:`.worker._SympyWorker`).

POSIX only (the worker is read with ``select`` and interrupted with ``SIGALRM``).

The stages are one module each: :mod:`.extract` (the final answer and its guards),
:mod:`.normalize` (cleaning one answer, number literals), :mod:`.verify` (the comparison),
:mod:`.worker` (the math-verify process) and :mod:`.reward` (the reward function).
"""

# Besides the public names: the limits and the verdict machinery (tests time the worker).
from .extract import MAX_ANSWER_CHARS as MAX_ANSWER_CHARS
from .extract import extract_final_answer
from .reward import AccuracyStats, accuracy_reward, make_accuracy_reward
from .verify import _verdict as _verdict
from .verify import restates_prompt as restates_prompt
from .verify import verify_answer
from .worker import _WORKER as _WORKER
from .worker import HARD_KILL_GRACE_S as HARD_KILL_GRACE_S
from .worker import WORKER_MEMORY_LIMIT_BYTES as WORKER_MEMORY_LIMIT_BYTES
from .worker import WORKER_STARTUP_TIMEOUT_S as WORKER_STARTUP_TIMEOUT_S
from .worker import _Verdict as _Verdict

__all__ = [
    "AccuracyStats",
    "accuracy_reward",
    "extract_final_answer",
    "make_accuracy_reward",
    "verify_answer",
]
