"""Reading a run folder: ``metrics.jsonl`` (training and evaluation rows), and when present
``config.yaml``, ``rewards.json``, ``run.json``, ``events.jsonl`` and ``completions.jsonl``;
the series the plots and tables take from them, and how their numbers are written."""

from __future__ import annotations

import html
import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .record import RUN_INFO_FILE, number


class ReportError(Exception):
    """A run folder the report cannot be built from; the message names the file."""


@dataclass
class RunData:
    """Everything read from a run folder. ``None`` means the file does not exist."""

    run_dir: Path
    train: list[dict[str, Any]]  # one row per training step, sorted by step
    evals: list[dict[str, Any]]  # one row per evaluated step (eval/* keys only), sorted by step
    config: dict[str, Any] | None = None
    events: list[dict[str, Any]] | None = None
    completions: list[dict[str, Any]] | None = None
    notes: list[str] = field(default_factory=list)  # things the reader should know
    # rewards.json: [{"name", "weight", "is_correctness"}] per reward function (older runs: None)
    rewards: list[dict[str, Any]] | None = None
    # run.json: version, device, dtype, dates, wall time, the defaults of changed options (older
    # runs: None); see record_run_start
    info: dict[str, Any] | None = None


def read_jsonl(path: Path, notes: list[str] | None = None) -> list[dict[str, Any]]:
    """JSON objects, one per line (NaN allowed). A malformed line is an error naming the file and
    line, except an unterminated last line: the trainer may be writing it right now."""
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")
    rows: list[dict[str, Any]] = []
    for line_number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            if line_number == len(lines) and not text.endswith("\n"):
                if notes is not None:
                    notes.append(f"{path.name}: skipped an incomplete last line {line_number}")
                continue
            raise ReportError(
                f"{path}, line {line_number}: malformed JSON ({err.msg} at column {err.colno}); "
                "expected one JSON object per line"
            ) from None
        if not isinstance(row, dict):
            raise ReportError(
                f"{path}, line {line_number}: expected a JSON object, got {type(row).__name__}"
            )
        rows.append(row)
    return rows


def _split_metrics(
    rows: list[dict[str, Any]], notes: list[str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Training and evaluation rows, one of each per step: a resumed run re-logs some steps, and
    the later values win (they are the ones the final model descends from)."""
    train: dict[int, dict[str, Any]] = {}
    evals: dict[int, dict[str, Any]] = {}
    skipped = 0
    for row in rows:
        step = number(row.get("step"))
        if step is None or not math.isfinite(step):
            skipped += 1
            continue
        step = int(step)
        train_part = {k: v for k, v in row.items() if k != "step" and not k.startswith("eval/")}
        eval_part = {k: v for k, v in row.items() if k.startswith("eval/")}
        if train_part:
            train[step] = {"step": step, **train_part}
        if eval_part:
            evals.setdefault(step, {"step": step}).update(eval_part)
    if skipped:
        notes.append(f"metrics.jsonl: skipped {skipped} rows without a numeric 'step'")
    return [train[s] for s in sorted(train)], [evals[s] for s in sorted(evals)]


def load_run(run_dir: str | Path) -> RunData:
    """Read a run folder; only ``metrics.jsonl`` is required."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise ReportError(f"run directory {run_dir} does not exist")
    if not run_dir.is_dir():
        raise ReportError(f"{run_dir} is not a directory (expected a training output_dir)")
    metrics_path = run_dir / "metrics.jsonl"
    if not metrics_path.is_file():
        raise ReportError(
            f"{metrics_path} not found: expected the metrics.jsonl that `groupwise train` writes "
            "into its output_dir (one JSON object per logged step)"
        )
    notes: list[str] = []
    train, evals = _split_metrics(read_jsonl(metrics_path, notes), notes)
    if not train and not evals:
        notes.append("metrics.jsonl has no logged steps yet")
    earlier = sorted(p.name for p in run_dir.glob("metrics-*.jsonl"))
    if earlier:
        notes.append(f"earlier runs in this folder, not included: {', '.join(earlier)}")

    config = None
    config_path = run_dir / "config.yaml"
    if config_path.is_file():
        import yaml

        try:
            config = yaml.safe_load(config_path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as err:
            raise ReportError(f"{config_path}: not valid YAML ({err})") from None
        if not isinstance(config, dict):
            raise ReportError(f"{config_path}: expected a mapping of options")

    rewards = None
    if (run_dir / "rewards.json").is_file():
        rewards = read_rewards(run_dir / "rewards.json")

    info = None
    if (run_dir / RUN_INFO_FILE).is_file():
        info = read_run_info(run_dir / RUN_INFO_FILE)

    events = None
    if (run_dir / "events.jsonl").is_file():
        events = read_jsonl(run_dir / "events.jsonl", notes)
    completions = None
    if (run_dir / "completions.jsonl").is_file():
        completions = read_jsonl(run_dir / "completions.jsonl", notes)
    return RunData(run_dir, train, evals, config, events, completions, notes, rewards, info)


def read_rewards(path: Path) -> list[dict[str, Any]]:
    """The run's reward functions as the trainer records them in ``rewards.json``: a list of
    ``{"name", "weight", "is_correctness"}`` objects, in the order of ``reward_funcs``."""
    try:
        records = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ReportError(f"{path}: malformed JSON ({err.msg} at line {err.lineno})") from None
    if not isinstance(records, list) or not all(
        isinstance(r, dict) and isinstance(r.get("name"), str) for r in records
    ):
        raise ReportError(f"{path}: expected a list of objects, each with a string 'name'")
    return records


def read_run_info(path: Path) -> dict[str, Any]:
    """What the trainer records about a run besides its options (:func:`record_run_start`)."""
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ReportError(f"{path}: malformed JSON ({err.msg} at line {err.lineno})") from None
    if not isinstance(info, dict):
        raise ReportError(f"{path}: expected a JSON object")
    return info


# ----------------------------------------------------------------------------------------------
# Series and names


def series(
    rows: Sequence[dict[str, Any]], key: str, x: dict[int, float] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Steps (or ``x[step]``, rows whose step it lacks left out) and finite values of ``key``
    (rows where it is missing or NaN are left out)."""
    steps, values = [], []
    for row in rows:
        value = number(row.get(key))
        if value is not None and math.isfinite(value) and (x is None or row["step"] in x):
            steps.append(row["step"] if x is None else x[row["step"]])
            values.append(value)
    return np.asarray(steps, dtype=float), np.asarray(values, dtype=float)


TOKENS_KEY = "compute/generated_tokens_total"


def token_axis(run: RunData) -> dict[int, float]:
    """Step -> completion tokens generated up to and including it (``compute/generated_tokens_
    total``; step 0, before training, is 0 tokens). Empty when the run did not log it."""
    axis = {int(r["step"]): float(r[TOKENS_KEY]) for r in run.train if number(r.get(TOKENS_KEY))}
    return {0: 0.0, **axis} if axis else {}


def rows_for(run: RunData, key: str) -> list[dict[str, Any]]:
    """The rows a metric is logged in: evaluation rows for ``eval/*``, else training rows."""
    return run.evals if key.startswith("eval/") else run.train


def metric_keys(rows: Iterable[dict[str, Any]]) -> list[str]:
    """Every key of ``rows``, in order of first appearance."""
    return list(dict.fromkeys(k for row in rows for k in row))


def reward_names(keys: Sequence[str], prefix: str = "rewards/") -> list[str]:
    """The reward components logged as ``{prefix}<name>/mean``, in the order of ``keys``."""
    return [k[len(prefix) : -len("/mean")] for k in keys if re.fullmatch(rf"{prefix}.+/mean", k)]


def correctness_reward(
    names: Sequence[str], rewards: Sequence[dict[str, Any]] | None = None
) -> str | None:
    """The reward component that scores correctness, if any: the one ``rewards.json`` marks
    ``is_correctness`` (the trainer records the function's flag there), or for an older run
    without that file the first of ``names`` containing "accura" or "correct"."""
    if rewards is not None:
        return next((r["name"] for r in rewards if r.get("is_correctness") is True), None)
    return next((n for n in names if "accura" in n or "correct" in n), None)


def natural(key: str) -> tuple[Any, ...]:
    """Sort key that orders the numbers in a name by value: pass@2 before pass@16."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", key))


# ----------------------------------------------------------------------------------------------
# Numbers as text (tables, legends and the list of series left out)


def esc(value: Any) -> str:
    """``value`` as text safe inside HTML, quotes included."""
    return html.escape(str(value), quote=True)


def fmt(value: Any) -> str:
    """A number for a table: 4 significant digits, NaN and missing spelled out."""
    value_number = number(value)
    if value_number is None:
        return "—" if value is None else esc(value)
    if math.isnan(value_number):
        return "NaN"
    if isinstance(value, int) or (value_number.is_integer() and abs(value_number) < 1e6):
        return str(int(value_number))
    if value_number != 0 and (abs(value_number) >= 1e5 or abs(value_number) < 1e-3):
        return f"{value_number:.3g}"
    return f"{value_number:.4g}"


def fmt_duration(seconds: float) -> str:
    """``seconds`` as ``1h 02m 03s``, ``2m 03s`` or ``3s``."""
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m {secs:02d}s"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"
