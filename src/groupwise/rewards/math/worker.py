"""The math-verify + sympy worker: a persistent child process with a hard timeout per call.

The parent side is :class:`_SympyWorker` (one shared instance, ``_WORKER``); the child side is
:func:`_worker_main`, which imports only this module and math-verify. POSIX only (the worker is
read with ``select`` and interrupted with ``SIGALRM``).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from enum import Enum
from pathlib import Path
from typing import Any

#: Extra time the parent grants the worker beyond ``timeout_s`` before it kills it: the worker
#: normally stops itself at ``timeout_s``; the kill is for code that ignores its alarm.
HARD_KILL_GRACE_S = 1.0
#: How long a fresh worker may take to import math-verify and sympy (not part of any deadline).
WORKER_STARTUP_TIMEOUT_S = 120.0
#: Address-space cap of the worker, so that an expression that explodes in memory (e.g.
#: ``(x+1)^{100000}`` expanded) raises MemoryError in the worker instead of swapping the machine.
WORKER_MEMORY_LIMIT_BYTES = 4 << 30


class _Verdict(Enum):
    CORRECT = "correct"
    WRONG = "wrong"
    GOLD_UNPARSABLE = "gold_unparsable"
    TIMEOUT = "timeout"  # the symbolic check did not finish in time (or its worker died)


_WORKER_BOOTSTRAP = """
import sys, types
for name, path in {packages!r}:
    module = types.ModuleType(name)
    module.__path__ = [path]
    sys.modules[name] = module
from groupwise.rewards.math.worker import _worker_main
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
        here = Path(__file__).resolve().parent  # groupwise/rewards/math
        packages = [
            ("groupwise", str(here.parent.parent)),
            ("groupwise.rewards", str(here.parent)),
            ("groupwise.rewards.math", str(here)),
        ]
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
