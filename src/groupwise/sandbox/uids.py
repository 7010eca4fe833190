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

    def __init__(self, uids: Sequence[int]) -> None:
        if not uids:
            raise ValueError("a sandbox uid pool needs at least one uid")
        self.uids = list(uids)
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
        host's init, after a kill) would take the new run's process slots."""
        start = secrets.randbelow(len(self.uids))
        order = self.uids[start:] + self.uids[:start]
        warned = False
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
