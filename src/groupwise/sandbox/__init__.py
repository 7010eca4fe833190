"""The code sandbox: runs untrusted Python (a completion's code, a tool call) in child processes
isolated from the trainer, under CPU, wall-clock, memory, process and output limits. Assert
tests run in a second sandbox, the judge, that the solution cannot reach.

Used by the code reward (:mod:`groupwise.rewards.code`) and the ``python`` tool
(:mod:`groupwise.tools.builtin`); it imports nothing else from groupwise. What it defends
against, layer by layer and mode by mode, and what it does not: docs/sandbox.md.

Modules, in the trainer: ``info`` (constants, :class:`SandboxInfo`), ``probe``
(:func:`sandbox_info`: what this machine allows and which files the interpreter needs, detected
once per process), ``uids`` (dedicated uids when the trainer is root), ``cgroup`` (one cgroup
per sandbox process), ``seccomp`` (the syscall filter), ``process`` (starting launchers, output
limits, CPU and wall-clock deadlines, killing leftovers), ``execute`` (slots, the two-sandbox
assert run and stdin/stdout runs), ``program`` (:func:`run_program`). In the sandbox, loaded by
path: ``launcher`` (builds the sandbox and drops privileges), ``confine`` (seccomp, Landlock,
the keyring), ``harness`` (the solution's server, the judge, a program as ``__main__``).
"""

from .execute import ParsedTests, SandboxResult, check_limits, normalise_output, run_parsed
from .info import (
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    CLONE_NEWUSER,
    SandboxInfo,
    SandboxUnavailableError,
)
from .probe import sandbox_info
from .process import LAUNCHER
from .program import ProgramResult, run_program

__all__ = [
    "CLONE_NEWIPC",
    "CLONE_NEWNET",
    "CLONE_NEWNS",
    "CLONE_NEWPID",
    "CLONE_NEWUSER",
    "LAUNCHER",
    "ParsedTests",
    "ProgramResult",
    "SandboxInfo",
    "SandboxResult",
    "SandboxUnavailableError",
    "check_limits",
    "normalise_output",
    "run_parsed",
    "run_program",
    "sandbox_info",
]
