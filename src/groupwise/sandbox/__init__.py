"""The code sandbox: runs untrusted Python (a completion's code, a tool call) in a child process
isolated from the trainer, under wall-clock, CPU, memory, process and output limits.

Used by the code reward (:mod:`groupwise.rewards.code`) and the ``python`` tool
(:mod:`groupwise.tools.builtin`); it imports nothing else from groupwise. What it defends
against, layer by layer, and what it does not: docs/sandbox.md.

Modules: ``launcher`` (the program the sandbox interpreter runs: builds the sandbox, drops
privileges, runs the code), ``info`` (constants, :class:`SandboxInfo`), ``process`` (starting the
launcher, output limits, deadlines, killing process groups and leftovers), ``uids`` (dedicated
uids when the trainer is root), ``execute`` (one sandbox process per job and the two test
modes), ``probe`` (:func:`sandbox_info`: what this machine allows, detected once per process),
``program`` (:func:`run_program`).
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
