"""Function schemas for tools: what the chat template shows the model about each tool.

The schema is the OpenAI/transformers function format built by
``transformers.utils.get_json_schema`` from the function's type hints and its Google-style
docstring (a summary line and an ``Args:`` section describing every argument).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import ConfigError


def tool_name(fn: Callable[..., Any]) -> str:
    """The name the model calls a tool by: the function's ``__name__``."""
    name = getattr(fn, "__name__", None)
    if not isinstance(name, str) or not name.isidentifier():
        raise ConfigError(f"tools: {fn!r} has no usable __name__; give the tool a plain function")
    return name


def tool_schema(fn: Callable[..., Any]) -> dict[str, Any]:
    """``{"type": "function", "function": {"name", "description", "parameters", ...}}``.

    Raises ConfigError naming the function when it lacks type hints or a docstring with an
    ``Args:`` entry per argument (the schema cannot be built without them).
    """
    from transformers.utils import get_json_schema  # heavy import, only when tools are used

    name = tool_name(fn)
    try:
        return get_json_schema(fn)
    except Exception as err:  # transformers raises its own parsing exceptions, not ValueError
        raise ConfigError(
            f"tools: cannot build the schema of tool {name!r}: {err}. A tool needs type hints "
            "on every argument and a Google-style docstring (a summary line, then an 'Args:' "
            "section describing each argument)"
        ) from err
