"""Drawing the figures :func:`~groupwise.report.panels.plot_plan` chose, with matplotlib's Agg
backend (imported on first use, so importing the report package stays light)."""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .load import ReportError, RunData, rows_for, series, token_axis
from .panels import Line, Panel, PlotGroup
from .record import number

INSTALL_HINT = "pip install groupwise[report]"
LINESTYLES = ("-", "--", ":", "-.")


def require_matplotlib() -> tuple[Any, Any]:
    """matplotlib's Figure and Agg canvas, or a :class:`ReportError` that says how to install
    it."""
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
    """About 1/15 of the run, odd (so it is centred), at most 51 points."""
    window = max(1, min(51, points // 15))
    return window if window % 2 else window + 1


def render_group(run: RunData, group: PlotGroup, dpi: int = 110) -> bytes:
    """One figure of one run as PNG bytes."""
    return figure_png(draw_group([run], group, dpi))


def figure_png(fig: Any) -> bytes:
    """A matplotlib ``Figure`` as PNG bytes."""
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
    Figure, FigureCanvasAgg = require_matplotlib()
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
                steps, values = series(rows_for(run, line.key), line.key, x)
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
        values = [number(row.get(line.key)) for row in run.train]
        stacked.append([v if v is not None and math.isfinite(v) else 0.0 for v in values])
    ax.stackplot(steps, np.asarray(stacked), labels=[p.label for p in phases], alpha=0.75)
