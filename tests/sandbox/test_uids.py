"""The sandbox uid pool of a root trainer: a uid is leased only when no other run holds it and
no task of it is left (RLIMIT_NPROC counts zombies too)."""

import os
import time

import pytest

from groupwise.sandbox.process import process_uids
from groupwise.sandbox.uids import UidPool, UidPoolExhaustedError, candidate_uids

pytestmark = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0,
    reason="dedicated sandbox uids are leased only by a trainer running as root",
)


def zombie_of(uid: int) -> int:
    """A child process that takes ``uid`` and exits unreaped: a zombie owned by ``uid``."""
    pid = os.fork()
    if pid == 0:
        os.setuid(uid)
        os._exit(0)
    deadline = time.monotonic() + 10.0
    while process_uids().get(pid) != uid:
        assert time.monotonic() < deadline, f"the child {pid} never ran as uid {uid}"
        time.sleep(0.01)
    return pid


def leases(pool: UidPool, count: int) -> list[int]:
    out = []
    for _ in range(count):
        with pool.lease() as uid:
            out.append(uid)
    return out


def test_a_uid_that_still_owns_a_task_is_skipped_until_it_is_reaped():
    a, b = candidate_uids()[:2]
    pool = UidPool([a, b])
    pid = zombie_of(a)
    try:
        # Each lease starts at a random uid of the two: without the check about half would be a.
        assert leases(pool, 30) == [b] * 30
    finally:
        os.waitpid(pid, 0)
    assert a not in process_uids().values()
    assert a in leases(pool, 40)  # free again (missed with probability 2**-40)


def test_a_lease_gives_up_at_its_deadline_instead_of_waiting_for_ever():
    (uid,) = candidate_uids()[:1]
    pool = UidPool([uid], deadline_s=0.3)
    with pool.lease():
        start = time.monotonic()
        with pytest.raises(UidPoolExhaustedError, match="docker run --init"), pool.lease():
            pass
        assert 0.3 <= time.monotonic() - start < 2.0
    with pool.lease() as again:  # free once released
        assert again == uid
