"""Built-in tools: a safe calculator and a sandboxed Python interpreter.

Both are ``trusted`` (run in the trainer's process by :class:`~groupwise.tools.ToolBox`): the
calculator only walks an arithmetic syntax tree under size limits, ``python`` runs the code in
the sandbox the code reward also uses (:mod:`groupwise.sandbox`), which enforces its own limits.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import ConfigError
from ..imports import import_callable, is_import_spec
from ..sandbox import run_program
from .schema import tool_name

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 100
MAX_INT_DIGITS = 1000
_INT_LIMIT = 10**MAX_INT_DIGITS
_LIMIT_BITS = _INT_LIMIT.bit_length() + 1
_FLOAT_AS_INT_LIMIT = 1e15  # integral floats below this print as integers ("6/3" -> "2")

_BINARY_OPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY_OPS: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_ALLOWED = "numbers, + - * / // % **, unary + and -, and parentheses"


def _check_size(value: int | float) -> int | float:
    if isinstance(value, complex):  # (-8) ** 0.5
        raise ValueError("the result is not a real number")
    if isinstance(value, int) and abs(value) >= _INT_LIMIT:
        raise ValueError(f"the result has more than {MAX_INT_DIGITS} digits")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("the result is too large (not a finite number)")
    return value


def _power(base: int | float, exponent: int | float) -> int | float:
    if abs(exponent) > MAX_EXPONENT:
        raise ValueError(
            f"exponent {exponent} is too large (at most {MAX_EXPONENT} in absolute value)"
        )
    # Refuse before computing: base**exponent has at least (bits(base) - 1) * exponent + 1 bits,
    # and any int of _LIMIT_BITS bits is >= 10**MAX_INT_DIGITS.
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and base:
        if (abs(base).bit_length() - 1) * exponent + 1 >= _LIMIT_BITS:
            raise ValueError(f"the result has more than {MAX_INT_DIGITS} digits")
    return base**exponent


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY_OPS:
        return _UNARY_OPS[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY_OPS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            return _check_size(_power(left, right))
        return _check_size(_BINARY_OPS[type(node.op)](left, right))
    what = type(node).__name__ if not isinstance(node, ast.Constant) else repr(node.value)
    raise ValueError(f"unsupported element {what}; the calculator allows only {_ALLOWED}")


def format_number(value: int | float) -> str:
    """Exact ints; integral floats as ints; other floats to 12 significant digits."""
    if isinstance(value, int):
        return str(value)
    if value.is_integer() and abs(value) < _FLOAT_AS_INT_LIMIT:
        return str(int(value))
    return f"{value:.12g}"


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return its value.

    Args:
        expression: The expression, using numbers, + - * / // % ** and parentheses, e.g. "23 * 47".
    """
    if not isinstance(expression, str):
        raise ValueError(f"expression must be a string, got {type(expression).__name__}")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from None
    try:
        value = _evaluate(tree.body)
    except ZeroDivisionError:
        raise ValueError("division by zero") from None
    except OverflowError:
        raise ValueError("the result is too large") from None
    return format_number(value)


calculator.trusted = True  # type: ignore[attr-defined]

PYTHON_TIMEOUT_S = 5.0


def python(code: str) -> str:
    """Run a Python program in a sandbox and return what it prints to stdout.

    Args:
        code: The program's source code; print the values you want to see.
    """
    result = run_program(code, timeout_s=PYTHON_TIMEOUT_S)
    if result.status == "setup_failed":
        raise RuntimeError(result.stderr)  # not the program's fault: reported as a tool error
    notes = {
        "timeout": f"error: timed out after {PYTHON_TIMEOUT_S:g}s",
        "output_limit": "error: output limit exceeded, the program was stopped",
        "error": _last_line(result.stderr) or f"error: exit status {result.returncode}",
    }
    parts = [result.stdout.rstrip("\n")] if result.stdout.strip() else []
    if result.status in notes:
        parts.append(notes[result.status])
    return "\n".join(parts) if parts else "(no output)"


python.trusted = True  # type: ignore[attr-defined]


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


BUILTIN_TOOLS: dict[str, Callable[..., Any]] = {"calculator": calculator, "python": python}


def resolve_tools(specs: Sequence[str | Callable[..., Any]]) -> list[Callable[..., Any]]:
    """Tools from built-in names, ``"module:function"`` / ``"file.py:function"`` specs or
    callables (kept as given)."""
    tools: list[Callable[..., Any]] = []
    for spec in specs:
        if callable(spec):
            tools.append(spec)
        elif isinstance(spec, str) and spec in BUILTIN_TOOLS:
            tools.append(BUILTIN_TOOLS[spec])
        elif isinstance(spec, str) and is_import_spec(spec):
            tools.append(import_callable(spec, "tools"))
        else:
            raise ConfigError(
                f"tools: unknown tool {spec!r}; built-in tools are {', '.join(BUILTIN_TOOLS)}, "
                "or give a function as 'module:function' or 'path/to/file.py:function'"
            )
    for fn in tools:
        tool_name(fn)  # fail here, naming the spec list, rather than at the first rollout
    return tools
