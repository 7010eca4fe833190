"""A seccomp filter for the sandbox: a classic-BPF program built here, installed by the launcher.

:func:`build_filter` returns the program as ``bytes`` (an array of ``struct sock_filter``, native
byte order) for the host architecture; :func:`groupwise.sandbox.confine.install_seccomp` installs
it inside the sandbox. This module is pure: it builds bytes and touches no process state.

The filter:

1. kills the process when ``seccomp_data.arch`` is not the host's native ABI (on x86_64 this
   blocks the i386 ``int 0x80`` entry, whose syscall numbers differ and would dodge the list);
2. on x86_64, answers every x32 syscall number (bit 0x40000000 set) with ``EPERM``;
3. answers the syscalls of :data:`DENIED` with ``EPERM``; why each group is denied:

   - keys: kernel keyrings are not namespaced, so keys of other sessions/users could be read;
   - process_access: reading or writing another process's memory, comparing its kernel objects;
   - kernel_surface: perf, eBPF, userfaultfd and io_uring are frequent kernel-exploit vectors;
   - mounts_namespaces: undoing the read-only mounts, new (user) namespaces that grant caps;
   - system_admin: host-wide state (swap, reboot, kexec, modules, accounting, quotas, dmesg);
   - port_io: raw I/O-port access (x86 only);
   - file_handles: open_by_handle_at escapes a mount namespace or chroot (the "shocker" exploit);
   - fanotify: watching (and blocking) file access across whole mounts;
   - clock: setting the host clock would upset every deadline of the trainer;
   - personality: switching off ASLR or making readable memory executable;
   - network: no socket(2) at all (socketpair(2) stays, for multiprocessing/asyncio pipes);
   - memory_policy: moving the pages of this or another process between NUMA nodes;
   - obsolete: rarely used syscalls with a history of bugs (lookup_dcookie, memfd_secret);

4. answers ``clone`` with ``EPERM`` when its flags ask for a new namespace, and ``clone3`` with
   ``ENOSYS`` (its flags live in memory a filter cannot read; glibc then falls back to ``clone``);
5. allows everything else.

Each check is a ``JEQ`` to a shared return at the end of the program, so every jump offset stays
below 256 whatever the list's length.
"""

from __future__ import annotations

import errno
import platform
import struct

# BPF instruction classes/modes/ops (linux/bpf_common.h), combined.
BPF_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
BPF_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
BPF_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
BPF_JSET_K = 0x45  # BPF_JMP | BPF_JSET | BPF_K
BPF_RET_K = 0x06  # BPF_RET | BPF_K
BPF_MAXINSNS = 4096

# Return values (linux/seccomp.h).
SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000

# Offsets into struct seccomp_data {int nr; u32 arch; u64 instruction_pointer; u64 args[6];}.
OFFSET_NR = 0
OFFSET_ARCH = 4
OFFSET_ARG0_LOW = 16  # low 32 bits of args[0] on a little-endian machine

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
X32_SYSCALL_BIT = 0x40000000

# clone(2) flags that create a namespace. CLONE_NEWTIME (0x80) overlaps the exit-signal byte of
# clone(2) and is only honoured by clone3/unshare, but no valid signal sets it, so checking it
# costs nothing.
CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_NEWTIME = 0x00000080
CLONE_NAMESPACE_FLAGS = (
    CLONE_NEWNS
    | CLONE_NEWCGROUP
    | CLONE_NEWUTS
    | CLONE_NEWIPC
    | CLONE_NEWUSER
    | CLONE_NEWPID
    | CLONE_NEWNET
    | CLONE_NEWTIME
)

# The syscalls answered with EPERM, by group (the module docstring says why). A name missing
# from an architecture's table below does not exist there and is left out of its filter.
DENIED: dict[str, tuple[str, ...]] = {
    "keys": ("keyctl", "add_key", "request_key"),
    "process_access": ("ptrace", "process_vm_readv", "process_vm_writev", "kcmp"),
    "kernel_surface": (
        "perf_event_open",
        "bpf",
        "userfaultfd",
        "io_uring_setup",
        "io_uring_enter",
        "io_uring_register",
    ),
    "mounts_namespaces": (
        "mount",
        "umount2",
        "pivot_root",
        "chroot",
        "unshare",
        "setns",
        "fsopen",
        "fsconfig",
        "fsmount",
        "fspick",
        "move_mount",
        "open_tree",
        "mount_setattr",
    ),
    "system_admin": (
        "swapon",
        "swapoff",
        "reboot",
        "kexec_load",
        "kexec_file_load",
        "init_module",
        "finit_module",
        "delete_module",
        "acct",
        "quotactl",
        "quotactl_fd",
        "syslog",
        "vhangup",
    ),
    "port_io": ("iopl", "ioperm"),
    "file_handles": ("open_by_handle_at", "name_to_handle_at"),
    "fanotify": ("fanotify_init",),
    "clock": ("settimeofday", "clock_settime", "clock_adjtime", "adjtimex"),
    "personality": ("personality",),
    "network": ("socket",),
    "memory_policy": ("mbind", "migrate_pages", "move_pages"),
    "obsolete": ("lookup_dcookie", "memfd_secret"),
}

# Syscall numbers, x86_64: the kernel's arch/x86/entry/syscalls/syscall_64.tbl (the "common"
# and "64" entries; same as __NR_* in asm/unistd_64.h).
SYSCALLS_X86_64: dict[str, int] = {
    "socket": 41,
    "clone": 56,
    "ptrace": 101,
    "syslog": 103,
    "personality": 135,
    "vhangup": 153,
    "pivot_root": 155,
    "adjtimex": 159,
    "chroot": 161,
    "acct": 163,
    "settimeofday": 164,
    "mount": 165,
    "umount2": 166,
    "swapon": 167,
    "swapoff": 168,
    "reboot": 169,
    "iopl": 172,
    "ioperm": 173,
    "init_module": 175,
    "delete_module": 176,
    "quotactl": 179,
    "lookup_dcookie": 212,
    "clock_settime": 227,
    "mbind": 237,
    "kexec_load": 246,
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "migrate_pages": 256,
    "unshare": 272,
    "move_pages": 279,
    "perf_event_open": 298,
    "fanotify_init": 300,
    "name_to_handle_at": 303,
    "open_by_handle_at": 304,
    "clock_adjtime": 305,
    "setns": 308,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "kcmp": 312,
    "finit_module": 313,
    "kexec_file_load": 320,
    "bpf": 321,
    "userfaultfd": 323,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "clone3": 435,
    "mount_setattr": 442,
    "quotactl_fd": 443,
    "memfd_secret": 447,
}

# Syscall numbers, aarch64: the generic table, include/uapi/asm-generic/unistd.h (__NR_*).
# iopl and ioperm do not exist there. memfd_secret (447) is under __ARCH_WANT_MEMFD_SECRET,
# which arm64 defines; lookup_dcookie (18) is a stub on kernels from 6.8 on.
SYSCALLS_AARCH64: dict[str, int] = {
    "lookup_dcookie": 18,
    "umount2": 39,
    "mount": 40,
    "pivot_root": 41,
    "chroot": 51,
    "vhangup": 58,
    "quotactl": 60,
    "acct": 89,
    "personality": 92,
    "unshare": 97,
    "kexec_load": 104,
    "init_module": 105,
    "delete_module": 106,
    "clock_settime": 112,
    "syslog": 116,
    "ptrace": 117,
    "reboot": 142,
    "settimeofday": 170,
    "adjtimex": 171,
    "socket": 198,
    "add_key": 217,
    "request_key": 218,
    "keyctl": 219,
    "clone": 220,
    "swapon": 224,
    "swapoff": 225,
    "mbind": 235,
    "migrate_pages": 238,
    "move_pages": 239,
    "perf_event_open": 241,
    "fanotify_init": 262,
    "name_to_handle_at": 264,
    "open_by_handle_at": 265,
    "clock_adjtime": 266,
    "setns": 268,
    "process_vm_readv": 270,
    "process_vm_writev": 271,
    "kcmp": 272,
    "finit_module": 273,
    "bpf": 280,
    "userfaultfd": 282,
    "kexec_file_load": 294,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "clone3": 435,
    "mount_setattr": 442,
    "quotactl_fd": 443,
    "memfd_secret": 447,
}

SYSCALLS: dict[str, dict[str, int]] = {"x86_64": SYSCALLS_X86_64, "aarch64": SYSCALLS_AARCH64}
ARCH_ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}

_INSN = struct.Struct("=HBBI")  # struct sock_filter {u16 code; u8 jt; u8 jf; u32 k;}


def normalise_arch(arch: str | None = None) -> str:
    """``arch`` (default: ``platform.machine()``) as a key of :data:`SYSCALLS`; ValueError if
    there is no filter for it."""
    name = platform.machine() if arch is None else arch
    key = ARCH_ALIASES.get(name.lower(), name.lower())
    if key not in SYSCALLS:
        raise ValueError(f"no seccomp filter for the architecture {name!r}")
    return key


def denied_syscalls(arch: str | None = None) -> dict[str, int]:
    """The syscalls the filter answers with EPERM on ``arch``: name -> number, in list order."""
    table = SYSCALLS[normalise_arch(arch)]
    return {name: table[name] for names in DENIED.values() for name in names if name in table}


def build_filter(arch: str | None = None) -> bytes:
    """The seccomp program for ``arch`` (default: this machine) as ``struct sock_filter`` bytes."""
    key = normalise_arch(arch)
    table = SYSCALLS[key]
    denied = denied_syscalls(key)
    eperm = SECCOMP_RET_ERRNO | errno.EPERM
    enosys = SECCOMP_RET_ERRNO | errno.ENOSYS

    # Instructions as (code, jt, jf, k); a jump target is a label resolved below.
    prog: list[tuple[int, int | str, int | str, int]] = [
        (BPF_LD_W_ABS, 0, 0, OFFSET_ARCH),
        (BPF_JEQ_K, 1, 0, AUDIT_ARCH[key]),
        (BPF_RET_K, 0, 0, SECCOMP_RET_KILL_PROCESS),
        (BPF_LD_W_ABS, 0, 0, OFFSET_NR),
    ]
    if key == "x86_64":
        prog.append((BPF_JGE_K, "eperm", 0, X32_SYSCALL_BIT))
    for nr in denied.values():
        prog.append((BPF_JEQ_K, "eperm", 0, nr))
    prog += [
        (BPF_JEQ_K, "enosys", 0, table["clone3"]),
        (BPF_JEQ_K, 0, "allow", table["clone"]),
        (BPF_LD_W_ABS, 0, 0, OFFSET_ARG0_LOW),
        (BPF_JSET_K, "eperm", "allow", CLONE_NAMESPACE_FLAGS),
    ]
    labels = {"allow": len(prog), "eperm": len(prog) + 1, "enosys": len(prog) + 2}
    prog += [
        (BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
        (BPF_RET_K, 0, 0, eperm),
        (BPF_RET_K, 0, 0, enosys),
    ]
    if len(prog) > BPF_MAXINSNS:
        raise ValueError(f"seccomp program too long: {len(prog)} instructions")

    out = bytearray()
    for index, (code, jt, jf, k) in enumerate(prog):
        offsets = []
        for target in (jt, jf):
            if isinstance(target, str):  # relative to the next instruction
                target = labels[target] - index - 1
            if not 0 <= target < 256:
                raise ValueError(f"seccomp jump out of range at instruction {index}: {target}")
            offsets.append(target)
        out += _INSN.pack(code, offsets[0], offsets[1], k)
    return bytes(out)


def decode(program: bytes) -> list[tuple[int, int, int, int]]:
    """``program`` as a list of (code, jt, jf, k) tuples (for tests and debugging)."""
    if len(program) % _INSN.size:
        raise ValueError("a seccomp program is a whole number of 8-byte instructions")
    return [_INSN.unpack_from(program, at) for at in range(0, len(program), _INSN.size)]
