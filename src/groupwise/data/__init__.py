"""Prompt datasets: loading and checking data files (:mod:`.files`, :mod:`.rows`), chat
templating and prompt tokens (:mod:`.prompts`) and the train / eval split of generated tasks
(:mod:`.splits`). Their public names are importable from here; the built-in tasks, the
arithmetic one among them, are in :mod:`groupwise.tasks`.

A dataset is any sized, indexable collection of rows (dicts): a list, or a Hugging Face
``datasets.Dataset``. Each row has a ``prompt`` (a string, or a conversation as a list of
``{"role", "content"}`` messages) and any other columns (e.g. ``answer``), which are passed to
reward functions by name, as in TRL.
"""

from __future__ import annotations

from .files import load_jsonl, read_text
from .prompts import (
    CHAT_ROLES,
    count_long_prompts,
    filter_long_prompts,
    is_conversational,
    prompt_text,
    tokenize_prompts,
)
from .rows import LoadReport, load_dataset_rows
from .splits import STALL_DRAWS, check_split, is_eval_problem

__all__ = [
    "CHAT_ROLES",
    "STALL_DRAWS",
    "LoadReport",
    "check_split",
    "count_long_prompts",
    "filter_long_prompts",
    "is_conversational",
    "is_eval_problem",
    "load_dataset_rows",
    "load_jsonl",
    "prompt_text",
    "read_text",
    "tokenize_prompts",
]
