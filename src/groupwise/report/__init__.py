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

The parts, each importing only those before it: ``record`` (``run.json``, written by the
trainer), ``load`` (reading a run folder), ``panels`` (the table of figures, and what each run
fills in), ``plot`` (matplotlib, imported on first use), ``html`` (the page of one run),
``compare`` (the page of several), ``browser`` (the headless Chromium check).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .browser import CHROMIUM_FLAGS, check_in_browser, console_messages, dom_problems
from .compare import (
    MISSING,
    build_comparison,
    config_differences,
    default_comparison_path,
    render_comparison,
    run_labels,
)
from .html import (
    CSS,
    HEADLINE_METRICS,
    MAX_COMPLETIONS_PER_PROMPT,
    MAX_EVENTS_LISTED,
    MAX_PROMPTS_PER_STEP,
    REPORT_TITLE,
    SCRIPT,
    Headline,
    build_report,
    headline,
    render_html,
    run_facts,
)
from .load import (
    TOKENS_KEY,
    ReportError,
    RunData,
    correctness_reward,
    fmt,
    fmt_duration,
    load_run,
    read_jsonl,
    read_rewards,
    read_run_info,
    series,
    token_axis,
)
from .panels import (
    EXPECTED,
    FIGURES,
    SWITCHED_OFF,
    Hidden,
    Line,
    Panel,
    PlotGroup,
    candidate_groups,
    plot_groups,
    plot_plan,
)
from .plot import (
    INSTALL_HINT,
    LINESTYLES,
    draw_group,
    figure_png,
    moving_average,
    render_group,
    smoothing_window,
)
from .record import RUN_INFO_FILE, changed_defaults, record_run_end, record_run_start

__all__ = [
    "CHROMIUM_FLAGS",
    "CSS",
    "EXPECTED",
    "FIGURES",
    "HEADLINE_METRICS",
    "INSTALL_HINT",
    "LINESTYLES",
    "MAX_COMPLETIONS_PER_PROMPT",
    "MAX_EVENTS_LISTED",
    "MAX_PROMPTS_PER_STEP",
    "MISSING",
    "REPORT_TITLE",
    "RUN_INFO_FILE",
    "SCRIPT",
    "SWITCHED_OFF",
    "TOKENS_KEY",
    "Headline",
    "Hidden",
    "Line",
    "Panel",
    "PlotGroup",
    "ReportError",
    "RunData",
    "build_comparison",
    "build_report",
    "candidate_groups",
    "changed_defaults",
    "check_in_browser",
    "config_differences",
    "console_messages",
    "correctness_reward",
    "default_comparison_path",
    "dom_problems",
    "draw_group",
    "figure_png",
    "fmt",
    "fmt_duration",
    "headline",
    "load_run",
    "main",
    "moving_average",
    "plot_groups",
    "plot_plan",
    "read_jsonl",
    "read_rewards",
    "read_run_info",
    "record_run_end",
    "record_run_start",
    "render_comparison",
    "render_group",
    "render_html",
    "run_facts",
    "run_labels",
    "series",
    "smoothing_window",
    "token_axis",
]


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
