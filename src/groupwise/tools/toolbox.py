"""Executing tool calls without letting the model or the tool hurt the trainer.

:meth:`ToolBox.call` never raises for anything the model writes or the tool does: an unknown
tool, arguments that do not fit the signature, a tool that raises, hangs, prints, dies or
returns something huge or not text all become a :class:`ToolResult` whose text (``error: ...``)
is fed back to the model.

User tools run in a forked child process (its own process group, stdout/stderr on /dev/null,
SIGKILLed past ``timeout_s``), the result truncated in the child and sent back through a pipe.
Tools marked ``fn.trusted = True`` (the built-ins: pure or sandboxed themselves) run in-process,
with the same containment of exceptions, output types and sizes; they enforce their own
timeouts. Forking copies the trainer's memory lazily (copy-on-write), but its page tables
eagerly: an isolated call cost ~15-20 ms in a 0.4 GB process and ~40 ms in a 1.4 GB one (a
trusted call ~0.02 ms), so cheap pure tools are worth marking trusted. A tool must not rely on
threads or locks of the parent (only the calling thread exists in the child) and, the child
being a daemon process, cannot start ``multiprocessing`` children (``subprocess`` works).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from .calls import ToolCall
from .schema import tool_name, tool_schema

_JSON_TYPES = (bool, int, float, list, dict, type(None))
# A user function (a tool here, a reward function in groupwise.rewards.scoring) whose one call
# took longer than this is named, once, with the time it took (the slow_call_warning option):
# a slow user function is otherwise an unexplained slow step.
SLOW_CALL_WARNING_S = 5.0
logger = logging.getLogger("groupwise.tools")


@dataclass
class ToolResult:
    """One call's outcome; ``text`` goes back to the model, ``error`` is set when it failed.
    ``content`` is what the conversation's tool message holds for the reward functions, as TRL's
    tool loop builds it: the list the tool returned (an isolated tool's through JSON, so its
    tuples arrive as lists), else ``str`` of the value; the text when the call failed."""

    name: str
    text: str
    error: str | None = None
    content: Any = None

    def __post_init__(self) -> None:
        if self.content is None:
            self.content = self.text


def truncate(text: str, max_chars: int) -> str:
    """``text`` cut to ``max_chars`` characters plus a marker saying how many were dropped."""
    if len(text) <= max_chars:
        return text
    return f"{text[:max_chars]}... [truncated {len(text) - max_chars} chars]"


def to_text(value: Any) -> tuple[str, str | None]:
    """(text, error) for a tool's return value: str as is, JSON types dumped, others refused."""
    if isinstance(value, str):
        return value, None
    if isinstance(value, _JSON_TYPES):
        try:
            return json.dumps(value), None
        except (TypeError, ValueError) as err:
            return "", f"tool returned a {type(value).__name__} that is not JSON: {err}"
    return "", f"tool returned {type(value).__name__}, expected text"


def _describe(exc: BaseException) -> str:
    message = str(exc)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def resolved(value: Any) -> Any:
    """``value``, awaited when it is awaitable (an ``async def`` tool's or method's result, run
    to completion on a fresh event loop, as TRL runs async tools)."""
    if inspect.isawaitable(value):
        return asyncio.run(_awaited(value))
    return value


async def _awaited(value: Any) -> Any:
    return await value


def _run_contained(
    fn: Callable[..., Any], arguments: dict[str, Any], max_chars: int
) -> tuple[str, str | None, Any]:
    """Call ``fn`` (awaiting an ``async def`` tool) and turn any outcome into (text, error,
    content), text and error truncated; content is TRL's tool-message content: a returned list
    as is (None, i.e. the text, when its text is cut), else the value's ``str``, truncated."""
    try:
        value = resolved(fn(**arguments))
        text, error = to_text(value)
    except Exception as exc:
        value, text, error = None, "", _describe(exc)
    if error is not None:
        return "", truncate(error, max_chars), None
    if isinstance(value, list):  # as is; cut, it is the text the model is shown
        return truncate(text, max_chars), None, value if len(text) <= max_chars else None
    return truncate(text, max_chars), None, truncate(str(value), max_chars)


def _child_main(
    conn: Any, fn: Callable[..., Any], arguments: dict[str, Any], max_chars: int
) -> None:
    """Runs in the forked child: silence output, run the tool, send (text, error), exit."""
    os.setpgid(0, 0)  # own group: a timeout kills whatever the tool started too
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    # Python-level streams too: they may not write to fds 1/2 (e.g. under pytest capture).
    sys.stdout = sys.stderr = open(os.devnull, "w")
    try:
        result = _run_contained(fn, arguments, max_chars)
    except BaseException as exc:  # SystemExit, KeyboardInterrupt from the tool
        result = ("", truncate(_describe(exc), max_chars), None)
    try:
        conn.send_bytes(json.dumps(result).encode())  # JSON, not pickle: nothing to unpickle
    finally:
        os._exit(0)  # skip atexit handlers and buffers inherited from the trainer


class ToolBox:
    """Named tools and their safe execution. ``stats``: counts of calls, errors, timeouts."""

    def __init__(
        self,
        tools: Sequence[Callable[..., Any]],
        timeout_s: float = 10.0,
        max_output_chars: int = 4000,
        slow_call_s: float | None = SLOW_CALL_WARNING_S,
    ) -> None:
        if not timeout_s > 0:
            raise ConfigError(f"tool timeout_s must be > 0, got {timeout_s}")
        if max_output_chars < 1:
            raise ConfigError(f"tool max_output_chars must be >= 1, got {max_output_chars}")
        self._tools: dict[str, Callable[..., Any]] = {}
        for fn in tools:
            if not callable(fn):
                raise ConfigError(f"tools: {fn!r} is not callable; a tool is a function")
            name = tool_name(fn)
            if name in self._tools:
                raise ConfigError(f"tools: two tools are named {name!r}; tool names must differ")
            self._tools[name] = fn
        self.timeout_s, self.slow_call_s = timeout_s, slow_call_s
        self.max_output_chars = max_output_chars
        self._slow_logged: set[str] = set()
        self.stats = {"calls": 0, "errors": 0, "timeouts": 0}
        self._lock = threading.Lock()  # conversations may run tools from several threads
        self._schemas: list[dict[str, Any]] | None = None

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    @property
    def schemas(self) -> list[dict[str, Any]]:
        """Each tool's function schema (built once; ConfigError names an undocumented tool)."""
        if self._schemas is None:
            self._schemas = [tool_schema(fn) for fn in self._tools.values()]
        return self._schemas

    def call(self, call: ToolCall) -> ToolResult:
        """Run one call; failures come back as ``error: ...`` text, never as an exception."""
        timed_out = False
        fn = self._tools.get(call.name)
        if fn is None:
            error = f"unknown tool {call.name!r}; available: {', '.join(self._tools) or 'none'}"
        else:
            error = self._bind_error(fn, call)
        text, content, start = "", None, time.perf_counter()
        if error is None and fn is not None:
            if getattr(fn, "trusted", False):
                text, error, content = _run_contained(fn, call.arguments, self.max_output_chars)
            else:
                text, error, content, timed_out = self._run_isolated(fn, call)
        seconds = time.perf_counter() - start
        slow = self.slow_call_s is not None and seconds > self.slow_call_s and not timed_out
        with self._lock:
            self.stats["calls"] += 1
            self.stats["errors"] += error is not None
            self.stats["timeouts"] += timed_out
            first = slow and call.name not in self._slow_logged
            if first:
                self._slow_logged.add(call.name)
        if first:  # named once: every conversation waits for its calls
            logger.warning(
                "tool %r took %.1f s on one call (more than slow_call_warning=%g s); the "
                "conversations wait for it: make it faster (tool_timeout=%g s kills a call) "
                "(logged once)", call.name, seconds, self.slow_call_s, self.timeout_s,
            )  # fmt: skip
        if error is not None:
            return ToolResult(call.name, f"error: {error}", error)
        return ToolResult(call.name, text, content=content)

    @staticmethod
    def _bind_error(fn: Callable[..., Any], call: ToolCall) -> str | None:
        try:
            inspect.signature(fn).bind(**call.arguments)
        except TypeError as err:
            return f"bad arguments for tool {call.name!r}: {err}"
        return None

    def _run_isolated(
        self, fn: Callable[..., Any], call: ToolCall
    ) -> tuple[str, str | None, Any, bool]:
        """(text, error, content, timed_out) from running ``fn`` in a forked child."""
        ctx = multiprocessing.get_context("fork")
        receiver, sender = ctx.Pipe(duplex=False)
        args = (sender, fn, call.arguments, self.max_output_chars)
        proc = ctx.Process(target=_child_main, args=args, daemon=True)
        try:
            proc.start()
            sender.close()  # so that a child dying without a result reads as EOF here
            if not receiver.poll(self.timeout_s):
                _kill(proc)
                proc.join()
                return "", f"tool {call.name!r} timed out after {self.timeout_s:g}s", None, True
            try:
                result = _decode(receiver.recv_bytes())
            except (EOFError, OSError):
                result = None  # died before sending: its exit status says how
            # Kill whatever the tool left behind in its group. The child exits right after
            # sending; multiprocessing reaps it at the next start() (not waiting here saves the
            # several ms a big trainer process takes to tear down).
            if result is None:
                proc.join(timeout=1.0)  # its exit status tells what happened
            _kill(proc)
            if result is None:
                proc.join()
        finally:
            receiver.close()
            sender.close()
        if result is None:
            exited = f"tool {call.name!r} exited without a result ({_exit_text(proc)})"
            return "", exited, None, False
        text, error, content = result
        return text, error, content, False


def _decode(data: bytes) -> tuple[str, str | None, Any]:
    """The child's (text, error, content); anything else (the tool wrote to the pipe) is an
    error."""
    try:
        text, error, content = json.loads(data)
        if isinstance(text, str) and (error is None or isinstance(error, str)):
            return text, error, content
    except (ValueError, TypeError):
        pass
    return "", "the tool's result could not be read back", None


def _kill(proc: Any) -> None:
    """SIGKILL the child's process group (its id cannot be reused while the group has members
    or the child is unreaped) and the child itself."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if proc.exitcode is None:
        proc.kill()


def _exit_text(proc: Any) -> str:
    code = proc.exitcode
    if code is not None and code < 0:
        return f"killed by signal {-code}"
    return f"exit status {code}"
