"""Kernel confinement the sandbox launcher applies to itself before the solution runs.

Runs inside the sandbox on the sandbox interpreter (any CPython from 3.6 on): standard library
only, nothing from groupwise, no side effects at import time (the launcher loads it by file path
while it still has the trainer's privileges). Every function raises OSError naming its step, with
the errno, when the kernel refuses.

- :func:`install_seccomp` installs the filter of :func:`groupwise.sandbox.seccomp.build_filter`:
  the syscalls a solution has no use for and that open kernel attack surface or undo the other
  layers (ptrace, keyctl, bpf, io_uring, mount/unshare/setns, new namespaces through clone,
  socket, ...) fail with EPERM, and a foreign syscall ABI (i386, x32) kills the process.
- :func:`restrict_filesystem` applies a Landlock ruleset: files outside the listed paths cannot
  be opened, read-only paths cannot be written; from Landlock ABI 4 on no TCP bind/connect, from
  ABI 6 on no signals to processes outside the sandbox and no abstract unix sockets outside it.
  This holds even where no mount namespace is available and for the trainer's own uid.
- :func:`join_new_session_keyring` leaves the session keyring inherited from the trainer, so the
  keys the trainer's session holds (credentials, tokens) are not reachable from the sandbox.
- :func:`landlock_abi` says which Landlock ABI the kernel offers (0: none).
"""

import ctypes
import errno
import os
import stat
import struct

PR_SET_NO_NEW_PRIVS = 38
PR_GET_NO_NEW_PRIVS = 39
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2

# Syscall numbers: arch/x86/entry/syscalls/syscall_64.tbl, include/uapi/asm-generic/unistd.h.
SYSCALLS = {
    "x86_64": {
        "keyctl": 250,
        "landlock_create_ruleset": 444,
        "landlock_add_rule": 445,
        "landlock_restrict_self": 446,
    },
    "aarch64": {
        "keyctl": 219,
        "landlock_create_ruleset": 444,
        "landlock_add_rule": 445,
        "landlock_restrict_self": 446,
    },
}

KEYCTL_JOIN_SESSION_KEYRING = 1

# Landlock (include/uapi/linux/landlock.h).
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
ACCESS_FS_EXECUTE = 1 << 0
ACCESS_FS_WRITE_FILE = 1 << 1
ACCESS_FS_READ_FILE = 1 << 2
ACCESS_FS_READ_DIR = 1 << 3
# 1 << 4 .. 1 << 12: REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR, MAKE_REG, MAKE_SOCK,
# MAKE_FIFO, MAKE_BLOCK, MAKE_SYM: all handled from ABI 1 on.
ACCESS_FS_ABI1 = (1 << 13) - 1
ACCESS_FS_REFER = 1 << 13  # ABI 2
ACCESS_FS_TRUNCATE = 1 << 14  # ABI 3
ACCESS_FS_IOCTL_DEV = 1 << 15  # ABI 5
# The rights that apply to a file (as opposed to a directory): a rule on a file may hold only
# these, anything else gives EINVAL.
ACCESS_FILE = (
    ACCESS_FS_EXECUTE
    | ACCESS_FS_WRITE_FILE
    | ACCESS_FS_READ_FILE
    | ACCESS_FS_TRUNCATE
    | ACCESS_FS_IOCTL_DEV
)
ACCESS_READ_ONLY = ACCESS_FS_EXECUTE | ACCESS_FS_READ_FILE | ACCESS_FS_READ_DIR
ACCESS_NET_BIND_TCP = 1  # ABI 4
ACCESS_NET_CONNECT_TCP = 2  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET = 1  # ABI 6
SCOPE_SIGNAL = 2  # ABI 6

_libc = None


def libc():
    """The C library, loaded on first use."""
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(None, use_errno=True)
        lib.syscall.restype = ctypes.c_long
        lib.prctl.restype = ctypes.c_int
        lib.prctl.argtypes = [
            ctypes.c_int,
            ctypes.c_ulong,
            ctypes.c_ulong,
            ctypes.c_ulong,
            ctypes.c_ulong,
        ]
        _libc = lib
    return _libc


def _error(what):
    err = ctypes.get_errno()
    return OSError(err, f"{what}: {os.strerror(err)}")


def _nr(name):
    machine = os.uname().machine
    table = SYSCALLS.get(machine)
    if table is None:
        raise OSError(errno.ENOSYS, f"{name}: unsupported architecture {machine!r}")
    return table[name]


def _syscall(name, *args):
    """syscall(2) with every argument passed as a C long (pointers as addresses); -1 sets errno."""
    return libc().syscall(ctypes.c_long(_nr(name)), *[ctypes.c_long(a) for a in args])


def _no_new_privs():
    lib = libc()
    if lib.prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) == 1:
        return
    if lib.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise _error("prctl(PR_SET_NO_NEW_PRIVS)")


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install_seccomp(program):
    """Install the seccomp filter ``program`` (bytes of ``struct sock_filter``) on this thread.

    Sets PR_SET_NO_NEW_PRIVS first if it is not set. The filter covers the calling thread and
    whatever it forks or spawns afterwards, not threads that are already running.
    """
    program = bytes(program)
    count = len(program) // 8
    if not program or len(program) % 8 or count > 0xFFFF:
        raise OSError(errno.EINVAL, "seccomp: the program must be 1..65535 8-byte instructions")
    buf = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(count, ctypes.addressof(buf))
    _no_new_privs()
    if libc().prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0) != 0:
        raise _error("prctl(PR_SET_SECCOMP)")


def landlock_abi():
    """The Landlock ABI version the kernel offers; 0 when Landlock is missing or disabled."""
    try:
        version = _syscall("landlock_create_ruleset", 0, 0, LANDLOCK_CREATE_RULESET_VERSION)
    except OSError:
        return 0  # an architecture without a known syscall number
    if version < 0:
        err = ctypes.get_errno()
        if err in (errno.ENOSYS, errno.EOPNOTSUPP, errno.EPERM):
            return 0  # EPERM: a container's seccomp profile denies it
        raise OSError(err, f"landlock_create_ruleset(VERSION): {os.strerror(err)}")
    return version


def handled_access_fs(abi):
    """Every filesystem right Landlock ABI ``abi`` knows; the ruleset handles (denies) them all.

    ABI 1 has no REFER right: linking or renaming a file into another directory is then always
    denied inside the domain, and cannot be allowed per path.
    """
    rights = ACCESS_FS_ABI1
    if abi >= 2:
        rights |= ACCESS_FS_REFER
    if abi >= 3:
        rights |= ACCESS_FS_TRUNCATE
    if abi >= 5:
        rights |= ACCESS_FS_IOCTL_DEV
    return rights


def _ruleset_attr(abi):
    """struct landlock_ruleset_attr {u64 handled_access_fs, handled_access_net, scoped;}, cut to
    the size ABI ``abi`` knows (8, 16 or 24 bytes)."""
    fs = handled_access_fs(abi)
    if abi >= 6:
        net = ACCESS_NET_BIND_TCP | ACCESS_NET_CONNECT_TCP
        return struct.pack("=QQQ", fs, net, SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL)
    if abi >= 4:  # network handled, no rule: every TCP bind and connect is denied
        return struct.pack("=QQ", fs, ACCESS_NET_BIND_TCP | ACCESS_NET_CONNECT_TCP)
    return struct.pack("=Q", fs)


def _add_path_rule(ruleset_fd, path, access):
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            access &= ACCESS_FILE
        if not access:
            return
        # struct landlock_path_beneath_attr {u64 allowed_access; s32 parent_fd;} (packed)
        attr = ctypes.create_string_buffer(struct.pack("=Qi", access, fd), 12)
        ret = _syscall(
            "landlock_add_rule", ruleset_fd, LANDLOCK_RULE_PATH_BENEATH, ctypes.addressof(attr), 0
        )
        if ret != 0:
            raise _error(f"landlock_add_rule({path!r})")
    finally:
        os.close(fd)


def restrict_filesystem(read_only, read_write):
    """Confine this process (and what it starts later) to the given paths with Landlock.

    ``read_only`` paths (and everything beneath) may be read and executed, ``read_write`` paths
    also written, created in, removed from; every other path is out of reach. Paths that do not
    exist are skipped. Also sets PR_SET_NO_NEW_PRIVS. Returns the Landlock ABI used, or 0 (and
    changes nothing) when the kernel has no Landlock.
    """
    abi = landlock_abi()
    if abi <= 0:
        return 0
    handled = handled_access_fs(abi)
    attr = _ruleset_attr(abi)
    buf = ctypes.create_string_buffer(attr, len(attr))
    ruleset_fd = _syscall("landlock_create_ruleset", ctypes.addressof(buf), len(attr), 0)
    if ruleset_fd < 0:
        raise _error("landlock_create_ruleset")
    try:
        for path in read_only:
            _add_path_rule(ruleset_fd, path, ACCESS_READ_ONLY & handled)
        for path in read_write:
            _add_path_rule(ruleset_fd, path, handled)
        _no_new_privs()
        if _syscall("landlock_restrict_self", ruleset_fd, 0) != 0:
            raise _error("landlock_restrict_self")
    finally:
        os.close(ruleset_fd)
    return abi


def join_new_session_keyring():
    """Replace the session keyring inherited from the trainer with a new, empty, anonymous one.

    Returns the new keyring's serial, or 0 when the kernel has no keys support (ENOSYS) or a
    seccomp filter above this process denies keyctl (EPERM, as Docker's default profile does):
    no process under that filter can reach a keyring, the solution included.
    """
    serial = _syscall("keyctl", KEYCTL_JOIN_SESSION_KEYRING, 0)
    if serial < 0:
        err = ctypes.get_errno()
        if err in (errno.ENOSYS, errno.EPERM):
            return 0
        raise OSError(err, f"keyctl(KEYCTL_JOIN_SESSION_KEYRING): {os.strerror(err)}")
    return serial
