"""Dedicated sandbox uids for a trainer running as root: which ones are free, and leasing one per
run so that concurrent runs, also from other trainer processes, never share a uid."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import stat
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence

from .process import process_uids

logger = logging.getLogger("groupwise.sandbox")

UID_POOL_SIZE = 64
DEFAULT_UID_BASE = 59000
LEASE_DEADLINE_S = 30.0


class UidPoolExhaustedError(RuntimeError):
    """No sandbox uid came free before the lease deadline."""


def candidate_uids() -> tuple[int, ...]:
    """Uids of the pool (``GROUPWISE_SANDBOX_UID_BASE``, default 59000, and the 63 after it)
    with no passwd or group entry and no process."""
    import grp
    import pwd

    base = int(os.environ.get("GROUPWISE_SANDBOX_UID_BASE", DEFAULT_UID_BASE))
    busy = set(process_uids().values())
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


class UidPool:
    """Leases dedicated sandbox uids, one per concurrent run, across threads and processes."""

    def __init__(self, uids: Sequence[int], deadline_s: float = LEASE_DEADLINE_S) -> None:
        if not uids:
            raise ValueError("a sandbox uid pool needs at least one uid")
        self.uids = list(uids)
        self.deadline_s = deadline_s
        self.lock_dir = self._lock_dir()

    @staticmethod
    def _lock_dir() -> str:
        path = os.path.join(tempfile.gettempdir(), f"groupwise-sandbox-locks-{os.geteuid()}")
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
        st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077:
            return path
        logger.warning("%s is not a private directory; sandbox uid locks are per process", path)
        return tempfile.mkdtemp(prefix="groupwise-sandbox-locks-")

    @contextlib.contextmanager
    def lease(self) -> Iterator[int]:
        """A uid no other run holds and no task owns. RLIMIT_NPROC counts every task of the uid,
        zombies included: the processes of an earlier run that still wait to be reaped (by the
        host's init, after a kill) would take the new run's process slots.

        Raises :class:`UidPoolExhaustedError` after ``deadline_s`` without a free uid (the
        caller reports a sandbox that failed to start) instead of waiting for ever: uids held
        by zombies stay held until the host's init reaps them, which an init that does not
        reap (a container without ``--init``) never does."""
        start = secrets.randbelow(len(self.uids))
        order = self.uids[start:] + self.uids[:start]
        warned = False
        give_up = time.monotonic() + self.deadline_s
        while True:
            leftovers = False
            for uid in order:
                path = os.path.join(self.lock_dir, f"uid-{uid}.lock")
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                if uid in process_uids().values():  # a leftover: try the next uid
                    os.close(fd)
                    leftovers = True
                    continue
                try:
                    yield uid
                finally:
                    os.close(fd)  # releases the flock
                return
            if leftovers and not warned:
                logger.warning("every sandbox uid is leased or still owns a process (a leftover "
                               "of an earlier run); waiting for one")  # fmt: skip
                warned = True
            if time.monotonic() >= give_up:
                held = sorted({u for u in process_uids().values() if u in self.uids})
                raise UidPoolExhaustedError(
                    f"no sandbox uid came free in {self.deadline_s:g} s: {len(self.uids)} uids, "
                    f"{len(held)} still owning a process (zombies wait for the host's init to "
                    "reap them; in a container, run it with an init such as `docker run --init`)"
                )
            time.sleep(0.01)


_pool_lock = threading.Lock()
_pool: UidPool | None = None


def init_pool(uids: Sequence[int]) -> None:
    """Create this process's pool from the probed uids (once; later calls keep the first)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = UidPool(uids)


def shared_pool() -> UidPool | None:
    """This process's pool, or None before the probe created it."""
    return _pool
