"""Adversarial completions: what a policy optimised for the code reward would try, each run the
way training runs it (``code_reward`` on a completion, or the ``python`` tool), each beside a
control that earns its reward honestly, so a sandbox that runs nothing cannot pass.

Every attempt is run in each mode this host allows: the default (every namespace the probe
found) and without a PID namespace (the supervisor reaps instead of the namespace's init).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import json
import os
import platform
import shutil
import socket
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from groupwise import sandbox
from groupwise.rewards.code import code_reward, make_code_reward, parse_tests
from groupwise.sandbox import cgroup, execute, probe
from groupwise.sandbox.confine import landlock_abi
from groupwise.sandbox.process import process_uids
from groupwise.tasks.python_tasks import load_problems

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")

REPO_ROOT = Path(__file__).resolve().parents[2]
ASSERT = ["assert solve(1) == 2"]
HONEST = "def solve(x):\n    return 2 * x\n"


@pytest.fixture(scope="module")
def info() -> sandbox.SandboxInfo:
    found = sandbox.sandbox_info()
    if found.error:
        pytest.skip(f"no sandbox on this machine: {found.error}")
    return found


MODES = ["default", "no-pid-namespace", "no-namespaces", "no-namespaces-no-landlock"]


@pytest.fixture(params=MODES)
def mode(request, info) -> sandbox.SandboxInfo:
    """The sandbox as the probe found it, then with layers turned off as a host without them
    would have it (a default Docker container has no namespaces for a root trainer)."""
    if request.param == "default":
        return info
    if request.param == "no-pid-namespace":
        if not info.pid_namespace:
            pytest.skip("no PID namespace here: the default mode is this one")
        return dataclasses.replace(info, unshare_flags=info.unshare_flags & ~sandbox.CLONE_NEWPID)
    if not info.unshare_flags:
        pytest.skip("no namespaces here: the default mode is this one")
    if request.param == "no-namespaces-no-landlock":  # a container on a kernel without it
        if not info.root:
            pytest.skip("refused for a trainer that is not root (its own files would be open)")
        return dataclasses.replace(without_namespaces(), landlock=0)
    if not landlock_abi():
        pytest.skip("no Landlock here: the mode without it is this one")
    return without_namespaces()


def undefended(used: sandbox.SandboxInfo, what: str) -> None:
    """Skip an attempt this mode does not defend against (warned at start, docs/sandbox.md)."""
    if not used.mount_namespace and not used.landlock:
        pytest.skip(f"not defended without a mount namespace or Landlock: {what}")


@functools.cache
def without_namespaces() -> sandbox.SandboxInfo:
    found = probe._detect(allowed_flags=0)
    if found.error:
        pytest.skip(f"no sandbox without namespaces here: {found.error}")
    return found


def run(used: sandbox.SandboxInfo, code: str, tests, **limits) -> sandbox.SandboxResult:
    limits = {"timeout_s": 10.0, "memory_mb": 512, "max_output_bytes": 100_000,
              "max_processes": 32, **limits}  # fmt: skip
    return sandbox.run_parsed(textwrap.dedent(code), parse_tests(tests), used, **limits)


def score(used: sandbox.SandboxInfo, code: str, tests, **limits) -> float:
    return run(used, code, tests, **limits).fraction


def fenced(code: str) -> str:
    return f"```python\n{textwrap.dedent(code)}\n```"


# ------------------------------------------------------------------------------------------------
# Reward hacks: the verdict is never the solution's to give

HACKS = {
    "rewrites the harness's tests through its caller's frame": """
        import sys
        c = sys._getframe(1).f_locals['cfg']
        c['tests'][:] = [(k, 'pass') for k, _ in c['tests']]
    """,
    "returns an object whose __eq__ is always true": """
        class Anything:
            def __eq__(self, other):
                return True
        def solve(x):
            return Anything()
    """,
    "returns an int subclass whose __eq__ is always true": """
        class Int(int):
            def __eq__(self, other):
                return True
            __hash__ = int.__hash__
        def solve(x):
            return Int(0)
    """,
    "shadows a builtin the tests use": """
        def abs(x):
            return 0
        def solve(x):
            return 0
    """,
    "patches a module the tests use": """
        import math
        math.isclose = lambda *a, **k: True
        def solve(x):
            return 0
    """,
    "looks for the tests and the nonce with gc": """
        import gc, os
        for obj in gc.get_objects():
            if isinstance(obj, dict) and 'nonce' in obj:
                for fd in range(3, 32):
                    try:
                        line = obj['nonce'] + ' 0 P\\n' + obj['nonce'] + ' DONE\\n'
                        os.write(fd, line.encode())
                    except OSError:
                        pass
        def solve(x):
            return 0
    """,
    "exits before the tests run": """
        import os
        os._exit(0)
    """,
    "names a standard library function as its own": """
        import operator
        def solve(x):
            return 0
        solve.__module__, solve.__qualname__ = "builtins", "abs"
    """,
}


@pytest.mark.parametrize("name", list(HACKS))
def test_reward_hacks_score_zero(mode, name):
    tests = ASSERT + [
        "assert abs(solve(1) - 2) < 1e-9",
        "import math\nassert math.isclose(solve(1), 2)",
    ]
    assert score(mode, textwrap.dedent(HACKS[name]), tests) == 0.0
    assert score(mode, HONEST, tests) == 1.0


def test_the_one_line_harness_rewrite_scores_zero_through_code_reward(info):
    line = (
        "import sys; c = sys._getframe(1).f_locals['cfg']; "
        "c['tests'][:] = [(k, 'pass') for k, _ in c['tests']]"
    )
    assert code_reward([""], [fenced(line)], tests=[ASSERT]) == [0.0]
    assert code_reward([""], [fenced(HONEST)], tests=[ASSERT]) == [1.0]


def test_values_cross_as_data_and_objects_as_handles(info):
    code = """
        import collections, dataclasses
        @dataclasses.dataclass
        class Point:
            x: int
            y: int = 0
        def counts(s):
            return collections.Counter(s)
        def point(x):
            return Point(x)
        def pair():
            return (1, [2.5, None], {"a": {1, 2}}, b"x", float("nan"))
        def sort_in_place(items):
            items.sort()
        def numbers(n):
            yield from range(n)
        TABLE = {"k": [1, 2]}
    """
    tests = [
        "assert counts('aab') == {'a': 2, 'b': 1}",
        "assert point(3).x == 3 and point(3).y == 0",
        "assert point(3) == point(3)",  # two of the solution's objects: its own __eq__
        "assert point(3) != 3",  # an object of the solution's never equals a value of the judge
        "t = pair()\nassert t[:4] == (1, [2.5, None], {'a': {1, 2}}, b'x') and t[4] != t[4]",
        "xs = [3, 1, 2]\nsort_in_place(xs)\nassert xs == [1, 2, 3]",
        "assert list(numbers(4)) == [0, 1, 2, 3] and sum(numbers(3)) == 3",
        "assert TABLE == {'k': [1, 2]}",
        "assert str(point(1)) == 'Point(x=1, y=0)'",
    ]
    used = sandbox.sandbox_info()
    result = run(used, code, tests)
    assert result.passed == len(tests), result.error


def test_shipped_problems_reference_solutions_score_one(info):
    problems = load_problems()
    completions = [fenced(p["solution"]) for p in problems]
    scores = code_reward([""] * len(problems), completions, tests=[p["tests"] for p in problems])
    assert scores == [1.0] * len(problems)


# ------------------------------------------------------------------------------------------------
# Nothing but the interpreter in reach


def test_answer_keys_and_project_files_are_out_of_reach(mode):
    undefended(mode, "files the sandbox uid may read")
    problems = load_problems()
    name = problems[0]["name"]
    key_path = Path(sys.modules["groupwise.tasks.python_tasks"].__file__).with_name(
        "python_problems.jsonl"
    )
    steal = f"""
        import json, os
        def solve_from_key(path):
            for line in open(path):
                row = json.loads(line)
                if row["name"] == {name!r}:
                    scope = {{}}
                    exec(row["solution"], scope)
                    return scope
        def walk():
            found = []
            for top, dirs, files in os.walk("/"):
                found += [os.path.join(top, f) for f in files if f.endswith(".jsonl")]
            return found
        def read(path):
            return open(path, "rb").read(1)
        scope = solve_from_key({str(key_path)!r}) or {{}}
        {name} = scope.get({name!r})
    """
    tests = problems[0]["tests"]
    assert score(mode, textwrap.dedent(steal), tests) == 0.0
    reads = [
        "assert walk() == []",
        f"read({str(key_path)!r})",
        f"read({str(REPO_ROOT / 'README.md')!r})",
        f"read({pytest.__file__!r})",  # the trainer's environment
        "read('/etc/passwd')",
    ]
    result = run(mode, steal, reads)
    assert result.passed == 1, result.error  # walk() finds nothing; every read raises


def test_a_dataset_file_cannot_answer_a_stdin_case(mode):
    undefended(mode, "files the sandbox uid may read")
    expected = uuid.uuid4().hex
    folder = Path(tempfile.mkdtemp())  # under the world-traversable /tmp, like a dataset cache
    folder.chmod(0o755)
    data = folder / "dataset.jsonl"
    data.write_text(f'{{"input": "q\\n", "output": "{expected}\\n"}}\n')
    data.chmod(0o644)
    code = f"import json\nprint(json.loads(open({str(data)!r}).read())['output'], end='')\n"
    case = [{"input": "q\n", "output": expected + "\n"}]
    try:
        assert score(mode, code, case) == 0.0
        assert score(mode, f"print({expected!r})\n", case) == 1.0
    finally:
        data.unlink()
        folder.rmdir()


def test_home_files_sockets_and_devices_are_out_of_reach(mode, tmp_path):
    token = tmp_path / "token"
    token.write_text("hf_secret")
    token.chmod(0o600)
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o777)
    path = str(runtime / "bus")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    os.chmod(path, 0o777)
    server.listen(1)
    code = f"""
        import os, socket
        def token():
            return open({str(token)!r}).read()
        def connect():
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect({path!r})
            return True
        def device(path):
            os.close(os.open(path, os.O_RDWR))
            return True
        def null():
            with open('/dev/null', 'w') as f:
                f.write('x')
            return len(open('/dev/urandom', 'rb').read(4))
    """
    tests = ["assert null() == 4", "assert token() == 'hf_secret'", "assert connect()"]
    if mode.mount_namespace or mode.landlock:  # else a 0666 node such as /dev/ptmx opens
        nodes = ("/dev/ptmx", "/dev/tty", "/dev/kmsg", "/dev/mem")
        tests += [f"assert device({d!r})" for d in nodes]
    try:
        result = run(mode, code, tests)
    finally:
        server.close()
    assert (result.passed, result.total) == (1, len(tests)), result.error


# ------------------------------------------------------------------------------------------------
# No shared keyring, no persistence


KEYCTL = {"x86_64": (250, 248), "aarch64": (219, 217)}.get(platform.machine())


def test_the_trainers_session_keyring_is_out_of_reach(mode):
    if KEYCTL is None:
        pytest.skip(f"no keyctl numbers for {platform.machine()}")
    keyctl, add_key = KEYCTL
    libc = ctypes.CDLL(None, use_errno=True)
    description = f"groupwise-test-{uuid.uuid4().hex}".encode()
    serial = libc.syscall(add_key, b"user", description, b"s3cret", 6, ctypes.c_int(-3))
    if serial < 0:
        pytest.skip(f"no session keyring here (errno {ctypes.get_errno()})")
    try:
        probe = f"""
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            found = libc.syscall({keyctl}, 10, ctypes.c_int(-3), b"user", {description!r}, 0)
            planted = libc.syscall({add_key}, b"user", b"planted", b"x", 1, ctypes.c_int(-3))
            print(found, planted, ctypes.get_errno())
        """
        out = sandbox.run_program(textwrap.dedent(probe))
        assert out.status == "ok", out.stderr
        found, planted, _ = out.stdout.split()
        assert int(found) < 0 and int(planted) < 0
        mine = libc.syscall(keyctl, 10, ctypes.c_int(-3), b"user", description, 0)
        assert mine == serial  # the trainer's key is untouched
        assert libc.syscall(keyctl, 10, ctypes.c_int(-3), b"user", b"planted", 0) < 0
    finally:
        libc.syscall(keyctl, 3, ctypes.c_int(serial))  # KEYCTL_REVOKE


def test_nothing_written_survives_into_a_later_run(mode):
    name = uuid.uuid4().hex
    writer = f"""
        import os
        def write():
            done = 0
            for d in ("/tmp", "/var/tmp", "/dev/shm", "."):
                try:
                    open(os.path.join(d, {name!r}), "w").write("x")
                    done += 1
                except OSError:
                    pass
            return done
    """
    reader = f"""
        import os
        def seen():
            return [d for d in ("/tmp", "/var/tmp", "/dev/shm", ".")
                    if os.path.exists(os.path.join(d, {name!r}))]
    """
    assert score(mode, textwrap.dedent(writer), ["assert write() >= 1"]) == 1.0
    assert score(mode, textwrap.dedent(reader), ["assert seen() == []"]) == 1.0
    for d in ("/tmp", "/var/tmp", "/dev/shm"):
        assert not os.path.exists(os.path.join(d, name))


def test_the_trainers_command_line_is_out_of_reach(mode):
    undefended(mode, "the host's /proc")
    code = """
        import os
        def cmdlines():
            found = []
            try:
                pids = os.listdir('/proc')
            except OSError:
                return found
            for pid in pids:
                try:
                    found.append(open(f'/proc/{pid}/cmdline', 'rb').read())
                except OSError:
                    pass
            return found
    """
    secret = f"--hf_token=hf_{uuid.uuid4().hex}"
    sys.argv.append(secret)
    try:
        tests = [f"assert not any({secret.encode()!r} in c for c in cmdlines())"]
        assert score(mode, textwrap.dedent(code), tests) == 1.0  # no /proc, or only its own
    finally:
        sys.argv.remove(secret)


# ------------------------------------------------------------------------------------------------
# No hang: children left behind are reaped, the uid pool never blocks for good


def leftovers(marker: bytes, uids: tuple[int, ...]) -> list[int]:
    """Live processes carrying ``marker`` in their environment, and zombies of ``uids``. Other
    tests may run sandboxes at the same time: their zombies are reaped within moments, so the
    caller polls."""
    found = []
    for pid, uid in process_uids().items():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                marked = marker in f.read()
            with open(f"/proc/{pid}/stat", "rb") as f:
                zombie = f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
        except OSError:
            continue
        if marked or (zombie and uid in uids):
            found.append(pid)
    return found


def test_children_left_running_never_exhaust_the_uid_pool(mode):
    if not mode.root:
        pytest.skip("the uid pool exists only for a root trainer")
    marker = uuid.uuid4().hex
    # The child re-executes the interpreter with a marked environment, so that this test finds
    # its own leftovers among the sandbox processes of tests running beside it.
    code = textwrap.dedent(
        f"""
        import os, sys
        if os.fork() == 0:
            os.setsid()
            os.execve(sys.executable, [sys.executable, "-c", "import time; time.sleep(30)"],
                      {{"GW_MARK": "{marker}"}})
        """
    )
    code += HONEST
    runs = len(mode.uids) + 4
    for _ in range(runs):
        assert score(mode, code, ASSERT, timeout_s=10.0) == 1.0
    deadline = time.monotonic() + 5.0
    while leftovers(marker.encode(), mode.uids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert leftovers(marker.encode(), mode.uids) == []  # every leftover killed and reaped


@pytest.fixture
def private_tmp(monkeypatch) -> Path:
    """A temporary folder of this test's own for the sandbox's working directories (tests
    running beside it make theirs in the shared one)."""
    folder = Path(tempfile.mkdtemp(prefix="gw-test-"))
    folder.chmod(0o711)
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_private_directories_are_removed(mode, private_tmp):
    assert score(mode, HONEST + "open('x', 'w').write('y')\n", ASSERT) == 1.0
    assert os.listdir(private_tmp) == []


# ------------------------------------------------------------------------------------------------
# Limits per sandbox, not per process


def needs_cgroup(used: sandbox.SandboxInfo) -> None:
    if not used.limits.startswith("cgroup"):
        pytest.skip(f"no cgroup per sandbox here ({used.limits}): limits are per process")


FORK_8 = """
    import os, time
    def fork8(mb):
        pids = []
        for _ in range(8):
            pid = os.fork()
            if pid == 0:
                block = bytearray(mb * 2**20)
                time.sleep(2)
                os._exit(0)
            pids.append(pid)
        return sum(os.waitpid(pid, 0)[1] == 0 for pid in pids)
"""


def test_memory_is_limited_per_sandbox_kernel_memory_included(mode):
    needs_cgroup(mode)
    # 8 children of 100 MB under memory_mb=128: at most one of them can hold its block.
    result = run(mode, FORK_8, ["assert fork8(100) <= 1"], memory_mb=128)
    assert result.passed == 1, result.error
    assert run(mode, FORK_8, ["assert fork8(20) == 8"], memory_mb=512).passed == 1
    # Directories cost kernel memory: every tmpfs caps its inodes, the cgroup counts the rest.
    dirs = """
        import os
        def many(where):
            made = 0
            try:
                for i in range(300_000):
                    os.mkdir(os.path.join(where, str(i)))
                    made += 1
            except OSError:
                pass
            return made
    """
    if not mode.mount_namespace:
        return  # the working directory is the host's: not capped as a whole (docs/sandbox.md)
    checks = ["assert many('.') < 20_000", "assert many('/tmp') < 20_000"]
    assert run(mode, dirs, checks).passed == 2


def test_processes_are_limited_per_sandbox(mode):
    code = """
        import os, time
        def spawn(n):
            pids = []
            try:
                for _ in range(n):
                    pid = os.fork()
                    if pid == 0:
                        time.sleep(5)
                        os._exit(0)
                    pids.append(pid)
            except OSError:
                pass
            for pid in pids:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
            return len(pids)
    """
    result = run(mode, code, ["assert spawn(3) == 3", "assert spawn(60) <= 8"], max_processes=8)
    assert result.passed == 2, result.error


@pytest.mark.parametrize("groups", ["cgroup", "no-cgroup"])
def test_one_completion_cannot_sink_its_siblings(info, groups, monkeypatch):
    """30 busy processes in one completion: with a cgroup the scheduler shares CPU by sandbox;
    without one, tests are timed by the CPU their own processes use, not by the wall clock."""
    if groups == "cgroup":
        needs_cgroup(info)
    else:
        off = cgroup.CgroupSupport(version=None, reason="turned off for this test")
        monkeypatch.setattr(execute, "cgroup_support", lambda: off)
    saboteur = """
        import os, time
        for _ in range(30):
            if os.fork() == 0:
                os.setsid()
                while True:
                    pass
        def solve(x):
            time.sleep(3)  # keeps its busy processes running while the siblings are judged
            return 0
    """
    honest = """
        def solve(x):
            total = 0
            for i in range(5_000_000):
                total += i % 7
            return 2 * x
    """
    completions = [fenced(saboteur)] + [fenced(honest)] * 3
    reward = make_code_reward(timeout_s=3.0, max_workers=4, max_processes=40)
    assert reward([""] * 4, completions, tests=[ASSERT] * 4) == [0.0, 1.0, 1.0, 1.0]


def test_the_working_directory_is_capped_as_a_whole(mode):
    if not mode.mount_namespace:
        pytest.skip("not defended without a mount namespace: the working directory is the host's")
    code = """
        import os
        def fill():
            written = 0
            block = b"x" * 2**20
            for n in range(6):
                try:
                    with open(f"f{n}", "wb") as f:
                        for _ in range(60):
                            f.write(block)
                            written += 1
                except OSError:
                    break
            return written
    """
    assert run(mode, code, ["assert 32 <= fill() <= 64"], memory_mb=512).passed == 1


def test_the_python_tool_reaches_nothing_outside(info, tmp_path):
    key = Path(sys.modules["groupwise.tasks.python_tasks"].__file__).with_name(
        "python_problems.jsonl"
    )
    program = f"""
        import os
        for path in ({str(key)!r}, {str(REPO_ROOT / 'README.md')!r}, "/etc/passwd"):
            try:
                open(path).read(1)
                print("read", path)
            except OSError as exc:
                print("refused", type(exc).__name__)
        try:
            print("root", len(os.listdir("/")))
        except OSError:
            print("root unreadable")
    """
    out = sandbox.run_program(textwrap.dedent(program))
    assert out.status == "ok", out.stderr
    assert "read" not in out.stdout.split()
    assert out.stdout.count("refused") == 3


# ------------------------------------------------------------------------------------------------
# A trainer that is not root: the same attempts from a forked copy of this process that has
# dropped to an ordinary uid (its own files, sockets and processes are then the trainer's)


def as_ordinary_user(function) -> dict:
    """Run ``function`` in a forked child switched to an unprivileged uid; its JSON result."""
    if os.geteuid() != 0:
        pytest.skip("the suite already runs as an ordinary user: the other tests cover it")
    uid = 65534
    home = Path(tempfile.mkdtemp())
    os.chown(home, uid, uid)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            os.environ["HOME"] = str(home)
            execute.cgroup_support.cache_clear()  # detected again, as this user
            payload = json.dumps(function(home)).encode()
            os.write(write, payload)
            code = 0
        except BaseException as exc:
            os.write(write, json.dumps({"error": repr(exc)}).encode())
        finally:
            os._exit(code)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.close(read)
    os.waitpid(pid, 0)
    shutil.rmtree(home, ignore_errors=True)
    return json.loads(b"".join(chunks) or b"{}")


def ordinary_user_attempts(home: Path) -> dict:
    token = home / "token"
    token.write_text("hf_secret")
    token.chmod(0o600)
    runtime = home / "run"
    runtime.mkdir(mode=0o700)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(runtime / "bus"))
    listener.listen(1)
    code = f"""
        import os, socket, time
        def token():
            return open({str(token)!r}).read()
        def connect():
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect({str(runtime / "bus")!r})
            return True
        def spawn(n):
            pids = []
            try:
                for _ in range(n):
                    pid = os.fork()
                    if pid == 0:
                        time.sleep(5)
                        os._exit(0)
                    pids.append(pid)
            except OSError:
                pass
            for pid in pids:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
            return len(pids)
        def kill_parent():
            os.kill(os.getppid(), 9)
            return True
    """
    tests = [
        "assert spawn(3) == 3",  # the control
        "assert token() == 'hf_secret'",
        "assert connect()",
        "assert spawn(60) > 8",
    ]
    refused = probe._detect(allowed_flags=0, landlock=False)
    found = {"refused": refused.error or ""}
    for name, allowed in (("namespaces", -1), ("no-namespaces", 0)):
        used = probe._detect(allowed_flags=allowed)
        if used.error:
            found[name] = {"error": used.error}
            continue
        result = run(used, code, tests, max_processes=8)
        hack = run(used, textwrap.dedent(HACKS["returns an object whose __eq__ is always true"]),
                   ASSERT)  # fmt: skip
        found[name] = {"summary": used.summary(), "passed": result.passed, "error": result.error,
                       "hack": hack.passed, "honest": run(used, HONEST, ASSERT).passed}  # fmt: skip
    listener.close()
    return found


def test_a_trainer_that_is_not_root():
    found = as_ordinary_user(ordinary_user_attempts)
    assert "error" not in found or not isinstance(found["error"], str), found
    assert "no mount namespace and no Landlock" in found.pop("refused")
    for name, outcome in found.items():
        if "summary" not in outcome:
            continue  # the sandbox cannot be built in that mode here: nothing to defend
        assert outcome["honest"] == 1, (name, outcome)
        assert outcome["hack"] == 0, (name, outcome)
        # Only the control passes: no 0600 file, no socket in a 0700 runtime dir, and the
        # process limit holds although the trainer's uid already runs many tasks.
        assert outcome["passed"] == 1, (name, outcome)


# ------------------------------------------------------------------------------------------------
# The launcher and the harness run on any CPython from 3.6 on (the sandbox interpreter may be
# the system's, not the trainer's)


def interpreters() -> list[str]:
    import glob

    found = glob.glob("/root/.pyenv/versions/3.*/bin/python3.*[0-9]")
    found += glob.glob("/usr/bin/python3.[0-9]*")
    return sorted({os.path.realpath(p) for p in found if re_version(p)})


def re_version(path: str) -> bool:
    name = os.path.basename(path)
    return name.startswith("python3.") and name[8:].isdigit() and int(name[8:]) >= 6


@pytest.mark.parametrize("python", interpreters() or ["none"])
def test_every_interpreter_from_3_6_on(python, monkeypatch):
    if python == "none":
        pytest.skip("no other CPython on this machine")
    monkeypatch.setenv("GROUPWISE_SANDBOX_PYTHON", python)
    used = probe._detect()
    if used.error:
        pytest.skip(f"{python} cannot host the sandbox here: {used.error}")
    code = HACKS["returns an object whose __eq__ is always true"]
    assert score(used, code, ASSERT) == 0.0
    assert score(used, HONEST + "import collections\n", ASSERT) == 1.0
    case = [{"input": "abc\n", "output": "cba\n"}]
    assert score(used, "print(input()[::-1])\n", case) == 1.0
