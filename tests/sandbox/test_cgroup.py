"""Per-sandbox cgroups: real limits on this host where it has usable cgroups (memory of forked
children and of the kernel, process count, CPU, killing and removal), and the cgroup v2 and v1
logic against fake cgroup trees."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from groupwise.sandbox import cgroup
from groupwise.sandbox.cgroup import CgroupFs, CgroupSupport, SandboxCgroup

MB = 2**20

# --- real cgroups on this host -------------------------------------------------------------------

# The child joins the group itself, first thing, as the launcher will.
JOIN = """\
import os, sys
for _path in sys.argv[1:]:
    with open(_path, "w") as _f:
        _f.write(str(os.getpid()))
"""


@pytest.fixture(scope="module")
def support() -> CgroupSupport:
    found = cgroup.detect()
    if not found.available:
        pytest.skip(f"no usable cgroup on this host: {found.reason}")
    return found


@pytest.fixture
def groups(support):
    made: list[SandboxCgroup] = []

    def make(**limits) -> SandboxCgroup:
        limits.setdefault("max_processes", 64)
        group = SandboxCgroup.create(support, **limits)
        made.append(group)
        return group

    yield make
    for group in made:
        group.remove()


def start(group: SandboxCgroup, body: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", JOIN + body, *group.procs_files],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run(group: SandboxCgroup, body: str, timeout: float = 60.0) -> tuple[int, str, str]:
    proc = start(group, body)
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


FORK_AND_HOLD = """
import os, time
kids = []
for _ in range(8):
    pid = os.fork()
    if pid == 0:
        block = b"x" * (30 * 2**20)  # written, so every page is resident
        time.sleep(1.0)
        os._exit(0)
    kids.append(pid)
print(" ".join(str(os.waitpid(pid, 0)[1]) for pid in kids))
"""


def test_forked_children_share_one_memory_limit(groups):
    limited = groups(memory_bytes=96 * MB)
    code, out, err = run(limited, FORK_AND_HOLD)
    peak = limited.memory_peak()
    assert code == 0, err
    statuses = [int(s) for s in out.split()]
    killed = [s for s in statuses if os.WIFSIGNALED(s) and os.WTERMSIG(s) == signal.SIGKILL]
    print(f"96 MB group: peak {peak / MB:.1f} MB, {len(killed)}/8 children SIGKILLed")
    assert peak is not None and peak <= 100 * MB
    assert killed, f"8 x 30 MB fitted in 96 MB? statuses {statuses}"
    assert limited.oom_killed()

    control = groups(memory_bytes=512 * MB)
    code, out, err = run(control, FORK_AND_HOLD)
    peak = control.memory_peak()
    print(f"512 MB group: peak {(peak or 0) / MB:.1f} MB, statuses {out.strip()}")
    assert code == 0, err
    assert [int(s) for s in out.split()] == [0] * 8
    assert peak is not None and peak >= 8 * 30 * MB
    assert not control.oom_killed()


MKDIRS = """
import errno, os
base, count = {base!r}, {count}
made, error = 0, ""
try:
    while made < count:
        os.mkdir(os.path.join(base, str(made)))
        made += 1
except OSError as exc:
    error = errno.errorcode.get(exc.errno, str(exc.errno))
print(made, error)
"""


def _tmpfs_dir() -> str:
    with open("/proc/self/mountinfo") as f:
        for line in f:
            head, _, tail = line.partition(" - ")
            if tail.split()[:1] == ["tmpfs"] and head.split()[4] == "/dev/shm":
                if os.access("/dev/shm", os.W_OK):
                    return tempfile.mkdtemp(prefix="groupwise-cgroup-test-", dir="/dev/shm")
    pytest.skip("needs a writable tmpfs at /dev/shm (kernel memory: dentries and inodes)")


def test_kernel_memory_of_empty_directories_is_charged(groups):
    # Empty directories in a tmpfs cost only kernel memory (dentries, inodes), never reclaimable.
    base = _tmpfs_dir()
    try:
        control = groups(memory_bytes=256 * MB)
        os.mkdir(os.path.join(base, "control"))
        code, out, err = run(control, MKDIRS.format(base=f"{base}/control", count=20_000))
        assert code == 0 and out.split()[0] == "20000", (code, out, err)
        per_dir = (control.memory_peak() or 0) / 20_000
        print(
            f"20000 empty tmpfs directories: peak {control.memory_peak()} B, {per_dir:.0f} B each"
        )
        if per_dir < 200:
            pytest.skip(
                f"this kernel does not charge dentries/inodes to the memory cgroup "
                f"({per_dir:.0f} bytes per directory)"
            )

        limited = groups(memory_bytes=32 * MB)
        os.mkdir(os.path.join(base, "limited"))
        code, out, err = run(limited, MKDIRS.format(base=f"{base}/limited", count=200_000))
        peak = limited.memory_peak()
        made = len(os.listdir(os.path.join(base, "limited")))
        print(f"32 MB group: {made} directories made, exit {code}, {out.strip()!r}, peak {peak}")
        assert made < 200_000
        assert code != 0 or out.split()[1:] in (["ENOMEM"], ["ENOSPC"])
        assert peak is not None and peak <= 34 * MB
    finally:
        shutil.rmtree(base, ignore_errors=True)


FORK_20 = """
import errno, os
r, w = os.pipe()
made, error = 0, ""
for _ in range(20):
    try:
        pid = os.fork()
    except OSError as exc:
        error = errno.errorcode.get(exc.errno, str(exc.errno))
        break
    if pid == 0:
        os.close(w)
        os.read(r, 1)  # returns when the parent exits
        os._exit(0)
    made += 1
print(made, error)
"""


def test_process_limit_stops_a_fork_loop(support, groups):
    if not support.pids:
        pytest.skip("the pids controller is not available for sandbox groups here")
    group = groups(memory_bytes=128 * MB, max_processes=8)
    code, out, err = run(group, FORK_20)
    assert code == 0, err
    made, error = out.split()
    print(f"pids.max=8: {made} forks before {error}")
    assert int(made) < 20 and error == "EAGAIN"
    assert int(made) == 7  # the child itself is the eighth


BUSY = """
import time
clock = time.{clock}
end = clock() + {seconds}
while clock() < end:
    pass
"""


def test_cpu_time_is_accounted_and_capped(support, groups):
    group = groups(memory_bytes=128 * MB)
    before = group.cpu_seconds()
    if before is None:
        pytest.skip("no CPU accounting for sandbox groups here")
    code, _, err = run(group, BUSY.format(clock="process_time", seconds=0.5))
    assert code == 0, err
    used = group.cpu_seconds()
    print(f"busy for 0.5 CPU s: {used:.3f} CPU s accounted")
    assert used is not None and used >= before + 0.45
    if not support.cpu:
        return
    capped = groups(memory_bytes=128 * MB, cpus=0.2)
    code, _, err = run(capped, BUSY.format(clock="monotonic", seconds=1.5))
    assert code == 0, err
    used = capped.cpu_seconds()
    print(f"busy 1.5 s wall at cpus=0.2: {used:.3f} CPU s")
    assert used is not None and 0.05 <= used <= 0.2 * 1.5 + 0.25


ESCAPE = """
import os, time
r, w = os.pipe()
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork() == 0:  # double fork: reparented away from the child, own session
            os.write(w, b"x")
            time.sleep(60)
        os._exit(0)
    os.waitpid(pid, 0)
got = b""
while len(got) < 3:
    got += os.read(r, 3)
print("ready", flush=True)
time.sleep(60)
"""


def test_kill_reaches_processes_that_left_the_session(groups):
    group = groups(memory_bytes=128 * MB)
    proc = start(group, ESCAPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        escaped = [pid for pid in group.pids() if pid != proc.pid]
        assert len(escaped) == 3
        assert all(os.getsid(pid) != os.getsid(proc.pid) for pid in escaped)
        assert group.kill()
        assert group.pids() == []
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    assert group.remove()
    assert not any(os.path.exists(d) for d in group.directories)
    assert group.remove()  # already gone: no error


def test_remove_kills_the_processes_left_and_context_manager(support):
    with SandboxCgroup.create(support, memory_bytes=64 * MB, max_processes=8) as group:
        proc = start(group, "import time; print('ready', flush=True); time.sleep(60)")
        assert proc.stdout.readline().strip() == "ready"
        started = time.monotonic()
    print(f"remove() with one process left took {time.monotonic() - started:.3f} s")
    assert proc.wait(timeout=10) == -signal.SIGKILL
    proc.stdout.close()
    proc.stderr.close()
    assert not any(os.path.exists(d) for d in group.directories)


def test_join_from_the_trainer_side(support):
    with SandboxCgroup.create(support, memory_bytes=64 * MB, max_processes=8) as group:
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            group.join(proc.pid)
            assert group.pids() == [proc.pid]
        finally:
            proc.kill()
            proc.wait()


def test_cleanup_stale_removes_groups_of_a_dead_trainer(support):
    dead = os.fork()
    if dead == 0:
        os._exit(0)
    os.waitpid(dead, 0)
    name = f"run-{dead}-0123abcd"
    dirs = {controller: os.path.join(base, name) for controller, base in support.bases}
    stale = SandboxCgroup(support, name, dirs)
    for directory in stale.directories:
        os.mkdir(directory)
    proc = start(stale, "import time; print('ready', flush=True); time.sleep(60)")
    assert proc.stdout.readline().strip() == "ready"
    mine = SandboxCgroup.create(support, memory_bytes=64 * MB, max_processes=8)
    try:
        assert name in cgroup.cleanup_stale(support)
        assert proc.wait(timeout=10) == -signal.SIGKILL
        assert not any(os.path.exists(d) for d in stale.directories)
        assert all(os.path.isdir(d) for d in mine.directories)  # ours (alive pid) stays
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
        stale.remove()
        mine.remove()


# --- fake cgroup v2 tree -------------------------------------------------------------------------

OWN = "user.slice/user-1000.slice/user@1000.service/app.slice/trainer.scope"
PID = 4242


class FakeCgroup2(CgroupFs):
    """A cgroup2 mount in a plain directory that enforces what the kernel would: interface files
    appear with the controllers the parent enables, no internal processes (EBUSY), controllers
    only from cgroup.controllers, a process in one group at a time. Records every write."""

    def __init__(self, root: Path, controllers: str = "cpuset cpu io memory hugetlb pids"):
        self.root = root
        self.writes: list[tuple[str, str]] = []
        root.mkdir()
        self._populate(root, controllers.split(), is_root=True)
        (root / "cgroup.subtree_control").write_text(controllers)

    def _populate(self, d: Path, controllers: list[str], is_root: bool = False) -> None:
        files = {"cgroup.controllers": " ".join(controllers), "cgroup.subtree_control": ""}
        files |= {"cgroup.procs": "", "cpu.stat": "usage_usec 0\n"}
        if not is_root:
            files["cgroup.kill"] = ""
            if "memory" in controllers:
                files |= {"memory.max": "max", "memory.swap.max": "max", "memory.peak": "0"}
                files |= {"memory.oom.group": "0", "memory.events": "oom 0\noom_kill 0\n"}
            if "pids" in controllers:
                files["pids.max"] = "max"
            if "cpu" in controllers:
                files["cpu.max"] = "max 100000"
        for name, text in files.items():
            (d / name).write_text(text)

    def make(self, rel: str, controllers: str, procs: list[int] = ()) -> Path:
        d = self.root / rel
        d.mkdir(parents=True)
        self._populate(d, controllers.split())
        (d / "cgroup.procs").write_text("".join(f"{p}\n" for p in procs))
        return d

    def mkdir(self, path: str) -> None:
        os.mkdir(path)
        parent = Path(path).parent
        self._populate(Path(path), (parent / "cgroup.subtree_control").read_text().split())

    def rmdir(self, path: str) -> None:
        d = Path(path)
        if not d.is_dir():
            raise FileNotFoundError(errno.ENOENT, "gone", path)
        if (d / "cgroup.procs").read_text().split() or any(c.is_dir() for c in d.iterdir()):
            raise OSError(errno.EBUSY, "busy", path)
        shutil.rmtree(d)

    def write(self, path: str, text: str) -> None:
        self.writes.append((os.path.relpath(path, self.root), text))
        p, d = Path(path), Path(path).parent
        if not p.is_file():
            raise FileNotFoundError(errno.ENOENT, "no such file", path)
        if p.name == "cgroup.subtree_control":
            name = text.removeprefix("+")
            if name not in (d / "cgroup.controllers").read_text().split():
                raise OSError(errno.ENOENT, "no such controller", path)
            if d != self.root and (d / "cgroup.procs").read_text().split():
                raise OSError(errno.EBUSY, "no internal processes", path)
            p.write_text(" ".join([*p.read_text().split(), name]))
            for child in d.iterdir():  # children's cgroup.controllers follow
                if child.is_dir():
                    (child / "cgroup.controllers").write_text(p.read_text())
        elif p.name == "cgroup.procs":
            if d != self.root and (d / "cgroup.subtree_control").read_text().split():
                raise OSError(errno.EBUSY, "not a leaf", path)
            for procs in self.root.rglob("cgroup.procs"):
                procs.write_text("".join(f"{q}\n" for q in procs.read_text().split() if q != text))
            p.write_text(p.read_text() + f"{text}\n")
        elif p.name == "cgroup.kill":
            (d / "cgroup.procs").write_text("")
        else:
            p.write_text(text)


def mountinfo_v2(root: Path) -> str:
    return f"30 25 0:26 / {root} rw,nosuid,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"


@pytest.fixture
def fake(tmp_path) -> FakeCgroup2:
    return FakeCgroup2(tmp_path / "cgroup")


def detect_fake(fake: FakeCgroup2, own: str = OWN) -> CgroupSupport:
    return cgroup.detect(
        mountinfo=mountinfo_v2(fake.root), proc_cgroup=f"0::/{own}\n", pid=PID, fs=fake
    )


def procs(d: Path) -> list[int]:
    return [int(p) for p in (d / "cgroup.procs").read_text().split()]


def test_v2_moves_only_this_process_out_of_its_group_then_delegates(fake):
    own = fake.make(OWN, "cpu memory pids", procs=[PID])
    support = detect_fake(fake)
    assert support.version == 2 and support.reason is None
    assert (support.memory, support.pids, support.cpu, support.no_swap) == (True, True, True, True)
    assert support.bases == (("unified", str(own / "groupwise-sandboxes")),)
    assert fake.writes == [
        (f"{OWN}/cgroup.subtree_control", "+memory"),  # EBUSY: the trainer is inside
        (f"{OWN}/cgroup.subtree_control", "+pids"),
        (f"{OWN}/cgroup.subtree_control", "+cpu"),
        (f"{OWN}/groupwise-trainer/cgroup.procs", str(PID)),
        (f"{OWN}/cgroup.subtree_control", "+memory"),
        (f"{OWN}/cgroup.subtree_control", "+pids"),
        (f"{OWN}/cgroup.subtree_control", "+cpu"),
        (f"{OWN}/groupwise-sandboxes/cgroup.subtree_control", "+memory"),
        (f"{OWN}/groupwise-sandboxes/cgroup.subtree_control", "+pids"),
        (f"{OWN}/groupwise-sandboxes/cgroup.subtree_control", "+cpu"),
    ]
    assert procs(own) == [] and procs(own / "groupwise-trainer") == [PID]
    assert (own / "groupwise-sandboxes" / "cgroup.subtree_control").read_text() == "memory pids cpu"
    assert cgroup.describe(support) == (
        "cgroup v2: memory (kernel memory included, no swap), processes, CPU per sandbox"
    )
    # Detecting again from the leaf (a second call, or a child of the trainer) reuses the setup.
    fake.writes.clear()
    again = detect_fake(fake, own=f"{OWN}/groupwise-trainer")
    assert again == support
    assert all("cgroup.procs" not in path for path, _ in fake.writes)


def test_v2_refuses_to_move_other_processes(fake):
    own = fake.make(OWN, "cpu memory pids", procs=[PID, 777, 778])
    support = detect_fake(fake)
    assert support.version is None and not support.available
    assert "777 778" in support.reason and "Delegate=yes" in support.reason
    assert all(not path.endswith("cgroup.procs") for path, _ in fake.writes)
    assert procs(own) == [PID, 777, 778]
    assert not (own / "groupwise-trainer").exists()
    assert cgroup.describe(support).startswith("no cgroup (cgroup v2: cannot enable")
    assert cgroup.describe(support).endswith("memory and processes are limited per process only")


def test_v2_without_processes_of_its_own_needs_no_move(fake):
    own = fake.make(OWN, "memory", procs=[])  # pids and cpu not delegated
    support = detect_fake(fake)
    assert (support.version, support.memory, support.pids, support.cpu) == (2, True, False, False)
    assert fake.writes == [
        (f"{OWN}/cgroup.subtree_control", "+memory"),
        (f"{OWN}/groupwise-sandboxes/cgroup.subtree_control", "+memory"),
    ]
    assert not (own / "groupwise-trainer").exists()
    assert (
        cgroup.describe(support)
        == "cgroup v2: memory (kernel memory included, no swap) per sandbox"
    )


def test_v2_without_the_memory_controller_is_unavailable(fake):
    fake.make(OWN, "cpu pids", procs=[PID])
    support = detect_fake(fake)
    assert support.version is None
    assert "memory controller is not delegated" in support.reason
    assert fake.writes == []


def test_v2_not_delegated_says_what_to_do(fake):
    fake.make(OWN, "cpu memory pids", procs=[])

    class ReadOnly(type(fake)):
        def write(self, path, text):
            raise PermissionError(errno.EACCES, "Permission denied", path)

    ro = ReadOnly.__new__(ReadOnly)
    ro.__dict__.update(fake.__dict__)
    support = detect_fake(ro)
    assert support.version is None
    assert "EACCES" in support.reason and "systemd-run --user --scope" in support.reason


def test_v2_root_parameter_and_unreadable_group(fake):
    fake.make(OWN, "cpu memory pids", procs=[])
    support = cgroup.detect(root=str(fake.root), proc_cgroup=f"0::/{OWN}\n", pid=PID, fs=fake)
    assert support.version == 2
    missing = cgroup.detect(root=str(fake.root), proc_cgroup="0::/nowhere\n", pid=PID, fs=fake)
    assert missing.version is None and "cannot read" in missing.reason


@pytest.mark.parametrize(("cpus", "cpu_max"), [(1.0, "100000 100000"), (0.5, "50000 100000")])
def test_v2_run_group_limits(fake, cpus, cpu_max):
    fake.make(OWN, "cpu memory pids", procs=[PID])
    support = detect_fake(fake)
    fake.writes.clear()
    group = SandboxCgroup.create(support, memory_bytes=96 * MB, max_processes=8, cpus=cpus, fs=fake)
    d = fake.root / OWN / "groupwise-sandboxes" / group.name
    assert group.name.startswith(f"run-{os.getpid()}-")
    assert group.directories == (str(d),)
    assert group.procs_files == (str(d / "cgroup.procs"),)
    rel = f"{OWN}/groupwise-sandboxes/{group.name}"
    assert fake.writes == [
        (f"{rel}/memory.max", str(96 * MB)),
        (f"{rel}/memory.swap.max", "0"),
        (f"{rel}/memory.oom.group", "1"),
        (f"{rel}/pids.max", "8"),
        (f"{rel}/cpu.max", cpu_max),
    ]
    assert (d / "memory.swap.max").read_text() == "0"
    assert (d / "cpu.max").read_text() == cpu_max

    group.join(1234)
    assert group.pids() == [1234]
    (d / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\n")
    (d / "memory.peak").write_text(f"{90 * MB}\n")
    assert group.cpu_seconds() == 2.5 and group.memory_peak() == 90 * MB
    assert not group.oom_killed()
    (d / "memory.events").write_text("oom 3\noom_kill 1\noom_group_kill 1\n")
    assert group.oom_killed()
    assert group.kill() and group.pids() == []  # through cgroup.kill
    assert (f"{rel}/cgroup.kill", "1") in fake.writes
    assert group.remove() and not d.exists()
    assert group.remove()


def test_v2_optional_files_and_no_cpu_limit(fake):
    fake.make(OWN, "cpu memory pids", procs=[])
    support = detect_fake(fake)
    fake.writes.clear()
    real_mkdir = fake.mkdir

    def mkdir_without_swap(path):  # a kernel without swap accounting or memory.oom.group
        real_mkdir(path)
        (Path(path) / "memory.swap.max").unlink()
        (Path(path) / "memory.oom.group").unlink()

    fake.mkdir = mkdir_without_swap
    with SandboxCgroup.create(
        support, memory_bytes=64 * MB, max_processes=4, cpus=None, fs=fake
    ) as group:
        assert [name.rsplit("/", 1)[1] for name, _ in fake.writes] == ["memory.max", "pids.max"]
    assert not any(os.path.exists(d) for d in group.directories)


def test_v2_create_failure_cleans_up_and_raises(fake):
    fake.make(OWN, "cpu memory pids", procs=[])
    support = detect_fake(fake)
    real_mkdir = fake.mkdir

    def mkdir_without_memory_max(path):
        real_mkdir(path)
        (Path(path) / "memory.max").unlink()

    fake.mkdir = mkdir_without_memory_max
    with pytest.raises(cgroup.CgroupError, match="memory.max"):
        SandboxCgroup.create(support, memory_bytes=64 * MB, max_processes=4, fs=fake)
    assert os.listdir(fake.root / OWN / "groupwise-sandboxes") == [
        n for n in os.listdir(fake.root / OWN / "groupwise-sandboxes") if not n.startswith("run-")
    ]
    with pytest.raises(cgroup.CgroupError, match="no cgroup support"):
        SandboxCgroup.create(CgroupSupport(None, reason="x"), memory_bytes=MB, max_processes=1)


def test_v2_cleanup_stale(fake):
    fake.make(OWN, "cpu memory pids", procs=[])
    support = detect_fake(fake)
    dead = os.fork()
    if dead == 0:
        os._exit(0)
    os.waitpid(dead, 0)
    base = fake.root / OWN / "groupwise-sandboxes"
    for name in (f"run-{dead}-abc123", f"run-{os.getpid()}-abc123", "run-1-abc123", "other"):
        fake.mkdir(str(base / name))
    (base / f"run-{dead}-abc123" / "cgroup.procs").write_text("99999\n")
    fake.writes.clear()
    assert cgroup.cleanup_stale(support, fs=fake) == [f"run-{dead}-abc123"]
    assert (f"{OWN}/groupwise-sandboxes/run-{dead}-abc123/cgroup.kill", "1") in fake.writes
    left = sorted(n for n in os.listdir(base) if (base / n).is_dir())
    assert left == sorted([f"run-{os.getpid()}-abc123", "run-1-abc123", "other"])  # pid 1 lives


# --- fake cgroup v1 tree and parsing -------------------------------------------------------------


class FakeCgroup1(CgroupFs):
    """v1 hierarchies in plain directories: every new group gets every controller's files."""

    FILES = {
        "cgroup.procs": "",
        "memory.limit_in_bytes": "9223372036854771712",
        "memory.memsw.limit_in_bytes": "9223372036854771712",
        "memory.swappiness": "60",
        "memory.max_usage_in_bytes": "0",
        "memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n",
        "pids.max": "max",
        "cpu.cfs_period_us": "100000",
        "cpu.cfs_quota_us": "-1",
        "cpuacct.usage": "0",
    }

    def __init__(self) -> None:
        self.writes: list[tuple[str, str]] = []

    def mkdir(self, path: str) -> None:
        os.mkdir(path)
        for name, text in self.FILES.items():
            (Path(path) / name).write_text(text)

    def rmdir(self, path: str) -> None:
        shutil.rmtree(path)

    def write(self, path: str, text: str) -> None:
        self.writes.append((Path(path).name, text))
        super().write(path, text)


def test_v1_hybrid_prefers_v1_memory_and_dedupes_co_mounted_controllers(tmp_path):
    for sub in ("memory/abc", "pids", "cpu,cpuacct", "unified"):
        (tmp_path / sub).mkdir(parents=True)
    (tmp_path / "unified" / "cgroup.controllers").write_text("hugetlb")
    mountinfo = "".join(
        f"{i} 31 0:{i} {root} {tmp_path}/{point} rw - {fstype} cgroup rw{opts}\n"
        for i, (root, point, fstype, opts) in enumerate(
            [
                ("/docker", "memory", "cgroup", ",memory"),
                ("/", "pids", "cgroup", ",pids"),
                ("/", "cpu,cpuacct", "cgroup", ",cpu,cpuacct"),
                ("/", "systemd", "cgroup", ",name=systemd"),
                ("/", "unified", "cgroup2", ""),
            ],
            start=32,
        )
    )
    proc_cgroup = "4:memory:/docker/abc\n8:pids:/\n1:cpu,cpuacct:/\n0::/\n"
    fs = FakeCgroup1()
    support = cgroup.detect(mountinfo=mountinfo, proc_cgroup=proc_cgroup, pid=PID, fs=fs)
    assert support.version == 1 and (support.memory, support.pids, support.cpu) == (True,) * 3
    assert dict(support.bases) == {
        "memory": f"{tmp_path}/memory/abc/groupwise-sandboxes",
        "pids": f"{tmp_path}/pids/groupwise-sandboxes",
        "cpu": f"{tmp_path}/cpu,cpuacct/groupwise-sandboxes",
        "cpuacct": f"{tmp_path}/cpu,cpuacct/groupwise-sandboxes",
    }
    fs.writes.clear()
    group = SandboxCgroup.create(support, memory_bytes=96 * MB, max_processes=8, cpus=0.5, fs=fs)
    assert len(group.procs_files) == 3  # cpu and cpuacct share one directory
    assert fs.writes == [
        ("memory.limit_in_bytes", str(96 * MB)),
        ("memory.memsw.limit_in_bytes", str(96 * MB)),  # after the plain limit
        ("memory.swappiness", "0"),
        ("pids.max", "8"),
        ("cpu.cfs_period_us", "100000"),
        ("cpu.cfs_quota_us", "50000"),
    ]
    cpuacct = Path(group.dirs["cpuacct"])
    (cpuacct / "cpuacct.usage").write_text("1500000000\n")
    assert group.cpu_seconds() == 1.5
    assert not group.oom_killed()
    (Path(group.dirs["memory"]) / "memory.oom_control").write_text(
        "oom_kill_disable 0\noom_kill 2\n"
    )
    assert group.oom_killed()
    assert group.remove() and not any(os.path.exists(d) for d in group.directories)


def test_v1_without_a_writable_memory_hierarchy(tmp_path):
    mountinfo = f"35 31 0:32 / {tmp_path}/missing rw - cgroup cgroup rw,memory\n"
    support = cgroup.detect(mountinfo=mountinfo, proc_cgroup="4:memory:/\n", fs=FakeCgroup1())
    assert support.version is None
    assert support.reason.startswith("cgroup v1: memory controller: cannot create groups in")
    assert "ENOENT" in support.reason


def test_nothing_mounted():
    support = cgroup.detect(mountinfo="", proc_cgroup="0::/\n", fs=FakeCgroup1())
    assert support.version is None and "no cgroup file system is mounted" in support.reason


def test_parsing():
    text = (
        "41 31 0:38 / /sys/fs/cgroup/un\\040ified rw,relatime - cgroup2 cgroup2 rw\n"
        "42 31 0:39 / /proc rw - proc proc rw\n"
        "43 31 0:40 /docker/x /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
    )
    mounts = cgroup.parse_mountinfo(text)
    assert [(m.point, m.fstype) for m in mounts] == [
        ("/sys/fs/cgroup/un ified", "cgroup2"),
        ("/sys/fs/cgroup/memory", "cgroup"),
    ]
    assert cgroup._under_mount(mounts[1], "/docker/x/sub") == "/sys/fs/cgroup/memory/sub"
    assert cgroup._under_mount(mounts[1], "/docker/x") == "/sys/fs/cgroup/memory"
    assert cgroup._under_mount(mounts[1], "/elsewhere") is None
    assert cgroup.parse_proc_cgroup("4:memory:/a\n1:cpu,cpuacct:/b\n0::/c\n") == {
        "memory": "/a",
        "cpu": "/b",
        "cpuacct": "/b",
        "": "/c",
    }
