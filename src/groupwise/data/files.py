"""Reading a prompt dataset's records: JSONL, JSON, CSV and Parquet files, a folder written by
``datasets.save_to_disk``, an in-memory Hugging Face dataset or a list of dicts. Each record
comes with where it was read (file and line, or row) for messages; a record that is not an
object is kept as an :class:`_InvalidRow` for :func:`groupwise.data.rows.load_dataset_rows`
to raise or count.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .prompts import is_conversational


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


class _InvalidRow(Exception):
    """A row that ``on_invalid="skip"`` may skip: ``reason`` is the report's counter key."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


# One raw record as read: where it came from (for messages) and a dict, or the reason and
# message of a record that could not be read as a dict.
_Raw = tuple[str, "dict[str, Any] | _InvalidRow"]


def _object_records(records: Iterable[Any], name: str, unit: str, expected: str) -> list[_Raw]:
    """``records`` as read, each at ``name[unit index]``: a copy of each mapping, an
    ``_InvalidRow`` ("expected ``expected``") for anything else."""
    raws: list[_Raw] = []
    for index, record in enumerate(records):
        where = f"{name}[{unit} {index}]"
        if isinstance(record, Mapping):
            raws.append((where, dict(record)))
        else:
            kind = type(record).__name__
            message = f"{where}: expected {expected}, got {kind}"
            raws.append((where, _InvalidRow("not an object", message)))
    return raws


def _no_splits(name: str, split: str | None) -> None:
    if split is not None:
        raise ValueError(f"{name} is a single dataset with no splits; split={split!r}")


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
    raws = _object_records(data, str(path), "item", "an object")
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
    # Indexed, not iterated: a dataset-like object need only have len() and [i].
    rows = (dataset[index] for index in range(len(dataset)))
    return _object_records(rows, name, "row", "a dict"), list(dataset.column_names)


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
            else:
                _no_splits(name, split)
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
        _no_splits(name, split)
        return (name, *_read_hf(source, name))
    if isinstance(source, Mapping):
        name = f"<{type(source).__name__}>"
        chosen = _select_split(source, split, name)
        if not _is_dataset_like(chosen):
            raise TypeError(f"{name}: split values must be datasets, got {type(chosen).__name__}")
        return (name, *_read_hf(chosen, f"{name}[{split or next(iter(source))!r}]"))
    if isinstance(source, Sequence) and not isinstance(source, str | bytes):
        name = f"<{type(source).__name__}>"
        _no_splits(name, split)
        raws = _object_records(source, name, "row", "a dict")
        return name, raws, _columns_of(raws)
    raise TypeError(
        "source must be a path (.jsonl, .json, .csv, .parquet or a saved HF dataset directory), "
        f"a Hugging Face Dataset, or a list of dicts; got {type(source).__name__}"
    )
