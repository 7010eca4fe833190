"""``groupwise report RUN1 RUN2 ...``: one page comparing runs (their headlines in one table,
the options that differ, every plot with the runs overlaid, and their warnings)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..files import atomic_write_text
from .html import config_value, event_groups, headline, page, plots_section, run_facts, table, td
from .load import ReportError, RunData, esc, load_run, metric_keys
from .panels import plot_plan
from .plot import require_matplotlib


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
            scores = [td("no evaluation"), td("—", True), td("—", True), td("—", True)]
        elif found.evaluations == 1:
            last = f"{found.value(found.last)} <small>(step {found.last_step})</small>"
            scores = [td(esc(found.label)), td("—", True), td(last, True), td("—", True)]
        else:
            first = f"{found.value(found.first)} <small>(step {found.first_step})</small>"
            last = f"<b>{found.value(found.last)}</b> <small>(step {found.last_step})</small>"
            scores = [td(esc(found.label)), td(first, True), td(last, True)]
            scores.append(td(found.change(), True))
        extra = [
            td(esc(facts.get(k, "—")))
            for k in ("steps", "wall time", "started", "groupwise", "device", "dtype")
        ]
        rows.append([td(f"<b>{esc(label)}</b>"), *scores, *extra])
    header = ["run", "held-out metric", "before", "after", "change", "steps", "wall time",
              "started", "groupwise", "device", "dtype"]  # fmt: skip
    return table(header, rows, "compare-headline")


MISSING = object()  # an option a run's config.yaml does not have


def config_differences(runs: Sequence[RunData]) -> dict[str, list[Any]]:
    """Every option whose value is not the same in all runs (``MISSING`` where a run's
    config.yaml lacks it), in the order the options first appear."""
    keys = metric_keys(run.config or {} for run in runs)
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
            f'<p class="banner note">No config.yaml in {esc(", ".join(lacking))}: '
            "its options are unknown (—).</p>"
        )
    differences = config_differences(runs)
    if not differences:
        return out + "<p>The runs used the same options.</p>"
    rows = [
        [td(esc(key))] + [td("—" if v is MISSING else esc(config_value(v))) for v in values]
        for key, values in differences.items()
    ]
    return out + table(["option", *(esc(label) for label in labels)], rows, "config-compare")


def _compare_warnings(runs: Sequence[RunData], labels: Sequence[str]) -> str:
    rows = []
    for run, label in zip(runs, labels, strict=True):
        if run.events is None:
            text = "no events.jsonl"
        elif not run.events:
            text = "none"
        else:
            text = ", ".join(f"{g['kind']} ×{g['count']}" for g in event_groups(run.events))
        rows.append([td(f"<b>{esc(label)}</b>"), td(esc(text))])
    return table(["run", "warnings"], rows, "compare-warnings")


def render_comparison(runs: Sequence[RunData], dpi: int = 110) -> str:
    """One page comparing the runs: their headlines in one table, the options that differ,
    every plot with the runs overlaid (a colour per run), and their warnings."""
    labels = run_labels(runs)
    groups, hidden = plot_plan(runs)
    notes = "".join(
        f'<p class="banner note">{esc(label)}: {esc(n)}</p>'
        for run, label in zip(runs, labels, strict=True)
        for n in run.notes
    )
    top = f'<section id="headline">{_compare_headline(runs, labels)}</section>{notes}'
    sections = [
        ("config", "Options that differ", _compare_config(runs, labels)),
        ("plots", "Plots", plots_section(runs, groups, hidden, dpi, labels)),
        ("warnings", "Warnings", _compare_warnings(runs, labels)),
    ]
    title = "comparison of " + ", ".join(labels)
    subtitle = " | ".join(str(run.run_dir.resolve()) for run in runs)
    return page(title, subtitle, top, sections)


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
    require_matplotlib()
    target = Path(output) if output is not None else default_comparison_path(run_labels(runs))
    atomic_write_text(target, render_comparison(runs, dpi))
    return target
