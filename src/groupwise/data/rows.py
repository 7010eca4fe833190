"""Validated rows from any dataset source: :func:`load_dataset_rows` renames the prompt and
answer columns, checks every row (raising, or skipping and counting with ``on_invalid="skip"``),
applies ``prompt_template`` and ``system_prompt``, and reports what it did (:class:`LoadReport`).
"""

from __future__ import annotations

import math
import string
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .files import _InvalidRow, _read_source
from .prompts import CHAT_ROLES, is_conversational


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
