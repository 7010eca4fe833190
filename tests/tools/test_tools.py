"""Tools for multi-turn rollouts: schemas, the call format, containment, built-ins and
environments. Expected values are worked out by hand."""

from __future__ import annotations

import concurrent.futures
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from groupwise import sandbox
from groupwise.data.splits import is_eval_problem
from groupwise.errors import ConfigError
from groupwise.tools import (
    BUILTIN_TOOLS,
    ENVIRONMENTS,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    EnvStep,
    GuessNumberEnvironment,
    ToolBox,
    ToolCall,
    ToolEnvironment,
    ToolResult,
    calculator,
    format_tool_call,
    guess_number_dataset,
    guess_reward,
    parse_tool_calls,
    python,
    resolve_tools,
    tool_name,
    tool_schema,
)
from groupwise.tools.toolbox import _decode

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only (fork)")


# ------------------------------------------------------------------------------------------------
# Tools used by the tests (module level: the forked child sees them as they are).


def forecast(city: str, days: int = 1) -> str:
    """Look up the weather forecast.

    Args:
        city: The city's name.
        days: How many days ahead.
    """
    return f"{city}: sunny for {days} days"


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


async def async_multiply(a: int, b: int) -> int:
    """Multiply two integers, asynchronously.

    Args:
        a: The first.
        b: The second.
    """
    return a * b


def undocumented(a: int) -> int:
    return a


def no_hints(a):
    """Return a.

    Args:
        a: Anything.
    """
    return a


def sleeper() -> str:
    time.sleep(60)
    return "woke up"


def boom(key: str) -> str:
    raise KeyError(key)


def noisy() -> str:
    sys.stdout.write("x" * 100_000_000)
    sys.stdout.flush()
    os.write(1, b"y" * 1_000_000)
    os.write(2, b"z" * 1_000_000)
    print("visible?", file=sys.stderr)
    return "done"


def huge() -> str:
    return "a" * 100_000_000


def returns_object() -> object:
    return object()


def returns_dict() -> dict:
    return {"a": [1, 2], "b": None}


def returns_none() -> None:
    return None


def exits() -> str:
    os._exit(3)


def killed() -> str:
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"


def calls_exit() -> str:
    sys.exit("bye")


def spawner(wait: bool) -> str:
    """Start a long sleep, report its pid, then return or hang.

    Args:
        wait: Whether to hang after starting it.
    """
    child = subprocess.Popen(["sleep", "60"])
    with open(os.environ["GW_TEST_PID_FILE"], "w") as f:
        f.write(str(child.pid))
    if wait:
        time.sleep(60)
    return "started"


def gone(pid: int, within_s: float = 2.0) -> bool:
    """Whether ``pid`` is dead (gone or a zombie) within ``within_s``."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.02)
    return False


SEEN: list[int] = []


def remember(x: int) -> str:
    """Record x in SEEN.

    Args:
        x: The value.
    """
    SEEN.append(x)
    return "ok"


# ------------------------------------------------------------------------------------------------
# Schemas


def test_tool_schema_of_a_documented_function():
    assert tool_name(forecast) == "forecast"
    assert tool_schema(forecast) == {
        "type": "function",
        "function": {
            "name": "forecast",
            "description": "Look up the weather forecast.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "The city's name."},
                    "days": {"type": "integer", "description": "How many days ahead."},
                },
                "required": ["city"],
            },
            "return": {"type": "string"},
        },
    }


def test_tool_schema_refuses_missing_docstring_or_hints_naming_the_function():
    with pytest.raises(ConfigError, match=r"'undocumented'.*docstring"):
        tool_schema(undocumented)
    with pytest.raises(ConfigError, match=r"'no_hints'.*type hint"):
        tool_schema(no_hints)


def test_builtin_schemas_come_from_their_docstrings():
    schema = tool_schema(calculator)["function"]
    assert schema["name"] == "calculator"
    assert schema["parameters"]["required"] == ["expression"]
    assert schema["parameters"]["properties"]["expression"]["type"] == "string"
    assert tool_schema(python)["function"]["parameters"]["required"] == ["code"]


# ------------------------------------------------------------------------------------------------
# The tool-call format

CALC_BLOCK = (
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "23 * 47"}}\n</tool_call>'
)


def test_format_tool_call_is_the_hermes_text():
    call = ToolCall("calculator", {"expression": "23 * 47"})
    assert format_tool_call(call) == CALC_BLOCK
    assert (TOOL_CALL_OPEN, TOOL_CALL_CLOSE) == ("<tool_call>", "</tool_call>")
    assert parse_tool_calls("Let me compute.\n" + format_tool_call(call)) == ([call], [])


def test_parse_several_blocks_in_order():
    text = (
        "first <tool_call>{'bad': json}</tool_call> then "
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
        '<tool_call> {"name": "add", "parameters": {"a": 3, "b": 4}} </tool_call>'
        '<tool_call>{"name": "add", "arguments": "{\\"a\\": 5, \\"b\\": 6}"}</tool_call>'
        '<tool_call>{"name": "noargs"}</tool_call> done'
    )
    calls, errors = parse_tool_calls(text)
    assert calls == [
        ToolCall("add", {"a": 1, "b": 2}),
        ToolCall("add", {"a": 3, "b": 4}),
        ToolCall("add", {"a": 5, "b": 6}),
        ToolCall("noargs", {}),
    ]
    assert len(errors) == 1 and errors[0].startswith("error: tool call is not valid JSON")


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ("[1, 2]", "error: tool call must be a JSON object, got list"),
        ('{"arguments": {}}', 'error: tool call needs a "name" string'),
        ('{"name": 3}', 'error: tool call needs a "name" string'),
        (
            '{"name": "f", "arguments": [1]}',
            "error: \"arguments\" of tool call 'f' must be an object",
        ),
        (
            '{"name": "f", "arguments": "{nope"}',
            "error: \"arguments\" of tool call 'f' is a string ",
        ),
        (
            '{"name": "f", "arguments": "[1]"}',
            "error: \"arguments\" of tool call 'f' must be an object",
        ),
    ],
)
def test_parse_malformed_blocks(body, error):
    calls, errors = parse_tool_calls(f"{TOOL_CALL_OPEN}{body}{TOOL_CALL_CLOSE}")
    assert calls == [] and len(errors) == 1
    assert errors[0].startswith(error)


def test_parse_unclosed_block_and_plain_text():
    assert parse_tool_calls("The answer is 1081.") == ([], [])
    text = CALC_BLOCK + ' and <tool_call>{"name": "add", "arguments": {'
    calls, errors = parse_tool_calls(text)
    assert calls == [ToolCall("calculator", {"expression": "23 * 47"})]
    assert errors == ["error: unclosed <tool_call> (end it with </tool_call>)"]


# ------------------------------------------------------------------------------------------------
# Calculator


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("23 * 47", "1081"),
        ("(2+3)*4", "20"),
        ("7/2", "3.5"),
        ("6/3", "2"),
        ("1/3", "0.333333333333"),
        ("0.1 + 0.2", "0.3"),
        ("7 // 2", "3"),
        ("-7 // 2", "-4"),
        ("-7 % 3", "2"),
        ("-2 ** 2", "-4"),
        ("+5 - -5", "10"),
        ("2 ** -1", "0.5"),
        ("99999999999999999 * 3", "299999999999999997"),
        ("10 ** 20 / 1", "1e+20"),
        ("2 ** 100", "1267650600228229401496703205376"),
        ("(10 ** 100) ** 9", "1" + "0" * 900),
    ],
)
def test_calculator_values(expression, value):
    assert calculator(expression) == value


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("__import__('os')", "unsupported element Call"),
        ("x + 1", "unsupported element Name"),
        ("abs(-1)", "unsupported element Call"),
        ("(1).real", "unsupported element Attribute"),
        ("'a' * 3", "unsupported element 'a'"),
        ("True + 1", "unsupported element True"),
        ("1 < 2", "unsupported element Compare"),
        ("[1][0]", "unsupported element Subscript"),
        ("2 ** 1000", "exponent 1000 is too large (at most 100 in absolute value)"),
        ("2 ** -101", "exponent -101 is too large"),
        ("(10 ** 100) ** 10", "more than 1000 digits"),  # exactly 1001 digits
        ("(10 ** 90 * 10 ** 90) ** 90", "more than 1000 digits"),  # refused before computing
        ("9 ** 100 ** 100", "is too large"),
        ("1e308 * 10", "too large"),
        ("(-8) ** 0.5", "not a real number"),
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("1 +", "not an arithmetic expression"),
        ("1" + "+1" * 100, "longer than 200 characters"),
    ],
)
def test_calculator_refuses(expression, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        calculator(expression)


# ------------------------------------------------------------------------------------------------
# ToolBox containment


def test_toolbox_runs_isolated_and_trusted_tools():
    box = ToolBox([add, calculator, remember])
    assert box.names == ["add", "calculator", "remember"]
    assert box.schemas[0] == tool_schema(add)
    assert box.call(ToolCall("add", {"a": 2, "b": 3})) == ToolResult("add", "5")
    assert box.call(ToolCall("calculator", {"expression": "23 * 47"})) == ToolResult(
        "calculator", "1081"
    )
    # An isolated tool's side effects stay in the child; a trusted one runs here.
    SEEN.clear()
    assert box.call(ToolCall("remember", {"x": 1})).text == "ok"
    assert SEEN == []
    remember.trusted = True
    try:
        box.call(ToolCall("remember", {"x": 2}))
    finally:
        del remember.trusted
    assert SEEN == [2]
    assert box.stats == {"calls": 4, "errors": 0, "timeouts": 0}


def test_async_tools_are_awaited_isolated_and_trusted():
    # TRL accepts ``async def`` tools: their coroutine is run to its value (3 * 4 = 12), not
    # reported as a result that is not text.
    box = ToolBox([async_multiply])
    assert box.call(ToolCall("async_multiply", {"a": 3, "b": 4})) == ToolResult(
        "async_multiply", "12"
    )
    async_multiply.trusted = True
    try:
        assert box.call(ToolCall("async_multiply", {"a": 5, "b": 6})).text == "30"
    finally:
        del async_multiply.trusted
    assert box.call(ToolCall("async_multiply", {"a": 3, "c": 4})).error is not None
    assert box.stats == {"calls": 3, "errors": 1, "timeouts": 0}


def test_unknown_tool_and_wrong_arguments():
    box = ToolBox([add, calculator])
    result = box.call(ToolCall("foo", {}))
    assert result.text == "error: unknown tool 'foo'; available: add, calculator"
    assert result.error == "unknown tool 'foo'; available: add, calculator"
    missing = box.call(ToolCall("add", {"a": 1}))
    assert missing.text == "error: bad arguments for tool 'add': missing a required argument: 'b'"
    extra = box.call(ToolCall("add", {"a": 1, "b": 2, "c": 3}))
    assert extra.text.startswith("error: bad arguments for tool 'add': ")
    assert "'c'" in extra.text
    assert box.stats == {"calls": 3, "errors": 3, "timeouts": 0}


def test_hanging_tool_is_killed_at_the_timeout():
    box = ToolBox([sleeper], timeout_s=0.5)
    start = time.monotonic()
    result = box.call(ToolCall("sleeper", {}))
    assert time.monotonic() - start < 2.0
    assert result.text == "error: tool 'sleeper' timed out after 0.5s"
    assert box.stats == {"calls": 1, "errors": 1, "timeouts": 1}


def test_raising_tool_is_fed_back_truncated():
    box = ToolBox([boom, calculator], max_output_chars=30)
    assert box.call(ToolCall("boom", {"key": "nope"})).text == "error: KeyError: 'nope'"
    # "KeyError: 'kk...k'" is 11 + 100 + 1 = 112 chars: 30 kept, 82 cut, then the prefix.
    long = box.call(ToolCall("boom", {"key": "k" * 100})).text
    assert long == "error: KeyError: '" + "k" * 19 + "... [truncated 82 chars]"
    # The trusted calculator's ValueError is contained the same way.
    assert box.call(ToolCall("calculator", {"expression": "1/0"})).text == (
        "error: ValueError: division by zero"
    )


def test_printing_tool_reaches_neither_stdout_nor_stderr(capfd):
    result = ToolBox([noisy]).call(ToolCall("noisy", {}))
    assert result == ToolResult("noisy", "done")
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_huge_result_is_truncated_in_the_child():
    result = ToolBox([huge], max_output_chars=50).call(ToolCall("huge", {}))
    assert result.text == "a" * 50 + "... [truncated 99999950 chars]"
    assert result.error is None


def test_non_text_results():
    box = ToolBox([returns_object, returns_dict, returns_none, add])
    bad = box.call(ToolCall("returns_object", {}))
    assert bad.text == "error: tool returned object, expected text"
    assert box.call(ToolCall("returns_dict", {})).text == '{"a": [1, 2], "b": null}'
    assert box.call(ToolCall("returns_none", {})).text == "null"
    assert box.call(ToolCall("add", {"a": 1, "b": 1})).text == "2"


def test_dying_tools():
    box = ToolBox([exits, killed, calls_exit])
    assert box.call(ToolCall("exits", {})).text == (
        "error: tool 'exits' exited without a result (exit status 3)"
    )
    assert box.call(ToolCall("killed", {})).text == (
        "error: tool 'killed' exited without a result (killed by signal 9)"
    )
    assert box.call(ToolCall("calls_exit", {})).text == "error: SystemExit: bye"
    assert box.stats == {"calls": 3, "errors": 3, "timeouts": 0}


@pytest.mark.parametrize("wait", [False, True])
def test_processes_a_tool_leaves_behind_are_killed(wait, tmp_path, monkeypatch):
    pid_file = tmp_path / "pid"
    monkeypatch.setenv("GW_TEST_PID_FILE", str(pid_file))
    result = ToolBox([spawner], timeout_s=1.0).call(ToolCall("spawner", {"wait": wait}))
    expected = "error: tool 'spawner' timed out after 1s" if wait else "started"
    assert result.text == expected
    assert gone(int(pid_file.read_text()))


def test_calls_from_several_threads():
    box = ToolBox([add])
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda i: box.call(ToolCall("add", {"a": i, "b": i})), range(12)))
    assert [r.text for r in results] == [str(2 * i) for i in range(12)]
    assert box.stats == {"calls": 12, "errors": 0, "timeouts": 0}


def test_a_garbled_result_is_an_error():
    assert _decode(b'["[1]", null, [1]]') == ("[1]", None, [1])
    garbled = ("", "the tool's result could not be read back", None)
    assert _decode(b"\x80garbage") == garbled
    assert _decode(b'["ok", 3, "ok"]') == garbled
    assert _decode(b'["ok", null]') == garbled  # (text, error, content) expected


def test_toolbox_configuration_errors():
    with pytest.raises(ConfigError, match="two tools are named 'add'"):
        ToolBox([add, add])
    with pytest.raises(ConfigError, match="not callable"):
        ToolBox(["add"])
    with pytest.raises(ConfigError, match="timeout_s"):
        ToolBox([add], timeout_s=0)
    with pytest.raises(ConfigError, match="'undocumented'"):
        ToolBox([undocumented]).schemas  # noqa: B018


# ------------------------------------------------------------------------------------------------
# Built-in tools and resolution


def test_resolve_tools():
    assert resolve_tools(["calculator", "python", add]) == [calculator, python, add]
    assert resolve_tools(["groupwise.tools.builtin:calculator"]) == [calculator]
    assert BUILTIN_TOOLS == {"calculator": calculator, "python": python}
    assert calculator.trusted and python.trusted
    with pytest.raises(ConfigError, match="unknown tool 'calc'; built-in tools are calculator"):
        resolve_tools(["calc"])
    with pytest.raises(ConfigError, match="cannot import module 'no_such_module_xyz'"):
        resolve_tools(["no_such_module_xyz:f"])
    with pytest.raises(ConfigError, match="module 'os' has no function 'nope'"):
        resolve_tools(["os:nope"])


@pytest.fixture(scope="module")
def sandbox_ready() -> None:
    found = sandbox.sandbox_info()
    if found.error:
        pytest.skip(f"no sandbox on this machine: {found.error}")


def test_python_tool(sandbox_ready):
    assert python("print(6 * 7)") == "42"
    assert python("pass") == "(no output)"
    assert python("print('partial')\nraise ValueError('bad input')") == (
        "partial\nValueError: bad input"
    )
    assert python("raise SystemExit(3)") == "error: exit status 3"
    flood = python("print('x' * 2_000_000)")  # past the 1 MB output limit: stopped
    assert flood.endswith("\nerror: output limit exceeded, the program was stopped")
    assert set(flood.split("\n")[0]) == {"x"}
    result = sandbox.run_program("print(input()[::-1])", stdin="abc\n")
    assert (result.stdout, result.status, result.returncode) == ("cba\n", "ok", 0)


# ------------------------------------------------------------------------------------------------
# Environments


def calls_text(*calls: ToolCall) -> str:
    return "I will use tools.\n" + "\n".join(format_tool_call(c) for c in calls)


def test_tool_environment_steps():
    env = ToolEnvironment(ToolBox([calculator, add]))
    env.reset({"prompt": "x"})
    assert env.schemas == [tool_schema(calculator), tool_schema(add)]
    step = env.step(
        calls_text(ToolCall("calculator", {"expression": "23 * 47"}), ToolCall("add", {"a": 2}))
        + "<tool_call>not json</tool_call>"
    )
    assert [m["role"] for m in step.messages] == ["tool", "tool", "tool"]
    assert step.messages[0]["content"] == "1081"
    assert step.messages[1]["content"] == (
        "error: bad arguments for tool 'add': missing a required argument: 'b'"
    )
    assert step.messages[2]["content"].startswith("error: tool call is not valid JSON")
    assert [m.get("name") for m in step.messages] == ["calculator", "add", None]
    assert (step.done, step.tool_calls, step.tool_errors) == (False, 3, 2)
    step = env.step(calls_text(ToolCall("add", {"a": 2, "b": 3}), ToolCall("nope", {})))
    # TRL's tool message: the called tool's name; a malformed block (above) has none.
    assert step.messages[0] == {"role": "tool", "name": "add", "content": "5"}
    assert step.messages[1]["name"] == "nope"
    assert (step.done, step.tool_calls, step.tool_errors) == (False, 2, 1)
    assert env.step("The answer is 1081.") == EnvStep([], True, 0, 0)
    # Unknown tools are not "used".
    assert env.state() == {"tool_calls": 5, "tool_errors": 3, "tools_used": ["calculator", "add"]}
    env.reset({})
    assert env.state() == {"tool_calls": 0, "tool_errors": 0, "tools_used": []}


def test_tool_environment_call_limit():
    env = ToolEnvironment(ToolBox([add]), max_tool_calls=3)
    env.reset({})
    two = [ToolCall("add", {"a": 1, "b": 1}), ToolCall("add", {"a": 2, "b": 2})]
    step = env.step(calls_text(*two))
    assert (step.done, [m["content"] for m in step.messages]) == (False, ["2", "4"])
    step = env.step(calls_text(ToolCall("add", {"a": 3, "b": 3}), *two))
    limit = "error: tool call limit (3) reached"
    assert [m["content"] for m in step.messages] == ["6", limit, limit]
    assert (step.done, step.tool_calls, step.tool_errors) == (True, 3, 2)
    assert env.state() == {"tool_calls": 5, "tool_errors": 2, "tools_used": ["add"]}


def test_guess_number_full_game():
    env = ENVIRONMENTS["guess_number"]()
    env.reset({"secret": 37, "low": 1, "high": 100})
    assert env.step("Halfway: <answer>50</answer>") == EnvStep(
        [{"role": "user", "content": "lower"}], False
    )
    assert env.step("Then 25.").messages == [{"role": "user", "content": "higher"}]
    step = env.step("Between 1 and 100 it must be <answer> 37 </answer>")
    assert step == EnvStep([{"role": "user", "content": "correct"}], True)
    assert env.state() == {"solved": True, "guesses": 3, "secret": 37}
    assert env.step("again 37").done  # past the end: nothing more
    assert env.state()["guesses"] == 3


def test_guess_number_runs_out_of_guesses():
    env = GuessNumberEnvironment(max_guesses=2)
    env.reset({"secret": 5})
    step = env.step("no idea")
    assert step == EnvStep(
        [{"role": "user", "content": "reply with a number inside <answer> </answer>"}], False
    )
    step = env.step("<answer>9</answer> (was 2 before)")
    assert step == EnvStep([{"role": "user", "content": "lower"}], True)
    assert env.state() == {"solved": False, "guesses": 2, "secret": 5}
    with pytest.raises(ConfigError, match="'secret'"):
        env.reset({"low": 1})


def test_guess_number_dataset_splits_and_determinism():
    train = guess_number_dataset(200, "train", seed=3)
    assert train == guess_number_dataset(200, "train", seed=3)
    assert train != guess_number_dataset(200, "train", seed=4)
    evals = guess_number_dataset(200, "eval")
    train_secrets = {row["secret"] for row in train}
    eval_secrets = {row["secret"] for row in evals}
    assert not train_secrets & eval_secrets
    assert all(is_eval_problem(f"guess a number in [1, 100]: {s}") for s in eval_secrets)
    assert all(1 <= s <= 100 for s in train_secrets | eval_secrets)
    row = train[0]
    assert {k: row[k] for k in ("low", "high", "difficulty", "task")} == {
        "low": 1,
        "high": 100,
        "difficulty": 1,
        "task": "guess",
    }
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    assert row["prompt"][1]["content"] == "I am thinking of a number between 1 and 100. Guess it."
    assert "<answer>" in row["prompt"][0]["content"]
    with pytest.raises(ConfigError, match="split"):
        guess_number_dataset(1, "test")


def test_guess_reward():
    states = [{"solved": True, "guesses": 3, "secret": 1}, {"solved": False}, None]
    assert guess_reward(["p"] * 3, ["c"] * 3, env_state=states) == [1.0, 0.0, 0.0]
    assert guess_reward.is_correctness is True


def nap(seconds: float) -> str:
    """Sleep, then say so.

    Args:
        seconds: How long to sleep.
    """
    time.sleep(seconds)
    return "awake"


def test_a_slow_tool_is_named_once_with_the_time_it_took(caplog):
    import logging

    def trusted_nap(seconds: float) -> str:
        """Sleep in process, then say so.

        Args:
            seconds: How long to sleep.
        """
        return nap(seconds)

    trusted_nap.trusted = True
    trusted_nap.__name__ = "nap"
    trusted = ToolBox([trusted_nap], slow_call_s=0.05)
    isolated = ToolBox([nap], slow_call_s=0.05)  # a forked child: the wait is timed the same
    off = ToolBox([nap], slow_call_s=None)
    with caplog.at_level(logging.WARNING, logger="groupwise.tools"):
        for box in (trusted, isolated, off):
            assert box.call(ToolCall("nap", {"seconds": 0.01})).text == "awake"  # fast: quiet
            for _ in range(2):  # slow twice: named once per box
                assert box.call(ToolCall("nap", {"seconds": 0.15})).text == "awake"
    messages = [r.getMessage() for r in caplog.records if "slow_call_warning" in r.getMessage()]
    assert len(messages) == 2
    for message in messages:
        assert message.startswith("tool 'nap' took ")
        assert 0.1 <= float(message.split(" took ")[1].split(" s ")[0]) < 2.0
        assert "slow_call_warning=0.05 s" in message and "tool_timeout=10 s" in message


def test_assistant_message_is_trls_parsed_turn():
    from groupwise.tools.calls import assistant_message, assistant_text

    add_call = ToolCall("add", {"a": 1, "b": 2})
    calc = ToolCall("calculator", {"expression": "2 * 3"})
    text = "I will add.\n" + format_tool_call(add_call) + "\n" + format_tool_call(calc) + "\n"
    message = assistant_message(text)
    # TRL's parse_response (Qwen3 schema): the text before the calls, less one newline; the
    # calls in transformers' chat shape, arguments as objects.
    assert message == {
        "role": "assistant",
        "content": "I will add.",
        "tool_calls": [
            {"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}},
            {"type": "function",
             "function": {"name": "calculator", "arguments": {"expression": "2 * 3"}}},
        ],
    }  # fmt: skip
    # The log shows the turn as written (up to the final whitespace).
    assert assistant_text(message) == text.strip()
    assert assistant_message(format_tool_call(calc))["content"] == ""
    # TRL's fallback, plain text: no call, a malformed block, or text after the calls.
    for plain in ("The answer is 6.",
                  format_tool_call(calc) + "<tool_call>not json</tool_call>",
                  format_tool_call(calc) + "\nso the answer is 6",
                  format_tool_call(calc) + " and " + format_tool_call(add_call)):  # fmt: skip
        assert assistant_message(plain) == {"role": "assistant", "content": plain}


def test_tool_content_is_the_returned_value_as_trl_passes_it():
    def rows(n: int) -> list:
        """Rows.

        Args:
            n: How many.
        """
        return [(i, f"r{i}") for i in range(n)]

    def record(key: str) -> dict:
        """A record.

        Args:
            key: The key.
        """
        return {"key": key, "ok": True}

    for trusted in (False, True):
        rows.trusted = record.trusted = trusted  # forked child, or in process
        box = ToolBox([rows, record], max_output_chars=40)
        result = box.call(ToolCall("rows", {"n": 2}))
        # The list itself (tuples as lists through the child's JSON); the model sees JSON.
        assert result.content == ([(0, "r0"), (1, "r1")] if trusted else [[0, "r0"], [1, "r1"]])
        assert result.text == '[[0, "r0"], [1, "r1"]]'
        # Other values: str(value), as TRL's tool loop writes them.
        result = box.call(ToolCall("record", {"key": "k"}))
        assert result.content == "{'key': 'k', 'ok': True}" == str({"key": "k", "ok": True})
        # A list whose text is cut: the content is the cut text the model saw.
        result = box.call(ToolCall("rows", {"n": 9}))
        assert result.content == result.text and result.text.endswith("chars]")
        failed = box.call(ToolCall("rows", {}))
        assert failed.content == failed.text and failed.text.startswith("error: ")
