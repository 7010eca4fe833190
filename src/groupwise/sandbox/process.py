"""Process control on the trainer's side: start the launcher, read its output under a byte limit
and a deadline, and kill what a run leaves behind (its process group, every process of a sandbox
uid, or processes carrying the run's tag on their command line)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import marshal
import os
import secrets
import selectors
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .info import SANDBOX_PATH

logger = logging.getLogger("groupwise.sandbox")

# The program the sandbox interpreter runs; a file of this package, so it ships in the wheel.
LAUNCHER = str(Path(__file__).resolve().with_name("launcher.py"))
TAG_PREFIX = "groupwise-sandbox-"
_READ_CHUNK = 65536


def process_uids(include_zombies: bool = True) -> dict[int, int]:
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


def user_task_count(uid: int) -> int:
    """Tasks (threads) owned by ``uid``: what RLIMIT_NPROC counts."""
    count = 0
    for pid, owner in process_uids().items():
        if owner == uid:
            try:
                count += len(os.listdir(f"/proc/{pid}/task"))
            except OSError:
                count += 1
    return count


@contextlib.contextmanager
def workdir(uid: int | None) -> Iterator[str]:
    """A fresh private directory (owned by ``uid`` when given), removed afterwards."""
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


WORLD_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm")


def remove_files_of(uid: int, places: tuple[str, ...] = WORLD_WRITABLE, depth: int = 1) -> None:
    """Remove what a sandbox uid left in the world-writable directories (and ``depth`` levels
    down, in world-writable subdirectories such as ``/tmp/.X11-unix``), so that a later run
    cannot read it. Needed only where the sandbox sees the host's filesystem."""
    for place in places:
        try:
            entries = list(os.scandir(place))
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            is_dir = stat.S_ISDIR(st.st_mode)
            if st.st_uid == uid:
                if is_dir:
                    _remove_tree(entry.path)
                else:
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)
            elif is_dir and st.st_mode & 0o002 and depth > 0:
                remove_files_of(uid, (entry.path,), depth - 1)


@dataclasses.dataclass
class Output:
    """What one launcher process printed and how it ended (``returncode`` None: never started)."""

    stdout: bytes
    stderr: bytes
    returncode: int | None
    timed_out: bool
    truncated: bool
    cpu_s: float = 0.0  # CPU seconds of the run as last measured (with a CPU budget only)


def _exited(pid: int) -> bool:
    """Whether ``pid`` (our child) has exited, without reaping it (its pgid stays reserved)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _kill_until_gone(find: Callable[[], list[int]]) -> bool:
    """SIGKILL what ``find`` returns until it returns nothing (True) or 50 rounds pass (False)."""
    for _ in range(50):
        victims = find()
        if not victims:
            return True
        for pid in victims:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)
    return False


def kill_uid(uid: int) -> None:
    """SIGKILL every process of a sandbox uid (for processes that left the process group)."""

    def find() -> list[int]:
        return [pid for pid, owner in process_uids(False).items() if owner == uid]

    if not _kill_until_gone(find):
        logger.warning("processes of sandbox uid %d survived 50 kill rounds", uid)


def kill_tagged(tag: str) -> None:
    """SIGKILL our processes whose command line carries ``tag`` (non-root, no PID namespace)."""
    needle, me = tag.encode(), os.getpid()

    def find() -> list[int]:
        victims = []
        for pid, owner in process_uids(False).items():
            if owner != os.getuid() or pid == me:
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if needle in f.read():
                        victims.append(pid)
            except OSError:
                continue
        return victims

    _kill_until_gone(find)


@dataclasses.dataclass
class Launch:
    """One launcher process to start: its payload, working directory, the pipe ends it inherits
    (``pass_fds``) and what to sweep after it (see :func:`spawn`)."""

    payload: dict[str, Any]
    workdir: str
    pass_fds: tuple[int, ...] = ()
    sweep_uid: int | None = None
    sweep_tagged: bool = False
    sweep_only_if_killed: bool = False


def spawn(
    python: str,
    payload: dict[str, Any],
    workdir: str,
    *,
    deadline: float,
    limit: int,
    sweep_uid: int | None = None,
    sweep_tagged: bool = False,
    sweep_only_if_killed: bool = False,
) -> Output:
    """Start the launcher with ``payload``, read at most ``limit`` bytes, kill at ``deadline``.

    After the run the process group is killed; ``sweep_uid`` also kills every process of that
    uid (always, or with ``sweep_only_if_killed`` only after a kill), ``sweep_tagged`` every
    process of ours whose command line carries the run's tag.
    """
    launch = Launch(payload, workdir, (), sweep_uid, sweep_tagged, sweep_only_if_killed)
    return spawn_many(python, [launch], deadline=deadline, limit=limit)[0]


def _write_payload(launch: Launch) -> None:
    launch.payload.update(parent=os.getpid(), euid=os.geteuid(), egid=os.getegid())
    data = marshal.dumps(launch.payload, 4)
    fd = os.open(
        os.path.join(launch.workdir, ".payload"),
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o600,
    )
    with os.fdopen(fd, "wb") as f:
        f.write(data)


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def tree_cpu_seconds(roots: list[int]) -> float:
    """CPU seconds used by the processes ``roots`` and their descendants, the reaped ones
    included (their time is in their parents' ``cutime``/``cstime``). The launchers keep every
    process of a run in their tree: a PID namespace's init or the supervisor (a subreaper)
    adopts the orphans."""
    parent: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        pid = int(entry)
        parent[pid] = int(fields[1])
        ticks[pid] = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    inside = set(roots)
    changed = True
    while changed:
        changed = False
        for pid, ppid in parent.items():
            if ppid in inside and pid not in inside:
                inside.add(pid)
                changed = True
    return sum(ticks.get(pid, 0) for pid in inside) / _TICKS


def spawn_many(
    python: str,
    launches: list[Launch],
    *,
    deadline: float,
    limit: int,
    cpu_budget: float | None = None,
) -> list[Output]:
    """Start one launcher per ``launches`` item; read each one's stdout and stderr (at most
    ``limit`` bytes a process) until all have closed them or ``deadline`` passes. A timeout or
    an overflow in one process kills all of them: they are one run. The trainer's copies of
    the ``pass_fds`` are closed once every process has started, so a pipe between two of them
    reports end of file when either side exits.

    ``cpu_budget``: the run also times out once its processes together have used that many CPU
    seconds; ``deadline`` is then the wall-clock backstop. Timed by CPU, a run slowed down by
    a busy sibling still gets the computation it is owed."""
    procs: list[subprocess.Popen | None] = []
    tags: list[str] = []
    errors: list[bytes] = []
    try:
        for launch in launches:
            _write_payload(launch)
        for launch in launches:
            tag = f"{TAG_PREFIX}{secrets.token_hex(8)}"  # marks the run's processes, not secret
            tags.append(tag)
            try:
                procs.append(
                    subprocess.Popen(
                        [python, "-I", "-S", LAUNCHER, tag],
                        cwd=launch.workdir,
                        env={"PATH": SANDBOX_PATH},
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                        start_new_session=True,
                        close_fds=True,
                        pass_fds=launch.pass_fds,
                    )
                )
                errors.append(b"")
            except OSError as exc:
                procs.append(None)
                errors.append(f"cannot start {python}: {exc}".encode())
    finally:
        for launch in launches:
            for fd in launch.pass_fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
    started = [p for p in procs if p is not None]
    buffers: dict[int, bytearray] = {}
    owner: dict[int, int] = {}
    totals = [0] * len(procs)
    timed_out = truncated = False
    exited_at: dict[int, float] = {}
    streams: dict[int, tuple[int, int]] = {}
    for i, proc in enumerate(procs):
        if proc is not None:
            assert proc.stdout is not None and proc.stderr is not None
            streams[i] = (proc.stdout.fileno(), proc.stderr.fileno())
            for fileno in streams[i]:
                buffers[fileno] = bytearray()
                owner[fileno] = i
    next_cpu_check = time.monotonic() + 0.1
    roots = [proc.pid for proc in started]
    cpu_used = 0.0
    try:
        with selectors.DefaultSelector() as selector:
            for fileno in buffers:
                selector.register(fileno, selectors.EVENT_READ)
            while selector.get_map():
                now = time.monotonic()
                if now >= deadline:
                    timed_out = True
                    break
                if cpu_budget is not None and now >= next_cpu_check:
                    next_cpu_check = now + 0.1
                    cpu_used = tree_cpu_seconds(roots)
                    if cpu_used > cpu_budget:
                        timed_out = True
                        break
                events = selector.select(timeout=min(deadline - now, 0.1))
                for key, _ in events:
                    chunk = os.read(key.fd, _READ_CHUNK)
                    if not chunk:
                        selector.unregister(key.fd)
                        continue
                    i = owner[key.fd]
                    buffers[key.fd] += chunk[: max(limit - totals[i], 0)]
                    totals[i] += len(chunk)
                if any(total > limit for total in totals):
                    truncated = True
                    break
                if events:
                    continue
                open_owners = {owner[fd] for fd in selector.get_map()}
                for i in open_owners:
                    proc = procs[i]
                    if proc is not None and _exited(proc.pid):
                        # The launcher is gone but something still holds its pipes open.
                        if i not in exited_at:
                            exited_at[i] = now
                            kill_group(proc.pid)
                        elif now - exited_at[i] > 0.5:
                            for fd in [fd for fd in selector.get_map() if owner[fd] == i]:
                                selector.unregister(fd)
    finally:
        killed = timed_out or truncated or bool(exited_at)
        for proc in started:
            kill_group(proc.pid)  # the leader is not reaped yet, so its pgid cannot be reused
        for proc in started:
            proc.wait()
            assert proc.stdout is not None and proc.stderr is not None
            proc.stdout.close()
            proc.stderr.close()
        for launch, tag in zip(launches, tags, strict=False):
            if launch.sweep_uid is not None and (killed or not launch.sweep_only_if_killed):
                kill_uid(launch.sweep_uid)  # also waits for processes still dying from the kill
            if launch.sweep_tagged:
                kill_tagged(tag)
    outputs = []
    for i, proc in enumerate(procs):
        if proc is None:
            outputs.append(Output(b"", errors[i], None, timed_out=False, truncated=False))
            continue
        out_fd, err_fd = streams[i]
        outputs.append(
            Output(
                stdout=bytes(buffers[out_fd]),
                stderr=bytes(buffers[err_fd]),
                returncode=proc.returncode,
                timed_out=timed_out,
                truncated=truncated,
                cpu_s=cpu_used,
            )
        )
    return outputs
