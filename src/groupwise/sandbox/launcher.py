"""The sandbox launcher: the program every sandbox process runs, never imported by the trainer.

:func:`groupwise.sandbox.process.spawn` starts it as ``python -I -S launcher.py TAG`` in a fresh
working directory holding ``.payload``, a marshal-encoded dict that says what to do: probe which
namespaces work and which files the interpreter needs (``probe``), or build the sandbox, drop
privileges and run what ``harness.py`` says for the mode: a program as ``__main__`` (``io``), a
solution answering calls (``serve``) or the tests calling it (``judge``). It starts with the
trainer's privileges, so it is trusted code: it reads and deletes the payload, loads
``harness.py`` and ``confine.py`` from its own directory, builds the sandbox, and imports
everything it needs before the solution runs. What each step defends against: docs/sandbox.md.

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
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 4, 36, 38
MNT_DETACH = 2
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
SETUP_FAILED = 125
WORKDIR = "/sandbox"  # the working directory inside an allowlisted root

libc = None  # loaded by main(): importing this module has no side effects
confine = None  # confine.py, loaded by main()
host_proc = None  # a descriptor of the host's /proc kept across pivot_root (the supervisor's)


def load_libc():
    global libc
    libc = ctypes.CDLL(None, use_errno=True)
    libc.unshare.argtypes = [ctypes.c_int]
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                           ctypes.c_char_p]
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                           ctypes.c_ulong]
    libc.capset.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


def load_sibling(name):
    """A module of this directory, loaded by path (the package is not importable here)."""
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name + ".py")
    spec = importlib.util.spec_from_file_location("groupwise_sandbox_" + name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
    import json
    paths = interpreter_paths()
    found = {"paths": paths, "masks": package_dirs(paths)}
    os.write(1, f"{cfg['nonce']} PATHS {json.dumps(found)}\n".encode())


def package_dirs(paths):
    """``site-packages`` and ``dist-packages`` directories up to two levels below ``paths``:
    installed packages (groupwise's own data among them) are not the interpreter's."""
    found = []
    for path in paths:
        if not os.path.isdir(path):
            continue
        for top, dirs, _ in os.walk(path):
            if top.count("/") - path.count("/") >= 2:
                dirs[:] = []
            for name in list(dirs):
                if name in ("site-packages", "dist-packages"):
                    dirs.remove(name)
                    found.append(os.path.join(top, name))
    return found


def interpreter_paths():
    """What this interpreter needs to run any standard library module: its executable, its
    standard library (``site-packages`` and ``dist-packages`` are masked later), and the
    directories of every shared library mapped once each ``lib-dynload`` module is imported."""
    import importlib
    import sysconfig
    paths = [os.path.realpath(sys.executable)]
    stdlib = [os.path.realpath(sysconfig.get_paths()[key]) for key in ("stdlib", "platstdlib")]
    dynload = os.path.join(stdlib[-1], "lib-dynload")
    paths += stdlib
    if os.path.isdir(dynload):
        paths.append(os.path.realpath(dynload))
        for name in sorted(os.listdir(dynload)):
            module = name.split(".")[0]
            if name.endswith(".so") and module not in ("_tkinter", "_test", "xxlimited"):
                try:
                    importlib.import_module(module)
                except BaseException:
                    pass
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 6 and fields[5].startswith("/") and ".so" in fields[5]:
                paths.append(os.path.dirname(os.path.realpath(fields[5])))
    if os.path.exists("/etc/ld.so.cache"):
        paths.append("/etc/ld.so.cache")
    loader = elf_interpreter(paths[0])
    if loader:
        paths.append(loader)  # as the executable names it: the symlinks on the way are mirrored
    kept = []
    for path in sorted(set(paths), key=len):
        if not any(path == k or path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    return kept


def elf_interpreter(path):
    """The dynamic loader a 64-bit ELF executable names (PT_INTERP), or None."""
    import struct
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2:
            return None
        order = "<" if head[5] == 1 else ">"
        phoff = struct.unpack(order + "Q", head[32:40])[0]
        size, count = struct.unpack(order + "HH", head[54:58])
        for i in range(count):
            f.seek(phoff + i * size)
            header = f.read(size)
            if struct.unpack(order + "I", header[:4])[0] == 3:  # PT_INTERP
                offset, length = struct.unpack(order + "Q", header[8:16])[0], struct.unpack(
                    order + "Q", header[32:40])[0]
                f.seek(offset)
                return f.read(length).rstrip(b"\0").decode("utf-8", "replace") or None
    return None


def setup(cfg):
    flags = cfg["flags"]
    if flags:
        check(libc.unshare(flags), f"unshare({flags:#x})")
    if flags & NEWUSER:
        map_user(cfg)
    if flags & NEWNS:
        mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing propagates back to the host
        build_root(cfg)


def mirror(path, root, depth=0):
    """Create under ``root`` each symlink met on the way to ``path``; return its real path."""
    if depth > 40:
        raise OSError(40, f"too many symlinks resolving {path}")
    current = "/"
    parts = [part for part in path.split("/") if part]
    for i, part in enumerate(parts):
        host = os.path.join(current, part)
        if os.path.islink(host):
            target = os.readlink(host)
            link = root + host
            if not os.path.lexists(link):
                os.makedirs(os.path.dirname(link), exist_ok=True)
                os.symlink(target, link)
            resolved = os.path.normpath(os.path.join(current, target))
            rest = "/".join(parts[i + 1:])
            return mirror(os.path.join(resolved, rest) if rest else resolved, root, depth + 1)
        current = host
    return current


def bind(source, target, extra=0):
    """A read-only bind of ``source`` at ``target`` (flags the kernel locked are kept)."""
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.exists(target):
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT, 0o644))
    mount(source, target, None, MS_BIND | MS_REC)
    keep = os.statvfs(target).f_flag & MS_KEEP
    mount(None, target, None, MS_REMOUNT | MS_BIND | keep | extra | MS_NOSUID)


def build_root(cfg):
    """The sandbox's whole filesystem: a tmpfs holding read-only binds of the interpreter's own
    files (with ``site-packages`` and ``dist-packages`` masked), the harmless device nodes,
    private ``/tmp``-like dirs and the working directory; ``pivot_root`` into it and detach the
    host's tree. Nothing else of the host (datasets, package data, home directories, sockets,
    device nodes) exists in it."""
    root = cfg["workdir"]  # the host's fresh working directory: the payload is already read
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m,nr_inodes=4096")
    for path in cfg["root_paths"]:
        if os.path.exists(path):
            real = mirror(path, root)
            bind(real, root + real, MS_RDONLY | MS_NODEV)
    for path in cfg["root_masks"]:  # found by the probe
        if os.path.isdir(root + path):
            mount("tmpfs", root + path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                  "size=4k,nr_inodes=8")
    os.makedirs(root + "/dev", exist_ok=True)
    for name in ("null", "zero", "full", "random", "urandom"):
        if os.path.exists("/dev/" + name):
            bind("/dev/" + name, root + "/dev/" + name)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, root + "/dev/" + name)
    private = MS_NOSUID | MS_NODEV | MS_NOEXEC
    for path in ("/tmp", "/var/tmp", "/dev/shm"):
        os.makedirs(root + path, exist_ok=True)
        mount("tmpfs", root + path, "tmpfs", private, "mode=1777,size=16m,nr_inodes=4096")
    os.makedirs(root + "/proc", exist_ok=True)
    if cfg["flags"] & NEWUSER and cfg["flags"] & NEWPID:
        # In a user namespace the kernel mounts a new procfs only where a full one is already
        # visible: the host's stays under the namespace's own, which the init mounts on top.
        mount("/proc", root + "/proc", None, MS_BIND | MS_REC)
    work = root + WORKDIR
    os.makedirs(work)
    opts = f"mode=0700,size={cfg['disk_bytes'] // 1024}k,nr_inodes=16384"
    if cfg["uid"] is not None:
        opts += f",uid={cfg['uid']},gid={cfg['uid']}"
    mount("tmpfs", work, "tmpfs", private, opts)
    global host_proc
    host_proc = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)  # the supervisor's, not the worker's
    os.chdir(root)
    os.mkdir(".old")
    machine = os.uname().machine  # not platform: on 3.6 it forks `uname -p`, the PID ns's init
    number = SYS_PIVOT_ROOT.get(machine)
    if number is None:
        raise OSError(38, f"pivot_root: unknown architecture {machine}")
    check(libc.syscall(number, b".", b".old"), "pivot_root")
    os.chdir("/")
    check(libc.umount2(b"/.old", MNT_DETACH), "umount2(/.old)")
    os.rmdir("/.old")
    mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir(WORKDIR)


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
            libc.umount2(b"/proc", MNT_DETACH)  # never leave the host's in sight
            mount("tmpfs", "/proc", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=555")
    worker = os.fork()
    if worker == 0:
        os.close(alive_r)
        return
    prctl(PR_SET_DUMPABLE, 0)  # the solution keeps away from its init's memory
    while True:  # init: reap everything, exit with the worker's status (kills the rest)
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(SETUP_FAILED)
        if pid == worker:
            os._exit(exit_code(status))


def supervise():
    """Without a PID namespace: fork the worker and stay its subreaper, so every process the
    solution leaves (also one that called ``setsid``) is re-parented here, killed once the
    worker ends, and reaped: none is left as a zombie holding a sandbox uid. Returns in the
    worker."""
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    proc = host_proc if host_proc is not None else os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)
    worker = os.fork()
    if worker == 0:
        if proc != host_proc:
            os.close(proc)
        return
    prctl(PR_SET_DUMPABLE, 0)
    code = SETUP_FAILED
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        if pid == worker:
            code = exit_code(status)
            break
    me = str(os.getpid())
    while True:  # kill the children until none is left (orphans keep arriving here)
        children = []
        for entry in os.listdir(proc):
            if entry.isdigit():
                try:
                    fd = os.open(entry + "/stat", os.O_RDONLY, dir_fd=proc)
                    try:
                        fields = os.read(fd, 4096).rsplit(b")", 1)[1].split()
                    finally:
                        os.close(fd)
                except OSError:
                    continue
                if fields[1].decode() == me:
                    children.append(int(entry))
        for pid in children:
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            break
        if not children:
            import time
            time.sleep(0.005)
    os._exit(code)


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
    confine.join_new_session_keyring()  # the trainer's session keyring is out of reach
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    prctl(PR_SET_DUMPABLE, 0 if cfg["mode"] == "judge" else 1)
    prctl(PR_SET_PDEATHSIG, 9)  # cleared by the uid change
    if cfg["landlock"]:
        read_only, read_write = landlock_paths(cfg)
        confine.restrict_filesystem(read_only, read_write)
    if cfg.get("seccomp"):
        confine.install_seccomp(cfg["seccomp"])  # last: it denies what the steps above use


def landlock_paths(cfg):
    """Where the solution may read (the interpreter's files, harmless device nodes) and write
    (its working directory; the private /tmp-like dirs of an allowlisted root)."""
    devices = ["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"]
    read_only = list(cfg["root_paths"]) + devices
    read_write = ["/dev/null", os.getcwd()]
    if cfg["flags"] & NEWNS:
        read_write += ["/tmp", "/var/tmp", "/dev/shm"]
        if cfg["flags"] & NEWPID:
            read_only.append("/proc")  # this namespace's own
    return read_only, read_write


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


def main():
    global confine
    try:
        load_libc()
        with open(".payload", "rb") as f:
            cfg = marshal.loads(f.read())
        os.unlink(".payload")
        prctl(PR_SET_PDEATHSIG, 9)
        if os.getppid() != cfg["parent"]:
            os._exit(SETUP_FAILED)
        for path in cfg.get("cgroup_procs", ()):  # first: everything from here on is counted
            with open(path, "w") as f:
                f.write("0")
        if cfg.get("probe"):
            probe(cfg)
            os._exit(0)
        harness = load_sibling("harness")
        confine = load_sibling("confine")
        setup(cfg)
        if cfg["flags"] & NEWPID:
            start_pid_namespace(cfg)
        else:
            supervise()
        if host_proc is not None:
            os.close(host_proc)
        set_stdin(cfg)
        if cfg["block_network"]:
            block_network()  # imports socket while the stdlib is surely readable
        drop_privileges(cfg)
        os.write(2, f"{cfg['nonce']} READY\n".encode())
    except BaseException as exc:
        fail(f"{type(exc).__name__}: {exc}")
    {"io": harness.run_io, "serve": harness.serve, "judge": harness.judge}[cfg["mode"]](cfg)


if __name__ == "__main__":
    main()
