"""Prompts as the model sees them: a conversation rendered by the chat template (with the
generation prompt, as TRL does) or a plain string, its token ids, and the length checks that
``max_prompt_length`` / ``long_prompts`` apply."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase

from ..errors import ModelLoadError

# The roles of a conversational prompt's messages (the OpenAI / Hugging Face chat format that
# chat templates read); others ("human", "gpt", ...) would be rendered wrongly or dropped.
CHAT_ROLES = ("system", "user", "assistant", "tool")


def is_conversational(prompt: Any) -> bool:
    return (
        isinstance(prompt, list)
        and len(prompt) > 0
        and all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt)
    )


def prompt_text(
    prompt: Any,
    tokenizer: PreTrainedTokenizerBase,
    template_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """The text fed to the model: the chat template with a generation prompt for conversations
    (as TRL does; ``template_kwargs``, TRL's ``chat_template_kwargs``, go to the template, e.g.
    Qwen3's ``enable_thinking``), the string itself otherwise."""
    if is_conversational(prompt):
        if getattr(tokenizer, "chat_template", "") is None:  # a stand-in may lack the field
            raise ModelLoadError(
                f"the tokenizer of model {getattr(tokenizer, 'name_or_path', '') or '?'!r} has "
                "no chat template, but the prompts are conversations (lists of role/content "
                "messages) and a chat template is what turns them into text. Use an instruct "
                "model (its tokenizer_config.json or chat_template.jinja holds one), set "
                "tokenizer.chat_template (and pass the tokenizer as processing_class), or use "
                "plain-text prompts (a string per row, e.g. prompt_template: 'Q: {prompt}\\nA:')"
            )
        return tokenizer.apply_chat_template(
            prompt, add_generation_prompt=True, tokenize=False, **(template_kwargs or {})
        )
    if isinstance(prompt, str):
        return prompt
    raise TypeError(f"prompt must be a string or a list of messages, got {type(prompt).__name__}")


def _prompt_token_ids(
    prompt: Any, tokenizer: PreTrainedTokenizerBase, render: Callable[[Any], str] | None = None
) -> list[int]:
    text = render(prompt) if render is not None else prompt_text(prompt, tokenizer)
    # The chat template already holds the special tokens; don't add a second BOS.
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def tokenize_prompts(
    prompts: Sequence[Any],
    tokenizer: PreTrainedTokenizerBase,
    max_prompt_length: int | None,
    render: Callable[[Any], str] | None = None,
) -> list[list[int]]:
    """Token ids of each prompt, keeping the last ``max_prompt_length`` tokens (left truncation
    keeps the question and the generation prompt, as TRL does). ``render`` turns a prompt into
    its text (default :func:`prompt_text`; with tools, one that shows them)."""
    ids = []
    for prompt in prompts:
        tokens = _prompt_token_ids(prompt, tokenizer, render)
        if max_prompt_length is not None and len(tokens) > max_prompt_length:
            tokens = tokens[-max_prompt_length:]
        ids.append(tokens)
    return ids


def filter_long_prompts(
    rows: Sequence[dict[str, Any]],
    tokenizer: PreTrainedTokenizerBase,
    max_prompt_length: int,
    on_long: str = "skip",
) -> tuple[list[dict[str, Any]], int]:
    """The rows whose prompt, as fed to the model (chat template and generation prompt, as in
    ``tokenize_prompts`` but untruncated), is at most ``max_prompt_length`` tokens, and how
    many were skipped. ``on_long="error"`` raises a ValueError naming the first long row's
    index and length instead of skipping (the trainer would otherwise cut its start)."""
    if on_long not in ("skip", "error"):
        raise ValueError(f"on_long must be 'skip' or 'error', got {on_long!r}")
    if max_prompt_length < 1:
        raise ValueError(f"max_prompt_length must be >= 1, got {max_prompt_length}")
    kept = []
    skipped = 0
    for index, row in enumerate(rows):
        length = len(_prompt_token_ids(row["prompt"], tokenizer))
        if length <= max_prompt_length:
            kept.append(row)
        elif on_long == "error":
            raise ValueError(
                f"row {index}: prompt is {length} tokens, longer than "
                f"max_prompt_length={max_prompt_length}"
            )
        else:
            skipped += 1
    return kept, skipped


def count_long_prompts(
    rows: Sequence[dict[str, Any]], tokenizer: PreTrainedTokenizerBase, max_prompt_length: int
) -> int:
    """How many prompts, as fed to the model, are longer than ``max_prompt_length`` tokens
    (with ``long_prompts: truncate`` the trainer cuts their start)."""
    return sum(len(_prompt_token_ids(row["prompt"], tokenizer)) > max_prompt_length for row in rows)
