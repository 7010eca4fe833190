"""``groupwise report RUN_DIR``: one self-contained HTML page about a training run.

Reads what the trainer writes into its output folder (``metrics.jsonl``; and when present
``config.yaml``, ``rewards.json``, ``events.jsonl``, ``completions.jsonl``) and writes
``RUN_DIR/report.html``:
a summary, the run's warnings, plots (PNG, base64-embedded, made with matplotlib's Agg backend),
the configuration and example completions. The page loads nothing from anywhere else, so it can
be mailed or opened offline. :func:`check_in_browser` renders a report in headless Chromium and
lists what went wrong (used by ``scripts/check_report_browser.py`` and the tests).
"""

from __future__ import annotations

import argparse
import base64
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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
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

    events = None
    if (run_dir / "events.jsonl").is_file():
        events = read_jsonl(run_dir / "events.jsonl", notes)
    completions = None
    if (run_dir / "completions.jsonl").is_file():
        completions = read_jsonl(run_dir / "completions.jsonl", notes)
    return RunData(run_dir, train, evals, config, events, completions, notes, rewards)


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
    """The figures this run's metrics support, each with only the series that have data."""
    train_keys, eval_keys = _keys(run.train), _keys(run.evals)
    names = _reward_names(train_keys)
    correct = correctness_reward(names, run.rewards)
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
    tokens = token_axis(run)
    kept = []
    for group in groups:
        panels = []
        for panel in group.panels:
            x = tokens if panel.x == "tokens" else None
            lines = [
                line
                for line in panel.lines
                if series(_rows_for(run, line.key), line.key, x)[0].size
            ]
            if lines and (x is None or x):
                panels.append(Panel(panel.ylabel, lines, panel.style, panel.logy, panel.x))
        if panels:
            kept.append(PlotGroup(group.id, group.title, panels, group.caption))
    return kept


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


def render_group(run: RunData, group: PlotGroup, dpi: int = 110) -> bytes:
    """One figure as PNG bytes."""
    Figure, FigureCanvasAgg = _matplotlib()
    height = 0.9 + 2.2 * len(group.panels)
    fig = Figure(figsize=(8.5, height), dpi=dpi)
    FigureCanvasAgg(fig)
    # Fixed margins (in inches) rather than a layout engine, which doubles the drawing time.
    fig.subplots_adjust(left=0.1, right=0.98, top=1 - 0.4 / height, bottom=0.5 / height)
    axes = fig.subplots(len(group.panels), 1, sharex=True, squeeze=False)[:, 0]
    colors = [f"C{i}" for i in range(10)]
    for ax, panel in zip(axes, group.panels, strict=True):
        if panel.style == "stack":
            _draw_stack(ax, run, panel)
        for i, line in enumerate(panel.lines):
            if panel.style == "stack" and line.key != "time/step":
                continue
            x = token_axis(run) if panel.x == "tokens" else None
            steps, values = series(_rows_for(run, line.key), line.key, x)
            color = "black" if panel.style == "stack" else colors[i % len(colors)]
            if panel.style == "points" or line.key.startswith("eval/"):  # sparse: mark points
                ax.plot(steps, values, "o-", color=color, label=line.label, ms=4, lw=1.2)
            elif panel.style in ("raw", "stack") or values.size < 8:
                ax.plot(steps, values, color=color, label=line.label, lw=1.4)
            else:
                ax.plot(steps, values, color=color, alpha=0.25, lw=0.8)
                smooth = moving_average(values, smoothing_window(values.size))
                ax.plot(steps, smooth, color=color, label=line.label, lw=1.6)
        if panel.logy:
            ax.set_yscale("log")
        ax.set_ylabel(panel.ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best", fontsize=8, ncol=2 if len(panel.lines) > 4 else 1)
    axes[0].set_title(group.title, fontsize=11)
    tokens = group.panels[-1].x == "tokens"
    axes[-1].set_xlabel("completion tokens generated (cumulative)" if tokens else "step")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


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


def _plots(run: RunData, groups: Sequence[PlotGroup], dpi: int) -> str:
    if not groups:
        return "<p>No metric has a finite value to plot.</p>"
    out = []
    for group in groups:
        data = base64.b64encode(render_group(run, group, dpi)).decode("ascii")
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
    if run.config is None:
        return '<p class="banner note">No config.yaml in this run.</p>'
    rows = [[_td(_esc(k)), _td(_esc(_config_value(v)))] for k, v in run.config.items()]
    return _table(["option", "value"], rows, "config")


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


def render_html(run: RunData, dpi: int = 110) -> str:
    """The whole page as a string."""
    groups = plot_groups(run)
    name = run.run_dir.resolve().name or str(run.run_dir)
    notes = "".join(f'<p class="banner note">{_esc(n)}</p>' for n in run.notes)
    sections = [
        ("summary", "Summary", _summary(run)),
        ("warnings", "Warnings", _warnings(run)),
        ("plots", "Plots", _plots(run, groups, dpi)),
        ("config", "Configuration", _config(run)),
        ("completions", "Example completions", _completions(run)),
    ]
    nav = "".join(f'<a href="#{sid}">{title}</a>' for sid, title, _ in sections)
    body = "\n".join(
        f'<section id="{sid}"><h2>{title}</h2>\n{content}</section>'
        for sid, title, content in sections
    )
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en"><head><meta charset="utf-8"><title>{REPORT_TITLE}: {_esc(name)}</title>'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<style>{CSS}</style><script>{SCRIPT}</script></head>\n"
        f"<body><main><h1>{REPORT_TITLE}: {_esc(name)}</h1>"
        f'<p class="sub">{_esc(run.run_dir.resolve())}</p><nav>{nav}</nav>'
        f"{_warnings_banner(run)}{notes}\n{body}\n</main></body></html>\n"
    )


def build_report(run_dir: str | Path, output: str | Path | None = None, dpi: int = 110) -> Path:
    """Write the HTML report of ``run_dir`` to ``output`` (default RUN_DIR/report.html)."""
    run = load_run(run_dir)
    _matplotlib()  # fail before any work when the plots cannot be drawn
    target = Path(output) if output is not None else Path(run_dir) / "report.html"
    atomic_write_text(target, render_html(run, dpi))  # a reader never sees half a report
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
    """``groupwise report RUN_DIR [--output FILE]``."""
    parser = argparse.ArgumentParser(
        prog="groupwise report",
        description="Write a self-contained HTML report (plots, warnings, config, samples) of a "
        "training run folder.",
    )
    parser.add_argument("run_dir", help="a training output_dir (with metrics.jsonl)")
    parser.add_argument("--output", "-o", help="the HTML file to write (RUN_DIR/report.html)")
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 2
    try:
        path = build_report(args.run_dir, args.output)
    except (ReportError, OSError) as err:
        print(f"groupwise report: error: {err}", file=sys.stderr)
        return 1
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
