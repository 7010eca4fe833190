"""One cgroup per sandbox run: memory (kernel memory included, no swap), process-count and CPU
limits that hold for the whole process tree of a run, where the host lets us create cgroups.

Rlimits are per process (``RLIMIT_AS``: eight forked children of 100 MB each take 800 MB under a
128 MB limit) and do not count kernel memory (dentries and inodes of a million empty directories
in a tmpfs). A cgroup counts both, for every process of the run together.

:func:`detect` (once per process) finds where groups can be made: with cgroup v2, in a
``groupwise-sandboxes`` directory inside the trainer's own (delegated) cgroup; with cgroup v1,
in a ``groupwise-sandboxes`` directory inside the trainer's group of each of the memory, pids,
cpu and cpuacct hierarchies. :meth:`SandboxCgroup.create` makes one group per run and sets its
limits; the launcher joins it by writing its pid into every file of ``procs_files`` before it
drops privileges, so everything it forks is inside. :meth:`SandboxCgroup.remove` kills what is
left and deletes the group.

All file-system access goes through :class:`CgroupFs`, and :func:`detect` takes the contents of
``/proc/self/mountinfo`` and ``/proc/self/cgroup`` as parameters, so the logic can be tested
against a fake tree.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import re
import secrets
import signal
import sys
import time
from collections.abc import Iterable

logger = logging.getLogger("groupwise.sandbox")

SANDBOXES_DIR = "groupwise-sandboxes"
TRAINER_DIR = "groupwise-trainer"
CPU_PERIOD_US = 100_000
V2_CONTROLLERS = ("memory", "pids", "cpu")
V1_CONTROLLERS = ("memory", "pids", "cpu", "cpuacct")
UNIFIED = "unified"  # the key of the single v2 directory in ``bases``/``dirs``
_RUN_NAME = re.compile(r"^run-(\d+)-[0-9a-f]+$")
_KILL_ROUNDS = 50
_EMPTY_WAIT_S = 2.0
_RMDIR_WAIT_S = 1.0
_DELEGATE_HINT = (
    "run the trainer in a delegated cgroup of its own (e.g. `systemd-run --user --scope "
    "-p Delegate=yes ...`) or give the container a writable cgroup (e.g. docker "
    "`--cgroupns=private` with a read-write /sys/fs/cgroup)"
)


class CgroupError(RuntimeError):
    """A sandbox cgroup could not be created or limited."""


class CgroupFs:
    """The file operations this module does on cgroupfs (replaced by a fake in tests)."""

    def read(self, path: str) -> str:
        with open(path, encoding="utf-8") as f:
            return f.read()

    def write(self, path: str, text: str) -> None:
        # One write(2) per value: cgroupfs parses each write on its own. No O_CREAT: interface
        # files cannot be created, and a missing one must fail.
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def mkdir(self, path: str) -> None:
        os.mkdir(path)

    def rmdir(self, path: str) -> None:
        os.rmdir(path)

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)


_REAL_FS = CgroupFs()


@dataclasses.dataclass(frozen=True)
class CgroupSupport:
    """What :func:`detect` found: where per-sandbox groups go and which limits they can have.

    ``version``: 1, 2 or None (no usable cgroup, ``reason`` says why). ``bases``: (controller,
    directory under which run groups are created) pairs; v2 has one, keyed ``"unified"``; v1 one
    per controller (``memory``, ``pids``, ``cpu``, ``cpuacct``; co-mounted ones share a
    directory). ``memory``/``pids``/``cpu``: which limits are in force. ``no_swap``: the memory
    limit also covers swap (or the host has no swap).
    """

    version: int | None
    bases: tuple[tuple[str, str], ...] = ()
    memory: bool = False
    pids: bool = False
    cpu: bool = False
    no_swap: bool = False
    reason: str | None = None

    @property
    def available(self) -> bool:
        return self.version is not None and self.memory

    def base(self, controller: str) -> str | None:
        for name, path in self.bases:
            if name == controller:
                return path
        return None


def _unavailable(reason: str) -> CgroupSupport:
    return CgroupSupport(version=None, reason=reason)


# --- parsing -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Mount:
    point: str  # where it is mounted
    root: str  # which directory of the hierarchy appears there
    fstype: str
    options: tuple[str, ...]  # super options (controllers for v1)


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[_Mount]:
    """The cgroup and cgroup2 mounts of a ``/proc/self/mountinfo`` text."""
    mounts = []
    for line in text.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if not sep or len(fields) < 5 or len(rest) < 3 or rest[0] not in ("cgroup", "cgroup2"):
            continue
        mounts.append(
            _Mount(_unescape(fields[4]), _unescape(fields[3]), rest[0], tuple(rest[2].split(",")))
        )
    return mounts


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """controller -> path from ``/proc/self/cgroup``; the v2 line ``0::/path`` is keyed ``""``."""
    paths = {}
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if parts[0] == "0" and not controllers:
            paths[""] = path
        for controller in controllers.split(","):
            if controller:
                paths[controller] = path
    return paths


def _under_mount(mount: _Mount, path: str) -> str | None:
    """The directory of cgroup ``path`` below ``mount`` (None if the mount does not show it)."""
    root = mount.root.rstrip("/")
    if path.endswith(" (deleted)") or not (path == root or path.startswith(root + "/") or not root):
        return None
    rel = path[len(root) :].strip("/")
    return os.path.join(mount.point, rel) if rel else mount.point


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


def _host_has_no_swap() -> bool:
    text = _read_text("/proc/swaps")
    return text is not None and len(text.strip().splitlines()) <= 1


def _why(exc: OSError) -> str:
    return f"{errno.errorcode.get(exc.errno or 0, exc.errno)} ({exc.strerror or exc})"


# --- detection -----------------------------------------------------------------------------------


def detect(
    *,
    mountinfo: str | None = None,
    proc_cgroup: str | None = None,
    root: str | None = None,
    pid: int | None = None,
    fs: CgroupFs | None = None,
) -> CgroupSupport:
    """Find where per-sandbox cgroups can be created (see the module docstring).

    ``mountinfo``/``proc_cgroup``: the texts of ``/proc/self/mountinfo`` and ``/proc/self/cgroup``
    (read when None). ``root``: a cgroup2 mount point to use instead of the mounts in
    ``mountinfo``. ``pid``: this process (``os.getpid()``), the only one that may be moved.
    May move this process into ``<own cgroup>/groupwise-trainer`` (cgroup v2 only).
    """
    fs = fs or _REAL_FS
    if mountinfo is None and root is None and not sys.platform.startswith("linux"):
        return _unavailable(f"cgroups are Linux only (this is {sys.platform})")
    if proc_cgroup is None:
        proc_cgroup = _read_text("/proc/self/cgroup")
        if proc_cgroup is None:
            return _unavailable("/proc/self/cgroup is not readable")
    if root is not None:
        mounts = [_Mount(root, "/", "cgroup2", ())]
    else:
        if mountinfo is None:
            mountinfo = _read_text("/proc/self/mountinfo") or ""
        mounts = parse_mountinfo(mountinfo)
        if not mounts and fs.exists("/sys/fs/cgroup/cgroup.controllers"):
            mounts = [_Mount("/sys/fs/cgroup", "/", "cgroup2", ())]
    paths = parse_proc_cgroup(proc_cgroup)
    pid = os.getpid() if pid is None else pid

    reasons = []
    v1_memory = any(m.fstype == "cgroup" and "memory" in m.options for m in mounts)
    for mount in mounts:
        if mount.fstype != "cgroup2" or "" not in paths:
            continue
        own = _under_mount(mount, paths[""])
        if own is None:
            continue
        if os.path.basename(own.rstrip("/")) == TRAINER_DIR:
            own = os.path.dirname(own.rstrip("/"))  # moved here earlier (by us or our parent)
        try:
            controllers = fs.read(os.path.join(own, "cgroup.controllers")).split()
        except OSError as exc:
            reasons.append(f"cgroup v2 at {mount.point}: cannot read {own}: {_why(exc)}")
            continue
        if "memory" not in controllers:
            if not v1_memory:  # in a v1/v2 hybrid memory lives in v1: no reason to give
                reasons.append(
                    f"cgroup v2 at {mount.point}: the memory controller is not delegated to "
                    f"{own} (cgroup.controllers: {' '.join(controllers) or 'none'}); "
                    + _DELEGATE_HINT
                )
            continue
        return _detect_v2(own, controllers, pid, fs)
    if v1_memory:
        return _detect_v1(mounts, paths, fs)
    if not mounts:
        reasons.append("no cgroup file system is mounted (/proc/self/mountinfo)")
    return _unavailable("; ".join(reasons) or "no usable cgroup hierarchy")


def _enable(fs: CgroupFs, directory: str, controllers: Iterable[str]) -> dict[str, OSError]:
    """Enable each controller in ``directory``'s subtree_control; the errors by controller."""
    path = os.path.join(directory, "cgroup.subtree_control")
    try:
        enabled = set(fs.read(path).split())
    except OSError:
        enabled = set()
    errors = {}
    for controller in controllers:
        if controller in enabled:
            continue
        try:
            fs.write(path, f"+{controller}")
        except OSError as exc:
            errors[controller] = exc
    return errors


def _procs(fs: CgroupFs, directory: str) -> list[int]:
    try:
        text = fs.read(os.path.join(directory, "cgroup.procs"))
    except OSError:
        return []
    return [int(tok) for tok in text.split() if tok.isdigit()]


def _detect_v2(own: str, controllers: list[str], pid: int, fs: CgroupFs) -> CgroupSupport:
    wanted = [c for c in V2_CONTROLLERS if c in controllers]
    errors = _enable(fs, own, wanted)
    if any(exc.errno == errno.EBUSY for exc in errors.values()):
        # No internal processes: controllers can be handed down only by a cgroup without
        # processes of its own. If we are the only one, step into a leaf and try again.
        others = sorted(set(_procs(fs, own)) - {pid})
        if others:
            shown = " ".join(map(str, others[:8])) + (" ..." if len(others) > 8 else "")
            return _unavailable(
                f"cgroup v2: cannot enable {'/'.join(wanted)} for child groups of {own}: "
                f"it holds other processes too ({shown}), which we must not move; " + _DELEGATE_HINT
            )
        leaf = os.path.join(own, TRAINER_DIR)
        try:
            with contextlib.suppress(FileExistsError):
                fs.mkdir(leaf)
            fs.write(os.path.join(leaf, "cgroup.procs"), str(pid))
        except OSError as exc:
            return _unavailable(
                f"cgroup v2: cannot move this process ({pid}) into {leaf}: {_why(exc)}; "
                + _DELEGATE_HINT
            )
        logger.info("moved the trainer (pid %d) into the cgroup %s", pid, leaf)
        errors = _enable(fs, own, wanted)
    if "memory" in errors:
        return _unavailable(
            f"cgroup v2: cannot enable the memory controller in {own}/cgroup.subtree_control: "
            f"{_why(errors['memory'])}; " + _DELEGATE_HINT
        )
    base = os.path.join(own, SANDBOXES_DIR)
    try:
        with contextlib.suppress(FileExistsError):
            fs.mkdir(base)
    except OSError as exc:
        return _unavailable(f"cgroup v2: cannot create {base}: {_why(exc)}; " + _DELEGATE_HINT)
    granted = [c for c in wanted if c not in errors]
    base_errors = _enable(fs, base, granted)
    if "memory" in base_errors:
        return _unavailable(
            f"cgroup v2: cannot enable the memory controller in {base}/cgroup.subtree_control: "
            f"{_why(base_errors['memory'])}"
        )
    try:
        enabled = set(fs.read(os.path.join(base, "cgroup.subtree_control")).split())
    except OSError:
        enabled = {c for c in granted if c not in base_errors}
    return CgroupSupport(
        version=2,
        bases=((UNIFIED, base),),
        memory="memory" in enabled,
        pids="pids" in enabled,
        cpu="cpu" in enabled,
        no_swap=fs.exists(os.path.join(base, "memory.swap.max")) or _host_has_no_swap(),
    )


def _detect_v1(mounts: list[_Mount], paths: dict[str, str], fs: CgroupFs) -> CgroupSupport:
    bases: list[tuple[str, str]] = []
    problems: dict[str, str] = {}
    for controller in V1_CONTROLLERS:
        mount = next((m for m in mounts if m.fstype == "cgroup" and controller in m.options), None)
        if mount is None:
            problems[controller] = "not mounted"
            continue
        own = _under_mount(mount, paths.get(controller, "/"))
        if own is None:
            problems[controller] = f"this process's group is not visible under {mount.point}"
            continue
        base = os.path.join(own, SANDBOXES_DIR)
        probe = os.path.join(base, f"probe-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            with contextlib.suppress(FileExistsError):
                fs.mkdir(base)
            fs.mkdir(probe)  # proves that groups can be made there, also if base existed
            fs.rmdir(probe)
        except OSError as exc:
            problems[controller] = f"cannot create groups in {base}: {_why(exc)}"
            continue
        bases.append((controller, base))
    names = {name for name, _ in bases}
    if "memory" not in names:
        return _unavailable(f"cgroup v1: memory controller: {problems['memory']}; {_DELEGATE_HINT}")
    for controller, problem in problems.items():
        logger.debug("cgroup v1 %s controller unavailable: %s", controller, problem)
    memory_base = dict(bases)["memory"]
    return CgroupSupport(
        version=1,
        bases=tuple(bases),
        memory=True,
        pids="pids" in names,
        cpu="cpu" in names,
        no_swap=fs.exists(os.path.join(memory_base, "memory.memsw.limit_in_bytes"))
        or _host_has_no_swap(),
    )


def describe(support: CgroupSupport) -> str:
    """One line for the start-of-run log: which limits hold per sandbox."""
    if not support.available:
        return f"no cgroup ({support.reason}): memory and processes are limited per process only"
    parts = [
        "memory (kernel memory included, "
        + ("no swap)" if support.no_swap else "swap not limited)")
    ]
    if support.pids:
        parts.append("processes")
    if support.cpu:
        parts.append("CPU")
    return f"cgroup v{support.version}: {', '.join(parts)} per sandbox"


# --- per-run groups ------------------------------------------------------------------------------


class SandboxCgroup:
    """The cgroup (one directory per hierarchy with v1) of one sandbox run."""

    def __init__(
        self, support: CgroupSupport, name: str, dirs: dict[str, str], fs: CgroupFs | None = None
    ) -> None:
        self.support = support
        self.name = name
        self.dirs = dict(dirs)  # controller (or "unified") -> directory
        self._fs = fs or _REAL_FS
        self.directories: tuple[str, ...] = tuple(dict.fromkeys(self.dirs.values()))
        self.procs_files: tuple[str, ...] = tuple(
            os.path.join(d, "cgroup.procs") for d in self.directories
        )

    def __repr__(self) -> str:
        return f"SandboxCgroup({self.name!r}, v{self.support.version}, {self.directories})"

    def __enter__(self) -> SandboxCgroup:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.remove()

    @classmethod
    def create(
        cls,
        support: CgroupSupport,
        *,
        memory_bytes: int,
        max_processes: int,
        cpus: float | None = 1.0,
        fs: CgroupFs | None = None,
    ) -> SandboxCgroup:
        """Make a new group ``run-<pid>-<hex>`` with these limits; raises :class:`CgroupError`.

        ``cpus``: CPU time per wall-clock second (0.5: half a core), None for no CPU limit.
        """
        if not support.available:
            raise CgroupError(f"no cgroup support: {support.reason}")
        if memory_bytes < 4096 or max_processes < 1 or (cpus is not None and not cpus > 0):
            raise ValueError(
                f"bad limits: memory_bytes={memory_bytes} max_processes={max_processes} cpus={cpus}"
            )
        fs = fs or _REAL_FS
        name = f"run-{os.getpid()}-{secrets.token_hex(6)}"
        dirs = {controller: os.path.join(base, name) for controller, base in support.bases}
        group = cls(support, name, dirs, fs)
        try:
            for directory in group.directories:
                fs.mkdir(directory)
            if support.version == 2:
                group._limit_v2(memory_bytes, max_processes, cpus)
            else:
                group._limit_v1(memory_bytes, max_processes, cpus)
        except (OSError, CgroupError) as exc:
            group.remove()
            if isinstance(exc, CgroupError):
                raise
            raise CgroupError(f"cannot create the sandbox cgroup {name}: {exc}") from exc
        return group

    def _set(self, controller: str, filename: str, value: object, required: bool = True) -> bool:
        """Write ``value``; an optional file that is missing or refuses is skipped (False)."""
        path = os.path.join(self.dirs[controller], filename)
        if not required and not self._fs.exists(path):
            return False
        try:
            self._fs.write(path, str(value))
        except OSError as exc:
            if required:
                raise CgroupError(f"cannot write {value} to {path}: {_why(exc)}") from exc
            logger.debug("cannot write %s to %s: %s", value, path, exc)
            return False
        return True

    def _limit_v2(self, memory_bytes: int, max_processes: int, cpus: float | None) -> None:
        self._set(UNIFIED, "memory.max", memory_bytes)
        self._set(UNIFIED, "memory.swap.max", 0, required=False)
        self._set(UNIFIED, "memory.oom.group", 1, required=False)
        if self.support.pids:
            self._set(UNIFIED, "pids.max", max_processes)
        if self.support.cpu and cpus is not None:
            self._set(UNIFIED, "cpu.max", f"{_quota(cpus)} {CPU_PERIOD_US}")

    def _limit_v1(self, memory_bytes: int, max_processes: int, cpus: float | None) -> None:
        # memsw (memory + swap) must stay >= the plain limit, so the plain one goes first.
        self._set("memory", "memory.limit_in_bytes", memory_bytes)
        self._set("memory", "memory.memsw.limit_in_bytes", memory_bytes, required=False)
        self._set("memory", "memory.swappiness", 0, required=False)
        if "pids" in self.dirs:
            self._set("pids", "pids.max", max_processes)
        if "cpu" in self.dirs and cpus is not None:
            self._set("cpu", "cpu.cfs_period_us", CPU_PERIOD_US)
            self._set("cpu", "cpu.cfs_quota_us", _quota(cpus))

    def join(self, pid: int) -> None:
        """Move process ``pid`` (0: the caller) into the group, every hierarchy."""
        for path in self.procs_files:
            self._fs.write(path, str(pid))

    def pids(self) -> list[int]:
        """Every process in the group (any hierarchy)."""
        found: dict[int, None] = {}
        for directory in self.directories:
            for pid in _procs(self._fs, directory):
                found[pid] = None
        return list(found)

    def kill(self) -> bool:
        """SIGKILL every process of the group; True once none is left (bounded rounds)."""
        if self.support.version == 2:
            kill_file = os.path.join(self.dirs[UNIFIED], "cgroup.kill")
            if self._fs.exists(kill_file):
                with contextlib.suppress(OSError):
                    self._fs.write(kill_file, "1")
        for _ in range(_KILL_ROUNDS):
            victims = self.pids()
            if not victims:
                return True
            for pid in victims:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)
        return not self.pids()

    def _read(self, controller: str, filename: str) -> str | None:
        directory = self.dirs.get(controller)
        if directory is None:
            return None
        try:
            return self._fs.read(os.path.join(directory, filename))
        except OSError:
            return None

    def _stat(self, controller: str, filename: str) -> dict[str, int]:
        values = {}
        for line in (self._read(controller, filename) or "").splitlines():
            key, _, value = line.partition(" ")
            if value.strip().lstrip("-").isdigit():
                values[key] = int(value)
        return values

    def cpu_seconds(self) -> float | None:
        """CPU time used by the group's processes so far (None if not accounted)."""
        if self.support.version == 2:
            usec = self._stat(UNIFIED, "cpu.stat").get("usage_usec")
            return None if usec is None else usec / 1e6
        text = self._read("cpuacct", "cpuacct.usage")
        return int(text) / 1e9 if text and text.strip().isdigit() else None

    def memory_peak(self) -> int | None:
        """Highest memory use of the group in bytes (None if the kernel does not say)."""
        if self.support.version == 2:
            text = self._read(UNIFIED, "memory.peak")
        else:
            text = self._read("memory", "memory.max_usage_in_bytes")
        return int(text) if text and text.strip().isdigit() else None

    def memory_current(self) -> int | None:
        """Current memory use of the group in bytes."""
        if self.support.version == 2:
            text = self._read(UNIFIED, "memory.current")
        else:
            text = self._read("memory", "memory.usage_in_bytes")
        return int(text) if text and text.strip().isdigit() else None

    def oom_killed(self) -> bool:
        """Whether the kernel's OOM killer killed a process of the group.

        v1 kernels before 4.13 have no ``oom_kill`` counter: there, whether the group ever hit
        its limit (``memory.failcnt``), which is what made the OOM killer act.
        """
        if self.support.version == 2:
            events = self._stat(UNIFIED, "memory.events")
            return events.get("oom_kill", 0) > 0 or events.get("oom_group_kill", 0) > 0
        control = self._stat("memory", "memory.oom_control")
        if "oom_kill" in control:
            return control["oom_kill"] > 0
        failcnt = self._read("memory", "memory.failcnt")
        return bool(failcnt and failcnt.strip().isdigit() and int(failcnt) > 0)

    def remove(self) -> bool:
        """Kill what is left, wait until the group is empty and delete it; never raises.

        Blocks at most about 4.5 s (0.5 s of kill rounds, 2 s waiting for exits, 1 s of rmdir
        retries that may kill again), only with processes stuck in the kernel; normally ~10 ms.
        Returns whether every directory is gone.
        """
        try:
            self.kill()
            deadline = time.monotonic() + _EMPTY_WAIT_S
            while self.pids() and time.monotonic() < deadline:
                time.sleep(0.01)
            left = []
            rmdir_deadline = time.monotonic() + _RMDIR_WAIT_S  # one budget for every directory
            for directory in self.directories:
                if not self._rmdir(directory, rmdir_deadline):
                    left.append(directory)
        except Exception as exc:  # cleanup must never take the trainer down
            logger.warning("cannot remove the sandbox cgroup %s: %s", self.name, exc)
            return False
        if left:
            logger.warning(
                "cannot remove the sandbox cgroup %s (%s); processes left: %s",
                self.name,
                ", ".join(left),
                self.pids() or "none",
            )
        return not left

    def _rmdir(self, directory: str, deadline: float) -> bool:
        while True:
            try:
                self._fs.rmdir(directory)
                return True
            except FileNotFoundError:
                return True
            except OSError as exc:
                # EBUSY: processes still exiting (or, v2, a child group left by someone else).
                if exc.errno != errno.EBUSY or time.monotonic() >= deadline:
                    logger.debug("rmdir %s: %s", directory, exc)
                    return False
                self.kill()
                time.sleep(0.02)


def _quota(cpus: float) -> int:
    return max(1000, round(cpus * CPU_PERIOD_US))  # the kernel refuses quotas under 1 ms


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup_stale(support: CgroupSupport, *, fs: CgroupFs | None = None) -> list[str]:
    """Remove ``run-*`` groups whose creating process is gone (a crashed trainer), killing
    their processes first. Returns the names removed. Never raises."""
    if not support.available:
        return []
    fs = fs or _REAL_FS
    stale: dict[str, dict[str, str]] = {}
    for controller, base in support.bases:
        try:
            entries = fs.listdir(base)
        except OSError:
            continue
        for entry in entries:
            match = _RUN_NAME.match(entry)
            if match and int(match.group(1)) != os.getpid() and not _alive(int(match.group(1))):
                stale.setdefault(entry, {})[controller] = os.path.join(base, entry)
    removed = []
    for name, dirs in sorted(stale.items()):
        if SandboxCgroup(support, name, dirs, fs).remove():
            removed.append(name)
    if removed:
        logger.info("removed %d stale sandbox cgroup(s): %s", len(removed), ", ".join(removed))
    return removed
