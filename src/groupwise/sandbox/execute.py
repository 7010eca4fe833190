"""Running code in the sandbox, given what the probe found: one launcher process per job, its
rlimits and uid lease, and the two test modes (assert tests in one process, reported on a side
channel; stdin/stdout cases in one process each, on a shared wall-clock budget)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import os
import secrets
import time
from collections.abc import Iterator
from typing import Any

from . import cgroup, seccomp
from .info import (
    CLONE_NEWNET,
    MAX_FILE_BYTES,
    MAX_OPEN_FILES,
    WALL_CLOCK_FACTOR,
    SandboxInfo,
    SandboxUnavailableError,
)
from .process import Launch, Output, remove_files_of, spawn_many, user_task_count, workdir
from .uids import UidPoolExhaustedError, shared_pool

# Tests as the launcher takes them: ("asserts", ((kind, source), ...)) with kind "test" or
# "setup", or ("io", ((stdin, expected_stdout), ...)).
logger = logging.getLogger("groupwise.sandbox")

ParsedTests = tuple[str, tuple[tuple[str, str], ...]]


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    """Outcome of running one piece of code against one set of tests.

    ``passed``/``total``: tests passed / run. ``timed_out``: the wall-clock budget ran out.
    ``error``: the first reason something failed (None when every test passed).
    ``output_truncated``: the output limit was hit and the sandbox killed. ``setup_failed``: the
    sandbox itself could not be started, the code never ran (scores None, not 0).
    """

    passed: int
    total: int
    timed_out: bool = False
    error: str | None = None
    output_truncated: bool = False
    setup_failed: bool = False
    duration_s: float = 0.0

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0

    @property
    def all_passed(self) -> bool:
        return self.total > 0 and self.passed == self.total


def check_limits(
    timeout_s: float, memory_mb: float, max_output_bytes: int, max_processes: int
) -> None:
    """Raise ``ValueError`` naming the first limit out of range."""
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    if not memory_mb >= 64:
        raise ValueError(f"memory_mb must be >= 64 (the interpreter needs it), got {memory_mb}")
    if max_output_bytes < 1024:
        raise ValueError(f"max_output_bytes must be >= 1024, got {max_output_bytes}")
    if max_processes < 1:
        raise ValueError(f"max_processes must be >= 1, got {max_processes}")


@functools.cache
def seccomp_program() -> bytes | None:
    """This machine's seccomp filter (None on an architecture without one: logged once)."""
    try:
        return seccomp.build_filter()
    except ValueError as exc:
        logger.warning("no seccomp filter in the code sandbox: %s", exc)
        return None


def _rlimits(info: SandboxInfo, cpu_s: float, memory_mb: float, max_processes: int) -> list:
    # A backstop a second past the budget: the trainer's count of the run's CPU stops it first,
    # as a timeout, rather than a signal that reads as a crash.
    cpu = max(1, math.ceil(cpu_s)) + 1
    memory = int(memory_mb * 1024 * 1024)
    if info.root:
        nproc = max_processes
    elif info.user_namespace:  # counted per user namespace: the launcher and its init count too
        nproc = max_processes + 2
    else:  # RLIMIT_NPROC counts every task of the user, the trainer's threads included
        nproc = user_task_count(os.getuid()) + max_processes + 3
    return [
        ("RLIMIT_CPU", cpu, cpu + 1),
        ("RLIMIT_AS", memory, memory),
        ("RLIMIT_NPROC", nproc, nproc),
        ("RLIMIT_FSIZE", MAX_FILE_BYTES, MAX_FILE_BYTES),
        ("RLIMIT_NOFILE", MAX_OPEN_FILES, MAX_OPEN_FILES),
        ("RLIMIT_CORE", 0, 0),
    ]


@functools.cache
def cgroup_support() -> cgroup.CgroupSupport:
    """Whether this host gives each sandbox its own cgroup (detected once; stale groups of
    crashed trainers removed)."""
    support = cgroup.detect()
    if support.available:
        cgroup.cleanup_stale(support)
    return support


@dataclasses.dataclass
class Slot:
    """What one launcher process holds: a leased uid (root), a fresh working directory and,
    where the host allows, its own cgroup (memory with kernel memory, processes, one CPU)."""

    uid: int | None
    path: str
    group: cgroup.SandboxCgroup | None


@contextlib.contextmanager
def _slot(info: SandboxInfo, memory_mb: float, max_processes: int) -> Iterator[Slot]:
    if info.root:
        pool = shared_pool()
        if pool is None:
            raise SandboxUnavailableError("the sandbox uid pool is not initialised")
        lease: contextlib.AbstractContextManager[int | None] = pool.lease()
    else:
        lease = contextlib.nullcontext(None)
    support = cgroup_support()
    with contextlib.ExitStack() as stack:
        uid = stack.enter_context(lease)
        path = stack.enter_context(workdir(uid))
        if uid is not None and not info.mount_namespace:
            stack.callback(remove_files_of, uid)  # after the cgroup's removal: nothing runs
        group = None
        if support.available:
            try:
                group = cgroup.SandboxCgroup.create(
                    support, memory_bytes=int(memory_mb * 2**20), max_processes=max_processes + 2
                )  # +2: the supervisor or the namespace's init, and the worker
            except cgroup.CgroupError as exc:
                raise SandboxUnavailableError(f"cannot create the sandbox's cgroup: {exc}") from exc
            stack.callback(group.remove)
        yield Slot(uid, path, group)


def _launch(info: SandboxInfo, job: dict[str, Any], nonce: str, slot: Slot, rlimits: list,
            pass_fds: tuple[int, ...] = ()) -> Launch:  # fmt: skip
    uid, path = slot.uid, slot.path
    payload = {
        **job,
        "nonce": nonce,
        "flags": info.unshare_flags,
        "root_paths": list(info.root_paths),
        "root_masks": list(info.root_masks),
        "workdir": path,
        "disk_bytes": MAX_FILE_BYTES,
        "uid": uid,
        "rlimits": rlimits,
        "block_network": not info.unshare_flags & CLONE_NEWNET,
        "seccomp": seccomp_program(),
        "landlock": info.landlock,
        "cgroup_procs": list(slot.group.procs_files) if slot.group else [],
    }
    # Without a PID namespace, processes that left the process group are hunted down: by uid
    # when we run as root, else by the tag on their command line (best effort). With one, the
    # uid is still checked after a kill: the namespace dies asynchronously.
    return Launch(
        payload,
        path,
        pass_fds,
        sweep_uid=uid,
        sweep_tagged=uid is None and not info.pid_namespace,
        sweep_only_if_killed=info.pid_namespace,
    )


def _ready(out: Output, nonce: str) -> tuple[bool, str]:
    marker = f"{nonce} READY\n".encode()
    ready = out.stderr.startswith(marker)
    stderr = out.stderr[len(marker) :] if ready else out.stderr
    return ready, stderr.decode("utf-8", "replace")


def sandbox_once(
    info: SandboxInfo,
    job: dict[str, Any],
    *,
    deadline: float,
    memory_mb: float,
    max_output_bytes: int,
    max_processes: int,
    cpu_budget: float | None = None,
) -> tuple[Output, bool, str, str]:
    """Run one sandbox process; (output, ready, stderr text without the marker, nonce).
    Timed by wall clock up to ``deadline``, and also by CPU when ``cpu_budget`` is given."""
    nonce = secrets.token_hex(16)
    cpu = cpu_budget if cpu_budget is not None else deadline - time.monotonic()
    rlimits = _rlimits(info, cpu, memory_mb, max_processes)
    assert info.python is not None
    with _slot(info, memory_mb, max_processes) as slot:
        launch = _launch(info, job, nonce, slot, rlimits)
        out = spawn_many(
            info.python, [launch], deadline=deadline, limit=max_output_bytes, cpu_budget=cpu_budget
        )[0]
    ready, stderr = _ready(out, nonce)
    return out, ready, stderr, nonce


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def setup_error(out: Output, stderr: str) -> str:
    """Why a sandbox that never reported ready did not start."""
    if out.timed_out:
        return "the sandbox did not start before the deadline"
    detail = _last_line(stderr) or f"launcher exit status {out.returncode}"
    return f"the sandbox did not start: {detail}"


def _died(out: Output, stderr: str) -> str:
    code = out.returncode
    how = f"killed by signal {code - 128}" if code is not None and code > 128 else f"status {code}"
    tail = _last_line(stderr)
    return f"solution process died ({how})" + (f": {tail}" if tail else "")


def normalise_output(text: str) -> list[str]:
    """Lines of ``text`` without trailing whitespace, ``\\r\\n`` ends or trailing blank lines."""
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _run_asserts(
    code: str,
    items: tuple[tuple[str, str], ...],
    info: SandboxInfo,
    deadline: float,
    cpu_budget: float,
    **limits,
) -> SandboxResult:
    """The solution serves calls in one sandbox; the tests run in another (the judge) and
    report their verdicts. The tests never enter the solution's sandbox."""
    total = sum(1 for kind, _ in items if kind == "test")
    nonces = secrets.token_hex(16), secrets.token_hex(16)
    rlimits = _rlimits(info, cpu_budget, limits["memory_mb"], limits["max_processes"])
    to_solution, to_judge = os.pipe(), os.pipe()  # (read end, write end) each
    assert info.python is not None
    handed = False  # spawn_many closes the trainer's ends; closing them twice could close
    try:  # descriptors another thread has just been given the same numbers for
        with (
            _slot(info, limits["memory_mb"], limits["max_processes"]) as solution_slot,
            _slot(info, limits["memory_mb"], limits["max_processes"]) as judge_slot,
        ):
            server = _launch(
                info,
                {"mode": "serve", "code": code, "rpc_in": to_solution[0], "rpc_out": to_judge[1]},
                nonces[0], solution_slot, rlimits, (to_solution[0], to_judge[1]),
            )  # fmt: skip
            judge = _launch(
                info,
                {"mode": "judge", "tests": [list(item) for item in items],
                 "rpc_in": to_judge[0], "rpc_out": to_solution[1]},
                nonces[1], judge_slot, rlimits, (to_judge[0], to_solution[1]),
            )  # fmt: skip
            handed = True
            solution_out, out = spawn_many(
                info.python,
                [server, judge],
                deadline=deadline,
                limit=limits["max_output_bytes"],
                cpu_budget=cpu_budget,
            )
    finally:
        if not handed:
            for fd in (*to_solution, *to_judge):
                os.close(fd)
    solution_ready, solution_stderr = _ready(solution_out, nonces[0])
    ready, stderr = _ready(out, nonces[1])
    if not (solution_ready and ready):
        failed, why = (out, stderr) if not ready else (solution_out, solution_stderr)
        return SandboxResult(0, total, setup_failed=True, error=setup_error(failed, why))
    nonce = nonces[1]
    verdicts: dict[int, bool] = {}
    failures: dict[int, str] = {}
    setup_errors: list[str] = []
    done = False
    for line in out.stdout.decode("utf-8", "replace").splitlines():
        head, _, rest = line.partition(" ")
        if head != nonce:
            continue
        if rest == "DONE":
            done = True
        elif rest.startswith("SETUP "):
            setup_errors.append(rest[len("SETUP ") :])
        else:
            index, _, tail = rest.partition(" ")
            verdict, _, message = tail.partition(" ")
            if not index.isdigit() or int(index) >= total or verdict not in ("P", "F"):
                continue
            i = int(index)
            verdicts[i] = verdicts.get(i, True) and verdict == "P"  # any failure wins
            if verdict == "F":
                failures.setdefault(i, message or "failed")
    passed = sum(verdicts.values())
    error = None
    if passed < total:
        if out.timed_out:
            error = "timed out"
        elif out.truncated:
            error = f"output limit of {limits['max_output_bytes']} bytes exceeded"
        elif not done:
            error = _died(out, stderr)
        elif setup_errors:
            error = f"solution raised {setup_errors[0]}"
        else:
            first = min(failures) if failures else 0
            error = f"test {first}: {failures.get(first, 'no result')}"
    return SandboxResult(
        passed, total, timed_out=out.timed_out, error=error, output_truncated=out.truncated
    )


def _run_io(
    code: str,
    cases: tuple[tuple[str, str], ...],
    info: SandboxInfo,
    deadline: float,
    cpu_budget: float,
    **limits,
) -> SandboxResult:
    passed = 0
    errors: list[str] = []
    timed_out = truncated = False
    cpu_used = 0.0  # as polled: a case shorter than a poll counts as free
    for i, (stdin, expected) in enumerate(cases):
        if time.monotonic() >= deadline or cpu_used >= cpu_budget:
            timed_out = True
            errors.append(f"case {i}: timed out (budget spent)")
            break
        job = {"mode": "io", "code": code, "stdin": stdin}
        out, ready, stderr, _ = sandbox_once(
            info, job, deadline=deadline, cpu_budget=cpu_budget - cpu_used, **limits
        )
        cpu_used += out.cpu_s
        if not ready:
            return SandboxResult(
                passed, len(cases), setup_failed=True, error=setup_error(out, stderr)
            )
        if out.timed_out:
            timed_out = True
            errors.append(f"case {i}: timed out")
            break
        if out.truncated:
            truncated = True
            errors.append(f"case {i}: output limit of {limits['max_output_bytes']} bytes exceeded")
        elif out.returncode != 0:
            errors.append(f"case {i}: " + _died(out, stderr))
        elif normalise_output(out.stdout.decode("utf-8", "replace")) == normalise_output(expected):
            passed += 1
        else:
            errors.append(f"case {i}: wrong answer")
    return SandboxResult(
        passed,
        len(cases),
        timed_out=timed_out,
        error=errors[0] if errors and passed < len(cases) else None,
        output_truncated=truncated,
    )


def run_parsed(
    code: str,
    parsed: ParsedTests,
    info: SandboxInfo,
    *,
    timeout_s: float,
    memory_mb: float,
    max_output_bytes: int,
    max_processes: int,
) -> SandboxResult:
    """Run ``code`` against already parsed tests in the sandbox ``info`` describes.

    ``timeout_s`` is the CPU-time budget for all the tests, the processes of the run together;
    the run is also stopped after ``WALL_CLOCK_FACTOR`` times that in wall-clock time (a run
    that sleeps or blocks). Raises :class:`SandboxUnavailableError` when ``info`` says no
    sandbox can be built.
    """
    if info.error or info.python is None:
        raise SandboxUnavailableError(f"no code sandbox on this machine: {info.error}")
    start = time.monotonic()
    limits = {
        "memory_mb": memory_mb,
        "max_output_bytes": max_output_bytes,
        "max_processes": max_processes,
    }
    mode, items = parsed
    runner = _run_asserts if mode == "asserts" else _run_io
    try:
        deadline = start + WALL_CLOCK_FACTOR * timeout_s
        result = runner(code, items, info, deadline, timeout_s, **limits)
    except UidPoolExhaustedError as exc:
        total = sum(1 for kind, _ in items if kind == "test") if mode == "asserts" else len(items)
        result = SandboxResult(0, total, setup_failed=True, error=str(exc))
    return dataclasses.replace(result, duration_s=time.monotonic() - start)
