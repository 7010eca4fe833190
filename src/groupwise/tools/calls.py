"""The tool-call text format (Qwen/Hermes style, used by most chat templates with tools):

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "23 * 47"}}
    </tool_call>

Parsing never raises: malformed blocks come back as error texts to show the model.
:func:`assistant_message` is an assistant turn as TRL hands it to reward functions: its tool
calls parsed into transformers' chat shape.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
_BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + ".*?" + re.escape(TOOL_CALL_CLOSE), re.S)


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


def format_tool_call(call: ToolCall) -> str:
    """The text of one call, exactly as a model following the format writes it."""
    payload = json.dumps({"name": call.name, "arguments": call.arguments})
    return f"{TOOL_CALL_OPEN}\n{payload}\n{TOOL_CALL_CLOSE}"


def _short(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def _parse_block(body: str) -> ToolCall | str:
    """One block's JSON as a ToolCall, or the error text."""
    try:
        data = json.loads(body)
    except json.JSONDecodeError as err:
        return f"error: tool call is not valid JSON ({err.msg}): {_short(body)!r}"
    if not isinstance(data, dict):
        return f"error: tool call must be a JSON object, got {type(data).__name__}"
    name = data.get("name")
    if not isinstance(name, str) or not name:
        return 'error: tool call needs a "name" string'
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):  # some models JSON-encode the arguments a second time
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return f'error: "arguments" of tool call {name!r} is a string that is not JSON'
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return f'error: "arguments" of tool call {name!r} must be an object'
    return ToolCall(name, arguments)


def parse_tool_calls(text: str) -> tuple[list[ToolCall], list[str]]:
    """Every ``<tool_call>...</tool_call>`` block of ``text`` in order, and one error text per
    malformed block (an unclosed block at the end included). ``([], [])`` without blocks."""
    calls: list[ToolCall] = []
    errors: list[str] = []
    pos = 0
    while (start := text.find(TOOL_CALL_OPEN, pos)) >= 0:
        body_start = start + len(TOOL_CALL_OPEN)
        end = text.find(TOOL_CALL_CLOSE, body_start)
        if end < 0:
            errors.append(f"error: unclosed {TOOL_CALL_OPEN} (end it with {TOOL_CALL_CLOSE})")
            break
        parsed = _parse_block(text[body_start:end].strip())
        if isinstance(parsed, ToolCall):
            calls.append(parsed)
        else:
            errors.append(parsed)
        pos = end + len(TOOL_CALL_CLOSE)
    return calls, errors


def chat_tool_calls(calls: list[ToolCall]) -> list[dict[str, Any]]:
    """Calls in transformers' chat shape (what chat templates render and TRL's rewards read):
    ``[{"type": "function", "function": {"name": ..., "arguments": {...}}}]``."""
    return [
        {"type": "function", "function": {"name": c.name, "arguments": dict(c.arguments)}}
        for c in calls
    ]


def assistant_message(text: str) -> dict[str, Any]:
    """An assistant turn as TRL 1.16's tool loop passes it on (``parse_response`` with the
    Qwen3 response schema): when the turn is text, then well-formed ``<tool_call>`` blocks and
    nothing after them, ``content`` is the text before the first block (less the newline that
    separates them) and ``tool_calls`` the parsed calls; any other turn (no call, a malformed
    block, text after the calls) is ``{"role": "assistant", "content": text}``, as TRL's
    fallback decodes it."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    calls, errors = parse_tool_calls(text)
    start = text.find(TOOL_CALL_OPEN)
    only_calls = not _BLOCK.sub("", text[start:]).strip()  # whitespace between and after
    if calls and not errors and only_calls:
        message["content"] = text[:start].removesuffix("\n")
        message["tool_calls"] = chat_tool_calls(calls)
    return message


def assistant_text(message: dict[str, Any]) -> str:
    """An assistant message as the turn was written: its content, then its parsed tool calls
    in the ``<tool_call>`` format."""
    calls = [ToolCall(c["function"]["name"], c["function"]["arguments"])
             for c in message.get("tool_calls", ())]  # fmt: skip
    return "\n".join(t for t in [message["content"], *map(format_tool_call, calls)] if t)


def content_text(content: Any) -> str:
    """A message's content as text: a tool's returned list (TRL's tool-message content) as JSON,
    as the model is shown it."""
    return content if isinstance(content, str) else json.dumps(content, default=str)
