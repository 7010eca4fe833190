"""Prompt datasets and chat templating.

A dataset is any sized, indexable collection of rows (dicts): a list, or a Hugging Face
``datasets.Dataset``. Each row has a ``prompt`` (a string, or a conversation as a list of
``{"role", "content"}`` messages) and any other columns (e.g. ``answer``), which are passed to
reward functions by name, as in TRL.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import io
import itertools
import json
import math
import random
import string
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerBase

from .errors import ModelLoadError, TaskSizeError

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


# --------------------------------------------------------------------------------------------
# Task: integer arithmetic with a difficulty knob.


def is_eval_problem(text: str, eval_fraction: float = 0.25) -> bool:
    """Whether a problem (by its canonical text) belongs to the eval split. The split is a
    function of the text alone, so train and eval never overlap, whatever seeds or sizes."""
    digest = hashlib.sha256(text.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < eval_fraction


def arithmetic_expression(rng: random.Random, digits: int, num_operands: int, ops: str) -> str:
    low = 0 if digits == 1 else 10 ** (digits - 1)
    high = 10**digits - 1
    parts = [str(rng.randint(low, high))]
    for _ in range(num_operands - 1):
        parts += [rng.choice(ops), str(rng.randint(low, high))]
    return " ".join(parts)


# A generator that draws this many problems in a row without a new one has (all but surely)
# exhausted its space: the set of distinct problems it has found is its size.
STALL_DRAWS = 50_000
# Spaces up to this many expressions are counted exactly (hashing each: well under a second).
_COUNTABLE = 400_000


def _arithmetic_space(digits: int, min_operands: int, max_operands: int, ops: str) -> int:
    values = 10 if digits == 1 else 9 * 10 ** (digits - 1)
    return sum(values**k * len(ops) ** (k - 1) for k in range(min_operands, max_operands + 1))


@functools.lru_cache(maxsize=32)
def arithmetic_split_size(
    digits: int, min_operands: int, max_operands: int, ops: str, split: str,
    eval_fraction: float = 0.25,
) -> int | None:  # fmt: skip
    """How many distinct ``split`` problems the arithmetic task has with these settings (the
    split is a hash of the expression, so they are counted); None when the space is too large
    to count and far larger than any training set."""
    if _arithmetic_space(digits, min_operands, max_operands, ops) > _COUNTABLE:
        return None
    low = 0 if digits == 1 else 10 ** (digits - 1)
    numbers = [str(n) for n in range(low, 10**digits)]
    want_eval = split == "eval"
    count = 0
    for k in range(min_operands, max_operands + 1):
        for operands in itertools.product(numbers, repeat=k):
            for operators in itertools.product(ops, repeat=k - 1):
                parts = [operands[0]]
                for op, operand in zip(operators, operands[1:], strict=True):
                    parts += [op, operand]
                count += is_eval_problem(" ".join(parts), eval_fraction) == want_eval
    return count


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
    settings = f" with digits={digits}, operands {min_operands}-{max_operands}, ops={ops!r}"
    size = arithmetic_split_size(digits, min_operands, max_operands, ops, split, eval_fraction)
    if size is not None and num_problems > size:
        raise TaskSizeError("arithmetic", split, num_problems, size, hint=settings)
    rng = random.Random(f"arithmetic-{split}-{seed}")
    want_eval = split == "eval"
    seen: set[str] = set()
    rows = []
    misses = 0
    while len(rows) < num_problems:
        misses += 1
        if misses > STALL_DRAWS:
            raise TaskSizeError(
                "arithmetic", split, num_problems, len(rows), exact=False, hint=settings
            )
        num_operands = rng.randint(min_operands, max_operands)
        expression = arithmetic_expression(rng, digits, num_operands, ops)
        if expression in seen or is_eval_problem(expression, eval_fraction) != want_eval:
            continue
        seen.add(expression)
        misses = 0
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
    for line_no, line in enumerate(read_text(path).split("\n"), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{line_no}: not valid JSON ({err.msg})") from None
        if not isinstance(row, dict) or prompt_column not in row:
            raise ValueError(f"{path}:{line_no}: expected an object with a {prompt_column!r} key")
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


# --------------------------------------------------------------------------------------------
# Loading prompt datasets from files (JSONL, JSON, CSV, Parquet), HF datasets, or in memory.


@dataclass
class LoadReport:
    """What ``load_dataset_rows`` read and what it did with it: every row read is either kept
    or counted in ``skipped`` under a reason (nothing is dropped silently). ``examples`` keeps
    the first message seen for each skip reason."""

    source: str
    rows_read: int = 0
    rows_kept: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)

    def summary(self) -> str:
        total = sum(self.skipped.values())
        text = f"{self.source}: read {self.rows_read} rows, kept {self.rows_kept}, skipped {total}"
        if total:
            reasons = ", ".join(f"{reason}: {n}" for reason, n in sorted(self.skipped.items()))
            first = "; ".join(self.examples[reason] for reason in sorted(self.skipped))
            text += f" ({reasons}); first of each: {first}"
        return text


class _InvalidRow(Exception):
    """A row that ``on_invalid="skip"`` may skip: ``reason`` is the report's counter key."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


# One raw record as read: where it came from (for messages) and a dict, or the reason and
# message of a record that could not be read as a dict.
_Raw = tuple[str, "dict[str, Any] | _InvalidRow"]


def _columns_of(raws: list[_Raw]) -> list[str]:
    columns: dict[str, None] = {}
    for _, record in raws:
        if isinstance(record, dict):
            columns.update(dict.fromkeys(record))
    return list(columns)


def read_text(path: str | Path) -> str:
    """A data file's text: UTF-8, with a byte-order mark dropped and Windows line ends (CRLF)
    read as plain ones; any other encoding is a ValueError naming the file, line and column."""
    data = Path(path).read_bytes()
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise ValueError(f"{path}: the file is UTF-16 (byte-order mark); save it as UTF-8")
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise ValueError(
            f"{path}:{line}: byte 0x{data[err.start]:02x} at column {column} is not UTF-8; "
            "save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
        ) from None
    return text.replace("\r\n", "\n")


def _read_jsonl(path: Path) -> tuple[list[_Raw], list[str]]:
    raws: list[_Raw] = []
    for line_no, line in enumerate(read_text(path).split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{path}:{line_no}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            bad = _InvalidRow(
                "malformed JSON", f"{where}: not valid JSON at column {err.colno} ({err.msg})"
            )
            raws.append((where, bad))
            continue
        if not isinstance(record, dict):
            kind = type(record).__name__
            bad = _InvalidRow("not an object", f"{where}: expected a JSON object, got {kind}")
            raws.append((where, bad))
            continue
        raws.append((where, record))
    return raws, _columns_of(raws)


def _read_json(path: Path) -> tuple[list[_Raw], list[str]]:
    try:
        data = json.loads(read_text(path))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from None
    if not isinstance(data, list):
        raise ValueError(
            f"{path}: a .json dataset must be a list of objects, got {type(data).__name__} "
            "(use .jsonl for one object per line)"
        )
    raws: list[_Raw] = []
    for index, record in enumerate(data):
        where = f"{path}[item {index}]"
        if not isinstance(record, dict):
            kind = type(record).__name__
            raws.append(
                (where, _InvalidRow("not an object", f"{where}: expected an object, got {kind}"))
            )
        else:
            raws.append((where, record))
    return raws, _columns_of(raws)


def _read_csv(path: Path) -> tuple[list[_Raw], list[str]]:
    raws: list[_Raw] = []
    with io.StringIO(read_text(path), newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None or not any(cell.strip() for cell in header):
            raise ValueError(f"{path}: CSV file has no header line naming the columns")
        if any(not cell.strip() for cell in header):
            raise ValueError(
                f"{path}: CSV header has an empty column name (header: {header}); the first "
                "line must name every column"
            )
        duplicates = sorted({cell for cell in header if header.count(cell) > 1})
        if duplicates:
            raise ValueError(f"{path}: CSV header repeats column names {duplicates}")
        for cells in reader:
            where = f"{path}:{reader.line_num}"
            if not any(cell.strip() for cell in cells):
                continue
            if len(cells) != len(header):
                bad = _InvalidRow(
                    "malformed CSV row",
                    f"{where}: CSV row has {len(cells)} fields, the header has {len(header)}",
                )
                raws.append((where, bad))
                continue
            raws.append((where, dict(zip(header, cells, strict=True))))
    return raws, list(header)


def _missing_dependency(path: Any, what: str, package: str) -> ImportError:
    return ImportError(
        f"{path}: reading {what} needs the optional package {package!r}, which is not "
        f"installed: pip install {package}"
    )


def _read_parquet(path: Path) -> tuple[list[_Raw], list[str]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise _missing_dependency(path, "a Parquet file", "pyarrow") from None
    table = pq.read_table(path)
    raws: list[_Raw] = [(f"{path}[row {i}]", r) for i, r in enumerate(table.to_pylist())]
    return raws, list(table.column_names)


def _select_split(source: Any, split: str | None, name: str) -> Any:
    """The ``split`` of a DatasetDict-like mapping of splits; the only split if there is one."""
    splits = list(source.keys())
    if split is None:
        if len(splits) != 1:
            raise ValueError(f"{name} holds splits {splits}; pass split= to choose one")
        split = splits[0]
    if split not in source:
        raise ValueError(f"{name} has no split {split!r}; splits: {splits}")
    return source[split]


def _read_hf(dataset: Any, name: str) -> tuple[list[_Raw], list[str]]:
    raws: list[_Raw] = []
    for index in range(len(dataset)):
        where = f"{name}[row {index}]"
        record = dataset[index]
        if not isinstance(record, Mapping):
            kind = type(record).__name__
            raws.append(
                (where, _InvalidRow("not an object", f"{where}: expected a dict, got {kind}"))
            )
        else:
            raws.append((where, dict(record)))
    return raws, list(dataset.column_names)


def _is_dataset_like(obj: Any) -> bool:
    # A DatasetDict also has column_names (a dict of them): it is a Mapping of splits.
    return (
        not isinstance(obj, Mapping)
        and hasattr(obj, "column_names")
        and hasattr(obj, "__len__")
        and hasattr(obj, "__getitem__")
    )


def _read_source(source: Any, split: str | None) -> tuple[str, list[_Raw], list[str]]:
    if isinstance(source, str | Path):
        path = Path(source)
        name = str(source)
        if path.is_dir():
            try:
                import datasets
            except ImportError:
                raise _missing_dependency(
                    path, "a saved Hugging Face dataset", "datasets"
                ) from None
            loaded = datasets.load_from_disk(str(path))
            if not _is_dataset_like(loaded):
                loaded = _select_split(loaded, split, name)
            elif split is not None:
                raise ValueError(f"{name} is a single dataset with no splits; split={split!r}")
            return (name, *_read_hf(loaded, name))
        if not path.exists():
            raise FileNotFoundError(f"{name}: no such file or directory")
        if split is not None:
            raise ValueError(f"{name}: split= only applies to Hugging Face datasets with splits")
        readers = {
            ".jsonl": _read_jsonl,
            ".json": _read_json,
            ".csv": _read_csv,
            ".parquet": _read_parquet,
        }
        reader = readers.get(path.suffix.lower())
        if reader is None:
            raise ValueError(
                f"{name}: unknown dataset format {path.suffix!r}; expected one of "
                f"{sorted(readers)} or a directory saved by datasets.save_to_disk"
            )
        return (name, *reader(path))
    if _is_dataset_like(source):
        name = f"<{type(source).__name__}>"
        if split is not None:
            raise ValueError(f"{name} is a single dataset with no splits; split={split!r}")
        return (name, *_read_hf(source, name))
    if isinstance(source, Mapping):
        name = f"<{type(source).__name__}>"
        chosen = _select_split(source, split, name)
        if not _is_dataset_like(chosen):
            raise TypeError(f"{name}: split values must be datasets, got {type(chosen).__name__}")
        return (name, *_read_hf(chosen, f"{name}[{split or next(iter(source))!r}]"))
    if isinstance(source, Sequence) and not isinstance(source, str | bytes):
        name = f"<{type(source).__name__}>"
        if split is not None:
            raise ValueError(f"{name} is a single dataset with no splits; split={split!r}")
        raws: list[_Raw] = []
        for index, record in enumerate(source):
            where = f"{name}[row {index}]"
            if isinstance(record, Mapping):
                raws.append((where, dict(record)))
            else:
                kind = type(record).__name__
                raws.append(
                    (where, _InvalidRow("not an object", f"{where}: expected a dict, got {kind}"))
                )
        return name, raws, _columns_of(raws)
    raise TypeError(
        "source must be a path (.jsonl, .json, .csv, .parquet or a saved HF dataset directory), "
        f"a Hugging Face Dataset, or a list of dicts; got {type(source).__name__}"
    )


def _template_fields(template: str) -> list[str]:
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as err:
        raise ValueError(
            f"prompt_template {template!r} is not a valid format string: {err}"
        ) from None
    fields = []
    for _, field_name, _, _ in parsed:
        if field_name is None:
            continue
        base = field_name.split(".")[0].split("[")[0]
        if not base or base.isdigit():
            raise ValueError(
                f"prompt_template {template!r}: fields must be column names, e.g. {{prompt}}"
            )
        fields.append(base)
    return fields


def _clean_answer(value: Any, column: str, where: str) -> str:
    if isinstance(value, str):
        if not value.strip():
            raise _InvalidRow("empty answer", f"{where}: {column!r} is empty")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        kind = "None" if value is None else type(value).__name__
        raise _InvalidRow(
            "invalid answer", f"{where}: {column!r} must be a string or a number, got {kind}"
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise _InvalidRow("invalid answer", f"{where}: {column!r} is {value}")
    return str(value)


def _clean_prompt(value: Any, column: str, where: str) -> str | list[dict[str, Any]]:
    if value is None or (isinstance(value, str | list) and not value):
        raise _InvalidRow("empty prompt", f"{where}: {column!r} is empty")
    if isinstance(value, str):
        if not value.strip():
            raise _InvalidRow("empty prompt", f"{where}: {column!r} is empty")
        return value
    if is_conversational(value):
        for index, message in enumerate(value):
            if message["role"] not in CHAT_ROLES:
                raise _InvalidRow(
                    "unknown role",
                    f"{where}: {column!r} message {index} has role {message['role']!r}; the "
                    f"allowed roles are {', '.join(CHAT_ROLES)} (e.g. 'user', not 'human')",
                )
        return [dict(message) for message in value]
    raise _InvalidRow(
        "invalid prompt",
        f"{where}: {column!r} must be a string or a list of {{'role', 'content'}} messages, "
        f"got {type(value).__name__}",
    )


def load_dataset_rows(
    source: Any,
    *,
    prompt_column: str = "prompt",
    answer_column: str | None = "answer",
    system_prompt: str | None = None,
    prompt_template: str | None = None,
    split: str | None = None,
    on_invalid: str = "error",
) -> tuple[list[dict[str, Any]], LoadReport]:
    """Rows ``{"prompt", "answer", ...other columns}`` from a dataset, and a ``LoadReport``.

    ``source``: a path to a ``.jsonl`` file (one object per line), a ``.json`` file (a list of
    objects), a ``.csv`` file (the first line names the columns; every cell is a string, so
    CSV prompts are plain text), a ``.parquet`` file (needs ``pyarrow``), or a directory
    written by ``datasets.save_to_disk`` (needs ``datasets``); or an already-loaded Hugging
    Face ``Dataset`` (anything with ``column_names``, ``len`` and integer indexing), a
    ``DatasetDict``-like mapping of splits (pick one with ``split``; a single split is taken
    as is), or a list of dicts.

    ``prompt_column`` is renamed to ``"prompt"``: a plain string, or a conversation (a list of
    ``{"role", "content"}`` messages). ``answer_column`` (``None``: no answer column) is
    renamed to ``"answer"`` and converted to a string (numbers via ``str``). The default
    ``"answer"`` column is optional; a column named explicitly must exist. Other columns are
    kept as they are and are passed to reward functions by name.

    ``prompt_template`` (e.g. ``"Question: {prompt}\\nAnswer:"``) formats plain-text prompts,
    for base models without a chat template; it may use any column by name (``{prompt}`` is
    the prompt, the original column names work too). A field no column provides is an error;
    a conversational prompt with a template is an error. ``system_prompt`` is then added as a
    system message: before the messages of a conversation (an error if it already starts
    with a system message), or making a plain prompt the conversation
    ``[{"role": "system", ...}, {"role": "user", "content": prompt}]``, which the tokenizer's
    chat template then renders.

    Invalid rows (not an object, malformed JSON/CSV line, missing or empty prompt, a prompt
    that is neither a string nor a conversation, a missing, empty, ``None``, list or dict
    answer) raise a ValueError naming the file and line (or row) with
    ``on_invalid="error"``; with ``on_invalid="skip"`` they are skipped and counted in the
    report by reason. Errors about the dataset as a whole (a missing prompt column, a CSV
    without a header, a template or column name clash) always raise, as does a dataset with
    no usable rows.
    """
    if on_invalid not in ("error", "skip"):
        raise ValueError(f"on_invalid must be 'error' or 'skip', got {on_invalid!r}")
    name, raws, columns = _read_source(source, split)
    report = LoadReport(source=name, rows_read=len(raws))
    if not raws:
        raise ValueError(f"{name}: no rows")
    if not columns and all(isinstance(record, _InvalidRow) for _, record in raws):
        if on_invalid == "error":
            raise ValueError(str(raws[0][1]))
        for _, record in raws:
            report.skipped[record.reason] += 1
            report.examples.setdefault(record.reason, str(record))
        raise ValueError(f"{name}: no usable rows; {report.summary()}")
    if prompt_column not in columns:
        raise ValueError(f"{name}: no {prompt_column!r} column; available columns: {columns}")
    has_answer = answer_column is not None and answer_column in columns
    if answer_column is not None and answer_column != "answer" and not has_answer:
        raise ValueError(f"{name}: no {answer_column!r} column; available columns: {columns}")
    for source_column, target in ((prompt_column, "prompt"), (answer_column, "answer")):
        if source_column != target and target in columns and (target != "answer" or has_answer):
            raise ValueError(
                f"{name}: column {source_column!r} would be renamed to {target!r}, but a "
                f"{target!r} column already exists; available columns: {columns}"
            )
    template_fields = _template_fields(prompt_template) if prompt_template is not None else []
    available = set(columns) | {"prompt"} | ({"answer"} if has_answer else set())
    missing_fields = [f for f in template_fields if f not in available]
    if missing_fields:
        raise ValueError(
            f"prompt_template {prompt_template!r} uses {missing_fields}, which {name} does not "
            f"have; available columns: {sorted(available)}"
        )

    rows: list[dict[str, Any]] = []
    for where, record in raws:
        try:
            if isinstance(record, _InvalidRow):
                raise record
            row = _build_row(
                record,
                where,
                prompt_column=prompt_column,
                answer_column=answer_column if has_answer else None,
                system_prompt=system_prompt,
                prompt_template=prompt_template,
            )
        except _InvalidRow as invalid:
            if on_invalid == "error":
                raise ValueError(str(invalid)) from None
            report.skipped[invalid.reason] += 1
            report.examples.setdefault(invalid.reason, str(invalid))
            continue
        rows.append(row)
    report.rows_kept = len(rows)
    if not rows:
        raise ValueError(f"{name}: no usable rows; {report.summary()}")
    return rows, report


def _build_row(
    record: dict[str, Any],
    where: str,
    *,
    prompt_column: str,
    answer_column: str | None,
    system_prompt: str | None,
    prompt_template: str | None,
) -> dict[str, Any]:
    if prompt_column not in record:
        raise _InvalidRow(
            "missing prompt", f"{where}: no {prompt_column!r} key; keys: {list(record)}"
        )
    prompt = _clean_prompt(record[prompt_column], prompt_column, where)
    row: dict[str, Any] = {"prompt": prompt}
    if answer_column is not None:
        if answer_column not in record:
            raise _InvalidRow(
                "missing answer", f"{where}: no {answer_column!r} key; keys: {list(record)}"
            )
        row["answer"] = _clean_answer(record[answer_column], answer_column, where)
    for key, value in record.items():
        if key not in (prompt_column, answer_column):
            row[key] = value
    if prompt_template is not None:
        if not isinstance(prompt, str):
            raise ValueError(
                f"{where}: prompt_template applies to plain-text prompts, but this prompt is a "
                "conversation; drop the template or use plain-text prompts"
            )
        fields = {**record, **row}
        try:
            row["prompt"] = prompt_template.format(**fields)
        except KeyError as err:
            raise _InvalidRow(
                "missing template field",
                f"{where}: prompt_template uses {err.args[0]!r}, which this row does not have; "
                f"keys: {list(fields)}",
            ) from None
    if system_prompt is not None:
        system = {"role": "system", "content": system_prompt}
        if isinstance(row["prompt"], str):
            row["prompt"] = [system, {"role": "user", "content": row["prompt"]}]
        elif row["prompt"][0].get("role") == "system":
            raise ValueError(
                f"{where}: the conversation already starts with a system message; "
                "system_prompt would add a second one"
            )
        else:
            row["prompt"] = [system, *row["prompt"]]
    return row


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

