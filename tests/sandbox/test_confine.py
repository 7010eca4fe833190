"""The launcher's kernel confinement (:mod:`groupwise.sandbox.confine`), each step applied in a
forked child, never in the pytest process: Landlock keeps the child to its paths, off TCP and
(ABI 6) away from processes outside it; a new session keyring hides the inherited keys;
install_seccomp reports a refused program. Each denial is paired with what stays allowed."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import platform
import socket
import struct
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from groupwise.sandbox import confine

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or platform.machine() not in confine.SYSCALLS,
    reason="the sandbox's confinement is for Linux on x86_64 and aarch64",
)


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


def errno_of(fn: Callable[[], Any]) -> int:
    """0 when ``fn()`` succeeds, else the errno of its OSError."""
    try:
        fn()
    except OSError as exc:
        return exc.errno
    return 0


ABI = confine.landlock_abi() if sys.platform == "linux" else 0
needs_landlock = pytest.mark.skipif(ABI < 1, reason="the kernel has no Landlock")


def test_landlock_abi_is_a_version_or_zero():
    assert isinstance(ABI, int) and ABI >= 0
    assert in_child(confine.landlock_abi) == ABI


def test_handled_rights_grow_with_the_abi():
    assert confine.handled_access_fs(1) == 0x1FFF
    assert confine.handled_access_fs(2) == 0x3FFF
    assert confine.handled_access_fs(4) == 0x7FFF
    assert confine.handled_access_fs(7) == 0xFFFF
    assert [len(confine._ruleset_attr(abi)) for abi in (1, 3, 4, 5, 6, 7)] == [8, 8, 16, 16, 24, 24]


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    """A read-only dir, a read-write dir, a writable single file and a dir outside them all."""
    paths = {name: tmp_path / name for name in ("ro", "rw", "outside")}
    for path in paths.values():
        path.mkdir()
        (path / "file.txt").write_text(f"in {path.name}\n")
    paths["rw_file"] = tmp_path / "rw_file.txt"
    paths["rw_file"].write_text("single file\n")
    paths["ro_file"] = tmp_path / "ro_file.txt"
    paths["ro_file"].write_text("read-only file\n")
    return paths


def read(path: Path | str) -> str:
    with open(path) as f:
        return f.read()


def write(path: Path | str, text: str = "x", mode: str = "w") -> None:
    with open(path, mode) as f:
        f.write(text)


@needs_landlock
def test_landlock_keeps_the_child_to_its_paths(tree):
    stdlib = os.path.dirname(os.__file__)
    interpreter = os.path.realpath(sys.executable)
    read_only = [stdlib, interpreter, str(tree["ro"]), str(tree["ro_file"]), "/no/such/path"]
    read_write = [str(tree["rw"]), str(tree["rw_file"])]
    hostname = "/etc/hostname" if os.path.exists("/etc/hostname") else "/etc/passwd"

    def child():
        abi = confine.restrict_filesystem(read_only, read_write)
        rw, ro = tree["rw"], tree["ro"]
        allowed = {
            "read_stdlib": lambda: read(os.__file__),
            "list_stdlib": lambda: os.listdir(stdlib),
            "read_ro": lambda: read(ro / "file.txt"),
            "read_ro_file": lambda: read(tree["ro_file"]),
            "write_rw": lambda: write(rw / "new.txt"),
            "append_rw": lambda: write(rw / "file.txt", "y", "a"),
            "mkdir_rw": lambda: os.mkdir(rw / "sub"),
            "rename_rw": lambda: os.rename(rw / "new.txt", rw / "sub" / "moved.txt"),
            "unlink_rw": lambda: os.unlink(rw / "sub" / "moved.txt"),
            "write_rw_file": lambda: write(tree["rw_file"], "changed"),
        }
        denied = {
            "read_outside": lambda: read(tree["outside"] / "file.txt"),
            "list_outside": lambda: os.listdir(tree["outside"]),
            "read_etc": lambda: read(hostname),
            "list_root": lambda: os.listdir("/"),
            "write_ro": lambda: write(ro / "file.txt", "y", "a"),
            "create_in_ro": lambda: write(ro / "new.txt"),
            "unlink_in_ro": lambda: os.unlink(ro / "file.txt"),
            "write_ro_file": lambda: write(tree["ro_file"], "y", "a"),
            "write_stdlib": lambda: write(os.path.join(stdlib, "groupwise-probe")),
            "write_outside": lambda: write(tree["outside"] / "new.txt"),
        }
        return {
            "abi": abi,
            "allowed": {name: errno_of(fn) for name, fn in allowed.items()},
            "denied": {name: errno_of(fn) for name, fn in denied.items()},
        }

    got = in_child(child)
    assert got["abi"] == ABI
    assert got["allowed"] == dict.fromkeys(got["allowed"], 0)
    assert got["denied"] == dict.fromkeys(got["denied"], errno.EACCES)
    assert len(got["allowed"]) == len(got["denied"]) == 10
    # What the child was allowed to do did happen; what it was denied did not.
    assert (tree["rw"] / "file.txt").read_text() == "in rw\ny"
    assert (tree["rw"] / "sub").is_dir() and not (tree["rw"] / "new.txt").exists()
    assert tree["rw_file"].read_text() == "changed"
    assert (tree["ro"] / "file.txt").read_text() == "in ro\n"
    assert sorted(p.name for p in tree["ro"].iterdir()) == ["file.txt"]
    assert tree["ro_file"].read_text() == "read-only file\n"
    assert not (tree["outside"] / "new.txt").exists()


@needs_landlock
def test_without_landlock_the_same_child_reaches_everything(tree):
    def child():
        return {
            "read_outside": errno_of(lambda: read(tree["outside"] / "file.txt")),
            "write_ro": errno_of(lambda: write(tree["ro"] / "other.txt")),
        }

    assert in_child(child) == {"read_outside": 0, "write_ro": 0}


@needs_landlock
def test_landlock_children_inherit_the_domain(tree):
    def child():
        confine.restrict_filesystem(
            [os.path.realpath(sys.executable), "/usr", "/lib", "/lib64"], []
        )
        pid = os.fork()
        if pid == 0:
            os._exit(errno_of(lambda: read(tree["ro"] / "file.txt")))
        return os.WEXITSTATUS(os.waitpid(pid, 0)[1])

    assert in_child(child) == errno.EACCES


@pytest.mark.skipif(ABI < 4, reason="Landlock restricts TCP from ABI 4 on")
def test_landlock_denies_tcp_connect_and_bind():
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]

        def connect_and_bind(restrict: bool) -> dict[str, int]:
            if restrict:
                confine.restrict_filesystem([], [])

            def connect():
                with socket.create_connection(("127.0.0.1", port), timeout=10):
                    pass

            def bind():
                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0))

            return {"connect": errno_of(connect), "bind": errno_of(bind)}

        assert in_child(lambda: connect_and_bind(False)) == {"connect": 0, "bind": 0}
        denied = {"connect": errno.EACCES, "bind": errno.EACCES}
        assert in_child(lambda: connect_and_bind(True)) == denied


@pytest.mark.skipif(ABI < 6, reason="Landlock scopes signals and abstract sockets from ABI 6 on")
def test_landlock_scopes_signals_and_abstract_unix_sockets():
    name = f"\0groupwise-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(name)
        server.listen()

        def child():
            out = {"before_kill": errno_of(lambda: os.kill(os.getppid(), 0))}
            confine.restrict_filesystem([], [])
            out["kill_parent"] = errno_of(lambda: os.kill(os.getppid(), 0))
            inner = os.fork()  # created inside the domain: may be signalled
            if inner == 0:
                os._exit(0)
            out["kill_own_child"] = errno_of(lambda: os.kill(inner, 0))
            os.waitpid(inner, 0)

            def connect():
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.connect(name)

            out["abstract_connect"] = errno_of(connect)
            return out

        assert in_child(child) == {
            "before_kill": 0,
            "kill_parent": errno.EPERM,
            "kill_own_child": 0,
            "abstract_connect": errno.EPERM,
        }


@needs_landlock
def test_landlock_leaves_exec_of_allowed_interpreters_working(tmp_path):
    # What the launcher needs: the interpreter, its libraries and stdlib stay usable.
    real = os.path.realpath(sys.executable)
    prefixes = {sys.base_prefix, "/usr", "/lib", "/lib64", "/etc/ld.so.cache", real}

    def child():
        confine.restrict_filesystem(sorted(prefixes), [str(tmp_path)])
        proc = subprocess.run(
            [real, "-I", "-S", "-c", "print(1)"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=str(tmp_path),
            env={},
        )
        return [proc.returncode, proc.stdout]

    assert in_child(child) == [0, "1\n"]


# --- keyrings ---------------------------------------------------------------------------------

KEYCTL_JOIN_SESSION_KEYRING, KEYCTL_SEARCH, KEYCTL_READ = 1, 10, 11
KEY_SPEC_SESSION_KEYRING = -3
ADD_KEY = {"x86_64": 248, "aarch64": 217}

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def syscall(nr: int, *args: Any) -> int:
    """syscall(nr, *args) with ints as C longs and bytes as pointers: the result, or -errno."""
    conv = [a if isinstance(a, bytes) else ctypes.c_long(a) for a in args]
    ctypes.set_errno(0)
    ret = libc.syscall(ctypes.c_long(nr), *conv)
    return -ctypes.get_errno() if ret == -1 else ret


def test_joining_a_new_session_keyring_hides_the_inherited_keys():
    keyctl = confine.SYSCALLS[platform.machine()]["keyctl"]
    add_key = ADD_KEY[platform.machine()]

    def child():
        # A private session keyring first, so the key never lands in pytest's own session.
        outer = syscall(keyctl, KEYCTL_JOIN_SESSION_KEYRING, 0)
        if outer == -errno.ENOSYS:
            return None
        key = syscall(add_key, b"user", b"groupwise-secret", b"token", 5, KEY_SPEC_SESSION_KEYRING)
        search = (KEYCTL_SEARCH, KEY_SPEC_SESSION_KEYRING, b"user", b"groupwise-secret", 0)
        out = {"outer": outer, "key": key, "found_before": syscall(keyctl, *search)}
        out["read_before"] = syscall(keyctl, KEYCTL_READ, KEY_SPEC_SESSION_KEYRING, 0, 0)
        out["joined"] = confine.join_new_session_keyring()
        out["found_after"] = syscall(keyctl, *search)
        out["read_after"] = syscall(keyctl, KEYCTL_READ, KEY_SPEC_SESSION_KEYRING, 0, 0)
        return out

    got = in_child(child)
    if got is None:
        pytest.skip("the kernel has no keys support")
    assert got["outer"] > 0 and got["key"] > 0, got
    assert got["found_before"] == got["key"], got
    assert got["read_before"] == 4, got  # one 4-byte key serial
    assert got["joined"] > 0 and got["joined"] != got["outer"], got
    assert got["found_after"] == -errno.ENOKEY, got
    assert got["read_after"] == 0, got


# --- seccomp installation errors ---------------------------------------------------------------


@pytest.mark.parametrize("program", [b"", b"\0" * 7])
def test_install_seccomp_refuses_a_malformed_program(program):
    def child():
        with pytest.raises(OSError) as info:
            confine.install_seccomp(program)
        return info.value.errno

    assert in_child(child) == errno.EINVAL


def test_install_seccomp_names_the_step_the_kernel_refused():
    bad_jump = struct.pack("HBBI", 0x15, 9, 9, 0)  # a JEQ past the end, and no RET

    def child():
        with pytest.raises(OSError) as info:
            confine.install_seccomp(bad_jump)
        flag = ctypes.CDLL(None).prctl(confine.PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0)
        return [info.value.errno, str(info.value), flag]

    code, message, no_new_privs = in_child(child)
    assert code == errno.EINVAL
    assert "PR_SET_SECCOMP" in message
    assert no_new_privs == 1  # set on the way, as the filter requires


def test_a_keyctl_denied_by_a_filter_above_is_no_keyring_to_leave():
    """Docker's default seccomp profile denies keyctl: joining gives 0 rather than failing the
    sandbox, since nothing under that filter reaches a keyring."""
    from groupwise.sandbox.seccomp import build_filter

    def child():
        confine.install_seccomp(build_filter())  # denies keyctl, as such a profile does
        return confine.join_new_session_keyring()

    assert in_child(child) == 0
