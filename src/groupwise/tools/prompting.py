"""How the prompt shows the model its tools.

A chat template that supports tools (it reads a ``tools`` variable, as Qwen's, Llama 3's and
Mistral's do) renders the schemas itself: the prompt is ``apply_chat_template(messages,
tools=schemas)``, and the model calls a tool in the format it was trained on (Qwen/Hermes
``<tool_call>`` JSON for most). Other templates (SmolLM2's) get groupwise's documented default:
the instructions below appended to the system message, in the same ``<tool_call>`` format, and
a worked example per tool as prior chat turns, since a small model copies a format from an
example far more reliably than from a description.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase

from ..data.prompts import is_conversational

TOOL_INSTRUCTIONS = (
    "You can call tools. To call one, write\n"
    "<tool_call>\n"
    '{{"name": "<tool name>", "arguments": {{<arguments as JSON>}}}}\n'
    "</tool_call>\n"
    "and stop: the result comes back in the next message, then you continue. Tools:\n"
    "{schemas}"
)


def _calculator_example(a: int, b: int) -> list[dict[str, str]]:
    call = json.dumps({"name": "calculator", "arguments": {"expression": f"{a} * {b}"}})
    return [
        {"role": "user", "content": f"What is {a} * {b}?"},
        {"role": "assistant", "content": f"<tool_call>\n{call}\n</tool_call>"},
        {"role": "tool", "content": str(a * b)},
        {"role": "assistant", "content": f"<answer> {a * b} </answer>"},
    ]


# Worked conversations per built-in tool (shown when ``tool_examples`` is on). The calculator
# has two: SmolLM2-135M-Instruct copies the tool call from two examples far more often than
# from one (benchmarks/tool_use.py --examples 1 measures the difference).
EXAMPLES: dict[str, list[dict[str, str]]] = {
    "calculator": _calculator_example(12, 34) + _calculator_example(57, 89),
    "python": [
        {"role": "user", "content": "What is the sum of the squares of 1 to 10?"},
        {
            "role": "assistant",
            "content": '<tool_call>\n{"name": "python", "arguments": {"code": '
            '"print(sum(i * i for i in range(1, 11)))"}}\n</tool_call>',
        },
        {"role": "tool", "content": "385"},
        {"role": "assistant", "content": "<answer> 385 </answer>"},
    ],
}


def template_supports_tools(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the chat template renders a ``tools`` argument (transformers' convention)."""
    template = tokenizer.chat_template
    if isinstance(template, dict):  # named templates: the default one, or a "tool_use" one
        return "tool_use" in template or "tools" in str(template.get("default", ""))
    return isinstance(template, str) and "tools" in template


def tool_signature(schema: dict[str, Any]) -> str:
    """One line per tool, e.g. ``- calculator(expression: string): Evaluate ...``: shorter than
    the JSON schema (prompt tokens cost every rollout) and easier for a small model to read."""
    function = schema.get("function", schema)
    properties = function.get("parameters", {}).get("properties", {})
    args = ", ".join(f"{name}: {p.get('type', 'any')}" for name, p in properties.items())
    described = "; ".join(
        f"{name}: {p['description']}" for name, p in properties.items() if p.get("description")
    )
    line = f"- {function['name']}({args}): {function.get('description', '')}".rstrip(": ")
    return f"{line} ({described})" if described else line


def tool_instructions(schemas: Sequence[dict[str, Any]]) -> str:
    return TOOL_INSTRUCTIONS.format(schemas="\n".join(tool_signature(s) for s in schemas))


def examples_for(schemas: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    """The worked examples of the tools that have one, in order, as chat turns."""
    names = [s.get("function", s).get("name") for s in schemas]
    return [m for name in names for m in EXAMPLES.get(str(name), [])]


def _with_examples(
    messages: list[dict[str, Any]], examples: list[dict[str, str]]
) -> list[dict[str, Any]]:
    """Examples go after the system message (first), before the conversation."""
    if messages and messages[0].get("role") == "system":
        return [messages[0], *examples, *messages[1:]]
    return [*examples, *messages]


def prompt_text_with_tools(
    prompt: Any,
    tokenizer: PreTrainedTokenizerBase,
    schemas: Sequence[dict[str, Any]],
    examples: bool = True,
    template_kwargs: dict[str, Any] | None = None,
) -> str:
    """The prompt text with the tools shown (see the module docstring). A plain-string prompt
    gets the instructions (and examples, as text) in front of it."""
    shots = examples_for(schemas) if examples else []
    if isinstance(prompt, str):
        shown = "".join(f"{m['role']}: {m['content']}\n" for m in shots)
        return f"{tool_instructions(schemas)}\n\n{shown}{prompt}"
    if not is_conversational(prompt):
        raise TypeError(
            f"prompt must be a string or a list of messages, got {type(prompt).__name__}"
        )
    messages = [dict(m) for m in prompt]
    if template_supports_tools(tokenizer):
        return tokenizer.apply_chat_template(
            _with_examples(messages, shots),
            tools=list(schemas),
            add_generation_prompt=True,
            tokenize=False,
            **(template_kwargs or {}),
        )
    text = tool_instructions(schemas)
    if messages and messages[0].get("role") == "system":
        messages[0]["content"] = f"{messages[0]['content']}\n\n{text}"
    else:
        messages.insert(0, {"role": "system", "content": text})
    return tokenizer.apply_chat_template(
        _with_examples(messages, shots),
        add_generation_prompt=True,
        tokenize=False,
        **(template_kwargs or {}),
    )
