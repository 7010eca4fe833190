"""The sandbox's Linux constants and fixed limits, :class:`SandboxInfo` (what the one-time probe
found) and the error raised when no sandbox can be built."""

from __future__ import annotations

import dataclasses

# Linux constants (unshare(2)).
CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_OPEN_FILES = 256
# Tests are timed by CPU: a run may take this many times its budget in wall-clock time (a busy
# machine or sibling slows it down) before it is stopped anyway (a sleeping or blocked run).
WALL_CLOCK_FACTOR = 3.0


class SandboxUnavailableError(RuntimeError):
    """No sandbox can be built on this machine; untrusted code is not run."""


@dataclasses.dataclass(frozen=True)
class SandboxInfo:
    """What the one-time probe found; docs/sandbox.md says what each layer defends against."""

    python: str | None = None  # interpreter run in the sandbox
    python_version: str | None = None
    root: bool = False  # trainer is root: children switch to a dedicated uid from `uids`
    uids: tuple[int, ...] = ()
    unshare_flags: int = 0  # CLONE_NEW* flags used for every run
    root_paths: tuple[str, ...] = ()  # the interpreter's files: all the sandbox may read
    root_masks: tuple[str, ...] = ()  # package directories among them, hidden
    limits: str = ""  # which resource limits hold per sandbox (cgroup) or per process
    landlock: int = 0  # the Landlock ABI the sandbox applies (0: none)
    error: str | None = None  # set when no sandbox is available

    def summary(self) -> str:
        if self.error:
            return f"unavailable: {self.error}"
        names = {
            CLONE_NEWUSER: "user",
            CLONE_NEWNET: "network",
            CLONE_NEWPID: "pid",
            CLONE_NEWNS: "mount",
            CLONE_NEWIPC: "ipc",
        }
        spaces = [name for flag, name in names.items() if self.unshare_flags & flag] or ["none"]
        who = f"dedicated uids {self.uids[0]}.." if self.root and self.uids else "trainer's uid"
        return (
            f"python {self.python_version} ({self.python}); runs as {who}; "
            f"namespaces: {', '.join(spaces)}; network: {self.network_isolation}; "
            f"filesystem: {self.filesystem}; "
            f"limits: {self.limits or 'per process'}"
        )

    @property
    def network_isolation(self) -> str:
        """'namespace' (no network at all) or 'socket-block' (Python sockets blocked only)."""
        return "namespace" if self.unshare_flags & CLONE_NEWNET else "socket-block"

    @property
    def filesystem(self) -> str:
        """How the solution's view of the filesystem is restricted."""
        layers = ["allowlisted root"] if self.mount_namespace else []
        layers += [f"Landlock ABI {self.landlock}"] if self.landlock else []
        return " + ".join(layers) or "file permissions only"

    @property
    def pid_namespace(self) -> bool:
        return bool(self.unshare_flags & CLONE_NEWPID)

    @property
    def mount_namespace(self) -> bool:
        return bool(self.unshare_flags & CLONE_NEWNS)

    @property
    def user_namespace(self) -> bool:
        return bool(self.unshare_flags & CLONE_NEWUSER)

    @property
    def filesystem_isolation(self) -> bool:
        """True when the solution cannot write outside its working directory."""
        return self.mount_namespace or self.root

    @property
    def process_isolation(self) -> bool:
        """True when the solution cannot signal the trainer or other processes."""
        return self.pid_namespace or self.root

    @property
    def trainer_invisible(self) -> bool:
        """True when the solution cannot read the trainer's /proc entries (its environment)."""
        return self.root or (self.pid_namespace and self.mount_namespace)
