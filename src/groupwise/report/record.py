"""``run.json``: what the trainer records about a run besides its options (version, device,
dtype, the defaults of the options it changed, dates and wall time). The trainer writes it
through this module at the start and end of every training segment; the report reads it.
Nothing here draws or renders, so the trainer's import of it stays light."""

from __future__ import annotations

import contextlib
import json
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..files import atomic_write_text

RUN_INFO_FILE = "run.json"


def number(value: Any) -> float | None:
    """``value`` as a float when it is a JSON number (booleans are not), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _utc(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="seconds")


def _read_info_quietly(path: Path) -> dict[str, Any]:
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def record_run_start(output_dir: str | Path, facts: dict[str, Any], resumed: bool) -> float:
    """Write ``output_dir/run.json`` as a training run starts: ``facts`` (the trainer's:
    groupwise version, device, dtype, precision, ranks, and under ``defaults`` the default of
    every option the run changed) with the start date. A resumed run keeps its first start
    date and the wall time of its earlier segments. Returns the segment's start time (for
    :func:`record_run_end`)."""
    path = Path(output_dir) / RUN_INFO_FILE
    earlier = _read_info_quietly(path) if resumed else {}
    now = time.time()
    info = {
        **facts,
        "started": earlier.get("started", _utc(now)),
        "finished": None,
        "wall_time_s": number(earlier.get("wall_time_s")) or 0.0,
    }
    atomic_write_text(path, json.dumps(info, indent=1, default=str) + "\n")
    return now


def record_run_end(output_dir: str | Path, segment_start: float) -> None:
    """Add the segment since ``segment_start`` to ``run.json``'s wall time and date its end
    (also when training stops on an error: the time was spent). Never raises: the run's own
    outcome matters more than this record."""
    path = Path(output_dir) / RUN_INFO_FILE
    info = _read_info_quietly(path)
    if not info:
        return
    now = time.time()
    info["wall_time_s"] = (number(info.get("wall_time_s")) or 0.0) + (now - segment_start)
    info["finished"] = _utc(now)
    with contextlib.suppress(OSError):
        atomic_write_text(path, json.dumps(info, indent=1, default=str) + "\n")


def changed_defaults(defaults: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """The default of every option whose value in ``config`` differs from it."""
    return {k: d for k, d in defaults.items() if k in config and config[k] != d}
