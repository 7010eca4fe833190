"""Tests for the sandboxed code-execution reward (groupwise.rewards.code) and the sandbox it runs
the code in (groupwise.sandbox).

Security tests pair every attack with a control test that legitimately passes, so a broken
sandbox that runs nothing cannot look like a successful defence (expected reward 0.5, not 0).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import select
import shutil
import socket
import sys
import tempfile
import textwrap
import time
import tracemalloc
import uuid
from pathlib import Path

import pytest

from groupwise import sandbox
from groupwise.rewards.code import (
    code_reward,
    code_reward_binary,
    extract_code,
    make_code_reward,
    parse_tests,
    run_tests,
)
from groupwise.sandbox.info import WALL_CLOCK_FACTOR, SandboxUnavailableError

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")

REPO_ROOT = Path(__file__).resolve().parents[2]
DOUBLE = "def double(x):\n    return 2 * x\n"
DOUBLE_TESTS = ["assert double(2) == 4", "assert double(-1) == -2"]
OK = "def ok():\n    return True\n"


@pytest.fixture(scope="module")
def info() -> sandbox.SandboxInfo:
    found = sandbox.sandbox_info()
    if found.error:
        pytest.skip(f"no sandbox on this machine: {found.error}")
    return found


def fenced(code: str, lang: str = "python") -> str:
    return f"Here is my solution:\n\n```{lang}\n{code}```\n\nDone."


def without(info: sandbox.SandboxInfo, flag: int, what: str) -> sandbox.SandboxInfo:
    """``info`` with one namespace turned off (to test the fallback path of that layer)."""
    if not info.unshare_flags & flag:
        pytest.skip(f"no {what} namespace here: the fallback is what the default run tests")
    return dataclasses.replace(info, unshare_flags=info.unshare_flags & ~flag)


def run_with(used: sandbox.SandboxInfo, code: str, tests, timeout_s=5.0, **limits):
    limits = {"memory_mb": 512, "max_output_bytes": 1_000_000, "max_processes": 32, **limits}
    return sandbox.run_parsed(code, parse_tests(tests), used, timeout_s=timeout_s, **limits)


@pytest.fixture(autouse=True)
def own_tag(monkeypatch) -> str:
    """A tag prefix of this test's own on its launchers' command lines: other tests run
    sandboxes beside it, and only this test's leftovers are this test's to find."""
    prefix = f"groupwise-sandbox-{uuid.uuid4().hex[:12]}-"
    monkeypatch.setattr(sandbox.process, "TAG_PREFIX", prefix)
    return prefix


def sandbox_processes() -> list[int]:
    """Pids of processes running a launcher this test started (any uid; zombies excluded)."""
    marker = sandbox.process.TAG_PREFIX.encode()
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if marker in f.read():
                        pids.append(int(entry))
            except OSError:
                continue
    return pids


def assert_no_leftovers(info: sandbox.SandboxInfo) -> None:
    """No process of this test's sandboxes is left (polls briefly: they die asynchronously)."""
    deadline = time.monotonic() + 3.0
    while sandbox_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sandbox_processes() == []


# ------------------------------------------------------------------------------------------------
# Code extraction and test parsing (no sandbox)


def test_extract_code_takes_last_python_block_and_ignores_other_languages():
    text = (
        "```python\nfirst = 1\n```\ntext\n```\nsecond = 2\n```\n"
        "```bash\nrm -rf /\n```\n```text\nOutput: 3\n```\n"
    )
    assert extract_code(text) == "second = 2\n"
    assert extract_code("```py\na = 1\n```") == "a = 1\n"
    assert extract_code("no fences here\nx = 1") == "no fences here\nx = 1"


def test_extract_code_dedents_and_accepts_a_truncated_trailing_block():
    assert extract_code("1. Step:\n   ```python\n   x = 1\n   ```\n") == "x = 1\n"
    assert extract_code("```python\nold = 0\n```\n```python\nnew = 1\n") == "new = 1\n"
    assert extract_code("```python\r\nx = 1\r\n```\r\nbye") == "x = 1\r\n"


def test_parse_tests_forms():
    assert parse_tests(None) is None
    assert parse_tests(float("nan")) is None
    assert parse_tests("   ") is None
    assert parse_tests([]) is None
    assert parse_tests(["", "  "]) is None
    assert parse_tests(["assert a", ""]) == ("asserts", (("test", "assert a"),))
    assert parse_tests({"inputs": [], "outputs": []}) is None
    assert parse_tests(["assert a == 1", "assert b"]) == (
        "asserts",
        (("test", "assert a == 1"), ("test", "assert b")),
    )
    source = "import math\nassert f(4) == 2\nassert f(\n    9\n) == 3\nx = 1\n"
    mode, items = parse_tests(source)
    assert mode == "asserts"
    assert [kind for kind, _ in items] == ["setup", "test", "test", "setup"]
    assert items[2][1] == "assert f(\n    9\n) == 3"
    assert parse_tests("check(candidate)") == ("asserts", (("test", "check(candidate)"),))
    assert parse_tests("x = 2; assert x == 2; assert x > 1  # two tests") == (
        "asserts",
        (("setup", "x = 2"), ("test", "assert x == 2"), ("test", "assert x > 1")),
    )
    decorated = "@cache\ndef g():\n    return 'é'\nassert g() == 'é'\n"
    assert parse_tests(decorated)[1] == (
        ("setup", "@cache\ndef g():\n    return 'é'"),
        ("test", "assert g() == 'é'"),
    )
    assert parse_tests("assert f(1) ==\n# note\nassert g()") == (
        "asserts",
        (("test", "assert f(1) =="), ("test", "assert g()")),
    )
    io = ("io", (("1\n", "2\n"), ("3\n", "4\n")))
    assert parse_tests([{"input": "1\n", "output": "2\n"}, {"input": "3\n", "output": "4\n"}]) == io
    assert parse_tests({"inputs": ["1\n", "3\n"], "outputs": ["2\n", "4\n"]}) == io
    assert parse_tests('{"inputs": ["1\\n", "3\\n"], "outputs": ["2\\n", "4\\n"]}') == io
    assert parse_tests({"input": "1\n", "output": "2\n"}) == ("io", (("1\n", "2\n"),))


@pytest.mark.parametrize(
    "bad",
    [
        {"fn_name": "f", "inputs": [[1]], "outputs": [[2]]},
        {"inputs": ["1"], "outputs": []},
        [{"input": "1"}],
        ["assert x", {"input": "1", "output": "2"}],
        [{"input": 1, "output": 2}],
        42,
    ],
)
def test_parse_tests_rejects_malformed_values(bad):
    with pytest.raises(ValueError):
        parse_tests(bad)


def test_output_normalisation_ignores_trailing_whitespace_only():
    assert sandbox.normalise_output("1 2  \r\n3\n\n\n") == sandbox.normalise_output("1 2\n3")
    assert sandbox.normalise_output("1\n2") != sandbox.normalise_output("1 2")
    assert sandbox.normalise_output("\n1") != sandbox.normalise_output("1")


def test_reward_names_and_validation():
    assert code_reward.__name__ == "code_reward"
    assert code_reward_binary.__name__ == "code_reward_binary"
    assert make_code_reward(binary=True, tests_column="checks").__name__ == "code_reward_binary"
    with pytest.raises(ValueError):
        make_code_reward(timeout_s=0)
    with pytest.raises(ValueError):
        make_code_reward(max_workers=0)


def test_missing_tests_give_none_without_running_anything(monkeypatch):
    def explode(*args, **kwargs):
        raise AssertionError("the sandbox must not run for rows without tests")

    monkeypatch.setattr(sandbox, "run_parsed", explode)
    completions = [fenced(DOUBLE)] * 4
    assert code_reward([""] * 4, completions, tests=[None, "", [], "  "]) == [None] * 4
    assert code_reward([""] * 4, completions) == [None] * 4  # no tests column at all
    with pytest.raises(ValueError):
        run_tests(DOUBLE, [])


# ------------------------------------------------------------------------------------------------
# Functional behaviour


def test_correct_half_correct_and_syntax_error(info):
    half = "def double(x):\n    return 4 if x == 2 else 0\n"
    broken = "def double(x):\n    return 2 *\n"
    scores = code_reward(
        [""] * 3,
        [fenced(DOUBLE), fenced(half), fenced(broken)],
        tests=[DOUBLE_TESTS] * 3,
    )
    assert scores == [1.0, 0.5, 0.0]
    result = run_tests(broken, DOUBLE_TESTS)
    assert (result.passed, result.total) == (0, 2)
    assert "SyntaxError" in result.error
    assert not result.setup_failed and not result.timed_out


def test_binary_variant(info):
    half = "def double(x):\n    return 4\n"
    scores = code_reward_binary(
        [""] * 2, [fenced(DOUBLE), fenced(half)], tests=[DOUBLE_TESTS, DOUBLE_TESTS]
    )
    assert scores == [1.0, 0.0]


def test_assert_string_with_setup_statements_and_conversations(info):
    tests = "import math\nassert root(16) == 4\nvalue = 81\nassert root(value) == 9\n"
    completion = [{"role": "assistant", "content": fenced("def root(x):\n    return x ** 0.5\n")}]
    assert code_reward([""], [completion], tests=[tests]) == [1.0]
    result = run_tests("def root(x):\n    return 4\n", tests)
    assert (result.passed, result.total) == (1, 2)


def test_module_semantics_of_the_solution(info):
    code = textwrap.dedent(
        """
        from __future__ import annotations
        import dataclasses, sys
        @dataclasses.dataclass
        class Point:
            x: int
            y: int = 0
        def name():
            return __name__
        if __name__ == "__main__":
            print(input())  # stdin is empty in assert mode: this must not run there
        """
    )
    tests = ["assert Point(1).y == 0", "assert name() == 'solution'", "assert sys.argv[0] != ''"]
    result = run_tests(code, tests)
    assert result.passed == 3, result.error
    as_script = code + "print(name(), Point(2, 3))\n"
    case = {"input": "hello\n", "output": "hello\n__main__ Point(x=2, y=3)\n"}
    assert run_tests(as_script, [case]).passed == 1


def test_last_code_block_is_run_and_no_block_means_whole_completion(info):
    wrong_then_right = fenced("def double(x):\n    return 0\n") + fenced(DOUBLE)
    right_then_wrong = fenced(DOUBLE) + fenced("def double(x):\n    return 0\n")
    trailing_text_block = fenced(DOUBLE) + "Output:\n```text\n4\n```\n"
    scores = code_reward(
        [""] * 4,
        [wrong_then_right, right_then_wrong, trailing_text_block, DOUBLE],
        tests=[DOUBLE_TESTS] * 4,
    )
    assert scores == [1.0, 0.0, 1.0, 1.0]
    prose = "I think the answer is:\ndef double(x):\n    return 2 * x\n"
    assert code_reward([""], [prose], tests=[DOUBLE_TESTS]) == [0.0]


def test_stdin_stdout_tests(info):
    program = "import sys\na, b = map(int, sys.stdin.buffer.read().split())\nprint(a + b)  \n"
    cases = [
        {"input": "1 2\n", "output": "3\n"},
        {"input": "10 5", "output": "15"},
        {"input": "2 2\n", "output": "5\n"},
    ]
    result = run_tests(program, cases)
    assert (result.passed, result.total) == (2, 3)
    assert result.error == "case 2: wrong answer"
    apps_style = {"inputs": ["4 4", "1 1"], "outputs": ["8", "3"]}
    assert code_reward([""], [fenced(program)], tests=[apps_style]) == [0.5]
    # open(0), a threaded main (the usual recursion trick) and a failing exit status.
    threaded = textwrap.dedent(
        """
        import sys, threading
        def main():
            n = int(open(0).read())
            print(n * n)
        threading.stack_size(1 << 26)
        threading.Thread(target=main).start()
        """
    )
    assert run_tests(threaded, [{"input": "7\n", "output": "49\n"}]).passed == 1
    crash = "print(3)\nraise SystemExit(2)\n"
    result = run_tests(crash, [{"input": "", "output": "3"}])
    assert result.passed == 0 and "status 2" in result.error


def test_parallel_run_matches_serial(info):
    codes = [f"def double(x):\n    return {k} * x\n" for k in range(16)]
    tests = [["assert double(1) == 2", "assert double(3) == 6", "assert double(0) == 0"]] * 16
    completions = [fenced(c) for c in codes]
    serial = make_code_reward(max_workers=1)([""] * 16, completions, tests=tests)
    start = time.monotonic()
    parallel = make_code_reward(max_workers=4)([""] * 16, completions, tests=tests)
    elapsed = time.monotonic() - start
    expected = [1 / 3] * 16
    expected[2] = 1.0
    assert serial == pytest.approx(expected)
    assert parallel == serial
    assert elapsed < 20
    assert_no_leftovers(info)


def test_sandbox_environment_and_limits(info):
    checks = [
        "import os; assert set(os.environ) <= {'PATH', 'LC_CTYPE', 'LC_ALL', 'LANG'}",
        "import os; assert os.environ['PATH'] == '/usr/local/bin:/usr/bin:/bin'",
        "import sys; assert sys.flags.isolated and sys.flags.no_site",
        "open('scratch.txt', 'w').write('x'); assert open('scratch.txt').read() == 'x'",
        "import resource; assert resource.getrlimit(resource.RLIMIT_AS)[0] == 256 * 2**20",
        "import resource; assert resource.getrlimit(resource.RLIMIT_CPU)[0] <= 3",
        "import resource; assert resource.getrlimit(resource.RLIMIT_CORE) == (0, 0)",
        "import sys; assert sys.stdin.read() == ''",
    ]
    if info.root:
        checks += [
            "import os; assert os.getuid() not in (0,) and os.getgid() != 0",
            "import os; assert os.getgroups() == []",
            "import resource; assert resource.getrlimit(resource.RLIMIT_NPROC)[0] == 7",
        ]
    if info.pid_namespace and info.mount_namespace:
        checks.append(
            "import os; assert sorted(p for p in os.listdir('/proc') if p.isdigit()) == ['1', '2']"
        )
    if info.network_isolation == "namespace":
        checks.append(
            "assert [l.split(':')[0].strip() for l in open('/proc/net/dev')][2:] == ['lo']"
        )
    result = run_tests("x = 1\n", checks, timeout_s=2.0, memory_mb=256, max_processes=7)
    assert result.passed == result.total == len(checks), result.error


def test_working_directory_is_fresh_and_removed(info, monkeypatch):
    folder = Path(tempfile.mkdtemp(prefix="gw-test-"))  # this test's own: others run beside it
    folder.chmod(0o711)
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    try:
        code = "import os\nopen('left.txt', 'w').write('x')\n"
        code += "def listing():\n    return os.listdir('.')\n"
        first = run_tests(code, ["assert listing() == ['left.txt']"])
        assert first.passed == 1, first.error
        fresh = "import os\ndef listing():\n    return os.listdir('.')\n"
        second = run_tests(fresh, ["assert listing() == []"])
        assert second.passed == 1, second.error
        assert os.listdir(folder) == []
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("pid_namespace", [True, False])
def test_printed_results_cannot_be_forged(info, pid_namespace):
    """The verdicts come from the judge's own stdout: what the solution prints, on any
    descriptor, never reaches it; a test the judge cannot finish fails."""
    used = info if pid_namespace else without(info, sandbox.CLONE_NEWPID, "PID")
    code = textwrap.dedent(
        """
        import os, sys
        for i in range(3):
            print(f"{i} P")
            print("0" * 32 + f" {i} P")
            for fd in range(1, LAST_FD):
                try:
                    os.write(fd, f"deadbeef {i} P\\n{i} P\\nDONE\\n".encode())
                except OSError:
                    pass
        def quit():
            os._exit(0)
        """
    )
    tests = ["assert False", "assert False", "assert True"]
    result = run_with(used, "LAST_FD = 3\n" + code, tests)
    assert (result.passed, result.total) == (1, 3)
    # Writing on every descriptor garbles the solution's own answer channel: it gets nothing.
    garbled = run_with(used, "LAST_FD = 64\n" + code, tests)
    assert (garbled.passed, garbled.total) == (0, 3)
    early_exit = run_with(used, "import os\n", ["assert True", "os._exit(0)", "assert True"])
    assert (early_exit.passed, early_exit.total) == (1, 3)
    assert "died" in early_exit.error
    solution_exit = run_with(
        used, "LAST_FD = 1\n" + code, ["assert quit() is None", "assert False"]
    )
    assert (solution_exit.passed, solution_exit.total) == (0, 2)
    assert "died" in solution_exit.error


def test_sandbox_that_cannot_start_scores_none_or_raises(info, monkeypatch):
    broken = dataclasses.replace(info, python="/bin/false")
    result = sandbox.run_parsed(
        DOUBLE,
        parse_tests(DOUBLE_TESTS),
        broken,
        timeout_s=2.0,
        memory_mb=256,
        max_output_bytes=10_000,
        max_processes=8,
    )
    assert result.setup_failed and result.passed == 0
    monkeypatch.setattr(sandbox.probe, "_info", broken)
    with pytest.raises(SandboxUnavailableError):
        code_reward([""], [fenced(DOUBLE)], tests=[DOUBLE_TESTS])
    monkeypatch.setattr(sandbox.probe, "_info", dataclasses.replace(info, error="no sandbox"))
    with pytest.raises(SandboxUnavailableError):
        run_tests(DOUBLE, DOUBLE_TESTS)


# ------------------------------------------------------------------------------------------------
# Security: every attack ends with only the control test passing, the trainer alive and nothing
# changed outside the sandbox.


def test_infinite_loop_is_killed_at_the_deadline(info):
    code = OK + "def spin():\n    while True:\n        pass\n"
    start = time.monotonic()
    result = run_tests(code, ["assert ok()", "assert spin()"], timeout_s=1.0)
    elapsed = time.monotonic() - start
    assert (result.passed, result.total) == (1, 2)
    assert result.timed_out and result.error == "timed out"
    assert elapsed < 2.5
    assert_no_leftovers(info)


@pytest.mark.parametrize("pid_namespace", [True, False])
def test_fork_bomb_is_contained(info, pid_namespace):
    used = info if pid_namespace else without(info, sandbox.CLONE_NEWPID, "PID")
    code = OK + textwrap.dedent(
        """
        import os, time
        def bomb():
            while True:
                try:
                    if os.fork() == 0:
                        os.setsid()  # leave the process group: killpg alone misses these
                except OSError:
                    time.sleep(0.01)  # stay alive at the limit
        """
    )
    start = time.monotonic()
    result = run_with(used, code, ["assert ok()", "bomb()"], timeout_s=2.0, max_processes=16)
    # A bomb that mostly waits at the limit uses little CPU: the wall-clock backstop stops it.
    assert time.monotonic() - start < WALL_CLOCK_FACTOR * 2.0 + 2.0
    assert (result.passed, result.total) == (1, 2)
    assert result.timed_out
    assert_no_leftovers(info)
    os.kill(os.getpid(), 0)


def test_fork_limit_is_enforced(info):
    code = textwrap.dedent(
        """
        import os
        def spawn(n):
            pids = []
            try:
                for _ in range(n):
                    pid = os.fork()
                    if pid == 0:
                        import time; time.sleep(5); os._exit(0)
                    pids.append(pid)
            except OSError:
                pass
            for pid in pids:
                os.kill(pid, 9); os.waitpid(pid, 0)
            return len(pids)
        """
    )
    # Not root: the limit is the user's task count at the start plus 8 (+3 for the launcher).
    bound = 8 if info.root else 24
    tests = ["assert spawn(3) == 3", f"assert spawn(40) < {bound}"]
    result = run_tests(code, tests, max_processes=8)
    assert result.passed == 2, result.error
    assert_no_leftovers(info)


def test_allocating_10_gb_fails_inside_the_sandbox(info):
    code = OK + "def big():\n    block = bytearray(10 * 1024**3)\n    return len(block) > 0\n"
    start = time.monotonic()
    result = run_tests(code, ["assert ok()", "assert big()"], timeout_s=5.0)
    assert (result.passed, result.total) == (1, 2)
    assert "MemoryError" in result.error
    assert time.monotonic() - start < 4.0


def test_cannot_write_into_the_project(info):
    if not info.filesystem_isolation:
        pytest.skip("no filesystem isolation here (not root, no mount namespace)")
    target = REPO_ROOT / f".sandbox-escape-{uuid.uuid4().hex}"
    code = OK + "def write(path):\n    open(path, 'w').write('pwned')\n    return True\n"
    try:
        result = run_tests(code, ["assert ok()", f"assert write({str(target)!r})"])
        assert (result.passed, result.total) == (1, 2)
        assert not target.exists()
    finally:
        if target.exists():
            target.unlink()


def test_trainer_environment_is_invisible(info, monkeypatch):
    secret = "sk-fake-" + uuid.uuid4().hex
    monkeypatch.setenv("GROUPWISE_FAKE_API_KEY", secret)
    code = OK + textwrap.dedent(
        f"""
        import os
        def from_environ():
            return os.environ.get("GROUPWISE_FAKE_API_KEY")
        def from_proc():
            for pid in os.listdir("/proc"):
                try:
                    if b{secret!r} in open(f"/proc/{{pid}}/environ", "rb").read():
                        return True
                except OSError:
                    pass
            return False
        """
    )
    tests = ["assert ok()", f"assert from_environ() == {secret!r}"]
    if info.trainer_invisible:  # else the same user may read the trainer's /proc/PID/environ
        tests.append("assert from_proc()")
    result = run_tests(code, tests)
    assert (result.passed, result.total) == (1, len(tests))


@pytest.mark.parametrize("mode", ["auto", "socket-block"])
def test_no_network_connection_to_localhost(info, mode):
    used = info
    if mode == "socket-block":
        used = dataclasses.replace(info, unshare_flags=info.unshare_flags & ~sandbox.CLONE_NEWNET)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    code = OK + textwrap.dedent(
        """
        import socket
        def connect(port):
            s = socket.create_connection(("127.0.0.1", port), timeout=1)
            s.sendall(b"leak")
            return True
        def raw(port):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.settimeout(1)
            s.connect(("127.0.0.1", port))
            return True
        """
    )
    tests = ["assert ok()", f"assert connect({port})", f"assert raw({port})"]
    if mode == "socket-block":
        tests.append("import socket\ntry:\n    socket.socket()\nexcept PermissionError:\n    pass")
        tests.append(
            "try:\n    import _socket\nexcept ImportError:\n    pass\nelse:\n    raise SystemExit"
        )
    try:
        result = sandbox.run_parsed(
            code,
            parse_tests(tests),
            used,
            timeout_s=5.0,
            memory_mb=512,
            max_output_bytes=100_000,
            max_processes=32,
        )
        readable, _, _ = select.select([listener], [], [], 0.2)
        assert readable == [], "a connection reached the trainer's listening socket"
    finally:
        listener.close()
    assert (result.passed, result.total) == (len(tests) - 2, len(tests)), result.error


def test_rmtree_of_outside_directory_has_no_effect(info):
    if not info.filesystem_isolation:
        pytest.skip("no filesystem isolation here (not root, no mount namespace)")
    canary = Path(tempfile.mkdtemp(prefix="groupwise-canary-", dir="/tmp"))
    try:
        (canary / "sub").mkdir()
        (canary / "sub" / "file.txt").write_text("keep me")
        (canary / "top.txt").write_text("keep me too")
        canary.chmod(0o755)
        code = OK + "import shutil\ndef wipe(path):\n    shutil.rmtree(path)\n    return True\n"
        result = run_tests(code, ["assert ok()", f"assert wipe({str(canary)!r})"])
        assert (result.passed, result.total) == (1, 2)
        assert (canary / "sub" / "file.txt").read_text() == "keep me"
        assert (canary / "top.txt").read_text() == "keep me too"
    finally:
        shutil.rmtree(canary, ignore_errors=True)


def test_cannot_kill_the_trainer(info):
    if not info.process_isolation:
        pytest.skip("no process isolation here (not root, no PID namespace)")
    code = OK + textwrap.dedent(
        """
        import os, signal
        def kill(pid):
            os.kill(pid, signal.SIGKILL)
            return "sent"
        def kill_all():
            os.kill(-1, signal.SIGKILL)
            return "sent"
        """
    )
    tests = [
        "assert ok()",
        f"assert kill({os.getpid()}) == 'sent'",
        f"assert kill({os.getppid()}) == 'sent'",
    ]
    result = run_tests(code, tests)
    assert (result.passed, result.total) == (1, 3)
    run_tests(code, ["kill_all()"])  # whatever it reaches inside the sandbox, nothing outside
    os.kill(os.getpid(), 0)
    with contextlib.suppress(PermissionError):  # alive, though another user's (not dead)
        os.kill(os.getppid(), 0)
    assert_no_leftovers(info)


def test_printing_100_mb_is_cut_at_the_output_limit(info):
    code = (
        OK + "import sys\ndef spam():\n    sys.stdout.write('x' * 100_000_000)\n    return True\n"
    )
    tracemalloc.start()
    try:
        start = time.monotonic()
        result = run_tests(code, ["assert ok()", "assert spam()"], max_output_bytes=1_000_000)
        elapsed = time.monotonic() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (result.passed, result.total) == (1, 2)
    assert result.output_truncated and "output limit" in result.error
    assert elapsed < 4.0
    assert peak < 8_000_000, f"the trainer buffered {peak} bytes"
    # The same for a stdin/stdout program: the case fails, nothing else breaks.
    io = run_tests(
        "print('x' * 50_000_000)", [{"input": "", "output": "x"}], max_output_bytes=10_000
    )
    assert io.passed == 0 and io.output_truncated
