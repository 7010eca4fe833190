"""The sandbox's seccomp filter: its encoding, its verdicts on both architectures (run through a
small BPF interpreter), and, installed in a forked child of this machine, what it denies and
what it leaves working. The filter is never installed in the pytest process itself."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import platform
import re
import socket
import struct
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from groupwise.sandbox import seccomp
from groupwise.sandbox.confine import install_seccomp

RET_EPERM = seccomp.SECCOMP_RET_ERRNO | errno.EPERM
RET_ENOSYS = seccomp.SECCOMP_RET_ERRNO | errno.ENOSYS
HOST = platform.machine()
HOST_SUPPORTED = sys.platform == "linux" and HOST in seccomp.SYSCALLS

needs_host_filter = pytest.mark.skipif(
    not HOST_SUPPORTED, reason=f"no seccomp filter for {sys.platform}/{HOST}"
)


# --- a forked child that applies the confinement and reports back ---------------------------


def in_child(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a forked child; return what it returned (JSON), fail on its exception."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            try:
                out = {"ok": fn()}
            except BaseException:
                out = {"error": traceback.format_exc()}
            view = memoryview(json.dumps(out).encode())
            while view:
                view = view[os.write(w, view) :]
        finally:
            os._exit(0)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child status {status:#x}"
    data = json.loads(b"".join(chunks))
    if "error" in data:
        pytest.fail("the child raised:\n" + data["error"])
    return data["ok"]


libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def raw(nr: int, *args: int) -> int:
    """syscall(nr, *args): 0 or the result on success, -errno on failure."""
    ctypes.set_errno(0)
    ret = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return -ctypes.get_errno() if ret == -1 else ret


def oserror_errno(fn: Callable[[], Any]) -> int:
    try:
        fn()
    except OSError as exc:
        return exc.errno
    return 0


def nr(name: str) -> int:
    return seccomp.SYSCALLS[seccomp.normalise_arch()][name]


# --- encoding --------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_the_program_starts_by_checking_the_architecture(arch):
    program = seccomp.build_filter(arch)
    assert len(program) % 8 == 0
    assert program[:8] == struct.pack("HBBI", 0x20, 0, 0, 4)  # A = seccomp_data.arch
    assert program[8:16] == struct.pack("HBBI", 0x15, 1, 0, seccomp.AUDIT_ARCH[arch])
    assert program[16:24] == struct.pack("HBBI", 0x06, 0, 0, 0x80000000)  # KILL_PROCESS
    assert program[24:32] == struct.pack("HBBI", 0x20, 0, 0, 0)  # A = seccomp_data.nr
    insns = seccomp.decode(program)
    assert insns[-3:] == [
        (0x06, 0, 0, 0x7FFF0000),
        (0x06, 0, 0, RET_EPERM),
        (0x06, 0, 0, RET_ENOSYS),
    ]
    assert all(code in (0x20, 0x15, 0x35, 0x45, 0x06) for code, _, _, _ in insns)


def test_x86_64_rejects_x32_numbers_first():
    insns = seccomp.decode(seccomp.build_filter("x86_64"))
    code, jt, jf, k = insns[4]
    assert (code, jf, k) == (0x35, 0, 0x40000000)
    assert insns[4 + 1 + jt] == (0x06, 0, 0, RET_EPERM)


def test_syscall_numbers_checked_by_hand():
    x86, arm = seccomp.SYSCALLS_X86_64, seccomp.SYSCALLS_AARCH64
    assert (x86["keyctl"], x86["ptrace"], x86["socket"], x86["unshare"]) == (250, 101, 41, 272)
    assert (arm["keyctl"], arm["ptrace"], arm["socket"], arm["unshare"]) == (219, 117, 198, 97)
    assert (x86["clone"], x86["clone3"], arm["clone"], arm["clone3"]) == (56, 435, 220, 435)
    assert "iopl" not in arm and "ioperm" not in arm


def test_every_denied_name_is_known_and_the_tables_hold_nothing_else():
    names = {name for group in seccomp.DENIED.values() for name in group}
    for table in seccomp.SYSCALLS.values():
        assert set(table) - names == {"clone", "clone3"}
        assert len(set(table.values())) == len(table), "two names share a number"
    assert names - set(seccomp.SYSCALLS_X86_64) == set()
    assert names - set(seccomp.SYSCALLS_AARCH64) == {"iopl", "ioperm"}
    assert "socketpair" not in names


def header_numbers(path: str) -> dict[str, int]:
    text = Path(path).read_text()
    return {m[1]: int(m[2]) for m in re.finditer(r"#define\s+__NR_(\w+)\s+(\d+)\b", text)}


HEADERS = {
    "x86_64": ("/usr/include/x86_64-linux-gnu/asm/unistd_64.h", "/usr/include/asm/unistd_64.h"),
    "aarch64": ("/usr/include/asm-generic/unistd.h",),
}


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_syscall_numbers_match_the_installed_kernel_headers(arch):
    header = next((path for path in HEADERS[arch] if os.path.exists(path)), None)
    if header is None:
        pytest.skip(f"no kernel syscall header for {arch} is installed")
    numbers = header_numbers(header)
    table = seccomp.SYSCALLS[arch]
    assert {n: numbers[n] for n in table if n in numbers} == {
        n: table[n] for n in table if n in numbers
    }
    # Old headers lack the newest calls, new ones drop the removed lookup_dcookie.
    assert {"keyctl", "socket", "unshare", "clone", "ptrace"} <= set(numbers)
    assert set(table) - set(numbers) <= {"lookup_dcookie", "memfd_secret", "quotactl_fd"}


def test_an_unknown_architecture_is_refused_by_name():
    with pytest.raises(ValueError, match="riscv64"):
        seccomp.build_filter("riscv64")
    with pytest.raises(ValueError, match="i686"):
        seccomp.denied_syscalls("i686")
    assert seccomp.build_filter("amd64") == seccomp.build_filter("x86_64")


# --- verdicts, through a BPF interpreter (both architectures on any host) --------------------


def run_bpf(program: bytes, nr: int, arch: int, args: tuple[int, ...] = ()) -> int:
    data = struct.pack("<iIQ6Q", nr, arch, 0, *(list(args) + [0] * (6 - len(args))))
    insns = seccomp.decode(program)
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        pc += 1
        if code == 0x20:
            acc = struct.unpack_from("<I", data, k)[0]
        elif code == 0x06:
            return k
        else:
            taken = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += jt if taken else jf


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_verdicts(arch):
    program = seccomp.build_filter(arch)
    audit = seccomp.AUDIT_ARCH[arch]
    table = seccomp.SYSCALLS[arch]
    denied = seccomp.denied_syscalls(arch)
    for name, number in denied.items():
        assert run_bpf(program, number, audit) == RET_EPERM, name
    for number in set(range(600)) - set(table.values()):
        assert run_bpf(program, number, audit) == seccomp.SECCOMP_RET_ALLOW, number
    assert run_bpf(program, table["clone3"], audit) == RET_ENOSYS
    clone = table["clone"]
    assert run_bpf(program, clone, audit, (0x01200011,)) == seccomp.SECCOMP_RET_ALLOW  # fork()
    assert run_bpf(program, clone, audit, (0x003D0F00,)) == seccomp.SECCOMP_RET_ALLOW  # thread
    for flag in (0x20000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000):
        assert run_bpf(program, clone, audit, (flag | 17,)) == RET_EPERM, hex(flag)
    assert run_bpf(program, clone, audit, (0x40000000 | 17,)) == RET_EPERM
    assert run_bpf(program, clone, audit, (0x80,)) == RET_EPERM
    # A foreign ABI (i386 on x86_64, AArch32 on aarch64) is killed whatever the call.
    for other in (0x40000003, 0x40000028, 0xC000003E ^ 0xC00000B7 ^ audit):
        assert run_bpf(program, 39, other) == seccomp.SECCOMP_RET_KILL_PROCESS
    x32 = run_bpf(program, 0x40000000 | 39, audit)
    assert x32 == (RET_EPERM if arch == "x86_64" else seccomp.SECCOMP_RET_ALLOW)


# --- installed in a child of this machine ----------------------------------------------------

KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING = 0, -3
CLONE_NEWUSER, SIGCHLD = 0x10000000, 17


def probes() -> dict[str, int]:
    """What the privileged-looking calls answer: 0 or a result on success, -errno on failure."""
    out = {
        "keyctl": raw(nr("keyctl"), KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 0),
        "socket": -oserror_errno(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()),
    }
    child = raw(nr("clone"), CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0)
    if child == 0:  # a raw fork into a new user namespace: leave at once
        os._exit(0)
    if child > 0:
        os.waitpid(child, 0)
    out["clone_newuser"] = child
    out["unshare"] = raw(nr("unshare"), CLONE_NEWUSER)  # last: it changes this process
    return out


@needs_host_filter
def test_a_child_without_the_filter_may_do_what_the_filter_denies():
    got = in_child(probes)
    assert got["keyctl"] > 0, got
    assert got["socket"] == 0, got
    if got["unshare"] != 0 or got["clone_newuser"] <= 0:
        pytest.skip(f"this machine refuses user namespaces anyway: {got}")


@needs_host_filter
def test_the_filter_denies_keys_sockets_namespaces_and_ptrace():
    program = seccomp.build_filter()

    def child():
        install_seccomp(program)
        out = probes()
        out["ptrace_traceme"] = raw(nr("ptrace"), 0, 0, 0, 0)
        out["clone3"] = raw(nr("clone3"), 0, 0)
        out["os_unshare"] = (
            -oserror_errno(lambda: os.unshare(CLONE_NEWUSER))
            if hasattr(os, "unshare")
            else -errno.EPERM
        )
        out["x32_getpid"] = raw(0x40000000 | 39) if HOST == "x86_64" else -errno.EPERM
        try:
            socket.socket()
        except PermissionError as exc:
            out["socket_exception"] = f"PermissionError {exc.errno}"
        return out

    got = in_child(child)
    eperm = -errno.EPERM
    assert got == {
        "keyctl": eperm,
        "socket": eperm,
        "unshare": eperm,
        "clone_newuser": eperm,
        "ptrace_traceme": eperm,
        "clone3": -errno.ENOSYS,
        "os_unshare": eperm,
        "x32_getpid": eperm,
        "socket_exception": f"PermissionError {errno.EPERM}",
    }


@needs_host_filter
def test_every_denied_syscall_gets_eperm():
    # All arguments -1: should the filter let one through, the kernel refuses the arguments
    # (vhangup takes none, so it is not called).
    program = seccomp.build_filter()
    calls = {n: k for n, k in seccomp.denied_syscalls().items() if n != "vhangup"}

    def child():
        install_seccomp(program)
        return {name: raw(number, -1, -1, -1, -1, -1, -1) for name, number in calls.items()}

    assert in_child(child) == {name: -errno.EPERM for name in calls}


@needs_host_filter
def test_ordinary_work_still_runs_under_the_filter():
    program = seccomp.build_filter()
    here = Path(__file__)

    def child():
        install_seccomp(program)
        out: dict[str, Any] = {"read": here.read_text()[:20]}
        pid = os.fork()
        if pid == 0:
            os._exit(7)
        out["fork"] = os.WEXITSTATUS(os.waitpid(pid, 0)[1])
        seen = []
        thread = threading.Thread(target=seen.append, args=("thread",))
        thread.start()
        thread.join()
        out["thread"] = seen
        a, b = socket.socketpair()
        a.sendall(b"pair")
        out["socketpair"] = b.recv(4).decode()
        a.close()
        b.close()
        proc = subprocess.run(
            [sys.executable, "-c", "print(1)"], capture_output=True, text=True, timeout=60
        )
        out["subprocess"] = (proc.returncode, proc.stdout)
        out["getpid"] = os.getpid() > 0
        return out

    got = in_child(child)
    assert got == {
        "read": here.read_text()[:20],
        "fork": 7,
        "thread": ["thread"],
        "socketpair": "pair",
        "subprocess": [0, "1\n"],
        "getpid": True,
    }
