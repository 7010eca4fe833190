"""What the report plots, as a table (:data:`FIGURES`): each figure's title, caption and panels,
each panel's axis label, style and series (metric name and legend label), and when a figure is
shown at all. :func:`candidate_groups` fills the table in from the runs' metric names;
:func:`plot_plan` then drops every series that carries nothing (constant, switched off by an
option, or not logged) and names the ones it dropped."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from .load import (
    RunData,
    correctness_reward,
    fmt,
    metric_keys,
    natural,
    reward_names,
    rows_for,
    series,
    token_axis,
)
from .record import number

# ----------------------------------------------------------------------------------------------
# The table


@dataclass(frozen=True)
class Series:
    """One line: a metric name and its legend label. ``{name}`` parts are placeholders (see
    :data:`EACH` and :data:`CHOSEN`); ``labels`` replaces the label for particular values of the
    series' placeholder (after :data:`EACH`'s ``show``)."""

    key: str
    label: str
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PanelSpec:
    """One panel: its y-axis label and series. ``style``: smooth (raw faint + moving average),
    raw, points, or stack (the phases stacked, ``time/step`` the line on top); eval/* series are
    always points. ``x``: step, or tokens (cumulative generated tokens, ``TOKENS_KEY``)."""

    ylabel: str
    series: tuple[Series, ...]
    style: str = "smooth"
    logy: bool = False
    x: str = "step"


@dataclass(frozen=True)
class FigureSpec:
    """One figure (one ``<img>``): panels sharing the x axis. ``needs``: the :data:`CHOSEN`
    values it is drawn for (without one of them, the figure is left out)."""

    id: str
    title: str
    panels: tuple[PanelSpec, ...]
    caption: str = ""
    needs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Each:
    """A placeholder a series is repeated for: one line per logged metric name that matches
    ``pattern`` in its place, ordered as the names were logged or naturally (pass@2 before
    pass@16); ``show`` is how the value reads in labels."""

    pattern: str
    order: str = "natural"  # natural | logged
    show: str = "as_is"  # as_is | integer


EACH = {
    "reward": Each(r".+", order="logged"),  # a reward component
    "bin": Each(r"\d+", show="integer"),  # a curriculum difficulty bin
    "score": Each(r"pass@\d+|mean@\d+|accuracy|greedy_accuracy|format_rate"),  # eval scores
    "level": Each(r".+"),  # a difficulty level of the held-out data
}
# Placeholders that stand for one value found from the runs (see chosen_values):
# correct: the correctness reward; difficulty_metric: the score plotted per difficulty level.
CHOSEN = ("correct", "difficulty_metric")

SMOOTH = "Faint: raw values; solid: centred moving average."
HARDEST = {"0": "bin 0 (hardest)"}  # the curriculum's bin 0 holds the hardest prompts


FIGURES: tuple[FigureSpec, ...] = (
    FigureSpec(
        "reward",
        "Reward: total and per component",
        (
            PanelSpec(
                "reward", (Series("reward", "total"), Series("rewards/{reward}/mean", "{reward}"))
            ),
        ),
        SMOOTH,
    ),
    FigureSpec(
        "accuracy",
        "Accuracy ({correct})",
        (
            PanelSpec(
                "fraction correct",
                (
                    Series("rewards/{correct}/mean", "training samples"),
                    Series("eval/rewards/{correct}/mean", "eval, greedy"),
                    Series("eval/accuracy", "eval, sampled"),
                ),
            ),
        ),
        SMOOTH,
        needs=("correct",),
    ),
    FigureSpec(
        "eval",
        "Evaluation over steps",
        (
            PanelSpec(
                "score",
                (Series("eval/reward", "eval reward"), Series("eval/{score}", "{score}")),
                "points",
            ),
        ),
    ),
    FigureSpec(
        "eval_difficulty",
        "Evaluation by difficulty",
        (
            PanelSpec(
                "{difficulty_metric}",
                (Series("eval/difficulty_{level}/{difficulty_metric}", "difficulty {level}"),),
                "points",
            ),
        ),
        needs=("difficulty_metric",),
    ),
    FigureSpec("loss", "Loss", (PanelSpec("loss", (Series("loss", "loss"),)),), SMOOTH),
    FigureSpec("kl", "KL to the reference", (PanelSpec("KL", (Series("kl", "kl"),)),), SMOOTH),
    FigureSpec(
        "entropy", "Token entropy", (PanelSpec("nats", (Series("entropy", "entropy"),)),), SMOOTH
    ),
    FigureSpec(
        "length",
        "Completion length and truncation",
        (
            PanelSpec(
                "tokens",
                (
                    Series("completions/mean_length", "mean length"),
                    Series("completions/max_length", "max length"),
                ),
            ),
            PanelSpec("fraction", (Series("completions/clipped_ratio", "clipped (truncated)"),)),
        ),
        SMOOTH,
    ),
    FigureSpec(
        "clip",
        "Clipped token fractions",
        (
            PanelSpec(
                "fraction",
                (
                    Series("clip_ratio/low_mean", "low"),
                    Series("clip_ratio/high_mean", "high"),
                    Series("clip_ratio/region_mean", "region"),
                ),
            ),
        ),
        SMOOTH,
    ),
    FigureSpec(
        "zero_std",
        "Groups with zero reward spread (no learning signal)",
        (PanelSpec("fraction", (Series("frac_reward_zero_std", "frac_reward_zero_std"),)),),
        SMOOTH,
    ),
    FigureSpec(
        "time",
        "Time per step by phase",
        (
            PanelSpec(
                "seconds",
                (
                    Series("time/generation", "generation"),
                    Series("time/scoring", "scoring"),
                    Series("time/update", "update"),
                    Series("time/planning", "planning"),
                    Series("time/step", "whole step"),
                ),
                "stack",
            ),
            PanelSpec("tokens / s", (Series("tokens_per_second", "generated tokens per second"),)),
        ),
        "Top: phases stacked, the line is the whole step.",
    ),
    FigureSpec(
        "optim",
        "Gradient norm and learning rate",
        (
            PanelSpec("grad norm", (Series("grad_norm", "grad_norm (before clipping)"),)),
            PanelSpec("learning rate", (Series("learning_rate", "learning_rate"),), "raw"),
        ),
        SMOOTH,
    ),
    FigureSpec(
        "curriculum_weights",
        "Curriculum: bin weights",
        (
            PanelSpec(
                "weight", (Series("curriculum/weight_bin_{bin}", "bin {bin}", HARDEST),), "raw"
            ),
        ),
    ),
    FigureSpec(
        "curriculum_rollouts",
        "Curriculum: rollouts per bin",
        (PanelSpec("rollouts", (Series("curriculum/rollouts_bin_{bin}", "bin {bin}", HARDEST),)),),
        SMOOTH,
    ),
    FigureSpec(
        "curriculum_prompts",
        "Curriculum: prompts per bin",
        (PanelSpec("prompts", (Series("curriculum/prompts_bin_{bin}", "bin {bin}", HARDEST),)),),
        SMOOTH,
    ),
    FigureSpec(
        "curriculum_stats",
        "Curriculum: Rollout-GDRO dual variable and weighted standard error",
        (
            PanelSpec("mu", (Series("curriculum/mu", "mu"),), "raw"),
            PanelSpec(
                "WSE",
                (
                    Series("curriculum/wse", "wse"),
                    Series("curriculum/wse_uniform", "wse with uniform rollouts"),
                ),
            ),
        ),
        SMOOTH,
    ),
    FigureSpec(
        "curriculum_select",
        "Curriculum select: prompts skipped before rollout, and group sizes",
        (
            PanelSpec(
                "prompts",
                (
                    Series("curriculum/select/skipped", "skipped (drawn, not rolled out)"),
                    Series("curriculum/select/informative_predicted", "informative, predicted"),
                    Series("curriculum/select/informative", "informative, realised"),
                ),
            ),
            PanelSpec(
                "rollouts per prompt",
                (
                    Series("curriculum/select/group_size_max", "max group size"),
                    Series("curriculum/select/group_size_mean", "mean group size"),
                    Series("curriculum/select/group_size_min", "min group size"),
                ),
                "raw",
            ),
        ),
        "Informative: groups whose rollouts are not all correct or all wrong. " + SMOOTH,
    ),
    FigureSpec(
        "tools",
        "Tool use and turns (multi-turn rollouts)",
        (
            PanelSpec(
                "share",
                (
                    Series("tools/call_rate", "conversations with a tool call"),
                    Series("tools/failure_frequency", "failed calls / calls"),
                    Series("tokens/masked_fraction", "tokens masked from the loss"),
                ),
            ),
            PanelSpec(
                "accuracy",
                (
                    Series("tools/accuracy_with_call", "with a tool call"),
                    Series("tools/accuracy_without_call", "without"),
                ),
            ),
            PanelSpec(
                "per conversation",
                (
                    Series("tools/call_frequency", "tool calls"),
                    Series("turns/mean", "assistant turns"),
                ),
            ),
        ),
        "Masked tokens: tool and environment replies, context for the policy but not trained "
        "on. Accuracy: mean correctness score of the conversations with / without a call. "
        + SMOOTH,
    ),
    FigureSpec(
        "eval_tokens",
        "Held-out accuracy against generated tokens (what the compute bought)",
        (
            PanelSpec(
                "score",
                (
                    Series("eval/rewards/{correct}/mean", "eval, greedy"),
                    Series("eval/{score}", "{score}"),
                ),
                "points",
                x="tokens",
            ),
        ),
        "x: completion tokens generated by training so far (compute/generated_tokens_total).",
    ),
)


# ----------------------------------------------------------------------------------------------
# The table filled in from the runs


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


_PLACEHOLDER = re.compile(r"\{(\w+)\}")


def placeholders(template: str) -> list[str]:
    """The ``{name}`` placeholders of a key, label or title, in order."""
    return _PLACEHOLDER.findall(template)


def _fill(template: str, values: Mapping[str, str]) -> str | None:
    """``template`` with its placeholders replaced; None when one of them has no value."""
    parts = _PLACEHOLDER.split(template)  # text, name, text, name, ..., text
    for name in parts[1::2]:
        if name not in values:
            return None
    return "".join(values[p] if i % 2 else p for i, p in enumerate(parts))


def chosen_values(
    runs: Sequence[RunData], train_keys: Sequence[str], eval_keys: Sequence[str]
) -> dict[str, str]:
    """The :data:`CHOSEN` placeholders the runs have a value for: the correctness reward (the
    first run that names one), and the score plotted per difficulty level (pass@1, else
    accuracy, else the first logged)."""
    chosen: dict[str, str] = {}
    names = reward_names(train_keys)
    correct = next(
        (c for run in runs if (c := correctness_reward(names, run.rewards)) is not None), None
    )
    if correct:
        chosen["correct"] = correct
    pattern = r"eval/difficulty_.+/(pass@\d+|mean@\d+|accuracy)"
    metrics = list(dict.fromkeys(m.group(1) for k in eval_keys if (m := re.fullmatch(pattern, k))))
    if metrics:
        preferred = [m for m in ("pass@1", "accuracy") if m in metrics]
        chosen["difficulty_metric"] = (preferred or sorted(metrics, key=natural))[0]
    return chosen


def _lines(
    spec: Series, chosen: Mapping[str, str], train_keys: Sequence[str], eval_keys: Sequence[str]
) -> list[Line]:
    """The lines a series of the table stands for in these runs: one, or one per matching
    metric name for an :data:`EACH` placeholder, or none when a chosen value is missing."""
    each = [name for name in placeholders(spec.key) if name in EACH]
    if not each:
        key, label = _fill(spec.key, chosen), _fill(spec.label, chosen)
        return [] if key is None or label is None else [Line(key, label)]
    name, rule = each[0], EACH[each[0]]
    parts = _PLACEHOLDER.split(spec.key)
    pattern = ""
    for i, part in enumerate(parts):
        if i % 2 == 0:
            pattern += re.escape(part)
        elif part == name:
            pattern += f"({rule.pattern})"
        elif part in chosen:
            pattern += re.escape(chosen[part])
        else:
            return []
    pool = eval_keys if spec.key.startswith("eval/") else train_keys
    found = [(m.group(1), key) for key in pool if (m := re.fullmatch(pattern, key))]
    if rule.order == "natural":
        found.sort(key=lambda pair: natural(pair[0]))
    lines = []
    for value, key in found:
        shown = str(int(value)) if rule.show == "integer" else value
        label = spec.labels.get(shown) or _fill(spec.label, {**chosen, name: shown})
        if label is not None:
            lines.append(Line(key, label))
    return lines


def candidate_groups(runs: Sequence[RunData]) -> list[PlotGroup]:
    """:data:`FIGURES` filled in with every series the runs' metric names allow (one table for
    one run or several), before :func:`plot_plan` drops what carries nothing. A panel without
    series and a figure without panels are left out."""
    train_keys = metric_keys(row for run in runs for row in run.train)
    eval_keys = metric_keys(row for run in runs for row in run.evals)
    chosen = chosen_values(runs, train_keys, eval_keys)
    groups = []
    for figure in FIGURES:
        title = _fill(figure.title, chosen)
        if title is None or any(name not in chosen for name in figure.needs):
            continue
        panels = []
        for spec in figure.panels:
            lines = [line for s in spec.series for line in _lines(s, chosen, train_keys, eval_keys)]
            ylabel = _fill(spec.ylabel, chosen)
            if lines and ylabel is not None:
                panels.append(Panel(ylabel, lines, spec.style, spec.logy, spec.x))
        if panels:
            groups.append(PlotGroup(figure.id, title, panels, figure.caption))
    return groups


# ----------------------------------------------------------------------------------------------
# What carries nothing


@dataclass(frozen=True)
class Hidden:
    """A series left out of the plots, and why: named in one line above them."""

    key: str
    reason: str

    def __str__(self) -> str:
        return f"{self.key} ({self.reason})"


@dataclass(frozen=True)
class SwitchedOff:
    """A series that says nothing when ``option`` is ``value`` in the run's config.yaml,
    whatever the run logged; ``reason`` is what the plots say instead."""

    option: str
    value: float
    reason: str

    def __call__(self, config: Mapping[str, object]) -> str | None:
        return self.reason if number(config.get(self.option)) == self.value else None


SWITCHED_OFF = {
    # beta = 0: no reference model, so the logged KL is not computed (TRL logs 0).
    "kl": SwitchedOff("beta", 0, "beta 0"),
}
# Series every run is expected to log: when one is missing, the plots say so; optional families
# (curriculum, tools, evaluation by difficulty, ...) just do not appear.
EXPECTED = ("reward", "loss", "kl", "entropy", "completions/mean_length", "grad_norm")


def plot_groups(run: RunData) -> list[PlotGroup]:
    """The figures this run's metrics support, each with only the series that carry something
    (see :func:`plot_plan`)."""
    return plot_plan([run])[0]


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
            values = series(rows_for(run, line.key), line.key, x)[1]
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
