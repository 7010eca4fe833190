"""Multi-turn tool use: tool schemas, the tool-call format, safe execution and environments."""

from .builtin import BUILTIN_TOOLS, calculator, python, resolve_tools
from .calls import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, ToolCall, format_tool_call, parse_tool_calls
from .environment import (
    ENVIRONMENTS,
    Environment,
    EnvStep,
    GuessNumberEnvironment,
    ToolEnvironment,
    guess_number_dataset,
    guess_reward,
)
from .schema import tool_name, tool_schema
from .toolbox import ToolBox, ToolResult

__all__ = [
    "BUILTIN_TOOLS",
    "ENVIRONMENTS",
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "EnvStep",
    "Environment",
    "GuessNumberEnvironment",
    "ToolBox",
    "ToolCall",
    "ToolEnvironment",
    "ToolResult",
    "calculator",
    "format_tool_call",
    "guess_number_dataset",
    "guess_reward",
    "parse_tool_calls",
    "python",
    "resolve_tools",
    "tool_name",
    "tool_schema",
]
