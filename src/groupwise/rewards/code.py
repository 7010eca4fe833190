"""Code-execution rewards: run the completion's code against the row's tests in a sandbox.

``code_reward`` is the fraction of the row's tests that pass, ``code_reward_binary`` is 1.0 only
if all of them pass; rows without tests get None (not applicable). :func:`make_code_reward`
builds configured variants, :func:`run_tests` runs one piece of code against one set of tests,
:func:`run_program` runs a program and returns what it printed (the ``python`` tool).

Code: the completion's **last** fenced block tagged ``python``/``py``/``python3``/``py3`` or
untagged (```` ```python ... ``` ```` / ```` ``` ... ``` ````; the fences on lines of their own,
indented fences are dedented; a trailing fence left open by a truncated completion counts as
closed at the end). Blocks tagged with another language are ignored. Without any such block the
whole completion is the code.

Tests (the ``tests`` column; ``tests_column`` renames it). Accepted forms, anything else raises
``ValueError``:

- **assert tests** - the solution runs once as module ``solution`` (so an
  ``if __name__ == "__main__":`` block does not run), then each test runs in the solution's
  namespace in its own try/except; a test passes when it raises nothing.

  - a list of strings: each non-blank string is one test (a statement or a block of
    statements, e.g. ``"x = f(3)\\nassert x == 9"``);
  - one string of Python: every top-level ``assert`` statement is one test (it may span several
    lines); the other top-level statements (imports, helper definitions, assignments) are setup
    that runs in order between the tests and is not counted. A string without any ``assert``
    is a single test. A string that does not parse as Python is split into lines, each non-blank,
    non-comment line one test.

- **stdin/stdout tests** - the solution runs as ``__main__`` once per case, in its own sandbox
  process, with the case's input as stdin; a case passes when the process exits with status 0
  and its stdout equals the expected output up to trailing whitespace on each line, ``\\r\\n``
  line ends and trailing blank lines. The expected output never enters the sandbox.

  - a list of ``{"input": str, "output": str}`` dicts;
  - a dict ``{"inputs": [str, ...], "outputs": [str, ...]}`` (APPS/TACO style);
  - a single ``{"input": str, "output": str}`` dict;
  - a JSON string encoding any of the above (or a JSON list of assert strings).

  Call-based APPS tests (a dict with ``fn_name``) are not supported.

- missing tests - ``None``, NaN, an empty or blank string, an empty list or dict: the reward is
  None for that row; :func:`run_tests` refuses them with ``ValueError``.

Limits (per completion): ``timeout_s`` is the wall-clock budget for *all* of a completion's tests
(the assert tests after one that hangs fail; stdin/stdout cases run one after the other on the
remaining budget and those after it is spent fail); each sandbox process also gets
``RLIMIT_CPU`` = ceil(remaining budget) s, ``RLIMIT_AS`` = ``memory_mb``, ``RLIMIT_FSIZE`` =
64 MiB, ``RLIMIT_NOFILE`` = 256, no core dumps, at most ``max_processes`` processes/threads
(``RLIMIT_NPROC``), and ``max_output_bytes`` of stdout+stderr together: the trainer keeps at most
that much and kills the sandbox as soon as it is exceeded.

Isolation. Code never runs in the trainer's process. Each run starts a fresh interpreter
(``python -I -S -c LAUNCHER``: no user site, no site-packages, no ``PYTHON*`` variables, the
script directory not on ``sys.path``) with an empty environment except ``PATH``, stdin from
``/dev/null`` (or the case's input), in a new session/process group (``os.killpg`` kills the tree
on timeout or output overflow), in a fresh ``tempfile.mkdtemp`` working directory that is deleted
afterwards (owned by the sandbox uid when root). The code and tests reach the sandbox in a 0600
file of the trainer's user that the launcher reads and deletes before the solution starts. The
launcher (trusted code, run by the sandbox interpreter) then, in order:

1. sets ``PR_SET_PDEATHSIG`` so the sandbox dies with the trainer;
2. ``unshare``s the namespaces the one-time probe found available: **network** (only a down
   loopback: no connection anywhere, not even to 127.0.0.1), **PID** (the solution cannot see
   or signal any outside process; a tiny init reaps, and when it exits the kernel kills every
   process left in the namespace, also those that called ``setsid``), **mount** and **IPC**.
   With the mount namespace every mount is remounted read-only, the world-writable ``/tmp``,
   ``/var/tmp``, ``/dev/shm`` and ``/run/lock`` get private 16 MiB tmpfs, the working directory
   is a private 64 MiB tmpfs and ``/proc`` shows only the sandbox's processes (an empty
   tmpfs hides it where a new procfs cannot be mounted);
3. sets the rlimits above;
4. when the trainer runs as **root**: switches to a dedicated unprivileged uid/gid with no
   supplementary groups (a pool of 64 uids from 59000, override with
   ``GROUPWISE_SANDBOX_UID_BASE``, keeping those with no passwd/group entry and no process; one
   uid is leased per run through a ``flock`` in a root-only directory, so concurrent runs, also
   from other trainer processes, never share a uid). Root is exempt from ``RLIMIT_NPROC``; the
   dedicated uid makes the limit bite, and its file permissions and signal rights keep the
   project, the home directory and the trainer out of reach even without namespaces. After a run
   that had to be killed, or after every run without a PID namespace, every process of the uid
   is killed (this catches processes that left the process group).
   When the trainer is **not root** the solution keeps the trainer's uid: ``RLIMIT_NPROC`` then
   counts all of that user's tasks, so it is set to the user's current task count plus
   ``max_processes``; the namespaces come from an unprivileged user namespace where the
   system allows one (the user's own uid mapped to itself; every capability in it is dropped
   before the solution runs, so it cannot undo the mounts). Without a mount namespace the
   solution can write wherever the trainer's user can and read the trainer's ``/proc``
   entries, environment included; without any namespace it can also signal the trainer, and
   the processes of a run are found again after it by a random tag on their command line (best
   effort: a process that ``exec``s something else escapes it, though not its rlimits);
5. sets ``PR_SET_NO_NEW_PRIVS`` (set-uid binaries gain nothing);
6. without a network namespace: blocks socket creation in Python (``socket.socket``,
   ``socketpair``, ``fromfd``, ``create_connection``, ``getaddrinfo``... raise
   ``PermissionError``; ``_socket`` and ``ctypes`` cannot be imported again). This stops
   Python-level networking only, not a subprocess such as ``curl``.

The interpreter must be readable by the sandbox uid: the trainer's own (``sys.executable``
resolved, without its venv) is tried first, then ``python3`` on ``/usr/local/bin:/usr/bin:/bin``
(e.g. when the trainer's Python lives under a ``/root`` that other users cannot enter), or only
the one named by ``GROUPWISE_SANDBOX_PYTHON``; solutions run on that interpreter's version.
Detection runs once per process, on first use (a few short sandbox processes);
:func:`sandbox_info` reports what it found. If no sandbox can be built (not Linux, or root but no
usable uid/interpreter), the reward raises :class:`SandboxUnavailableError` rather than run
untrusted code unsandboxed.

Results. Assert results travel on their own file descriptor as lines ``<nonce> <i> P|F``, with a
fresh random nonce per run and only from the harness's own pid (a forked copy cannot report), so
printing cannot forge a pass and exiting early fails the remaining tests. A sandbox that failed to
start (it never printed its nonce-tagged ready line) is reported as ``setup_failed`` and scores
None, never 0; the reward raises if that happens to every completion of a batch.

Limitations: assert tests run in the solution's own process, so code that inspects the harness
(``sys._getframe``, ``gc``) can read the tests and the nonce, and objects with a rigged ``__eq__``
pass ``assert f(x) == y``; stdin/stdout tests do not have this weakness. Only Linux is supported.
"""

from __future__ import annotations

import ast
import concurrent.futures
import contextlib
import dataclasses
import fcntl
import json
import logging
import math
import os
import re
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from .basic import RewardFunc, completion_text

logger = logging.getLogger("groupwise.rewards")

__all__ = [
    "ProgramResult",
    "SandboxInfo",
    "SandboxResult",
    "SandboxUnavailableError",
    "code_reward",
    "code_reward_binary",
    "extract_code",
    "make_code_reward",
    "parse_tests",
    "run_program",
    "run_tests",
    "sandbox_info",
]

# Linux constants (unshare(2)).
CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
UID_POOL_SIZE = 64
DEFAULT_UID_BASE = 59000
MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_OPEN_FILES = 256
_SETUP_FAILED_STATUS = 125
_READ_CHUNK = 65536

# ------------------------------------------------------------------------------------------------
# The launcher: runs inside the sandbox interpreter (any CPython >= 3.6, so no newer syntax).
# It starts with the trainer's privileges, builds the sandbox, drops privileges, then runs the
# solution. Everything it needs is imported before the solution runs.
_LAUNCHER = r'''
import os, sys, marshal, ctypes

NEWNS, NEWIPC, NEWUSER, NEWPID, NEWNET = 0x20000, 0x8000000, 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 262144
MS_KEEP = 2 | 4 | 8 | 1024 | 2048 | 4096
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 1, 4, 38
SETUP_FAILED = 125

libc = ctypes.CDLL(None, use_errno=True)
libc.unshare.argtypes = [ctypes.c_int]
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                       ctypes.c_char_p]
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                       ctypes.c_ulong]
libc.capset.argtypes = [ctypes.c_void_p, ctypes.c_void_p]


def check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, "%s: %s" % (what, os.strerror(err)))


def prctl(option, value):
    check(libc.prctl(option, value, 0, 0, 0), "prctl(%d)" % option)


def enc(text):
    return None if text is None else text.encode()


def mount(source, target, fstype, flags, data=None):
    check(libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)),
          "mount(%s)" % target)


def exit_code(status):
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def fail(message):
    try:
        os.write(2, ("groupwise sandbox setup failed: %s\n" % message).encode("utf-8", "replace"))
    finally:
        os._exit(SETUP_FAILED)


def map_user(cfg):
    # Inside a new user namespace: map our own uid/gid to themselves (files can be created).
    for name, text in (("setgroups", "deny"), ("uid_map", "%d %d 1\n" % (cfg["euid"], cfg["euid"])),
                       ("gid_map", "%d %d 1\n" % (cfg["egid"], cfg["egid"]))):
        path = "/proc/self/" + name
        if name == "setgroups" and not os.path.exists(path):
            continue
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)


def mountpoints():
    points = []
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            point = line.split()[4].decode("utf-8", "surrogateescape")
            for code in ("\\040", "\\011", "\\012", "\\134"):
                point = point.replace(code, chr(int(code[1:], 8)))
            points.append(point)
    return points


def make_readonly():
    for point in mountpoints():
        try:
            keep = os.statvfs(point).f_flag & MS_KEEP
            mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | keep)
        except OSError:
            pass  # unreachable or locked mount: its permissions still apply


def probe(cfg):
    ok = []
    for name, flags in cfg["candidates"]:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                check(libc.unshare(flags), "unshare")
                if flags & NEWUSER:
                    map_user(cfg)
                if flags & NEWNS:
                    mount(None, "/", None, MS_REC | MS_PRIVATE)
                    mount("tmpfs", cfg["workdir"], "tmpfs", MS_NOSUID | MS_NODEV, "size=64k")
                    mount(None, cfg["workdir"], None, MS_REMOUNT | MS_BIND | MS_RDONLY)
                if flags & NEWPID:
                    child = os.fork()
                    if child == 0:
                        os._exit(0 if os.getpid() == 1 else 1)
                    code = exit_code(os.waitpid(child, 0)[1])
                else:
                    code = 0
            except BaseException:
                code = 1
            os._exit(code)
        if exit_code(os.waitpid(pid, 0)[1]) == 0:
            ok.append(name)
    version = "%d.%d.%d" % tuple(sys.version_info[:3])
    os.write(1, ("%s PROBE %s %s\n" % (cfg["nonce"], ",".join(ok) or "-", version)).encode())


def setup(cfg):
    flags = cfg["flags"]
    if flags:
        check(libc.unshare(flags), "unshare(%#x)" % flags)
    if flags & NEWUSER:
        map_user(cfg)
    if flags & NEWNS:
        mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing propagates back to the host
        make_readonly()
        for path in cfg["masks"]:
            mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=1777,size=16m")
        work = cfg["workdir"]
        if not os.path.isdir(work):
            os.makedirs(work, 0o700)
        opts = "mode=0700,size=%dk" % (cfg["disk_bytes"] // 1024)
        if cfg["uid"] is not None:
            opts += ",uid=%d,gid=%d" % (cfg["uid"], cfg["uid"])
        mount("tmpfs", work, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, opts)
        os.chdir(work)


def start_pid_namespace(cfg):
    """Fork the namespace's init (pid 1); return in the worker (pid 2)."""
    alive_r, alive_w = os.pipe()
    init = os.fork()
    if init:
        os.close(alive_r)
        status = os.waitpid(init, 0)[1]
        os._exit(exit_code(status))
    os.close(alive_w)
    prctl(PR_SET_PDEATHSIG, 9)
    os.set_blocking(alive_r, False)
    try:
        if os.read(alive_r, 1) == b"":
            os._exit(SETUP_FAILED)  # the launcher died before PDEATHSIG was armed
    except BlockingIOError:
        pass
    if cfg["flags"] & NEWNS:  # a /proc of this namespace only; failing that, none
        try:
            mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        except OSError:
            mount("tmpfs", "/proc", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=555")
    worker = os.fork()
    if worker == 0:
        os.close(alive_r)
        return
    while True:  # init: reap everything, exit with the worker's status (kills the rest)
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(SETUP_FAILED)
        if pid == worker:
            os._exit(exit_code(status))


def drop_capabilities():
    # capset(2), version 3: empty effective, permitted and inheritable sets.
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)
    data = (ctypes.c_uint32 * 6)()
    check(libc.capset(header, data), "capset")


def drop_privileges(cfg):
    import resource
    for name, soft, hard in cfg["rlimits"]:
        res = getattr(resource, name)
        cur_hard = resource.getrlimit(res)[1]
        if cur_hard != resource.RLIM_INFINITY:
            hard = min(hard, cur_hard)
        resource.setrlimit(res, (min(soft, hard), hard))
    uid = cfg["uid"]
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        if (os.getuid(), os.geteuid(), os.getgid(), os.getegid()) != (uid, uid, uid, uid):
            raise RuntimeError("could not switch to uid %d" % uid)
        try:
            os.setuid(0)
        except OSError:
            pass
        else:
            raise RuntimeError("could regain root after dropping it")
    elif cfg["flags"] & NEWUSER:
        drop_capabilities()  # those of the user namespace: no mount, no namespace tricks
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    prctl(PR_SET_DUMPABLE, 1)
    prctl(PR_SET_PDEATHSIG, 9)  # cleared by the uid change


def block_network():
    import errno, socket, _socket

    def blocked(*args, **kwargs):
        raise PermissionError(errno.EACCES, "network access is disabled in this sandbox")

    names = ("socket", "SocketType", "socketpair", "fromfd", "fromshare", "create_connection",
             "create_server", "getaddrinfo", "gethostbyname", "gethostbyname_ex",
             "gethostbyaddr", "getnameinfo")
    for module in (socket, _socket):
        for name in names:
            if hasattr(module, name):
                setattr(module, name, blocked)
    for name in ("_socket", "ctypes", "_ctypes"):
        sys.modules[name] = None


def set_stdin(cfg):
    if cfg["mode"] == "io":
        data = cfg["stdin"].encode("utf-8")
        if hasattr(os, "memfd_create"):
            fd = os.memfd_create("stdin")
        else:
            name = ".stdin-%d" % os.getpid()
            fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            os.unlink(name)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.lseek(fd, 0, 0)
    else:
        fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(fd, 0)
    os.close(fd)


def describe(exc):
    try:
        text = "%s: %s" % (type(exc).__name__, exc) if str(exc) else type(exc).__name__
    except BaseException:
        text = "exception"
    return " ".join(text.split())[:300]


def run_asserts(cfg):
    nonce, me, write = cfg["nonce"], os.getpid(), os.write
    results = os.dup(1)
    os.dup2(2, 1)  # the solution's stdout goes to stderr; fd `results` is the harness's

    def emit(line):
        if os.getpid() == me:  # a forked copy of the harness must not report
            try:
                write(results, ("%s %s\n" % (nonce, line)).encode("utf-8", "replace"))
            except OSError:
                pass

    import builtins
    module = type(sys)("solution")
    module.__file__ = "solution.py"
    module.__builtins__ = builtins
    sys.modules["solution"] = module
    namespace = module.__dict__
    run = exec
    compile_ = compile
    try:
        run(compile_(cfg["code"], "solution.py", "exec", dont_inherit=True, optimize=0), namespace)
    except BaseException as exc:
        emit("SETUP " + describe(exc))
    index = 0
    for kind, source in cfg["tests"]:
        name = "<test %d>" % index if kind == "test" else "<setup>"
        try:
            run(compile_(source, name, "exec", dont_inherit=True, optimize=0), namespace)
        except BaseException as exc:
            emit(("%d F " % index if kind == "test" else "SETUP ") + describe(exc))
        else:
            if kind == "test":
                emit("%d P" % index)
        if kind == "test":
            index += 1
    emit("DONE")
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    os._exit(0)


def run_io(cfg):
    import builtins
    sys.argv = ["solution.py"]
    module = type(sys)("__main__")
    module.__file__ = "solution.py"
    module.__builtins__ = builtins
    sys.modules["__main__"] = module
    namespace = module.__dict__
    status = 0
    try:
        exec(compile(cfg["code"], "solution.py", "exec", dont_inherit=True, optimize=0), namespace)
    except SystemExit as exc:
        status = exc.code
    except BaseException:
        import traceback
        traceback.print_exc()
        status = 1
    sys.exit(status)  # normal interpreter shutdown: joins threads, flushes stdout


def main():
    try:
        with open(".payload", "rb") as f:
            cfg = marshal.loads(f.read())
        os.unlink(".payload")
        prctl(PR_SET_PDEATHSIG, 9)
        if os.getppid() != cfg["parent"]:
            os._exit(SETUP_FAILED)
        if cfg.get("probe"):
            probe(cfg)
            os._exit(0)
        setup(cfg)
        if cfg["flags"] & NEWPID:
            start_pid_namespace(cfg)
        set_stdin(cfg)
        if cfg["block_network"]:
            block_network()  # imports socket while the stdlib is surely readable
        drop_privileges(cfg)
        os.write(2, ("%s READY\n" % cfg["nonce"]).encode())
    except BaseException as exc:
        fail("%s: %s" % (type(exc).__name__, exc))
    if cfg["mode"] == "io":
        run_io(cfg)
    else:
        run_asserts(cfg)


main()
'''


# ------------------------------------------------------------------------------------------------
# Public data types


class SandboxUnavailableError(RuntimeError):
    """No sandbox can be built on this machine; untrusted code is not run."""


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    """Outcome of one :func:`run_tests` call.

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


@dataclasses.dataclass(frozen=True)
class SandboxInfo:
    """What the one-time probe found; see the module docstring for what each layer does."""

    python: str | None = None  # interpreter run in the sandbox
    python_version: str | None = None
    root: bool = False  # trainer is root: children switch to a dedicated uid from `uids`
    uids: tuple[int, ...] = ()
    unshare_flags: int = 0  # CLONE_NEW* flags used for every run
    masked_dirs: tuple[str, ...] = ()  # world-writable dirs hidden behind private tmpfs
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
            f"namespaces: {', '.join(spaces)}; network: {self.network_isolation}"
        )

    @property
    def network_isolation(self) -> str:
        """'namespace' (no network at all) or 'socket-block' (Python sockets blocked only)."""
        return "namespace" if self.unshare_flags & CLONE_NEWNET else "socket-block"

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


# ------------------------------------------------------------------------------------------------
# Code extraction and test parsing

_FENCE = re.compile(
    r"^[ \t]*```[ \t]*(?P<lang>[\w+.-]*)[^\n]*\n(?P<body>.*?)^[ \t]*```[ \t\r]*$",
    re.MULTILINE | re.DOTALL,
)
_OPEN_FENCE = re.compile(r"^[ \t]*```[ \t]*(?P<lang>[\w+.-]*)[^\n]*\n(?P<body>.*)\Z", re.M | re.S)
_PYTHON_TAGS = {"", "python", "py", "python3", "py3"}


def extract_code(text: str) -> str:
    """The last fenced Python (or untagged) code block of ``text``; the whole text if none."""
    last = None
    end = 0
    for match in _FENCE.finditer(text):
        end = match.end()
        if match.group("lang").lower() in _PYTHON_TAGS:
            last = match.group("body")
    tail = _OPEN_FENCE.search(text, end)
    if tail is not None and tail.group("lang").lower() in _PYTHON_TAGS:
        last = tail.group("body")  # a truncated completion: the open fence runs to the end
    if last is None:
        return text
    return textwrap.dedent(last)


# Parsed tests: ("asserts", ((kind, source), ...)) with kind "test" or "setup",
# or ("io", ((stdin, expected_stdout), ...)).
ParsedTests = tuple[str, tuple[tuple[str, str], ...]]


def _is_missing(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, float) and math.isnan(value):
        return True
    if isinstance(value, str):
        return not value.strip()
    if isinstance(value, (list, tuple, dict)):
        return len(value) == 0
    return False


def _split_assert_source(source: str) -> tuple[tuple[str, str], ...]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        lines = [line.strip() for line in source.splitlines()]
        return tuple(("test", line) for line in lines if line and not line.startswith("#"))
    if not any(isinstance(node, ast.Assert) for node in tree.body):
        return (("test", source),)
    lines = source.encode("utf-8").splitlines(keepends=True)  # ast columns are UTF-8 offsets
    items = []
    for node in tree.body:
        decorators = getattr(node, "decorator_list", [])
        if decorators:  # a decorated definition starts at its first "@", always on a new line
            start, col = min(d.lineno for d in decorators), 0
        else:
            start, col = node.lineno, node.col_offset
        end, end_col = node.end_lineno or node.lineno, node.end_col_offset or 0
        if start == end:
            text = lines[start - 1][col:end_col]
        else:
            text = lines[start - 1][col:] + b"".join(lines[start : end - 1])
            text += lines[end - 1][:end_col]
        kind = "test" if isinstance(node, ast.Assert) else "setup"
        items.append((kind, text.decode("utf-8")))
    return tuple(items)


def _io_case(case: Any) -> tuple[str, str]:
    if not isinstance(case, dict) or "input" not in case or "output" not in case:
        raise ValueError(f"a stdin/stdout test must be a dict with 'input' and 'output': {case!r}")
    stdin, stdout = case["input"], case["output"]
    if not isinstance(stdin, str) or not isinstance(stdout, str):
        raise ValueError("stdin/stdout test 'input' and 'output' must be strings")
    return stdin, stdout


def parse_tests(tests: Any) -> ParsedTests | None:
    """Normalise a ``tests`` value (see the module docstring for the forms); None if missing."""
    if _is_missing(tests):
        return None
    if isinstance(tests, str):
        stripped = tests.strip()
        if stripped[0] in "[{":
            try:
                decoded = json.loads(stripped)
            except ValueError:
                decoded = None
            if isinstance(decoded, (list, dict)):
                return parse_tests(decoded)
        items = _split_assert_source(tests)
        return ("asserts", items) if items else None
    if isinstance(tests, dict):
        if "fn_name" in tests:
            raise ValueError("call-based tests (fn_name) are not supported; use assert tests")
        if "inputs" in tests or "outputs" in tests:
            inputs, outputs = tests.get("inputs"), tests.get("outputs")
            if not isinstance(inputs, list) or not isinstance(outputs, list):
                raise ValueError("'inputs' and 'outputs' must both be lists")
            if len(inputs) != len(outputs):
                raise ValueError(f"{len(inputs)} inputs but {len(outputs)} outputs")
            if not inputs:
                return None
            cases = [{"input": i, "output": o} for i, o in zip(inputs, outputs, strict=True)]
            return ("io", tuple(_io_case(c) for c in cases))
        return ("io", (_io_case(tests),))
    if isinstance(tests, (list, tuple)):
        if all(isinstance(t, str) for t in tests):
            items = tuple(("test", textwrap.dedent(t)) for t in tests if t.strip())
            return ("asserts", items) if items else None
        if all(isinstance(t, dict) for t in tests):
            return ("io", tuple(_io_case(t) for t in tests))
        raise ValueError("a list of tests must hold only strings (asserts) or only dicts (I/O)")
    raise ValueError(f"unsupported tests value of type {type(tests).__name__}")


def _normalise_output(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


# ------------------------------------------------------------------------------------------------
# Detection (once per process)

_info_lock = threading.Lock()
_info: SandboxInfo | None = None
_uid_pool: _UidPool | None = None


def sandbox_info() -> SandboxInfo:
    """Detect (once, then cached) which isolation layers this machine allows."""
    global _info
    with _info_lock:
        if _info is None:
            _info = _detect()
            if _info.error:
                logger.warning("code sandbox unavailable: %s", _info.error)
            else:
                logger.info("code sandbox: %s", _info.summary())
        return _info


def _python_candidates() -> list[str]:
    override = os.environ.get("GROUPWISE_SANDBOX_PYTHON")
    if override:
        return [override]
    found = [os.path.realpath(sys.executable)] if sys.executable else []
    system = shutil.which("python3", path=SANDBOX_PATH)
    if system:
        found.append(os.path.realpath(system))
    return list(dict.fromkeys(found))


def _process_uids(include_zombies: bool = True) -> dict[int, int]:
    """pid -> real uid of every visible process (zombies only if ``include_zombies``)."""
    result = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"State:") and not include_zombies:
                        if line.split()[1] in (b"Z", b"X"):
                            break
                    elif line.startswith(b"Uid:"):
                        result[int(entry)] = int(line.split()[1])
                        break
        except OSError:
            continue
    return result


def _user_task_count(uid: int) -> int:
    """Tasks (threads) owned by ``uid``: what RLIMIT_NPROC counts."""
    count = 0
    for pid, owner in _process_uids().items():
        if owner == uid:
            try:
                count += len(os.listdir(f"/proc/{pid}/task"))
            except OSError:
                count += 1
    return count


def _candidate_uids() -> tuple[int, ...]:
    import grp
    import pwd

    base = int(os.environ.get("GROUPWISE_SANDBOX_UID_BASE", DEFAULT_UID_BASE))
    busy = set(_process_uids().values())
    uids = []
    for uid in range(base, base + UID_POOL_SIZE):
        if uid in busy:
            continue
        try:
            pwd.getpwuid(uid)
            continue
        except KeyError:
            pass
        try:
            grp.getgrgid(uid)
            continue
        except KeyError:
            pass
        uids.append(uid)
    return tuple(uids)


def _masked_dirs() -> tuple[str, ...]:
    found = []
    for path in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", tempfile.gettempdir()):
        real = os.path.realpath(path)
        try:
            st = os.stat(real)
        except OSError:
            continue
        if os.path.isdir(real) and st.st_mode & 0o002 and real != "/":
            found.append(real)
    return tuple(dict.fromkeys(found))


def _probe_namespaces(python: str, root: bool) -> tuple[int, str] | None:
    """(CLONE flags to use, interpreter version), or None if the interpreter does not run."""
    if root:
        candidates = [
            ("net", CLONE_NEWNET),
            ("pid", CLONE_NEWPID),
            ("mnt", CLONE_NEWNS),
            ("ipc", CLONE_NEWIPC),
        ]
    else:
        candidates = [
            ("user", CLONE_NEWUSER),
            ("net", CLONE_NEWUSER | CLONE_NEWNET),
            ("pid", CLONE_NEWUSER | CLONE_NEWPID),
            ("mnt", CLONE_NEWUSER | CLONE_NEWNS),
            ("ipc", CLONE_NEWUSER | CLONE_NEWIPC),
        ]
    nonce = secrets.token_hex(16)
    payload = {"probe": True, "candidates": candidates, "nonce": nonce}
    with _workdir(None) as workdir:
        payload["workdir"] = workdir
        out = _spawn(python, payload, workdir, deadline=time.monotonic() + 20.0, limit=65536)
    for line in out.stdout.decode("utf-8", "replace").splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] == nonce and parts[1] == "PROBE":
            ok = set(parts[2].split(","))
            names = {name: flag for name, flag in candidates}
            if not root:
                if "user" not in ok:
                    return 0, parts[3]
                names = {k: v & ~CLONE_NEWUSER for k, v in names.items()}
                flags = CLONE_NEWUSER
            else:
                flags = 0
            for name in ok & set(names):
                flags |= names[name]
            return flags, parts[3]
    return None


def _detect() -> SandboxInfo:
    global _uid_pool
    if not sys.platform.startswith("linux"):
        return SandboxInfo(error=f"the code sandbox needs Linux, not {sys.platform}")
    root = os.geteuid() == 0
    uids = _candidate_uids() if root else ()
    if root and not uids:
        return SandboxInfo(root=True, error="no free uid for the sandbox (all in use)")
    errors = []
    for python in _python_candidates():
        probed = _probe_namespaces(python, root)
        if probed is None:
            errors.append(f"{python}: does not start")
            continue
        flags, version = probed
        if root and _uid_pool is None:
            _uid_pool = _UidPool(uids)
        # A layer the probe accepted may still fail in the full setup: drop mount, then all.
        ladder = dict.fromkeys([flags, flags & ~CLONE_NEWNS, 0])
        for attempt in ladder:
            info = SandboxInfo(
                python=python,
                python_version=version,
                root=root,
                uids=uids,
                unshare_flags=attempt,
                masked_dirs=_masked_dirs() if attempt & CLONE_NEWNS else (),
            )
            check = _run(
                "import json, math, collections, re, itertools\nvalue = json.loads('[1, 2]')",
                ("asserts", (("test", "assert value == [1, 2]"),)),
                info,
                timeout_s=20.0,
                memory_mb=512,
                max_output_bytes=65536,
                max_processes=32,
            )
            if check.passed == 1:
                return info
            errors.append(f"{python} (namespaces {attempt:#x}): {check.error}")
    return SandboxInfo(root=root, uids=uids, error="; ".join(errors) or "no Python interpreter")


# ------------------------------------------------------------------------------------------------
# Running one sandbox process


class _UidPool:
    """Leases dedicated sandbox uids, one per concurrent run, across threads and processes."""

    def __init__(self, uids: Sequence[int]) -> None:
        self.uids = list(uids)
        self.lock_dir = self._lock_dir()

    @staticmethod
    def _lock_dir() -> str:
        path = os.path.join(tempfile.gettempdir(), f"groupwise-sandbox-locks-{os.geteuid()}")
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
        st = os.lstat(path)
        import stat

        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077:
            return path
        logger.warning("%s is not a private directory; sandbox uid locks are per process", path)
        return tempfile.mkdtemp(prefix="groupwise-sandbox-locks-")

    @contextlib.contextmanager
    def lease(self) -> Iterator[int]:
        start = secrets.randbelow(len(self.uids))
        order = self.uids[start:] + self.uids[:start]
        while True:
            for uid in order:
                path = os.path.join(self.lock_dir, f"uid-{uid}.lock")
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                try:
                    yield uid
                finally:
                    os.close(fd)  # releases the flock
                return
            time.sleep(0.01)


@contextlib.contextmanager
def _workdir(uid: int | None) -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="groupwise-sandbox-")
    try:
        if uid is not None:
            os.chown(path, uid, uid)
        yield path
    finally:
        _remove_tree(path)


def _remove_tree(path: str) -> None:
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        pass
    except OSError:  # e.g. directories the sandbox made unreadable (same user, not root)
        for root, dirs, _ in os.walk(path):
            for name in dirs:
                with contextlib.suppress(OSError):
                    os.chmod(os.path.join(root, name), 0o700, follow_symlinks=False)
        shutil.rmtree(path, ignore_errors=True)


@dataclasses.dataclass
class _Output:
    stdout: bytes
    stderr: bytes
    returncode: int | None
    timed_out: bool
    truncated: bool


def _exited(pid: int) -> bool:
    """Whether ``pid`` (our child) has exited, without reaping it (its pgid stays reserved)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _kill_uid(uid: int) -> None:
    """SIGKILL every process of a sandbox uid (for processes that left the process group)."""
    for _ in range(50):
        victims = [pid for pid, owner in _process_uids(False).items() if owner == uid]
        if not victims:
            return
        for pid in victims:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)
    logger.warning("processes of sandbox uid %d survived 50 kill rounds", uid)


def _kill_tagged(tag: str) -> None:
    """SIGKILL our processes whose command line carries ``tag`` (non-root, no PID namespace)."""
    needle, me = tag.encode(), os.getpid()
    for _ in range(50):
        victims = []
        for pid, owner in _process_uids(False).items():
            if owner != os.getuid() or pid == me:
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if needle in f.read():
                        victims.append(pid)
            except OSError:
                continue
        if not victims:
            return
        for pid in victims:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


def _spawn(
    python: str,
    payload: dict[str, Any],
    workdir: str,
    *,
    deadline: float,
    limit: int,
    sweep_uid: int | None = None,
    sweep_tagged: bool = False,
    sweep_only_if_killed: bool = False,
) -> _Output:
    """Start the launcher with ``payload``, read at most ``limit`` bytes, kill at ``deadline``."""
    import marshal

    payload.update(parent=os.getpid(), euid=os.geteuid(), egid=os.getegid())
    data = marshal.dumps(payload, 4)
    fd = os.open(
        os.path.join(workdir, ".payload"),
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o600,
    )
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    tag = f"groupwise-sandbox-{secrets.token_hex(8)}"  # marks the run's processes, not secret
    try:
        proc = subprocess.Popen(
            [python, "-I", "-S", "-c", _LAUNCHER, tag],
            cwd=workdir,
            env={"PATH": SANDBOX_PATH},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as exc:
        message = f"cannot start {python}: {exc}".encode()
        return _Output(b"", message, None, timed_out=False, truncated=False)
    assert proc.stdout is not None and proc.stderr is not None
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    buffers = {out_fd: bytearray(), err_fd: bytearray()}
    total = 0
    timed_out = truncated = False
    exited_at: float | None = None
    try:
        with selectors.DefaultSelector() as selector:
            for fileno in buffers:
                selector.register(fileno, selectors.EVENT_READ)
            while selector.get_map():
                now = time.monotonic()
                if now >= deadline:
                    timed_out = True
                    break
                events = selector.select(timeout=min(deadline - now, 0.2))
                for key, _ in events:
                    chunk = os.read(key.fd, _READ_CHUNK)
                    if not chunk:
                        selector.unregister(key.fd)
                        continue
                    buffers[key.fd] += chunk[: max(limit - total, 0)]
                    total += len(chunk)
                if total > limit:
                    truncated = True
                    break
                if not events and _exited(proc.pid):
                    # The launcher is gone but something still holds the pipes open.
                    if exited_at is None:
                        exited_at = now
                        _kill_group(proc.pid)
                    elif now - exited_at > 0.5:
                        break
    finally:
        _kill_group(proc.pid)  # the leader is not reaped yet, so its pgid cannot be reused
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
        killed = timed_out or truncated or exited_at is not None
        if sweep_uid is not None and (killed or not sweep_only_if_killed):
            _kill_uid(sweep_uid)  # also waits for processes still dying from the kill
        if sweep_tagged:
            _kill_tagged(tag)
    return _Output(
        stdout=bytes(buffers[out_fd]),
        stderr=bytes(buffers[err_fd]),
        returncode=proc.returncode,
        timed_out=timed_out,
        truncated=truncated,
    )


def _sandbox_once(
    info: SandboxInfo,
    job: dict[str, Any],
    *,
    deadline: float,
    memory_mb: float,
    max_output_bytes: int,
    max_processes: int,
) -> tuple[_Output, bool, str, str]:
    """Run one sandbox process; (output, ready, stderr text without the marker, nonce)."""
    nonce = secrets.token_hex(16)
    remaining = max(deadline - time.monotonic(), 0.001)
    cpu = max(1, math.ceil(remaining))
    memory = int(memory_mb * 1024 * 1024)
    if info.root:
        nproc = max_processes
    else:  # RLIMIT_NPROC counts every task of the user, the trainer's threads included
        nproc = _user_task_count(os.getuid()) + max_processes + 3
    rlimits = [
        ("RLIMIT_CPU", cpu, cpu + 1),
        ("RLIMIT_AS", memory, memory),
        ("RLIMIT_NPROC", nproc, nproc),
        ("RLIMIT_FSIZE", MAX_FILE_BYTES, MAX_FILE_BYTES),
        ("RLIMIT_NOFILE", MAX_OPEN_FILES, MAX_OPEN_FILES),
        ("RLIMIT_CORE", 0, 0),
    ]
    if info.root:
        if _uid_pool is None:
            raise SandboxUnavailableError("the sandbox uid pool is not initialised")
        lease: contextlib.AbstractContextManager[int | None] = _uid_pool.lease()
    else:
        lease = contextlib.nullcontext(None)
    with lease as uid, _workdir(uid) as workdir:
        payload = {
            **job,
            "nonce": nonce,
            "flags": info.unshare_flags,
            "masks": list(info.masked_dirs),
            "workdir": workdir,
            "disk_bytes": MAX_FILE_BYTES,
            "uid": uid,
            "rlimits": rlimits,
            "block_network": not info.unshare_flags & CLONE_NEWNET,
        }
        # Without a PID namespace, processes that left the process group are hunted down: by
        # uid when we run as root, else by the tag on their command line (best effort). With
        # one, the uid is still checked after a kill: the namespace dies asynchronously.
        assert info.python is not None
        out = _spawn(
            info.python,
            payload,
            workdir,
            deadline=deadline,
            limit=max_output_bytes,
            sweep_uid=uid,
            sweep_tagged=uid is None and not info.pid_namespace,
            sweep_only_if_killed=info.pid_namespace,
        )
    marker = f"{nonce} READY\n".encode()
    ready = out.stderr.startswith(marker)
    stderr = out.stderr[len(marker) :] if ready else out.stderr
    return out, ready, stderr.decode("utf-8", "replace"), nonce


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def _setup_error(out: _Output, stderr: str) -> str:
    if out.timed_out:
        return "the sandbox did not start before the deadline"
    detail = _last_line(stderr) or f"launcher exit status {out.returncode}"
    return f"the sandbox did not start: {detail}"


def _died(out: _Output, stderr: str) -> str:
    code = out.returncode
    how = f"killed by signal {code - 128}" if code is not None and code > 128 else f"status {code}"
    tail = _last_line(stderr)
    return f"solution process died ({how})" + (f": {tail}" if tail else "")


def _run_asserts(
    code: str, items: tuple[tuple[str, str], ...], info: SandboxInfo, deadline: float, **limits
) -> SandboxResult:
    total = sum(1 for kind, _ in items if kind == "test")
    job = {"mode": "asserts", "code": code, "tests": [list(item) for item in items]}
    out, ready, stderr, nonce = _sandbox_once(info, job, deadline=deadline, **limits)
    if not ready:
        return SandboxResult(0, total, setup_failed=True, error=_setup_error(out, stderr))
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
    code: str, cases: tuple[tuple[str, str], ...], info: SandboxInfo, deadline: float, **limits
) -> SandboxResult:
    passed = 0
    errors: list[str] = []
    timed_out = truncated = False
    for i, (stdin, expected) in enumerate(cases):
        if time.monotonic() >= deadline:
            timed_out = True
            errors.append(f"case {i}: timed out (budget spent)")
            break
        job = {"mode": "io", "code": code, "stdin": stdin}
        out, ready, stderr, _ = _sandbox_once(info, job, deadline=deadline, **limits)
        if not ready:
            return SandboxResult(
                passed, len(cases), setup_failed=True, error=_setup_error(out, stderr)
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
        elif _normalise_output(out.stdout.decode("utf-8", "replace")) == _normalise_output(
            expected
        ):
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


def _run(
    code: str,
    parsed: ParsedTests,
    info: SandboxInfo,
    *,
    timeout_s: float,
    memory_mb: float,
    max_output_bytes: int,
    max_processes: int,
) -> SandboxResult:
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
    result = runner(code, items, info, start + timeout_s, **limits)
    return dataclasses.replace(result, duration_s=time.monotonic() - start)


def _check_limits(
    timeout_s: float, memory_mb: float, max_output_bytes: int, max_processes: int
) -> None:
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    if not memory_mb >= 64:
        raise ValueError(f"memory_mb must be >= 64 (the interpreter needs it), got {memory_mb}")
    if max_output_bytes < 1024:
        raise ValueError(f"max_output_bytes must be >= 1024, got {max_output_bytes}")
    if max_processes < 1:
        raise ValueError(f"max_processes must be >= 1, got {max_processes}")


def run_tests(
    code: str,
    tests: Any,
    *,
    timeout_s: float = 5.0,
    memory_mb: float = 512,
    max_output_bytes: int = 1_000_000,
    max_processes: int = 32,
) -> SandboxResult:
    """Run ``code`` (plain source, no extraction) against ``tests`` in the sandbox.

    ``tests`` takes any form of the module docstring; ``timeout_s`` is the wall-clock budget for
    all of them. Raises ``ValueError`` for missing or malformed tests and
    :class:`SandboxUnavailableError` when this machine cannot sandbox code.
    """
    _check_limits(timeout_s, memory_mb, max_output_bytes, max_processes)
    parsed = parse_tests(tests)
    if parsed is None:
        raise ValueError("no tests to run")
    return _run(
        code,
        parsed,
        sandbox_info(),
        timeout_s=timeout_s,
        memory_mb=memory_mb,
        max_output_bytes=max_output_bytes,
        max_processes=max_processes,
    )


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

    Same isolation and limits as a stdin/stdout test case of :func:`run_tests`. Raises
    :class:`SandboxUnavailableError` when this machine cannot sandbox code.
    """
    _check_limits(timeout_s, memory_mb, max_output_bytes, max_processes)
    info = sandbox_info()
    if info.error or info.python is None:
        raise SandboxUnavailableError(f"no code sandbox on this machine: {info.error}")
    job = {"mode": "io", "code": code, "stdin": stdin}
    out, ready, stderr, _ = _sandbox_once(
        info,
        job,
        deadline=time.monotonic() + timeout_s,
        memory_mb=memory_mb,
        max_output_bytes=max_output_bytes,
        max_processes=max_processes,
    )
    stdout = out.stdout.decode("utf-8", "replace")
    if not ready:
        return ProgramResult("", _setup_error(out, stderr), "setup_failed", out.returncode)
    if out.timed_out:
        status = "timeout"
    elif out.truncated:
        status = "output_limit"
    else:
        status = "ok" if out.returncode == 0 else "error"
    return ProgramResult(stdout, stderr, status, out.returncode)


def make_code_reward(
    timeout_s: float = 5.0,
    memory_mb: float = 512,
    max_output_bytes: int = 1_000_000,
    max_workers: int | None = None,
    binary: bool = False,
    tests_column: str = "tests",
    max_processes: int = 32,
) -> RewardFunc:
    """A reward function (TRL signature) scoring each completion's code on its row's tests.

    Score: fraction of tests passed, or with ``binary`` 1.0 only if all pass. None for rows
    without tests and for completions whose sandbox failed to start (logged); raises if the
    sandbox failed to start for every completion of a call. Completions run in parallel on
    ``max_workers`` threads (default ``min(4, os.cpu_count())``), each driving one sandbox
    process at a time; identical (code, tests) pairs in one call are run once.
    """
    _check_limits(timeout_s, memory_mb, max_output_bytes, max_processes)
    workers = max_workers if max_workers is not None else min(4, os.cpu_count() or 1)
    if workers < 1:
        raise ValueError(f"max_workers must be >= 1, got {workers}")
    limits = {
        "timeout_s": timeout_s,
        "memory_mb": memory_mb,
        "max_output_bytes": max_output_bytes,
        "max_processes": max_processes,
    }

    def reward(
        prompts: Sequence[Any], completions: Sequence[Any], **columns: Any
    ) -> list[float | None]:
        n = len(completions)
        column = columns.get(tests_column)
        scores: list[float | None] = [None] * n
        if column is None:
            return scores
        if len(column) != n:
            raise ValueError(f"{len(column)} values in column {tests_column!r} for {n} completions")
        jobs: dict[tuple[str, ParsedTests], list[int]] = {}
        for i, (completion, tests) in enumerate(zip(completions, column, strict=True)):
            parsed = parse_tests(tests)
            if parsed is not None:
                key = (extract_code(completion_text(completion)), parsed)
                jobs.setdefault(key, []).append(i)
        if not jobs:
            return scores
        info = sandbox_info()

        def run(key: tuple[str, ParsedTests]) -> SandboxResult:
            return _run(key[0], key[1], info, **limits)

        keys = list(jobs)
        if workers == 1 or len(keys) == 1:
            results = [run(key) for key in keys]
        else:
            with concurrent.futures.ThreadPoolExecutor(
                max_workers=min(workers, len(keys)), thread_name_prefix="code-reward"
            ) as pool:
                results = list(pool.map(run, keys))
        failed = [r for r in results if r.setup_failed]
        if len(failed) == len(results):
            raise SandboxUnavailableError(f"the code sandbox failed to start: {failed[0].error}")
        for r in failed:
            logger.warning("code sandbox failed to start, reward None: %s", r.error)
        for key, result in zip(keys, results, strict=True):
            if result.setup_failed:
                continue
            value = (1.0 if result.all_passed else 0.0) if binary else result.fraction
            for i in jobs[key]:
                scores[i] = value
        return scores

    name = "code_reward_binary" if binary else "code_reward"
    reward.__name__ = reward.__qualname__ = name
    reward.__doc__ = (
        f"{'1.0 if all' if binary else 'Fraction'} of the {tests_column!r} tests passed by the "
        "completion's last Python code block, run in a sandbox; None without tests."
    )
    reward.is_correctness = True  # type: ignore[attr-defined]
    return reward


code_reward = make_code_reward()
code_reward_binary = make_code_reward(binary=True)
