"""The tool-call text format (Qwen/Hermes style, used by most chat templates with tools):

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "23 * 47"}}
    </tool_call>

Parsing never raises: malformed blocks come back as error texts to show the model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"


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
