"""Page assembly for ``groupwise report``: the CSS and load script, the headline (held-out
accuracy before -> after), the summary, warnings, plots, configuration and example completions
of one run, and :func:`build_report`. The page loads nothing from anywhere else, so it can be
mailed or opened offline."""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..files import atomic_write_text
from .load import (
    RunData,
    correctness_reward,
    esc,
    fmt,
    fmt_duration,
    load_run,
    metric_keys,
    reward_names,
    series,
)
from .panels import Hidden, PlotGroup, plot_plan
from .plot import draw_group, figure_png, require_matplotlib
from .record import changed_defaults, number

REPORT_TITLE = "groupwise training report"

MAX_PROMPTS_PER_STEP = 3  # example prompts shown for each of the first and last logged steps
MAX_COMPLETIONS_PER_PROMPT = 16
MAX_EVENTS_LISTED = 200

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


def table(header: Sequence[str] | None, rows: Iterable[Sequence[str]], cls: str = "") -> str:
    """Cells are HTML already (escape text before passing it in)."""
    head = "".join(f"<th>{h}</th>" for h in header or ())
    thead = f"<thead><tr>{head}</tr></thead>" if header else ""
    body = "".join("<tr>" + "".join(cells) + "</tr>" for cells in rows)
    return f'<table class="{cls}">{thead}<tbody>{body}</tbody></table>'


def td(text: str, num: bool = False) -> str:
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

    def value(self, score: float) -> str:
        return f"{score:.1%}" if self.fraction else fmt(score)

    def change(self) -> str:
        delta = self.last - self.first
        return f"{100 * delta:+.1f} points" if self.fraction else f"{delta:+.4g}"


def headline(run: RunData) -> Headline | None:
    """Held-out accuracy before -> after from the run's evaluation records (None: the run was
    never evaluated). The correctness reward's greedy mean first (what ``groupwise demo``
    prints), then greedy / sampled accuracy and pass@1; with no correctness score, the eval
    reward."""
    train_names = reward_names(metric_keys(run.train))
    eval_names = reward_names(metric_keys(run.evals), "eval/rewards/")
    correct = correctness_reward(list(dict.fromkeys(train_names + eval_names)), run.rewards)
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
        return f'<p class="headline none">{esc(_no_evaluation(run))}</p>'
    label = esc(found.label[0].upper() + found.label[1:])
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
    wall = number(info.get("wall_time_s"))
    if wall is not None and info.get("finished"):
        facts["wall time"] = fmt_duration(wall)
    elif info:
        facts["wall time"] = "not finished (running, or stopped without a clean exit)"
    if info.get("started"):
        facts["started"] = str(info["started"]).replace("T", " ")
    if info.get("groupwise_version"):
        facts["groupwise"] = str(info["groupwise_version"])
    if info.get("device"):
        world = number(info.get("world_size"))
        ranks = f" × {int(world)} ranks" if world and world > 1 else ""
        facts["device"] = f"{info['device']}{ranks}"
    if info.get("dtype"):
        precision = f" ({info['precision']})" if info.get("precision") else ""
        facts["dtype"] = f"{info['dtype']}{precision}"
    return facts


def _headline(run: RunData) -> str:
    facts = run_facts(run)
    line = " · ".join(esc(v if k in ("steps", "wall time") else f"{k} {v}") for k, v in
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
            rows.append([td(esc(key)), td(esc(config[key]))])
    if train:
        first, last = train[0]["step"], train[-1]["step"]
        rows.append([td("training steps logged"), td(f"{len(train)} (steps {first} to {last})")])
    else:
        rows.append([td("training steps logged"), td("none")])
    for key, label in [("reward", "reward")] + [
        (f"rewards/{n}/mean", n) for n in reward_names(metric_keys(train))
    ]:
        start, k = _window_mean(train, key, last=False)
        end, _ = _window_mean(train, key, last=True)
        if k:
            span = f" (means of the first / last {k} logged steps)" if k > 1 else ""
            rows.append([td(esc(label)), td(f"{fmt(start)} → {fmt(end)}{span}")])
    steps, times = series(train, "time/step")
    if times.size:
        missing = len(train) - times.size
        text = f"{fmt_duration(float(times.sum()))} ({fmt(float(times.mean()))} s per step"
        text += f"; {missing} steps without timing)" if missing else ")"
        rows.append([td("training time (sum of time/step over logged steps)"), td(text)])
    _, tps = series(train, "tokens_per_second")
    if tps.size:
        rows.append([td("generated tokens per second (mean)"), td(fmt(float(tps.mean())))])
    nonfinite = _nonfinite(train)
    if nonfinite:
        text = "; ".join(
            f"{esc(k)}: {len(s)} step{'s' if len(s) > 1 else ''} ({_steps_text(s)})"
            for k, s in nonfinite.items()
        )
        rows.append([td("NaN / infinite values"), td(text)])
    out = table(None, rows, "summary")
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
            found_number = number(value)
            if found_number is not None and not math.isfinite(found_number):
                found.setdefault(key, []).append(row["step"])
    return found


def _eval_table(evals: Sequence[dict[str, Any]]) -> str:
    """First, last and best value of each headline eval metric (all are higher-is-better)."""
    skip = re.compile(r"eval/(difficulty_|task_).*|eval/(num_prompts|mean_length|truncated_rate)")
    keys = [k for k in metric_keys(evals) if k != "step" and not skip.fullmatch(k)]
    rows = []
    for key in keys:
        steps, values = series(evals, key)
        if not values.size:
            continue
        best = int(np.argmax(values))
        rows.append(
            [
                td(esc(key.removeprefix("eval/"))),
                td(f"{fmt(values[0])} <small>(step {int(steps[0])})</small>", True),
                td(f"{fmt(values[-1])} <small>(step {int(steps[-1])})</small>", True),
                td(f"<b>{fmt(values[best])}</b> <small>(step {int(steps[best])})</small>", True),
            ]
        )
    return table(["metric", "first", "last", "best"], rows, "eval") if rows else ""


def event_groups(events: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Events grouped by kind, in order of first appearance."""
    groups: dict[str, dict[str, Any]] = {}
    for event in events:
        kind = str(event.get("kind") or "unknown")
        step = number(event.get("step"))
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
    groups = event_groups(run.events)
    kinds = ", ".join(f"{esc(g['kind'])} ×{g['count']}" for g in groups)
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
    for g in event_groups(run.events):
        steps = g["steps"]
        rows.append(
            [
                td(f"<b>{esc(g['kind'])}</b>"),
                td(str(g["count"]), True),
                td(str(min(steps)) if steps else "—", True),
                td(str(max(steps)) if steps else "—", True),
                td(esc(g["message"])),
            ]
        )
    out = table(["kind", "count", "first step", "last step", "first message"], rows, "warnings")
    listed = [
        [
            td(fmt(e.get("step")), True),
            td(esc(e.get("kind", "unknown"))),
            td(esc(e.get("message", ""))),
        ]
        for e in run.events[:MAX_EVENTS_LISTED]
    ]
    more = len(run.events) - len(listed)
    out += (
        f"<details><summary>All {len(run.events)} events</summary>"
        + table(["step", "kind", "message"], listed)
        + (f"<p>… {more} more in events.jsonl</p>" if more > 0 else "")
        + "</details>"
    )
    return out


def plots_section(
    runs: Sequence[RunData],
    groups: Sequence[PlotGroup],
    hidden: Sequence[Hidden],
    dpi: int,
    labels: Sequence[str] | None = None,
) -> str:
    out = []
    if hidden:
        listed = ", ".join(esc(h) for h in hidden)
        out.append(f'<p class="hidden-series">not shown: {listed}</p>')
    if not groups:
        return "".join(out) + "<p>No metric has a finite value that changes to plot.</p>"
    for group in groups:
        png = figure_png(draw_group(runs, group, dpi, labels))
        data = base64.b64encode(png).decode("ascii")
        caption = f"<figcaption>{esc(group.caption)}</figcaption>" if group.caption else ""
        out.append(
            f'<figure id="plot-{group.id}"><img alt="{esc(group.title)}" '
            f'src="data:image/png;base64,{data}">{caption}</figure>'
        )
    return "\n".join(out)


def config_value(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


def _config(run: RunData) -> str:
    facts = run_facts(run)
    out = ""
    if facts:
        rows = [[td(esc(k)), td(esc(v))] for k, v in facts.items()]
        out += table(None, rows, "facts")
    if run.config is None:
        return out + '<p class="banner note">No config.yaml in this run.</p>'
    full = table(
        ["option", "value"],
        ([td(esc(k)), td(esc(config_value(v)))] for k, v in run.config.items()),
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
            td(esc(k)),
            td(
                f"<code>{esc(config_value(defaults[k]))}</code> → "
                f"<b>{esc(config_value(run.config[k]))}</b>"
            ),
        ]
        for k in changed
    ]
    out += f"<h3>Options changed from the defaults ({len(changed)})</h3>"
    if rows:
        out += table(["option", "default → this run"], rows, "config-diff")
    else:
        out += "<p>None: the run used every default.</p>"
    return out + f"<details><summary>All {len(run.config)} options</summary>{full}</details>"


def _prompt_html(prompt: Any) -> str:
    if isinstance(prompt, list):
        parts = []
        for message in prompt:
            if isinstance(message, dict):
                role, content = message.get("role", "?"), message.get("content", "")
                parts.append(f"<b>{esc(role)}</b>: {esc(content)}")
            else:
                parts.append(esc(message))
        return '<pre class="prompt">' + "\n".join(parts) + "</pre>"
    return f'<pre class="prompt">{esc(prompt)}</pre>'


def _record_html(record: dict[str, Any]) -> str:
    answer = record.get("answer")
    answer_text = "—" if answer is None else esc(config_value(answer))
    out = [_prompt_html(record.get("prompt", "")), f"<p>answer: <code>{answer_text}</code></p>"]
    completions = record.get("completions") or []
    rows = []
    for i, c in enumerate(completions[:MAX_COMPLETIONS_PER_PROMPT]):
        if not isinstance(c, dict):
            c = {"text": c}
        parts = c.get("rewards") or {}
        components = "<br>".join(
            f"{esc(name)}: {fmt(value)}" for name, value in parts.items()
        ) or "—"  # fmt: skip
        advantage = number(c.get("advantage"))
        adv = "—" if advantage is None else f"{advantage:+.3f}"
        rows.append(
            [
                td(str(i + 1), True),
                td(fmt(c.get("reward")), True),
                td(components),
                td(adv, True),
                td(f"<pre>{esc(c.get('text', ''))}</pre>"),
            ]
        )
    out.append(table(["#", "reward", "components", "advantage", "completion"], rows, "samples"))
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
        step = number(record.get("step"))
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


def page(title: str, subtitle: str, top: str, sections: Sequence[tuple[str, str, str]]) -> str:
    nav = "".join(f'<a href="#{sid}">{name}</a>' for sid, name, _ in sections)
    body = "\n".join(
        f'<section id="{sid}"><h2>{name}</h2>\n{content}</section>'
        for sid, name, content in sections
    )
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en"><head><meta charset="utf-8"><title>{REPORT_TITLE}: {esc(title)}</title>'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<style>{CSS}</style><script>{SCRIPT}</script></head>\n"
        f"<body><main><h1>{REPORT_TITLE}: {esc(title)}</h1>"
        f'<p class="sub">{esc(subtitle)}</p>{top}<nav>{nav}</nav>\n{body}\n</main></body></html>\n'
    )


def render_html(run: RunData, dpi: int = 110) -> str:
    """The whole page as a string: the headline (held-out accuracy before -> after) first."""
    groups, hidden = plot_plan([run])
    name = run.run_dir.resolve().name or str(run.run_dir)
    notes = "".join(f'<p class="banner note">{esc(n)}</p>' for n in run.notes)
    top = f'<section id="headline">{_headline(run)}</section>{_warnings_banner(run)}{notes}'
    sections = [
        ("summary", "Summary", _summary(run)),
        ("warnings", "Warnings", _warnings(run)),
        ("plots", "Plots", plots_section([run], groups, hidden, dpi)),
        ("config", "Run and configuration", _config(run)),
        ("completions", "Example completions", _completions(run)),
    ]
    return page(name, str(run.run_dir.resolve()), top, sections)


def build_report(run_dir: str | Path, output: str | Path | None = None, dpi: int = 110) -> Path:
    """Write the HTML report of ``run_dir`` to ``output`` (default RUN_DIR/report.html)."""
    run = load_run(run_dir)
    require_matplotlib()  # fail before any work when the plots cannot be drawn
    target = Path(output) if output is not None else Path(run_dir) / "report.html"
    atomic_write_text(target, render_html(run, dpi))  # a reader never sees half a report
    return target
