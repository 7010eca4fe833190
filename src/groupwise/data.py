"""Prompt datasets and chat templating.

A dataset is any sized, indexable collection of rows (dicts): a list, or a Hugging Face
``datasets.Dataset``. Each row has a ``prompt`` (a string, or a conversation as a list of
``{"role", "content"}`` messages) and any other columns (e.g. ``answer``), which are passed to
reward functions by name, as in TRL.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerBase

SYSTEM_PROMPT = (
    "You are a careful calculator. Think step by step inside <think> </think>, "
    "then give only the final number inside <answer> </answer>."
)
# One worked example as a prior chat turn: SmolLM2-135M-Instruct writes no tags from a system
# prompt alone (every reward would be 0), but it copies the format from an example.
WORKED_EXAMPLE = [
    {"role": "user", "content": "What is 4 * 2 - 1?"},
    {"role": "assistant", "content": "<think> 4 * 2 = 8, 8 - 1 = 7 </think> <answer> 7 </answer>"},
]


def is_conversational(prompt: Any) -> bool:
    return (
        isinstance(prompt, list)
        and len(prompt) > 0
        and all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt)
    )


def prompt_text(prompt: Any, tokenizer: PreTrainedTokenizerBase) -> str:
    """The text fed to the model: the chat template with a generation prompt for conversations
    (as TRL does), the string itself otherwise."""
    if is_conversational(prompt):
        return tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
    if isinstance(prompt, str):
        return prompt
    raise TypeError(f"prompt must be a string or a list of messages, got {type(prompt).__name__}")


def tokenize_prompts(
    prompts: Sequence[Any], tokenizer: PreTrainedTokenizerBase, max_prompt_length: int | None
) -> list[list[int]]:
    """Token ids of each prompt, keeping the last ``max_prompt_length`` tokens (left truncation
    keeps the question and the generation prompt, as TRL does)."""
    ids = []
    for prompt in prompts:
        # The chat template already holds the special tokens; don't add a second BOS.
        tokens = tokenizer(prompt_text(prompt, tokenizer), add_special_tokens=False)["input_ids"]
        if max_prompt_length is not None and len(tokens) > max_prompt_length:
            tokens = tokens[-max_prompt_length:]
        ids.append(tokens)
    return ids


# --------------------------------------------------------------------------------------------
# Task: integer arithmetic with a difficulty knob.


def _is_eval_expression(expression: str, eval_fraction: float) -> bool:
    # The split is a function of the problem text alone, so train and eval never overlap,
    # whatever seeds or sizes are asked for.
    digest = hashlib.sha256(expression.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < eval_fraction


def arithmetic_expression(rng: random.Random, digits: int, num_operands: int, ops: str) -> str:
    low = 0 if digits == 1 else 10 ** (digits - 1)
    high = 10**digits - 1
    parts = [str(rng.randint(low, high))]
    for _ in range(num_operands - 1):
        parts += [rng.choice(ops), str(rng.randint(low, high))]
    return " ".join(parts)


def arithmetic_dataset(
    num_problems: int,
    split: str = "train",
    seed: int = 0,
    digits: int = 1,
    min_operands: int = 2,
    max_operands: int = 2,
    ops: str = "+-*",
    eval_fraction: float = 0.25,
    few_shot: bool = True,
) -> list[dict[str, Any]]:
    """Seeded integer arithmetic problems, e.g. ``What is 7 * 3 - 2?``, as conversational rows
    ``{"prompt", "answer", "difficulty", "expression"}``. The ``train`` and ``eval`` splits
    never share an expression. Problems are distinct within a split; if the space is too small
    for ``num_problems``, a ValueError says how many exist."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    if digits < 1 or min_operands < 2 or max_operands < min_operands:
        raise ValueError(
            f"need digits >= 1 and 2 <= min_operands <= max_operands, got digits={digits}, "
            f"min_operands={min_operands}, max_operands={max_operands}"
        )
    if not ops or set(ops) - set("+-*"):
        raise ValueError(f"ops must be a non-empty subset of '+-*', got {ops!r}")
    rng = random.Random(f"arithmetic-{split}-{seed}")
    want_eval = split == "eval"
    seen: set[str] = set()
    rows = []
    attempts = 0
    while len(rows) < num_problems:
        attempts += 1
        if attempts > 200 * num_problems + 10_000:
            raise ValueError(
                f"arithmetic task: only {len(rows)} distinct {split} problems exist with "
                f"digits={digits}, operands {min_operands}-{max_operands}, ops={ops!r}; "
                f"asked for {num_problems}"
            )
        num_operands = rng.randint(min_operands, max_operands)
        expression = arithmetic_expression(rng, digits, num_operands, ops)
        if expression in seen or _is_eval_expression(expression, eval_fraction) != want_eval:
            continue
        seen.add(expression)
        value = eval(expression, {"__builtins__": {}})  # digits and + - * only: safe
        messages = [{"role": "system", "content": SYSTEM_PROMPT}]
        if few_shot:
            messages += [dict(m) for m in WORKED_EXAMPLE]
        messages.append({"role": "user", "content": f"What is {expression}?"})
        rows.append(
            {
                "prompt": messages,
                "answer": str(value),
                "difficulty": digits * 10 + num_operands,
                "expression": expression,
            }
        )
    return rows


def load_jsonl(path: str | Path, prompt_column: str = "prompt") -> list[dict[str, Any]]:
    """Rows of a JSONL file; every row must be an object with a ``prompt_column`` that is a
    string or a list of messages. Errors name the file and line."""
    rows = []
    with open(path, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{line_no}: not valid JSON ({err.msg})") from None
            if not isinstance(row, dict) or prompt_column not in row:
                raise ValueError(
                    f"{path}:{line_no}: expected an object with a {prompt_column!r} key"
                )
            prompt = row[prompt_column]
            if not (isinstance(prompt, str) or is_conversational(prompt)):
                raise ValueError(
                    f"{path}:{line_no}: {prompt_column!r} must be a string or a list of "
                    "{'role', 'content'} messages"
                )
            if prompt_column != "prompt":
                row["prompt"] = row.pop(prompt_column)
            rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no rows")
    return rows


TASKS = ("arithmetic",)
