"""The sandbox launcher: the program every sandbox process runs, never imported by the trainer.

:func:`groupwise.sandbox.process.spawn` starts it as ``python -I -S launcher.py TAG`` in a fresh
working directory holding ``.payload``, a marshal-encoded dict that says what to do: probe which
namespaces work (``probe``), or build the sandbox, drop privileges and run the solution, either
once per stdin case (``mode: io``) or with assert tests reported on a side channel
(``mode: asserts``). It starts with the trainer's privileges, so it is trusted code: it reads and
deletes the payload, builds the sandbox, and imports everything it needs before the solution
runs. What each step defends against: docs/sandbox.md.

It runs on the sandbox interpreter, which may be the system's ``python3`` rather than the
trainer's, so it uses the standard library only, no syntax newer than CPython 3.6, and nothing
from groupwise (with ``-I -S`` the trainer's packages are not on ``sys.path``).
"""

import ctypes
import marshal
import os
import sys

NEWNS, NEWIPC, NEWUSER, NEWPID, NEWNET = 0x20000, 0x8000000, 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 262144
MS_KEEP = 2 | 4 | 8 | 1024 | 2048 | 4096
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 1, 4, 38
SETUP_FAILED = 125

libc = None  # loaded by main(): importing this module has no side effects


def load_libc():
    global libc
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
        raise OSError(err, f"{what}: {os.strerror(err)}")


def prctl(option, value):
    check(libc.prctl(option, value, 0, 0, 0), f"prctl({option})")


def enc(text):
    return None if text is None else text.encode()


def mount(source, target, fstype, flags, data=None):
    check(libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount({target})")


def exit_code(status):
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def fail(message):
    try:
        text = f"groupwise sandbox setup failed: {message}\n"
        os.write(2, text.encode("utf-8", "replace"))
    finally:
        os._exit(SETUP_FAILED)


def map_user(cfg):
    # Inside a new user namespace: map our own uid/gid to themselves (files can be created).
    uid, gid = cfg["euid"], cfg["egid"]
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1\n"),
                       ("gid_map", f"{gid} {gid} 1\n")):
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
    version = ".".join(str(part) for part in sys.version_info[:3])
    found = ",".join(ok) or "-"
    os.write(1, f"{cfg['nonce']} PROBE {found} {version}\n".encode())


def setup(cfg):
    flags = cfg["flags"]
    if flags:
        check(libc.unshare(flags), f"unshare({flags:#x})")
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
        opts = f"mode=0700,size={cfg['disk_bytes'] // 1024}k"
        if cfg["uid"] is not None:
            opts += f",uid={cfg['uid']},gid={cfg['uid']}"
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
            raise RuntimeError(f"could not switch to uid {uid}")
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
    import _socket
    import errno
    import socket

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
            name = f".stdin-{os.getpid()}"
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
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
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
                write(results, f"{nonce} {line}\n".encode("utf-8", "replace"))
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
        name = f"<test {index}>" if kind == "test" else "<setup>"
        try:
            run(compile_(source, name, "exec", dont_inherit=True, optimize=0), namespace)
        except BaseException as exc:
            emit((f"{index} F " if kind == "test" else "SETUP ") + describe(exc))
        else:
            if kind == "test":
                emit(f"{index} P")
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
    except BaseException as exc:
        import traceback
        # From the solution's frames on: the launcher's frame (and its path) is not the program's.
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
        status = 1
    sys.exit(status)  # normal interpreter shutdown: joins threads, flushes stdout


def main():
    try:
        load_libc()
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
        os.write(2, f"{cfg['nonce']} READY\n".encode())
    except BaseException as exc:
        fail(f"{type(exc).__name__}: {exc}")
    if cfg["mode"] == "io":
        run_io(cfg)
    else:
        run_asserts(cfg)


if __name__ == "__main__":
    main()
