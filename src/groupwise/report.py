"""``groupwise report RUN_DIR``: one self-contained HTML page about a training run.

Reads what the trainer writes into its output folder (``metrics.jsonl``; and when present
``config.yaml``, ``run.json``, ``rewards.json``, ``events.jsonl``, ``completions.jsonl``) and
writes ``RUN_DIR/report.html``: held-out accuracy before -> after first, a summary, the run's
warnings, plots (PNG, base64-embedded, made with matplotlib's Agg backend; a series that carries
nothing is named instead of plotted), the run's facts and changed options, and example
completions. ``groupwise report RUN1 RUN2 ...`` writes one page comparing runs instead. The
page loads nothing from anywhere else, so it can be mailed or opened offline.
:func:`check_in_browser` renders a report in headless Chromium and lists what went wrong (used
by ``scripts/check_report_browser.py`` and the tests).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import html
import io
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from .files import atomic_write_text

REPORT_TITLE = "groupwise training report"
INSTALL_HINT = "pip install groupwise[report]"

MAX_PROMPTS_PER_STEP = 3  # example prompts shown for each of the first and last logged steps
MAX_COMPLETIONS_PER_PROMPT = 16
MAX_EVENTS_LISTED = 200


class ReportError(Exception):
    """A run folder the report cannot be built from; the message names the file."""


# ----------------------------------------------------------------------------------------------
# Reading the run folder


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
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            if number == len(lines) and not text.endswith("\n"):
                if notes is not None:
                    notes.append(f"{path.name}: skipped an incomplete last line {number}")
                continue
            raise ReportError(
                f"{path}, line {number}: malformed JSON ({err.msg} at column {err.colno}); "
                "expected one JSON object per line"
            ) from None
        if not isinstance(row, dict):
            raise ReportError(
                f"{path}, line {number}: expected a JSON object, got {type(row).__name__}"
            )
        rows.append(row)
    return rows


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _split_metrics(
    rows: list[dict[str, Any]], notes: list[str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Training and evaluation rows, one of each per step: a resumed run re-logs some steps, and
    the later values win (they are the ones the final model descends from)."""
    train: dict[int, dict[str, Any]] = {}
    evals: dict[int, dict[str, Any]] = {}
    skipped = 0
    for row in rows:
        step = _number(row.get("step"))
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


RUN_INFO_FILE = "run.json"


def read_run_info(path: Path) -> dict[str, Any]:
    """What the trainer records about a run besides its options (:func:`record_run_start`)."""
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ReportError(f"{path}: malformed JSON ({err.msg} at line {err.lineno})") from None
    if not isinstance(info, dict):
        raise ReportError(f"{path}: expected a JSON object")
    return info


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
        "wall_time_s": _number(earlier.get("wall_time_s")) or 0.0,
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
    info["wall_time_s"] = (_number(info.get("wall_time_s")) or 0.0) + (now - segment_start)
    info["finished"] = _utc(now)
    with contextlib.suppress(OSError):
        atomic_write_text(path, json.dumps(info, indent=1, default=str) + "\n")


def changed_defaults(defaults: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """The default of every option whose value in ``config`` differs from it."""
    return {k: d for k, d in defaults.items() if k in config and config[k] != d}


def series(
    rows: Sequence[dict[str, Any]], key: str, x: dict[int, float] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Steps (or ``x[step]``, rows whose step it lacks left out) and finite values of ``key``
    (rows where it is missing or NaN are left out)."""
    steps, values = [], []
    for row in rows:
        value = _number(row.get(key))
        if value is not None and math.isfinite(value) and (x is None or row["step"] in x):
            steps.append(row["step"] if x is None else x[row["step"]])
            values.append(value)
    return np.asarray(steps, dtype=float), np.asarray(values, dtype=float)


TOKENS_KEY = "compute/generated_tokens_total"


def token_axis(run: RunData) -> dict[int, float]:
    """Step -> completion tokens generated up to and including it (``compute/generated_tokens_
    total``; step 0, before training, is 0 tokens). Empty when the run did not log it."""
    axis = {int(r["step"]): float(r[TOKENS_KEY]) for r in run.train if _number(r.get(TOKENS_KEY))}
    return {0: 0.0, **axis} if axis else {}


# ----------------------------------------------------------------------------------------------
# What to plot


@dataclass
class Line:
    key: str
    label: str


@dataclass
class Panel:
    ylabel: str
    lines: list[Line]
    # smooth: raw faint + moving average | raw | points | stack (eval/* lines are always points)
    style: str = "smooth"
    logy: bool = False
    x: str = "step"  # step | tokens (cumulative generated tokens, TOKENS_KEY)


@dataclass
class PlotGroup:
    """One figure (one <img>): one or more panels sharing the step axis."""

    id: str
    title: str
    panels: list[Panel]
    caption: str = ""


def _keys(rows: Iterable[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(k for row in rows for k in row))


def _reward_names(keys: Sequence[str], prefix: str = "rewards/") -> list[str]:
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


def _bins(keys: Sequence[str], prefix: str) -> list[Line]:
    found = [(int(m.group(1)), k) for k in keys if (m := re.fullmatch(rf"{prefix}(\d+)", k))]
    return [Line(k, f"bin {b}" + (" (hardest)" if b == 0 else "")) for b, k in sorted(found)]


def _natural(key: str) -> tuple[Any, ...]:
    # pass@2 before pass@16; difficulty_2 before difficulty_10.
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", key))


def plot_groups(run: RunData) -> list[PlotGroup]:
    """The figures this run's metrics support, each with only the series that carry something
    (see :func:`plot_plan`)."""
    return plot_plan([run])[0]


@dataclass(frozen=True)
class Hidden:
    """A series left out of the plots, and why: named in one line above them."""

    key: str
    reason: str

    def __str__(self) -> str:
        return f"{self.key} ({self.reason})"


# Series that say nothing when an option turns them off, whatever the run logged: the option's
# reason (None: the series counts) from the run's config.yaml.
SWITCHED_OFF = {
    # beta = 0: no reference model, so the logged KL is not computed (TRL logs 0).
    "kl": lambda config: "beta 0" if _number(config.get("beta")) == 0 else None,
}
# Series every run is expected to log: when one is missing, the plots say so; optional families
# (curriculum, tools, evaluation by difficulty, ...) just do not appear.
EXPECTED = ("reward", "loss", "kl", "entropy", "completions/mean_length", "grad_norm")


def plot_plan(runs: Sequence[RunData]) -> tuple[list[PlotGroup], list[Hidden]]:
    """The figures the runs' metrics support (one run: its report; several: their comparison),
    each with only the series that carry something, and the series left out: constant in every
    run (a fixed learning rate), switched off by an option in every run (KL with beta 0), or an
    expected metric no run logged."""
    groups = candidate_groups(runs)
    kept: list[PlotGroup] = []
    hidden: dict[str, Hidden] = {}
    for group in groups:
        panels = []
        for panel in group.panels:
            lines, left_out = _visible_lines(runs, panel)
            for h in left_out:
                hidden.setdefault(h.key, h)
            if lines:
                panels.append(Panel(panel.ylabel, lines, panel.style, panel.logy, panel.x))
        if panels:
            kept.append(PlotGroup(group.id, group.title, panels, group.caption))
    shown = {line.key for g in kept for p in g.panels for line in p.lines}
    return kept, [h for key, h in hidden.items() if key not in shown]


def _is_constant(values: np.ndarray) -> bool:
    # Two or more values, all equal (to rounding): a single point is an observation, not a line.
    return values.size >= 2 and bool(np.allclose(values, values[0], rtol=1e-9, atol=0.0))


def _visible_lines(runs: Sequence[RunData], panel: Panel) -> tuple[list[Line], list[Hidden]]:
    data = {}
    for line in panel.lines:
        per_run = []
        for run in runs:
            x = token_axis(run) if panel.x == "tokens" else None
            if x is not None and not x:
                continue  # this run did not count its tokens: nothing to plot against
            values = series(_rows_for(run, line.key), line.key, x)[1]
            if values.size:
                per_run.append(values)
        data[line.key] = per_run
    reasons: dict[str, str] = {}
    for line in panel.lines:
        per_run = data[line.key]
        rule = SWITCHED_OFF.get(line.key)
        offs = [rule(run.config) if rule and run.config is not None else None for run in runs]
        if offs and all(offs):
            reasons[line.key] = str(offs[0])
        elif not per_run:
            if line.key in EXPECTED:
                reasons[line.key] = "not logged"
        elif all(_is_constant(v) for v in per_run):
            firsts = {float(v[0]) for v in per_run}
            reasons[line.key] = (
                f"constant {fmt(firsts.pop())}" if len(firsts) == 1 else "constant in each run"
            )
    present = [line for line in panel.lines if data[line.key]]
    hidden = [Hidden(line.key, reasons[line.key]) for line in panel.lines if line.key in reasons]
    if panel.style == "stack":
        # The phases only mean something stacked together: all of them, or none.
        if any(line.key not in reasons for line in present):
            return present, []
        return [], hidden
    return [line for line in present if line.key not in reasons], hidden


def candidate_groups(runs: Sequence[RunData]) -> list[PlotGroup]:
    """The declarative table of figures: every panel and series the runs' keys allow (one
    table for one run or several), before :func:`plot_plan` drops what carries nothing."""
    train_keys = _keys(row for run in runs for row in run.train)
    eval_keys = _keys(row for run in runs for row in run.evals)
    names = _reward_names(train_keys)
    correct = next(
        (c for run in runs if (c := correctness_reward(names, run.rewards)) is not None), None
    )
    eval_scores = sorted(
        (
            k
            for k in eval_keys
            if re.fullmatch(r"eval/(pass@\d+|mean@\d+|accuracy|greedy_accuracy|format_rate)", k)
        ),
        key=_natural,
    )
    difficulty = _difficulty_lines(eval_keys)
    smooth_note = "Faint: raw values; solid: centred moving average."
    groups = [
        PlotGroup(
            "reward",
            "Reward: total and per component",
            [
                Panel(
                    "reward",
                    [Line("reward", "total")] + [Line(f"rewards/{n}/mean", n) for n in names],
                )
            ],
            smooth_note,
        ),
        PlotGroup(
            "accuracy",
            f"Accuracy ({correct})",
            [
                Panel(
                    "fraction correct",
                    [
                        Line(f"rewards/{correct}/mean", "training samples"),
                        Line(f"eval/rewards/{correct}/mean", "eval, greedy"),
                        Line("eval/accuracy", "eval, sampled"),
                    ],
                )
            ]
            if correct
            else [],
            smooth_note,
        ),
        PlotGroup(
            "eval",
            "Evaluation over steps",
            [
                Panel(
                    "score",
                    [Line("eval/reward", "eval reward")]
                    + [Line(k, k.removeprefix("eval/")) for k in eval_scores],
                    "points",
                )
            ],
        ),
        PlotGroup(
            "eval_difficulty",
            "Evaluation by difficulty",
            [Panel(difficulty[0], difficulty[1], "points")] if difficulty else [],
        ),
        PlotGroup("loss", "Loss", [Panel("loss", [Line("loss", "loss")])], smooth_note),
        PlotGroup("kl", "KL to the reference", [Panel("KL", [Line("kl", "kl")])], smooth_note),
        PlotGroup(
            "entropy", "Token entropy", [Panel("nats", [Line("entropy", "entropy")])], smooth_note
        ),
        PlotGroup(
            "length",
            "Completion length and truncation",
            [
                Panel(
                    "tokens",
                    [
                        Line("completions/mean_length", "mean length"),
                        Line("completions/max_length", "max length"),
                    ],
                ),
                Panel("fraction", [Line("completions/clipped_ratio", "clipped (truncated)")]),
            ],
            smooth_note,
        ),
        PlotGroup(
            "clip",
            "Clipped token fractions",
            [
                Panel(
                    "fraction",
                    [
                        Line("clip_ratio/low_mean", "low"),
                        Line("clip_ratio/high_mean", "high"),
                        Line("clip_ratio/region_mean", "region"),
                    ],
                )
            ],
            smooth_note,
        ),
        PlotGroup(
            "zero_std",
            "Groups with zero reward spread (no learning signal)",
            [Panel("fraction", [Line("frac_reward_zero_std", "frac_reward_zero_std")])],
            smooth_note,
        ),
        PlotGroup(
            "time",
            "Time per step by phase",
            [
                Panel(
                    "seconds",
                    [
                        Line("time/generation", "generation"),
                        Line("time/scoring", "scoring"),
                        Line("time/update", "update"),
                        Line("time/step", "whole step"),
                    ],
                    "stack",
                ),
                Panel("tokens / s", [Line("tokens_per_second", "generated tokens per second")]),
            ],
            "Top: phases stacked, the line is the whole step.",
        ),
        PlotGroup(
            "optim",
            "Gradient norm and learning rate",
            [
                Panel("grad norm", [Line("grad_norm", "grad_norm (before clipping)")]),
                Panel("learning rate", [Line("learning_rate", "learning_rate")], "raw"),
            ],
            smooth_note,
        ),
        PlotGroup(
            "curriculum_weights",
            "Curriculum: bin weights",
            [Panel("weight", _bins(train_keys, "curriculum/weight_bin_"), "raw")],
        ),
        PlotGroup(
            "curriculum_rollouts",
            "Curriculum: rollouts per bin",
            [Panel("rollouts", _bins(train_keys, "curriculum/rollouts_bin_"))],
            smooth_note,
        ),
        PlotGroup(
            "curriculum_prompts",
            "Curriculum: prompts per bin",
            [Panel("prompts", _bins(train_keys, "curriculum/prompts_bin_"))],
            smooth_note,
        ),
        PlotGroup(
            "curriculum_stats",
            "Curriculum: Rollout-GDRO dual variable and weighted standard error",
            [
                Panel("mu", [Line("curriculum/mu", "mu")], "raw"),
                Panel(
                    "WSE",
                    [
                        Line("curriculum/wse", "wse"),
                        Line("curriculum/wse_uniform", "wse with uniform rollouts"),
                    ],
                ),
            ],
            smooth_note,
        ),
        PlotGroup(
            "curriculum_select",
            "Curriculum select: prompts skipped before rollout, and group sizes",
            [
                Panel(
                    "prompts",
                    [
                        Line("curriculum/select/skipped", "skipped (drawn, not rolled out)"),
                        Line("curriculum/select/informative_predicted", "informative, predicted"),
                        Line("curriculum/select/informative", "informative, realised"),
                    ],
                ),
                Panel(
                    "rollouts per prompt",
                    [
                        Line("curriculum/select/group_size_max", "max group size"),
                        Line("curriculum/select/group_size_mean", "mean group size"),
                        Line("curriculum/select/group_size_min", "min group size"),
                    ],
                    "raw",
                ),
            ],
            "Informative: groups whose rollouts are not all correct or all wrong. " + smooth_note,
        ),
        PlotGroup(
            "tools",
            "Tool use and turns (multi-turn rollouts)",
            [
                Panel(
                    "share",
                    [
                        Line("tools/call_rate", "conversations with a tool call"),
                        Line("tools/failure_frequency", "failed calls / calls"),
                        Line("tokens/masked_fraction", "tokens masked from the loss"),
                    ],
                ),
                Panel(
                    "accuracy",
                    [
                        Line("tools/accuracy_with_call", "with a tool call"),
                        Line("tools/accuracy_without_call", "without"),
                    ],
                ),
                Panel(
                    "per conversation",
                    [
                        Line("tools/call_frequency", "tool calls"),
                        Line("turns/mean", "assistant turns"),
                    ],
                ),
            ],
            "Masked tokens: tool and environment replies, context for the policy but not trained "
            "on. Accuracy: mean correctness score of the conversations with / without a call. "
            + smooth_note,
        ),
        PlotGroup(
            "eval_tokens",
            "Held-out accuracy against generated tokens (what the compute bought)",
            [
                Panel(
                    "score",
                    ([Line(f"eval/rewards/{correct}/mean", "eval, greedy")] if correct else [])
                    + [Line(k, k.removeprefix("eval/")) for k in eval_scores],
                    "points",
                    x="tokens",
                )
            ],
            "x: completion tokens generated by training so far (compute/generated_tokens_total).",
        ),
    ]
    return groups


def _difficulty_lines(eval_keys: Sequence[str]) -> tuple[str, list[Line]] | None:
    """One line per difficulty level, of pass@1 (else accuracy, else the first metric logged)."""
    found: dict[str, dict[str, str]] = {}
    for key in eval_keys:
        m = re.fullmatch(r"eval/difficulty_(.+)/(pass@\d+|mean@\d+|accuracy)", key)
        if m:
            found.setdefault(m.group(2), {})[m.group(1)] = key
    if not found:
        return None
    metric = next((m for m in ("pass@1", "accuracy") if m in found), sorted(found, key=_natural)[0])
    levels = sorted(found[metric], key=_natural)
    return metric, [Line(found[metric][level], f"difficulty {level}") for level in levels]


def _rows_for(run: RunData, key: str) -> list[dict[str, Any]]:
    return run.evals if key.startswith("eval/") else run.train


# ----------------------------------------------------------------------------------------------
# Drawing


def _matplotlib() -> tuple[Any, Any]:
    """matplotlib's Figure and Agg canvas, imported here so ``import groupwise`` stays light."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as err:
        raise ReportError(
            f"groupwise report draws its plots with matplotlib, which is not installed ({err}); "
            f"install it with: {INSTALL_HINT}"
        ) from None
    return Figure, FigureCanvasAgg


def moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Centred moving average; near the ends the window shrinks instead of padding with zeros."""
    if window <= 1 or values.size < 3:
        return values
    kernel = np.ones(window)
    total = np.convolve(values, kernel, mode="same")
    count = np.convolve(np.ones_like(values), kernel, mode="same")
    return total / count


def smoothing_window(points: int) -> int:
    # About 1/15 of the run, odd (so it is centred), at most 51 points.
    window = max(1, min(51, points // 15))
    return window if window % 2 else window + 1


LINESTYLES = ("-", "--", ":", "-.")


def render_group(run: RunData, group: PlotGroup, dpi: int = 110) -> bytes:
    """One figure of one run as PNG bytes."""
    return figure_png(draw_group([run], group, dpi))


def figure_png(fig: Any) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def draw_group(
    runs: Sequence[RunData],
    group: PlotGroup,
    dpi: int = 110,
    labels: Sequence[str] | None = None,
) -> Any:
    """One figure (a matplotlib ``Figure``). One run: a colour per series. Several (labelled
    ``labels``): a colour per run and a line style per series, so each panel overlays the runs;
    stacked phases become the whole step's time alone (stacks do not overlay)."""
    Figure, FigureCanvasAgg = _matplotlib()
    from matplotlib.ticker import MaxNLocator

    compare = len(runs) > 1
    labels = list(labels) if labels is not None else [r.run_dir.name for r in runs]
    height = 0.9 + 2.2 * len(group.panels)
    fig = Figure(figsize=(8.5, height), dpi=dpi)
    FigureCanvasAgg(fig)
    # Fixed margins (in inches) rather than a layout engine, which doubles the drawing time.
    fig.subplots_adjust(left=0.1, right=0.98, top=1 - 0.4 / height, bottom=0.5 / height)
    axes = fig.subplots(len(group.panels), 1, sharex=True, squeeze=False)[:, 0]
    colors = [f"C{i}" for i in range(10)]
    for ax, panel in zip(axes, group.panels, strict=True):
        lines = panel.lines
        if panel.style == "stack":
            if compare:
                lines = [line for line in lines if line.key == "time/step"] or lines
            else:
                _draw_stack(ax, runs[0], panel)
                lines = [line for line in lines if line.key == "time/step"]
        entries = 0
        for i, line in enumerate(lines):
            for r, run in enumerate(runs):
                x = token_axis(run) if panel.x == "tokens" else None
                steps, values = series(_rows_for(run, line.key), line.key, x)
                if not values.size:
                    continue
                if compare:
                    color, dash = colors[r % len(colors)], LINESTYLES[i % len(LINESTYLES)]
                    label = labels[r] if len(lines) == 1 else f"{labels[r]}: {line.label}"
                else:
                    color = "black" if panel.style == "stack" else colors[i % len(colors)]
                    dash, label = "-", line.label
                entries += 1
                _draw_series(ax, panel, line, steps, values, color, dash, label)
        if panel.logy:
            ax.set_yscale("log")
        ax.set_ylabel(panel.ylabel)
        ax.grid(True, alpha=0.3)
        if panel.x == "step":  # steps are whole numbers: no tick at step 2.5
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(loc="best", fontsize=8, ncol=2 if entries > 4 else 1)
    axes[0].set_title(group.title, fontsize=11)
    tokens = group.panels[-1].x == "tokens"
    axes[-1].set_xlabel("completion tokens generated (cumulative)" if tokens else "step")
    return fig


def _draw_series(
    ax: Any,
    panel: Panel,
    line: Line,
    steps: np.ndarray,
    values: np.ndarray,
    color: str,
    dash: str,
    label: str,
) -> None:
    if panel.style == "points" or line.key.startswith("eval/"):  # sparse: mark points
        ax.plot(steps, values, marker="o", ls=dash, color=color, label=label, ms=4, lw=1.2)
    elif panel.style in ("raw", "stack") or values.size < 8:
        ax.plot(steps, values, ls=dash, color=color, label=label, lw=1.4)
    else:
        ax.plot(steps, values, ls=dash, color=color, alpha=0.25, lw=0.8)
        smooth = moving_average(values, smoothing_window(values.size))
        ax.plot(steps, smooth, ls=dash, color=color, label=label, lw=1.6)


def _draw_stack(ax: Any, run: RunData, panel: Panel) -> None:
    phases = [line for line in panel.lines if line.key != "time/step"]
    if not phases:
        return
    steps = np.asarray([row["step"] for row in run.train], dtype=float)
    stacked = []
    for line in phases:
        values = [_number(row.get(line.key)) for row in run.train]
        stacked.append([v if v is not None and math.isfinite(v) else 0.0 for v in values])
    ax.stackplot(steps, np.asarray(stacked), labels=[p.label for p in phases], alpha=0.75)


# ----------------------------------------------------------------------------------------------
# HTML


CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d232a;
background:#f6f7f9}
main{max-width:1000px;margin:0 auto;padding:16px 24px 48px}
h1{font-size:22px;margin:8px 0 2px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid
#d6dae0;padding-bottom:4px}h3{font-size:15px;margin:18px 0 6px}
.sub{color:#5b6570;margin:0 0 12px}nav a{margin-right:12px}
table{border-collapse:collapse;background:#fff;margin:6px 0;font-size:13px}
th,td{border:1px solid #d6dae0;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#eef1f4}td.num{text-align:right;font-variant-numeric:tabular-nums}
figure{background:#fff;border:1px solid #d6dae0;margin:12px 0;padding:6px}
figure img{max-width:100%;height:auto;display:block}figcaption{color:#5b6570;font-size:12px}
.banner{padding:8px 12px;border-radius:4px;margin:10px 0}
.warn{background:#fff4d6;border:1px solid #e6c15c}.ok{background:#e5f5e8;border:1px solid #8cc99a}
.note{background:#eef1f4;border:1px solid #d6dae0}
pre{white-space:pre-wrap;word-break:break-word;margin:0;max-height:320px;overflow:auto;
font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,monospace}
.prompt{background:#fff;border:1px solid #d6dae0;padding:6px;margin:4px 0}
table.samples{width:100%}
.headline{font-size:18px;margin:10px 0 2px}.headline.none{color:#8a5a00}
.facts,.hidden-series{color:#5b6570;font-size:12px;margin:2px 0 8px}
"""

# Runs on load: did every image decode, and did anything on the page raise? The browser check
# reads the answers back from <body data-...> in the dumped DOM.
SCRIPT = """
(function () {
  var errors = 0;
  window.addEventListener("error", function () { errors += 1; }, true);
  window.addEventListener("unhandledrejection", function () { errors += 1; });
  window.addEventListener("load", function () {
    var images = document.images, loaded = 0;
    for (var i = 0; i < images.length; i++) {
      if (images[i].complete && images[i].naturalWidth > 0) { loaded += 1; }
    }
    document.body.dataset.imagesLoaded = String(loaded);
    document.body.dataset.imagesOk = loaded === images.length ? "true" : "false";
    document.body.dataset.pageErrors = String(errors);
  });
})();
"""


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def fmt(value: Any) -> str:
    """A number for a table: 4 significant digits, NaN and missing spelled out."""
    number = _number(value)
    if number is None:
        return "—" if value is None else _esc(value)
    if math.isnan(number):
        return "NaN"
    if isinstance(value, int) or (number.is_integer() and abs(number) < 1e6):
        return str(int(number))
    if number != 0 and (abs(number) >= 1e5 or abs(number) < 1e-3):
        return f"{number:.3g}"
    return f"{number:.4g}"


def fmt_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m {secs:02d}s"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


def _table(header: Sequence[str] | None, rows: Iterable[Sequence[str]], cls: str = "") -> str:
    """Cells are HTML already (escape text before passing it in)."""
    head = "".join(f"<th>{h}</th>" for h in header or ())
    thead = f"<thead><tr>{head}</tr></thead>" if header else ""
    body = "".join("<tr>" + "".join(cells) + "</tr>" for cells in rows)
    return f'<table class="{cls}">{thead}<tbody>{body}</tbody></table>'


def _td(text: str, num: bool = False) -> str:
    return f'<td class="num">{text}</td>' if num else f"<td>{text}</td>"


def _window_mean(rows: Sequence[dict[str, Any]], key: str, last: bool) -> tuple[float, int]:
    """Mean of ``key`` over the first (or last) tenth of the logged steps (1 to 10 steps)."""
    steps, values = series(rows, key)
    if not values.size:
        return math.nan, 0
    k = max(1, min(10, values.size // 10))
    chunk = values[-k:] if last else values[:k]
    return float(chunk.mean()), k


# Held-out accuracy metrics, most direct first, after the correctness reward's greedy mean.
HEADLINE_METRICS = {
    "eval/greedy_accuracy": "held-out accuracy (greedy)",
    "eval/accuracy": "held-out accuracy (sampled)",
    "eval/pass@1": "held-out pass@1",
}


@dataclass
class Headline:
    """The run's held-out score at its first and last evaluation."""

    key: str
    label: str
    first_step: int
    first: float
    last_step: int
    last: float
    evaluations: int
    fraction: bool = True  # a share in [0, 1], shown in percent

    def value(self, number: float) -> str:
        return f"{number:.1%}" if self.fraction else fmt(number)

    def change(self) -> str:
        delta = self.last - self.first
        return f"{100 * delta:+.1f} points" if self.fraction else f"{delta:+.4g}"


def headline(run: RunData) -> Headline | None:
    """Held-out accuracy before -> after from the run's evaluation records (None: the run was
    never evaluated). The correctness reward's greedy mean first (what ``groupwise demo``
    prints), then greedy / sampled accuracy and pass@1; with no correctness score, the eval
    reward."""
    names = _reward_names(_keys(run.train)) + _reward_names(_keys(run.evals), "eval/rewards/")
    correct = correctness_reward(list(dict.fromkeys(names)), run.rewards)
    candidates: dict[str, str] = {}
    if correct:
        candidates[f"eval/rewards/{correct}/mean"] = f"held-out accuracy ({correct}, greedy)"
    candidates.update(HEADLINE_METRICS)
    candidates["eval/reward"] = "held-out reward (no accuracy metric logged)"
    for key, label in candidates.items():
        steps, values = series(run.evals, key)
        if values.size:
            return Headline(
                key,
                label,
                int(steps[0]),
                float(values[0]),
                int(steps[-1]),
                float(values[-1]),
                int(values.size),
                key != "eval/reward",
            )
    return None


def _no_evaluation(run: RunData) -> str:
    config = run.config or {}
    why = ""
    if config.get("num_eval_prompts") == 0:
        why = " (num_eval_prompts is 0)"
    elif config.get("eval_steps") in (0, None) and config.get("eval_on_start") is False:
        why = " (eval_steps is 0 and eval_on_start is off)"
    return (
        f"No held-out evaluation in this run{why}: metrics.jsonl has no eval/ records, so "
        "there is no accuracy before and after training."
    )


def _headline_text(run: RunData, found: Headline | None) -> str:
    if found is None:
        return f'<p class="headline none">{_esc(_no_evaluation(run))}</p>'
    label = _esc(found.label[0].upper() + found.label[1:])
    if found.evaluations == 1:
        return (
            f'<p class="headline">{label}: <b>{found.value(found.last)}</b> at step '
            f"{found.last_step} (evaluated once: no before and after)</p>"
        )
    before = "before training" if found.first_step == 0 else f"step {found.first_step}"
    return (
        f'<p class="headline">{label}: <b>{found.value(found.first)} → '
        f"{found.value(found.last)}</b> ({found.change()}; {before} → step {found.last_step}, "
        f"{found.evaluations} evaluations)</p>"
    )


def run_facts(run: RunData) -> dict[str, str]:
    """Steps, wall time, date, version, device and dtype, as far as the run recorded them."""
    info = run.info or {}
    facts: dict[str, str] = {}
    if run.train:
        facts["steps"] = f"{run.train[-1]['step']} training steps"
    wall = _number(info.get("wall_time_s"))
    if wall is not None and info.get("finished"):
        facts["wall time"] = fmt_duration(wall)
    elif info:
        facts["wall time"] = "not finished (running, or stopped without a clean exit)"
    if info.get("started"):
        facts["started"] = str(info["started"]).replace("T", " ")
    if info.get("groupwise_version"):
        facts["groupwise"] = str(info["groupwise_version"])
    if info.get("device"):
        world = _number(info.get("world_size"))
        ranks = f" × {int(world)} ranks" if world and world > 1 else ""
        facts["device"] = f"{info['device']}{ranks}"
    if info.get("dtype"):
        precision = f" ({info['precision']})" if info.get("precision") else ""
        facts["dtype"] = f"{info['dtype']}{precision}"
    return facts


def _headline(run: RunData) -> str:
    facts = run_facts(run)
    line = " · ".join(_esc(v if k in ("steps", "wall time") else f"{k} {v}") for k, v in
                      facts.items())  # fmt: skip
    if not run.info:
        line += " · " if line else ""
        line += "no run.json (older groupwise): date, wall time, version and device not recorded"
    return _headline_text(run, headline(run)) + f'<p class="facts">{line}</p>'


def _summary(run: RunData) -> str:
    train, evals = run.train, run.evals
    config = run.config or {}
    rows: list[list[str]] = []
    for key in ("model", "task", "algorithm", "curriculum", "loss_type"):
        if key in config:
            rows.append([_td(_esc(key)), _td(_esc(config[key]))])
    if train:
        first, last = train[0]["step"], train[-1]["step"]
        rows.append([_td("training steps logged"), _td(f"{len(train)} (steps {first} to {last})")])
    else:
        rows.append([_td("training steps logged"), _td("none")])
    for key, label in [("reward", "reward")] + [
        (f"rewards/{n}/mean", n) for n in _reward_names(_keys(train))
    ]:
        start, k = _window_mean(train, key, last=False)
        end, _ = _window_mean(train, key, last=True)
        if k:
            span = f" (means of the first / last {k} logged steps)" if k > 1 else ""
            rows.append([_td(_esc(label)), _td(f"{fmt(start)} → {fmt(end)}{span}")])
    steps, times = series(train, "time/step")
    if times.size:
        missing = len(train) - times.size
        text = f"{fmt_duration(float(times.sum()))} ({fmt(float(times.mean()))} s per step"
        text += f"; {missing} steps without timing)" if missing else ")"
        rows.append([_td("training time (sum of time/step over logged steps)"), _td(text)])
    _, tps = series(train, "tokens_per_second")
    if tps.size:
        rows.append([_td("generated tokens per second (mean)"), _td(fmt(float(tps.mean())))])
    nonfinite = _nonfinite(train)
    if nonfinite:
        text = "; ".join(
            f"{_esc(k)}: {len(s)} step{'s' if len(s) > 1 else ''} ({_steps_text(s)})"
            for k, s in nonfinite.items()
        )
        rows.append([_td("NaN / infinite values"), _td(text)])
    out = _table(None, rows, "summary")
    if evals:
        out += "<h3>Evaluation</h3>" + _eval_table(evals)
    return out


def _steps_text(steps: Sequence[int], limit: int = 8) -> str:
    shown = ", ".join(str(s) for s in steps[:limit])
    return shown + (f", … {len(steps) - limit} more" if len(steps) > limit else "")


def _nonfinite(rows: Sequence[dict[str, Any]]) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for row in rows:
        for key, value in row.items():
            number = _number(value)
            if number is not None and not math.isfinite(number):
                found.setdefault(key, []).append(row["step"])
    return found


def _eval_table(evals: Sequence[dict[str, Any]]) -> str:
    """First, last and best value of each headline eval metric (all are higher-is-better)."""
    skip = re.compile(r"eval/(difficulty_|task_).*|eval/(num_prompts|mean_length|truncated_rate)")
    keys = [k for k in _keys(evals) if k != "step" and not skip.fullmatch(k)]
    rows = []
    for key in keys:
        steps, values = series(evals, key)
        if not values.size:
            continue
        best = int(np.argmax(values))
        rows.append(
            [
                _td(_esc(key.removeprefix("eval/"))),
                _td(f"{fmt(values[0])} <small>(step {int(steps[0])})</small>", True),
                _td(f"{fmt(values[-1])} <small>(step {int(steps[-1])})</small>", True),
                _td(f"<b>{fmt(values[best])}</b> <small>(step {int(steps[best])})</small>", True),
            ]
        )
    return _table(["metric", "first", "last", "best"], rows, "eval") if rows else ""


def _event_groups(events: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Events grouped by kind, in order of first appearance."""
    groups: dict[str, dict[str, Any]] = {}
    for event in events:
        kind = str(event.get("kind") or "unknown")
        step = _number(event.get("step"))
        group = groups.setdefault(
            kind, {"kind": kind, "count": 0, "steps": [], "message": event.get("message", "")}
        )
        group["count"] += 1
        if step is not None and math.isfinite(step):
            group["steps"].append(int(step))
        group["last_message"] = event.get("message", "")
    return list(groups.values())


def _warnings_banner(run: RunData) -> str:
    if not run.events:
        return ""
    groups = _event_groups(run.events)
    kinds = ", ".join(f"{_esc(g['kind'])} ×{g['count']}" for g in groups)
    total = len(run.events)
    return (
        f'<div class="banner warn" id="warnings-banner"><b>{total} warning'
        f"{'s' if total != 1 else ''}</b>: {kinds}. "
        '<a href="#warnings">Details</a></div>'
    )


def _warnings(run: RunData) -> str:
    if run.events is None:
        return '<p class="banner note">No events.jsonl in this run (written by newer versions).</p>'
    if not run.events:
        return '<p class="banner ok">No warnings were raised.</p>'
    rows = []
    for g in _event_groups(run.events):
        steps = g["steps"]
        rows.append(
            [
                _td(f"<b>{_esc(g['kind'])}</b>"),
                _td(str(g["count"]), True),
                _td(str(min(steps)) if steps else "—", True),
                _td(str(max(steps)) if steps else "—", True),
                _td(_esc(g["message"])),
            ]
        )
    out = _table(["kind", "count", "first step", "last step", "first message"], rows, "warnings")
    listed = [
        [
            _td(fmt(e.get("step")), True),
            _td(_esc(e.get("kind", "unknown"))),
            _td(_esc(e.get("message", ""))),
        ]
        for e in run.events[:MAX_EVENTS_LISTED]
    ]
    more = len(run.events) - len(listed)
    out += (
        f"<details><summary>All {len(run.events)} events</summary>"
        + _table(["step", "kind", "message"], listed)
        + (f"<p>… {more} more in events.jsonl</p>" if more > 0 else "")
        + "</details>"
    )
    return out


def _plots(
    runs: Sequence[RunData],
    groups: Sequence[PlotGroup],
    hidden: Sequence[Hidden],
    dpi: int,
    labels: Sequence[str] | None = None,
) -> str:
    out = []
    if hidden:
        listed = ", ".join(_esc(h) for h in hidden)
        out.append(f'<p class="hidden-series">not shown: {listed}</p>')
    if not groups:
        return "".join(out) + "<p>No metric has a finite value that changes to plot.</p>"
    for group in groups:
        png = figure_png(draw_group(runs, group, dpi, labels))
        data = base64.b64encode(png).decode("ascii")
        caption = f"<figcaption>{_esc(group.caption)}</figcaption>" if group.caption else ""
        out.append(
            f'<figure id="plot-{group.id}"><img alt="{_esc(group.title)}" '
            f'src="data:image/png;base64,{data}">{caption}</figure>'
        )
    return "\n".join(out)


def _config_value(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


def _config(run: RunData) -> str:
    facts = run_facts(run)
    out = ""
    if facts:
        rows = [[_td(_esc(k)), _td(_esc(v))] for k, v in facts.items()]
        out += _table(None, rows, "facts")
    if run.config is None:
        return out + '<p class="banner note">No config.yaml in this run.</p>'
    full = _table(
        ["option", "value"],
        ([_td(_esc(k)), _td(_esc(_config_value(v)))] for k, v in run.config.items()),
        "config",
    )
    defaults = (run.info or {}).get("defaults")
    if not isinstance(defaults, dict):
        return (
            out + '<p class="banner note">No run.json in this run (written by newer versions), '
            "so the defaults it ran with are unknown: every option is shown.</p>" + full
        )
    changed = list(changed_defaults(defaults, run.config))  # both sides as they were written
    rows = [
        [
            _td(_esc(k)),
            _td(
                f"<code>{_esc(_config_value(defaults[k]))}</code> → "
                f"<b>{_esc(_config_value(run.config[k]))}</b>"
            ),
        ]
        for k in changed
    ]
    out += f"<h3>Options changed from the defaults ({len(changed)})</h3>"
    if rows:
        out += _table(["option", "default → this run"], rows, "config-diff")
    else:
        out += "<p>None: the run used every default.</p>"
    return out + f"<details><summary>All {len(run.config)} options</summary>{full}</details>"


def _prompt_html(prompt: Any) -> str:
    if isinstance(prompt, list):
        parts = []
        for message in prompt:
            if isinstance(message, dict):
                role, content = message.get("role", "?"), message.get("content", "")
                parts.append(f"<b>{_esc(role)}</b>: {_esc(content)}")
            else:
                parts.append(_esc(message))
        return '<pre class="prompt">' + "\n".join(parts) + "</pre>"
    return f'<pre class="prompt">{_esc(prompt)}</pre>'


def _record_html(record: dict[str, Any]) -> str:
    answer = record.get("answer")
    answer_text = "—" if answer is None else _esc(_config_value(answer))
    out = [_prompt_html(record.get("prompt", "")), f"<p>answer: <code>{answer_text}</code></p>"]
    completions = record.get("completions") or []
    rows = []
    for i, c in enumerate(completions[:MAX_COMPLETIONS_PER_PROMPT]):
        if not isinstance(c, dict):
            c = {"text": c}
        parts = c.get("rewards") or {}
        components = "<br>".join(
            f"{_esc(name)}: {fmt(value)}" for name, value in parts.items()
        ) or "—"  # fmt: skip
        advantage = _number(c.get("advantage"))
        adv = "—" if advantage is None else f"{advantage:+.3f}"
        rows.append(
            [
                _td(str(i + 1), True),
                _td(fmt(c.get("reward")), True),
                _td(components),
                _td(adv, True),
                _td(f"<pre>{_esc(c.get('text', ''))}</pre>"),
            ]
        )
    out.append(_table(["#", "reward", "components", "advantage", "completion"], rows, "samples"))
    if len(completions) > MAX_COMPLETIONS_PER_PROMPT:
        out.append(f"<p>… {len(completions) - MAX_COMPLETIONS_PER_PROMPT} more completions</p>")
    return "\n".join(out)


def _completions(run: RunData) -> str:
    if run.completions is None:
        return (
            '<p class="banner note">No completions.jsonl in this run '
            "(set log_completions_steps to log samples).</p>"
        )
    by_step: dict[int, list[dict[str, Any]]] = {}
    for record in run.completions:
        step = _number(record.get("step"))
        by_step.setdefault(int(step) if step is not None else -1, []).append(record)
    if not by_step:
        return '<p class="banner note">completions.jsonl is empty.</p>'
    steps = sorted(by_step)
    out = []
    for step in dict.fromkeys([steps[0], steps[-1]]):
        records = by_step[step]
        label = "first" if step == steps[0] else "last"
        out.append(f'<h3 id="completions-step-{step}">Step {step} ({label} logged step)</h3>')
        for record in records[:MAX_PROMPTS_PER_STEP]:
            out.append(_record_html(record))
        if len(records) > MAX_PROMPTS_PER_STEP:
            out.append(f"<p>… {len(records) - MAX_PROMPTS_PER_STEP} more prompts at this step</p>")
    return "\n".join(out)


def _page(title: str, subtitle: str, top: str, sections: Sequence[tuple[str, str, str]]) -> str:
    nav = "".join(f'<a href="#{sid}">{name}</a>' for sid, name, _ in sections)
    body = "\n".join(
        f'<section id="{sid}"><h2>{name}</h2>\n{content}</section>'
        for sid, name, content in sections
    )
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en"><head><meta charset="utf-8"><title>{REPORT_TITLE}: {_esc(title)}</title>'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<style>{CSS}</style><script>{SCRIPT}</script></head>\n"
        f"<body><main><h1>{REPORT_TITLE}: {_esc(title)}</h1>"
        f'<p class="sub">{_esc(subtitle)}</p>{top}<nav>{nav}</nav>\n{body}\n</main></body></html>\n'
    )


def render_html(run: RunData, dpi: int = 110) -> str:
    """The whole page as a string: the headline (held-out accuracy before -> after) first."""
    groups, hidden = plot_plan([run])
    name = run.run_dir.resolve().name or str(run.run_dir)
    notes = "".join(f'<p class="banner note">{_esc(n)}</p>' for n in run.notes)
    top = f'<section id="headline">{_headline(run)}</section>{_warnings_banner(run)}{notes}'
    sections = [
        ("summary", "Summary", _summary(run)),
        ("warnings", "Warnings", _warnings(run)),
        ("plots", "Plots", _plots([run], groups, hidden, dpi)),
        ("config", "Run and configuration", _config(run)),
        ("completions", "Example completions", _completions(run)),
    ]
    return _page(name, str(run.run_dir.resolve()), top, sections)


def build_report(run_dir: str | Path, output: str | Path | None = None, dpi: int = 110) -> Path:
    """Write the HTML report of ``run_dir`` to ``output`` (default RUN_DIR/report.html)."""
    run = load_run(run_dir)
    _matplotlib()  # fail before any work when the plots cannot be drawn
    target = Path(output) if output is not None else Path(run_dir) / "report.html"
    atomic_write_text(target, render_html(run, dpi))  # a reader never sees half a report
    return target


# ----------------------------------------------------------------------------------------------
# Several runs side by side


def run_labels(runs: Sequence[RunData]) -> list[str]:
    """A short name per run for legends and columns: the folder's name, with its parent where
    two runs share a name, and numbered where even that is not enough."""
    paths = [run.run_dir.resolve() for run in runs]
    labels = [p.name or str(p) for p in paths]
    if len(set(labels)) < len(labels):
        labels = [f"{p.parent.name}/{p.name}" for p in paths]
    if len(set(labels)) < len(labels):
        labels = [f"{i + 1}: {label}" for i, label in enumerate(labels)]
    return labels


def default_comparison_path(labels: Sequence[str], folder: str | Path = ".") -> Path:
    """``compare-A-vs-B.html`` in ``folder``; ``-2``, ``-3``, ... where that file exists, so a
    comparison never replaces an earlier one."""
    stem = "compare-" + "-vs-".join(re.sub(r"[^A-Za-z0-9._-]+", "-", n) for n in labels)
    stem = stem[:120].rstrip("-.")
    path, n = Path(folder) / f"{stem}.html", 1
    while path.exists():
        n += 1
        path = Path(folder) / f"{stem}-{n}.html"
    return path


def _compare_headline(runs: Sequence[RunData], labels: Sequence[str]) -> str:
    rows = []
    for run, label in zip(runs, labels, strict=True):
        found = headline(run)
        facts = run_facts(run)
        if found is None:
            scores = [_td("no evaluation"), _td("—", True), _td("—", True), _td("—", True)]
        elif found.evaluations == 1:
            last = f"{found.value(found.last)} <small>(step {found.last_step})</small>"
            scores = [_td(_esc(found.label)), _td("—", True), _td(last, True), _td("—", True)]
        else:
            first = f"{found.value(found.first)} <small>(step {found.first_step})</small>"
            last = f"<b>{found.value(found.last)}</b> <small>(step {found.last_step})</small>"
            scores = [_td(_esc(found.label)), _td(first, True), _td(last, True)]
            scores.append(_td(found.change(), True))
        extra = [
            _td(_esc(facts.get(k, "—")))
            for k in ("steps", "wall time", "started", "groupwise", "device", "dtype")
        ]
        rows.append([_td(f"<b>{_esc(label)}</b>"), *scores, *extra])
    header = ["run", "held-out metric", "before", "after", "change", "steps", "wall time",
              "started", "groupwise", "device", "dtype"]  # fmt: skip
    return _table(header, rows, "compare-headline")


MISSING = object()  # an option a run's config.yaml does not have


def config_differences(runs: Sequence[RunData]) -> dict[str, list[Any]]:
    """Every option whose value is not the same in all runs (``MISSING`` where a run's
    config.yaml lacks it), in the order the options first appear."""
    keys = _keys(run.config or {} for run in runs)
    found = {}
    for key in keys:
        values = [(run.config or {}).get(key, MISSING) for run in runs]
        if any(v != values[0] for v in values[1:]):
            found[key] = values
    return found


def _compare_config(runs: Sequence[RunData], labels: Sequence[str]) -> str:
    out = ""
    lacking = [label for run, label in zip(runs, labels, strict=True) if run.config is None]
    if lacking:
        out += (
            f'<p class="banner note">No config.yaml in {_esc(", ".join(lacking))}: '
            "its options are unknown (—).</p>"
        )
    differences = config_differences(runs)
    if not differences:
        return out + "<p>The runs used the same options.</p>"
    rows = [
        [_td(_esc(key))] + [_td("—" if v is MISSING else _esc(_config_value(v))) for v in values]
        for key, values in differences.items()
    ]
    return out + _table(["option", *(_esc(label) for label in labels)], rows, "config-compare")


def _compare_warnings(runs: Sequence[RunData], labels: Sequence[str]) -> str:
    rows = []
    for run, label in zip(runs, labels, strict=True):
        if run.events is None:
            text = "no events.jsonl"
        elif not run.events:
            text = "none"
        else:
            text = ", ".join(f"{g['kind']} ×{g['count']}" for g in _event_groups(run.events))
        rows.append([_td(f"<b>{_esc(label)}</b>"), _td(_esc(text))])
    return _table(["run", "warnings"], rows, "compare-warnings")


def render_comparison(runs: Sequence[RunData], dpi: int = 110) -> str:
    """One page comparing the runs: their headlines in one table, the options that differ,
    every plot with the runs overlaid (a colour per run), and their warnings."""
    labels = run_labels(runs)
    groups, hidden = plot_plan(runs)
    notes = "".join(
        f'<p class="banner note">{_esc(label)}: {_esc(n)}</p>'
        for run, label in zip(runs, labels, strict=True)
        for n in run.notes
    )
    top = f'<section id="headline">{_compare_headline(runs, labels)}</section>{notes}'
    sections = [
        ("config", "Options that differ", _compare_config(runs, labels)),
        ("plots", "Plots", _plots(runs, groups, hidden, dpi, labels)),
        ("warnings", "Warnings", _compare_warnings(runs, labels)),
    ]
    title = "comparison of " + ", ".join(labels)
    subtitle = " | ".join(str(run.run_dir.resolve()) for run in runs)
    return _page(title, subtitle, top, sections)


def build_comparison(
    run_dirs: Sequence[str | Path], output: str | Path | None = None, dpi: int = 110
) -> Path:
    """Write one page comparing ``run_dirs`` to ``output`` (default: a new
    ``compare-A-vs-B.html`` in the current folder, see :func:`default_comparison_path`)."""
    seen: dict[Path, str] = {}
    for run_dir in run_dirs:
        resolved = Path(run_dir).resolve()
        if resolved in seen:
            raise ReportError(
                f"run directory {run_dir} is given twice (also as {seen[resolved]}); "
                "expected different runs to compare"
            )
        seen[resolved] = str(run_dir)
    runs = [load_run(run_dir) for run_dir in run_dirs]
    _matplotlib()
    target = Path(output) if output is not None else default_comparison_path(run_labels(runs))
    atomic_write_text(target, render_comparison(runs, dpi))
    return target


# ----------------------------------------------------------------------------------------------
# Checking a report in a real browser

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--enable-logging=stderr",
    "--v=0",
    "--virtual-time-budget=5000",
)

# Chromium writes each console message of the page to stderr as
#   [pid:tid:date/time:INFO:CONSOLE:3] "Uncaught ReferenceError: f is not defined", source: ... (3)
# (Chromium 150; older versions wrote CONSOLE(3)). The level of console.error/warn/log is not in
# the line, so every console message counts: the report itself never writes to the console.
_CONSOLE = re.compile(r":CONSOLE(?::(\d+)\]|\((\d+)\)\])\s*(.*)")


def console_messages(stderr: str) -> list[str]:
    """The page's console messages (and any uncaught exception) from Chromium's stderr log."""
    found = []
    for line in stderr.splitlines():
        match = _CONSOLE.search(line)
        if match:
            found.append(match.group(3).strip())
        elif "Uncaught" in line:
            found.append(line.strip())
    return found


def dom_problems(dom: str, title: str = REPORT_TITLE) -> list[str]:
    """What is wrong with a report's DOM as dumped after the load event."""
    problems = []
    if title not in dom:
        problems.append(f"the page did not render: {title!r} is not in the DOM")
    body = re.search(r"<body\b[^>]*>", dom, re.IGNORECASE)
    attrs = dict(re.findall(r'(data-[\w-]+)="([^"]*)"', body.group(0))) if body else {}
    images = len(re.findall(r"<img\b", dom, re.IGNORECASE))
    if "data-images-ok" not in attrs:
        problems.append("the page's load script did not run (no data-images-ok on <body>)")
        return problems
    loaded = attrs.get("data-images-loaded", "")
    if attrs["data-images-ok"] != "true":
        problems.append(f"images failed to load: {loaded} of {images} <img> loaded")
    elif loaded != str(images):
        problems.append(f"data-images-loaded={loaded} but the page has {images} <img> tags")
    errors = attrs.get("data-page-errors", "0")
    if errors != "0":
        problems.append(f"{errors} error event(s) on the page (script errors or failed loads)")
    return problems


def check_in_browser(
    path: str | Path, chromium: str = "chromium", timeout: float = 60.0
) -> list[str]:
    """Open ``path`` in headless Chromium; the problems found (empty: it rendered, every image
    loaded, and nothing was written to the console)."""
    path = Path(path).resolve()
    if not path.is_file():
        return [f"{path}: no such file"]
    exe = shutil.which(chromium)
    if exe is None:
        return [f"{chromium!r} not found on PATH (Debian: apt-get install chromium)"]
    with tempfile.TemporaryDirectory(prefix="groupwise-chromium-") as profile:
        command = [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom", path.as_uri()]
        # Own process group, so a timeout can end the browser's helper processes too.
        proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        try:
            dom, log = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return [
                f"chromium did not finish within {timeout:.0f} s (an alert() or other dialog "
                "blocks headless Chromium)"
            ]
    problems = []
    if proc.returncode != 0:
        problems.append(f"chromium exited with status {proc.returncode}")
    problems += [f"console: {message}" for message in console_messages(log)]
    problems += dom_problems(dom)
    return problems


# ----------------------------------------------------------------------------------------------
# Command line


def main(argv: list[str] | None = None) -> int:
    """``groupwise report RUN_DIR [RUN_DIR ...] [--output FILE]``."""
    parser = argparse.ArgumentParser(
        prog="groupwise report",
        description="Write a self-contained HTML report (plots, warnings, config, samples) of a "
        "training run folder; given several run folders, one page comparing them.",
    )
    parser.add_argument(
        "run_dirs", nargs="+", metavar="RUN_DIR", help="a training output_dir (with metrics.jsonl)"
    )
    parser.add_argument(
        "--output",
        "-o",
        help="the HTML file to write (one run: RUN_DIR/report.html; several: a new "
        "compare-A-vs-B.html in the current folder, numbered rather than replacing one)",
    )
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 2
    replacing = args.output is not None and Path(args.output).exists()
    try:
        if len(args.run_dirs) == 1:
            path = build_report(args.run_dirs[0], args.output)
        else:
            path = build_comparison(args.run_dirs, args.output)
    except (ReportError, OSError) as err:
        print(f"groupwise report: error: {err}", file=sys.stderr)
        return 1
    print(f"wrote {path}" + (" (replacing the file that was there)" if replacing else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
