"""``run_program``: run a program in the sandbox and return what it printed (the ``python``
tool's entry point)."""

from __future__ import annotations

import dataclasses
import time

from .execute import check_limits, sandbox_once, setup_error
from .info import SandboxUnavailableError
from .probe import sandbox_info
from .uids import UidPoolExhaustedError


@dataclasses.dataclass(frozen=True)
class ProgramResult:
    """Outcome of one :func:`run_program` call.

    ``status``: ``"ok"`` (exit status 0), ``"error"`` (nonzero exit, e.g. an uncaught exception:
    its traceback is in ``stderr``), ``"timeout"``, ``"output_limit"`` (killed once stdout+stderr
    passed ``max_output_bytes``; the output kept so far is returned) or ``"setup_failed"`` (the
    sandbox did not start; ``stderr`` says why, the code never ran).
    """

    stdout: str
    stderr: str
    status: str
    returncode: int | None = None


def run_program(
    code: str,
    *,
    stdin: str = "",
    timeout_s: float = 5.0,
    memory_mb: float = 512,
    max_output_bytes: int = 1_000_000,
    max_processes: int = 32,
) -> ProgramResult:
    """Run ``code`` as ``__main__`` in the sandbox with ``stdin``; return what it printed.

    Same isolation and limits as a stdin/stdout test case of the code reward. Raises
    :class:`SandboxUnavailableError` when this machine cannot sandbox code.
    """
    check_limits(timeout_s, memory_mb, max_output_bytes, max_processes)
    info = sandbox_info()
    if info.error or info.python is None:
        raise SandboxUnavailableError(f"no code sandbox on this machine: {info.error}")
    job = {"mode": "io", "code": code, "stdin": stdin}
    try:
        out, ready, stderr, _ = sandbox_once(
            info,
            job,
            deadline=time.monotonic() + timeout_s,
            memory_mb=memory_mb,
            max_output_bytes=max_output_bytes,
            max_processes=max_processes,
        )
    except UidPoolExhaustedError as exc:
        return ProgramResult("", str(exc), "setup_failed", None)
    stdout = out.stdout.decode("utf-8", "replace")
    if not ready:
        return ProgramResult("", setup_error(out, stderr), "setup_failed", out.returncode)
    if out.timed_out:
        status = "timeout"
    elif out.truncated:
        status = "output_limit"
    else:
        status = "ok" if out.returncode == 0 else "error"
    return ProgramResult(stdout, stderr, status, out.returncode)
