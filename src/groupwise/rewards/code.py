"""Code-execution rewards: run the completion's code against the row's tests in a sandbox.

``code_reward`` is the fraction of the row's tests that pass, ``code_reward_binary`` is 1.0 only
if all of them pass; rows without tests get None (not applicable). :func:`make_code_reward`
builds configured variants, :func:`run_tests` runs one piece of code against one set of tests.
The sandbox's names (:func:`sandbox_info`, :func:`run_program`, the result types) are importable
from here too.

Code: the completion's **last** fenced block tagged ``python``/``py``/``python3``/``py3`` or
untagged (```` ```python ... ``` ```` / ```` ``` ... ``` ````; the fences on lines of their own,
indented fences are dedented; a trailing fence left open by a truncated completion counts as
closed at the end). Blocks tagged with another language are ignored. Without any such block the
whole completion is the code.

Tests (the ``tests`` column; ``tests_column`` renames it). Accepted forms, anything else raises
``ValueError``:

- **assert tests** - the solution runs once as module ``solution`` (so an
  ``if __name__ == "__main__":`` block does not run) in one sandbox; the tests run in another
  (the judge), each in its own try/except, and pass when they raise nothing. In the judge the
  solution's names forward calls to it and get back values (plain data, rebuilt in the judge;
  other objects as handles that equal nothing of the judge's), so the tests and their expected
  values never reach the solution (docs/sandbox.md).

  - a list of strings: each non-blank string is one test (a statement or a block of
    statements, e.g. ``"x = f(3)\\nassert x == 9"``);
  - one string of Python: every top-level ``assert`` statement is one test (it may span several
    lines); the other top-level statements (imports, helper definitions, assignments) are setup
    that runs in order between the tests and is not counted. A string without any ``assert``
    is a single test. A string that does not parse as Python is split into lines, each non-blank,
    non-comment line one test.

- **stdin/stdout tests** - the solution runs as ``__main__`` once per case, in its own sandbox
  process, with the case's input as stdin; a case passes when the process exits with status 0
  and its stdout equals the expected output up to trailing whitespace on each line, ``\\r\\n``
  line ends and trailing blank lines. The expected output never enters the sandbox.

  - a list of ``{"input": str, "output": str}`` dicts;
  - a dict ``{"inputs": [str, ...], "outputs": [str, ...]}`` (APPS/TACO style);
  - a single ``{"input": str, "output": str}`` dict;
  - a JSON string encoding any of the above (or a JSON list of assert strings).

  Call-based APPS tests (a dict with ``fn_name``) are not supported.

- missing tests - ``None``, NaN, an empty or blank string, an empty list or dict: the reward is
  None for that row; :func:`run_tests` refuses them with ``ValueError``.

Limits (per completion): ``timeout_s`` is the CPU-time budget for *all* of a completion's tests,
its processes together, so a busy machine or a busy sibling does not fail it; a run that sleeps
or blocks is stopped after three times that in wall-clock time (the assert tests after one that
hangs fail; stdin/stdout cases run one after the other on the remaining budget and those after
it is spent fail). Memory (``memory_mb``) and processes (``max_processes``) are limited per
sandbox by a cgroup where the host allows one, and per process by rlimits in any case
(``RLIMIT_AS``, ``RLIMIT_NPROC``, ``RLIMIT_CPU``; ``RLIMIT_FSIZE`` = 64 MiB, ``RLIMIT_NOFILE`` =
256, no core dumps); the trainer keeps at most ``max_output_bytes`` of output and kills the
sandbox as soon as it is exceeded.

Sandbox (:mod:`groupwise.sandbox`, shared with the ``python`` tool): each test run starts
fresh interpreters in child processes, in their own namespaces where the kernel allows them, in
a filesystem that holds only the interpreter's files, under a cgroup per sandbox where the host
allows one, as dedicated unprivileged uids when the trainer is root, behind a seccomp filter,
with an empty environment, a private working directory and no network. What each layer
defends against and its limits: docs/sandbox.md. If no sandbox can be built the reward raises
:class:`~groupwise.sandbox.SandboxUnavailableError` rather than run untrusted code unsandboxed; a
sandbox that failed to start scores None, never 0, and the reward raises if that happens to every
completion of a batch.
"""

from __future__ import annotations

import ast
import concurrent.futures
import json
import logging
import math
import os
import re
import textwrap
from collections.abc import Sequence
from typing import Any

from .. import sandbox
from ..sandbox import (
    ParsedTests,
    ProgramResult,
    SandboxInfo,
    SandboxResult,
    SandboxUnavailableError,
    run_program,
    sandbox_info,
)
from .basic import RewardFunc, completion_text

logger = logging.getLogger("groupwise.rewards")

__all__ = [
    "ProgramResult",
    "SandboxInfo",
    "SandboxResult",
    "SandboxUnavailableError",
    "code_reward",
    "code_reward_binary",
    "extract_code",
    "make_code_reward",
    "parse_tests",
    "run_program",
    "run_tests",
    "sandbox_info",
]


# ------------------------------------------------------------------------------------------------
# Code extraction and test parsing

_FENCE = re.compile(
    r"^[ \t]*```[ \t]*(?P<lang>[\w+.-]*)[^\n]*\n(?P<body>.*?)^[ \t]*```[ \t\r]*$",
    re.MULTILINE | re.DOTALL,
)
_OPEN_FENCE = re.compile(r"^[ \t]*```[ \t]*(?P<lang>[\w+.-]*)[^\n]*\n(?P<body>.*)\Z", re.M | re.S)
_PYTHON_TAGS = {"", "python", "py", "python3", "py3"}


def extract_code(text: str) -> str:
    """The last fenced Python (or untagged) code block of ``text``; the whole text if none."""
    last = None
    end = 0
    for match in _FENCE.finditer(text):
        end = match.end()
        if match.group("lang").lower() in _PYTHON_TAGS:
            last = match.group("body")
    tail = _OPEN_FENCE.search(text, end)
    if tail is not None and tail.group("lang").lower() in _PYTHON_TAGS:
        last = tail.group("body")  # a truncated completion: the open fence runs to the end
    if last is None:
        return text
    return textwrap.dedent(last)


def _is_missing(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, float) and math.isnan(value):
        return True
    if isinstance(value, str):
        return not value.strip()
    if isinstance(value, (list, tuple, dict)):
        return len(value) == 0
    return False


def _split_assert_source(source: str) -> tuple[tuple[str, str], ...]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        lines = [line.strip() for line in source.splitlines()]
        return tuple(("test", line) for line in lines if line and not line.startswith("#"))
    if not any(isinstance(node, ast.Assert) for node in tree.body):
        return (("test", source),)
    lines = source.encode("utf-8").splitlines(keepends=True)  # ast columns are UTF-8 offsets
    items = []
    for node in tree.body:
        decorators = getattr(node, "decorator_list", [])
        if decorators:  # a decorated definition starts at its first "@", always on a new line
            start, col = min(d.lineno for d in decorators), 0
        else:
            start, col = node.lineno, node.col_offset
        end, end_col = node.end_lineno or node.lineno, node.end_col_offset or 0
        if start == end:
            text = lines[start - 1][col:end_col]
        else:
            text = lines[start - 1][col:] + b"".join(lines[start : end - 1])
            text += lines[end - 1][:end_col]
        kind = "test" if isinstance(node, ast.Assert) else "setup"
        items.append((kind, text.decode("utf-8")))
    return tuple(items)


def _io_case(case: Any) -> tuple[str, str]:
    if not isinstance(case, dict) or "input" not in case or "output" not in case:
        raise ValueError(f"a stdin/stdout test must be a dict with 'input' and 'output': {case!r}")
    stdin, stdout = case["input"], case["output"]
    if not isinstance(stdin, str) or not isinstance(stdout, str):
        raise ValueError("stdin/stdout test 'input' and 'output' must be strings")
    return stdin, stdout


def parse_tests(tests: Any) -> ParsedTests | None:
    """Normalise a ``tests`` value (see the module docstring for the forms); None if missing."""
    if _is_missing(tests):
        return None
    if isinstance(tests, str):
        stripped = tests.strip()
        if stripped[0] in "[{":
            try:
                decoded = json.loads(stripped)
            except ValueError:
                decoded = None
            if isinstance(decoded, (list, dict)):
                return parse_tests(decoded)
        items = _split_assert_source(tests)
        return ("asserts", items) if items else None
    if isinstance(tests, dict):
        if "fn_name" in tests:
            raise ValueError("call-based tests (fn_name) are not supported; use assert tests")
        if "inputs" in tests or "outputs" in tests:
            inputs, outputs = tests.get("inputs"), tests.get("outputs")
            if not isinstance(inputs, list) or not isinstance(outputs, list):
                raise ValueError("'inputs' and 'outputs' must both be lists")
            if len(inputs) != len(outputs):
                raise ValueError(f"{len(inputs)} inputs but {len(outputs)} outputs")
            if not inputs:
                return None
            cases = [{"input": i, "output": o} for i, o in zip(inputs, outputs, strict=True)]
            return ("io", tuple(_io_case(c) for c in cases))
        return ("io", (_io_case(tests),))
    if isinstance(tests, (list, tuple)):
        if all(isinstance(t, str) for t in tests):
            items = tuple(("test", textwrap.dedent(t)) for t in tests if t.strip())
            return ("asserts", items) if items else None
        if all(isinstance(t, dict) for t in tests):
            return ("io", tuple(_io_case(t) for t in tests))
        raise ValueError("a list of tests must hold only strings (asserts) or only dicts (I/O)")
    raise ValueError(f"unsupported tests value of type {type(tests).__name__}")


# ------------------------------------------------------------------------------------------------
# Running tests and the reward


def run_tests(
    code: str,
    tests: Any,
    *,
    timeout_s: float = 5.0,
    memory_mb: float = 512,
    max_output_bytes: int = 1_000_000,
    max_processes: int = 32,
) -> SandboxResult:
    """Run ``code`` (plain source, no extraction) against ``tests`` in the sandbox.

    ``tests`` takes any form of the module docstring; ``timeout_s`` is the CPU-time budget for
    all of them (with a wall-clock backstop of three times that). Raises ``ValueError`` for
    missing or malformed tests and :class:`SandboxUnavailableError` when this machine cannot
    sandbox code.
    """
    sandbox.check_limits(timeout_s, memory_mb, max_output_bytes, max_processes)
    parsed = parse_tests(tests)
    if parsed is None:
        raise ValueError("no tests to run")
    return sandbox.run_parsed(
        code,
        parsed,
        sandbox_info(),
        timeout_s=timeout_s,
        memory_mb=memory_mb,
        max_output_bytes=max_output_bytes,
        max_processes=max_processes,
    )


def make_code_reward(
    timeout_s: float = 5.0,
    memory_mb: float = 512,
    max_output_bytes: int = 1_000_000,
    max_workers: int | None = None,
    binary: bool = False,
    tests_column: str = "tests",
    max_processes: int = 32,
) -> RewardFunc:
    """A reward function (TRL signature) scoring each completion's code on its row's tests.

    Score: fraction of tests passed, or with ``binary`` 1.0 only if all pass. None for rows
    without tests and for completions whose sandbox failed to start (logged); raises if the
    sandbox failed to start for every completion of a call. Completions run in parallel on
    ``max_workers`` threads (default ``min(4, os.cpu_count())``), each driving one sandbox
    process at a time; identical (code, tests) pairs in one call are run once.
    """
    sandbox.check_limits(timeout_s, memory_mb, max_output_bytes, max_processes)
    workers = max_workers if max_workers is not None else min(4, os.cpu_count() or 1)
    if workers < 1:
        raise ValueError(f"max_workers must be >= 1, got {workers}")
    limits = {
        "timeout_s": timeout_s,
        "memory_mb": memory_mb,
        "max_output_bytes": max_output_bytes,
        "max_processes": max_processes,
    }

    def reward(
        prompts: Sequence[Any], completions: Sequence[Any], **columns: Any
    ) -> list[float | None]:
        n = len(completions)
        column = columns.get(tests_column)
        scores: list[float | None] = [None] * n
        if column is None:
            return scores
        if len(column) != n:
            raise ValueError(f"{len(column)} values in column {tests_column!r} for {n} completions")
        jobs: dict[tuple[str, ParsedTests], list[int]] = {}
        for i, (completion, tests) in enumerate(zip(completions, column, strict=True)):
            parsed = parse_tests(tests)
            if parsed is not None:
                key = (extract_code(completion_text(completion)), parsed)
                jobs.setdefault(key, []).append(i)
        if not jobs:
            return scores
        info = sandbox_info()

        def run(key: tuple[str, ParsedTests]) -> SandboxResult:
            return sandbox.run_parsed(key[0], key[1], info, **limits)

        keys = list(jobs)
        if workers == 1 or len(keys) == 1:
            results = [run(key) for key in keys]
        else:
            with concurrent.futures.ThreadPoolExecutor(
                max_workers=min(workers, len(keys)), thread_name_prefix="code-reward"
            ) as pool:
                results = list(pool.map(run, keys))
        failed = [r for r in results if r.setup_failed]
        if len(failed) == len(results):
            raise SandboxUnavailableError(f"the code sandbox failed to start: {failed[0].error}")
        for r in failed:
            logger.warning("code sandbox failed to start, reward None: %s", r.error)
        for key, result in zip(keys, results, strict=True):
            if result.setup_failed:
                continue
            value = (1.0 if result.all_passed else 0.0) if binary else result.fraction
            for i in jobs[key]:
                scores[i] = value
        return scores

    name = "code_reward_binary" if binary else "code_reward"
    reward.__name__ = reward.__qualname__ = name
    reward.__doc__ = (
        f"{'1.0 if all' if binary else 'Fraction'} of the {tests_column!r} tests passed by the "
        "completion's last Python code block, run in a sandbox; None without tests."
    )
    reward.is_correctness = True  # type: ignore[attr-defined]
    return reward


code_reward = make_code_reward()
code_reward_binary = make_code_reward(binary=True)
